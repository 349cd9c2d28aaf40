// sfmoe._C: the Python binding of the C API. A thin layer: it turns DLPack arrays into sfmoe
// descriptors, calls sfmoe_* functions and turns a failed status into a Python exception that
// carries the library's own message. Framework handling (allocation, dtype mapping, streams)
// belongs to the Python package (python/sfmoe/). The numerics helpers at the end run the
// header-only numerics (include/sfmoe/numerics/) over NumPy arrays, for tests and inspection.
//
// Arrays: the sfmoe dtype of every array is passed explicitly. An array's items must be exactly
// as wide as the dtype's elements, except FP4 E2M1, which is carried in a byte array holding two
// elements per byte (element 2i in the low nibble): a byte array of shape [..., n] is an FP4
// tensor of shape [..., 2n]. Arrays must be C-contiguous; host (CPU, CUDA-pinned) arrays map to
// SFMOE_MEMORY_HOST and CUDA (or managed) arrays to SFMOE_MEMORY_CUDA on their device.
// Grouped tensors arrive as dicts of integers and arrays; their descriptors carry pointers but no
// buffer sizes, so the binding checks each array against the layout the descriptor implies.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "binding_errors.h"
#include "plan_binding.h"
#include "sfmoe/activation.h"
#include "sfmoe/cast.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "sfmoe/sfmoe.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// ---- errors -------------------------------------------------------------------------------------

using sfmoe_binding::CApiError;
using sfmoe_binding::check;

// Raises sfmoe.Error(message, status_name, code), the class python/sfmoe/_errors.py defines; a
// RuntimeError naming the status if that class cannot be reached.
void raise_c_api_error(const CApiError& error) {
  const char* status_name = sfmoe_status_name(error.status());
  PyObject* module = PyImport_ImportModule("sfmoe._errors");
  PyObject* error_class = module ? PyObject_GetAttrString(module, "Error") : nullptr;
  PyObject* instance = error_class
                           ? PyObject_CallFunction(error_class, "ssi", error.what(), status_name,
                                                   static_cast<int>(error.status()))
                           : nullptr;
  if (instance != nullptr) {
    PyErr_SetObject(error_class, instance);
  } else {
    PyErr_Clear();
    PyErr_Format(PyExc_RuntimeError, "%s: %s", status_name, error.what());
  }
  Py_XDECREF(instance);
  Py_XDECREF(error_class);
  Py_XDECREF(module);
}

void translate_exception(const std::exception_ptr& exception, void*) {
  try {
    std::rethrow_exception(exception);
  } catch (const CApiError& error) {
    raise_c_api_error(error);
  }
}

// ---- enums written as raw integers --------------------------------------------------------------

// Enum fields are stored through their integer representation: the library must see exactly the
// value the caller gave, invalid ones included (validation tests feed them on purpose), and such
// a value cannot be formed as the enum type itself without undefined behaviour.
template <class Enum>
void store_enum(Enum* field, int32_t value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "sfmoe enums are int-sized");
  memcpy(field, &value, sizeof(value));
}

template <class Enum>
Enum to_enum(int32_t value) {
  Enum e;
  store_enum(&e, value);
  return e;
}

// ---- DLPack arrays as sfmoe tensors -------------------------------------------------------------

std::string shape_string(size_t ndim, const int64_t* shape) {
  std::string s = "[";
  for (size_t d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

// Builds the descriptor of `array` as a tensor of sfmoe dtype `dtype`; raises ValueError /
// TypeError for what no descriptor can express (strided views, unknown devices, item sizes that
// do not match the dtype), so the library never reads or writes past an array.
template <class Array>
sfmoe_tensor describe_array(const char* what, const Array& array, int32_t dtype) {
  const int bits = sfmoe_dtype_bits(to_enum<sfmoe_dtype>(dtype));
  if (bits == 0) {
    throw nb::value_error(
        (std::string(what) + ": " + std::to_string(dtype) + " is not an sfmoe dtype").c_str());
  }
  sfmoe_memory memory;
  int32_t device = 0;
  switch (array.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value:
      memory = SFMOE_MEMORY_HOST;
      break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value:
      memory = SFMOE_MEMORY_CUDA;
      device = static_cast<int32_t>(array.device_id());
      break;
    default:
      throw nb::value_error((std::string(what) + ": DLPack device type " +
                             std::to_string(array.device_type()) +
                             " is neither host nor CUDA memory")
                                .c_str());
  }
  const nb::dlpack::dtype item = array.dtype();
  if (item.lanes != 1 || item.bits == 0 || item.bits % 8 != 0) {
    throw nb::type_error((std::string(what) + ": arrays of " + std::to_string(item.bits) +
                          "-bit x " + std::to_string(item.lanes) +
                          " items are not supported (use a byte array for packed data)")
                             .c_str());
  }
  const size_t ndim = array.ndim();
  if (ndim > SFMOE_MAX_DIMS) {
    throw nb::value_error((std::string(what) + ": " + std::to_string(ndim) +
                           " dimensions; sfmoe tensors have at most " +
                           std::to_string(SFMOE_MAX_DIMS) + " (reshape first)")
                              .c_str());
  }
  int64_t shape[SFMOE_MAX_DIMS] = {0, 0, 0, 0};
  bool empty = false;
  for (size_t d = 0; d < ndim; ++d) {
    shape[d] = static_cast<int64_t>(array.shape(d));
    empty = empty || shape[d] == 0;
  }
  // C order in elements; extents of 1 may carry any stride (frameworks differ there).
  const int64_t* strides = array.stride_ptr();
  if (strides != nullptr && !empty) {
    int64_t expected = 1;
    for (size_t d = ndim; d-- > 0;) {
      if (shape[d] != 1 && strides[d] != expected) {
        throw nb::value_error((std::string(what) + ": the array is not C-contiguous (shape " +
                               shape_string(ndim, shape) + ", strides " +
                               shape_string(ndim, strides) + " in elements)")
                                  .c_str());
      }
      expected *= shape[d];
    }
  }
  const char* dtype_name = sfmoe_dtype_name(to_enum<sfmoe_dtype>(dtype));
  if (dtype == SFMOE_DTYPE_FP4_E2M1) {
    if (item.bits != 8) {
      throw nb::type_error((std::string(what) +
                            ": fp4_e2m1 data is carried in a byte array (two "
                            "elements per byte), not in " +
                            std::to_string(item.bits) + "-bit items")
                               .c_str());
    }
    if (ndim == 0) {
      throw nb::value_error(
          (std::string(what) + ": a packed fp4_e2m1 array needs at least one dimension").c_str());
    }
    shape[ndim - 1] *= 2;
  } else if (item.bits != bits) {
    throw nb::type_error((std::string(what) + ": an array of " + std::to_string(item.bits) +
                          "-bit items cannot hold " + dtype_name + " (" + std::to_string(bits) +
                          "-bit elements)")
                             .c_str());
  }
  const void* data = array.data();
  return sfmoe_tensor_make(const_cast<void*>(data), to_enum<sfmoe_dtype>(dtype),
                           static_cast<int32_t>(ndim), shape, memory, device);
}

// ---- C API entry points -------------------------------------------------------------------------

// A CUDA stream handle passed from Python as an integer (0: the default stream).
void* stream_pointer(uint64_t stream) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(stream));
}

// An integer field of a raw descriptor; TypeError when the value is not an integer or does not
// fit the field.
template <class T>
T integer_field(const char* function, const std::string& field, nb::handle value) {
  T result;
  if (!nb::try_cast(value, result, false)) {
    const std::string type =
        (std::is_signed<T>::value ? "int" : "uint") + std::to_string(sizeof(T) * 8);
    throw nb::type_error((std::string(function) + ": " + field + " must be an integer that fits " +
                          type + ", got " + nb::cast<std::string>(nb::repr(value)))
                             .c_str());
  }
  return result;
}

void cast(nb::ndarray<nb::ro> input, int32_t input_dtype, nb::ndarray<> output,
          int32_t output_dtype, double scale, uint64_t stream, nb::object scale_device) {
  const sfmoe_tensor in = describe_array("input", input, input_dtype);
  const sfmoe_tensor out = describe_array("output", output, output_dtype);
  sfmoe_cast_config config = sfmoe_cast_config_init();
  config.scale = static_cast<float>(scale);
  nb::ndarray<nb::ro> scale_array;
  if (!scale_device.is_none()) {
    if (!nb::try_cast(scale_device, scale_array)) {
      throw nb::type_error("scale_device: expected an array (DLPack) of one float32");
    }
    const sfmoe_tensor s = describe_array("scale_device", scale_array, SFMOE_DTYPE_FP32);
    const nb::dlpack::dtype item = scale_array.dtype();
    if (item.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) ||
        scale_array.size() != 1) {
      throw nb::value_error("scale_device: expected exactly one float32 element");
    }
    // Where the scale lives decides how the library reads it; a mismatch would dereference a
    // device pointer on the host (or the reverse), so it is refused here.
    if (s.memory != in.memory || s.device != in.device) {
      throw nb::value_error("scale_device: must live in the same memory (and device) as input");
    }
    config.scale_device = static_cast<const float*>(s.data);
  }
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_cast(&in, &out, &config, stream_pointer(stream));
  }
  check(status);
}

// ---- grouped tensors ----------------------------------------------------------------------------
//
// A grouped tensor (sfmoe_grouped_tensor) arrives as a dict of plain integers and arrays:
//   dtype, scaling, scale_layout (int32); num_groups, row_capacity, cols, row_alignment,
//   uniform_group_rows (int64); group_offsets, rowwise_data, rowwise_scale_inv, columnwise_data,
//   columnwise_scale_inv, amax, columnwise_amax (arrays or None).
// The descriptor itself carries pointers but no buffer sizes, so the binding checks that every
// array holds at least what the descriptor makes the library read or write (the layouts of
// docs/quantization.md); everything else is the library's to judge.

constexpr int64_t kSizeLimit = int64_t{1} << 62;  // sizes saturate here ("larger than any array")

// Non-negative sizes multiplied with saturation; a negative operand counts as 0 (the library
// refuses such a descriptor before it touches memory).
int64_t size_mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kSizeLimit / b ? kSizeLimit : a * b;
}

int64_t size_ceil_div(int64_t a, int64_t b) { return a <= 0 ? 0 : a / b + (a % b != 0 ? 1 : 0); }

int64_t scaling_block(int32_t scaling) {
  return sfmoe_scaling_block_size(to_enum<sfmoe_scaling>(scaling));
}

// The sfmoe dtype of a scaling's scale entries, or -1 when it has none (NONE, unknown values):
// the library's rule (sfmoe_scale_dtype).
int32_t scale_dtype_of(int32_t scaling) {
  sfmoe_dtype dtype;
  if (sfmoe_scale_dtype(to_enum<sfmoe_scaling>(scaling), &dtype) != SFMOE_SUCCESS) return -1;
  return dtype;
}

// Bytes of the swizzled layout of a [rows, scale_cols] scale matrix: the formula of
// numerics/scale_swizzle.h, saturating where it would overflow.
int64_t swizzled_size(int64_t rows, int64_t scale_cols) {
  if (rows <= 0 || scale_cols <= 0) return 0;
  constexpr int64_t kExact = int64_t{1} << 30;  // the formula cannot overflow below this
  if (rows < kExact && scale_cols < kExact) {
    return sfmoe::numerics::swizzled_scale_padded_size(rows, scale_cols);
  }
  return size_mul(size_ceil_div(rows, sfmoe::numerics::kSwizzleTileRows),
                  size_mul(size_ceil_div(scale_cols, sfmoe::numerics::kSwizzleTileCols),
                           sfmoe::numerics::kSwizzleTileElements));
}

// The shape of one copy's scale array: the library's rule (sfmoe_scale_shape). The copy is
// [copy_rows, copy_cols]: [R, C] for the rowwise copy, [C, R] for the columnwise one.
std::vector<int64_t> scale_shape(int32_t scaling, int32_t scale_layout, int64_t num_groups,
                                 int64_t copy_rows, int64_t copy_cols) {
  int32_t ndim = 0;
  int64_t shape[2] = {0, 0};
  check(sfmoe_scale_shape(to_enum<sfmoe_scaling>(scaling),
                          to_enum<sfmoe_scale_layout>(scale_layout), num_groups, copy_rows,
                          copy_cols, &ndim, shape));
  return std::vector<int64_t>(shape, shape + ndim);
}

int64_t shape_elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count = extent <= 0 ? 0 : size_mul(count, extent);
  return count;
}

int64_t tensor_elements(const sfmoe_tensor& t) {
  int64_t count = 1;
  for (int32_t d = 0; d < t.ndim; ++d) count = size_mul(count, t.shape[d]);
  return count;
}

std::string place_name(sfmoe_memory memory, int32_t device) {
  return memory == SFMOE_MEMORY_CUDA ? "CUDA device " + std::to_string(device) : "host memory";
}

// Where a set of arrays lives; all of them must live in the same place, since one descriptor
// names one memory space (and a device pointer read on the host, or the reverse, would crash).
struct Placement {
  bool known = false;
  sfmoe_memory memory = SFMOE_MEMORY_HOST;
  int32_t device = 0;
  std::string first;

  void add(const std::string& name, const sfmoe_tensor& t) {
    if (!known) {
      known = true;
      memory = t.memory;
      device = t.device;
      first = name;
      return;
    }
    if (t.memory != memory || (memory == SFMOE_MEMORY_CUDA && t.device != device)) {
      throw nb::value_error((name + " lives in " + place_name(t.memory, t.device) + " but " +
                             first + " in " + place_name(memory, device) +
                             "; the arrays of one op must live in the same memory")
                                .c_str());
    }
  }
};

// An array for a grouped field: its descriptor, checked to hold `required` elements of `dtype`.
// Offsets and amax must be integer / float arrays (their items are values, not codes).
template <class Array>
sfmoe_tensor describe_field(const std::string& name, const Array& array, int32_t dtype,
                            int64_t required) {
  const sfmoe_tensor t = describe_array(name.c_str(), array, dtype);
  const auto code = static_cast<nb::dlpack::dtype_code>(array.dtype().code);
  if (dtype == SFMOE_DTYPE_INT64 && code != nb::dlpack::dtype_code::Int &&
      code != nb::dlpack::dtype_code::UInt) {
    throw nb::type_error((name + ": expected an int64 array").c_str());
  }
  if (dtype == SFMOE_DTYPE_FP32 && code != nb::dlpack::dtype_code::Float) {
    throw nb::type_error((name + ": expected a float32 array").c_str());
  }
  const int64_t have = tensor_elements(t);
  if (have < required) {
    throw nb::value_error((name + ": holds " + std::to_string(have) + " " +
                           sfmoe_dtype_name(to_enum<sfmoe_dtype>(dtype)) +
                           " elements but the descriptor needs " + std::to_string(required))
                              .c_str());
  }
  return t;
}

// The integer fields of a grouped-tensor descriptor, set from a Python value by name; false when
// `key` is not one of them. Shared by the op wrappers and validate_grouped_tensor.
template <class Int32, class Int64>
bool set_grouped_integer_field(sfmoe_grouped_tensor& t, const std::string& key, Int32 i32,
                               Int64 i64) {
  if (key == "dtype") {
    store_enum(&t.dtype, i32());
  } else if (key == "scaling") {
    store_enum(&t.scaling, i32());
  } else if (key == "scale_layout") {
    store_enum(&t.scale_layout, i32());
  } else if (key == "num_groups") {
    t.num_groups = i64();
  } else if (key == "row_capacity") {
    t.row_capacity = i64();
  } else if (key == "cols") {
    t.cols = i64();
  } else if (key == "row_alignment") {
    t.row_alignment = i64();
  } else if (key == "uniform_group_rows") {
    t.uniform_group_rows = i64();
  } else {
    return false;
  }
  return true;
}

// A grouped-tensor descriptor built from a dict (see above). `Array` is nb::ndarray<nb::ro> for
// tensors the op reads and nb::ndarray<> for those it writes; the imported arrays are kept in
// `keep` so that the pointers stay valid during the call.
template <class Array>
sfmoe_grouped_tensor describe_grouped(const char* function, const std::string& what,
                                      nb::dict fields, std::vector<Array>* keep,
                                      Placement* placement) {
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  t.row_alignment = 1;
  nb::handle arrays[7] = {};
  static const char* const kArrayNames[7] = {
      "group_offsets",        "rowwise_data", "rowwise_scale_inv", "columnwise_data",
      "columnwise_scale_inv", "amax",         "columnwise_amax"};
  for (auto item : fields) {
    const std::string key = nb::cast<std::string>(nb::str(item.first));
    const nb::handle value = item.second;
    const std::string field = what + "." + key;
    auto i32 = [&]() { return integer_field<int32_t>(function, field, value); };
    auto i64 = [&]() { return integer_field<int64_t>(function, field, value); };
    bool is_array = false;
    for (int i = 0; i < 7; ++i) {
      if (key == kArrayNames[i]) {
        arrays[i] = value;
        is_array = true;
      }
    }
    if (is_array) continue;
    if (!set_grouped_integer_field(t, key, i32, i64)) {
      throw nb::type_error((std::string(function) + ": unknown field '" + field + "'").c_str());
    }
  }
  const int32_t scaling = static_cast<int32_t>(t.scaling);
  const int32_t dtype = static_cast<int32_t>(t.dtype);
  const int32_t layout = static_cast<int32_t>(t.scale_layout);
  const int64_t data_elements = size_mul(t.row_capacity, t.cols);
  for (int i = 0; i < 7; ++i) {
    if (!arrays[i].is_valid() || arrays[i].is_none()) continue;
    const std::string name = std::string(function) + ": " + what + "." + kArrayNames[i];
    Array array;
    if (!nb::try_cast(arrays[i], array)) {
      throw nb::type_error((name + ": expected a " + (Array::ReadOnly ? "" : "writable ") +
                            "array (DLPack), got " +
                            nb::cast<std::string>(nb::str(arrays[i].type().attr("__name__"))))
                               .c_str());
    }
    int32_t field_dtype = dtype;
    int64_t required = 0;
    switch (i) {
      case 0:  // group_offsets
        field_dtype = SFMOE_DTYPE_INT64;
        required = t.num_groups < 0 ? 0 : std::min(t.num_groups, kSizeLimit - 1) + 1;
        break;
      case 1:  // rowwise_data [R, C]
      case 3:  // columnwise_data [C, R]
        required = data_elements;
        break;
      case 2:  // rowwise_scale_inv
      case 4:  // columnwise_scale_inv
        field_dtype = scale_dtype_of(scaling);
        if (field_dtype < 0) {
          throw nb::value_error(
              (name + ": scaling " + std::to_string(scaling) + " has no scales").c_str());
        }
        required =
            i == 2
                ? shape_elements(scale_shape(scaling, layout, t.num_groups, t.row_capacity, t.cols))
                : shape_elements(
                      scale_shape(scaling, layout, t.num_groups, t.cols, t.row_capacity));
        break;
      default:  // amax, columnwise_amax
        field_dtype = SFMOE_DTYPE_FP32;
        required = std::max<int64_t>(t.num_groups, 0);
        break;
    }
    const sfmoe_tensor d = describe_field(name, array, field_dtype, required);
    placement->add(what + "." + kArrayNames[i], d);
    void* pointer = d.data;
    switch (i) {
      case 0:
        t.group_offsets = static_cast<int64_t*>(pointer);
        break;
      case 1:
        t.rowwise_data = pointer;
        break;
      case 2:
        t.rowwise_scale_inv = pointer;
        break;
      case 3:
        t.columnwise_data = pointer;
        break;
      case 4:
        t.columnwise_scale_inv = pointer;
        break;
      case 5:
        t.amax = static_cast<float*>(pointer);
        break;
      default:
        t.columnwise_amax = static_cast<float*>(pointer);
        break;
    }
    keep->push_back(std::move(array));
  }
  return t;
}

void place(sfmoe_grouped_tensor* t, const Placement& placement) {
  t->memory = placement.memory;
  t->device = placement.device;
}

// `keep` holds the arrays the config points at (tensor_scales, group_amax) until the call returns.
sfmoe_quantize_config describe_config(const char* function, nb::handle config,
                                      std::vector<nb::ndarray<nb::ro>>* keep) {
  sfmoe_quantize_config c = sfmoe_quantize_config_init();
  if (config.is_none()) return c;
  nb::dict fields;
  if (!nb::try_cast(config, fields)) {
    throw nb::type_error((std::string(function) + ": config must be a dict or None").c_str());
  }
  for (auto item : fields) {
    const std::string key = nb::cast<std::string>(nb::str(item.first));
    const std::string field = "config." + key;
    if (key == "power_of_two_scales") {
      c.power_of_two_scales = integer_field<int32_t>(function, field, item.second);
    } else if (key == "stochastic_rounding") {
      c.stochastic_rounding = integer_field<int32_t>(function, field, item.second);
    } else if (key == "seed") {
      c.seed = integer_field<uint64_t>(function, field, item.second);
    } else if (key == "offset") {
      c.offset = integer_field<uint64_t>(function, field, item.second);
    } else if (key == "hadamard_columnwise") {
      c.hadamard_columnwise = integer_field<int32_t>(function, field, item.second);
    } else if (key == "trap_nan_amax") {
      c.trap_nan_amax = integer_field<int32_t>(function, field, item.second);
    } else if (key == "tensor_scales" || key == "group_amax") {
      // float32 [num_groups] (checked in Python; the library checks memory space and alignment),
      // imported once and kept for the call.
      if (!item.second.is_none()) {
        keep->push_back(nb::cast<nb::ndarray<nb::ro>>(item.second));
        const float* values = static_cast<const float*>(keep->back().data());
        (key == "tensor_scales" ? c.tensor_scales : c.group_amax) = values;
      }
    } else {
      throw nb::type_error((std::string(function) + ": unknown field '" + field + "'").c_str());
    }
  }
  return c;
}

// The status word (sfmoe_status_word), owned by a Python object.
class StatusWord {
 public:
  StatusWord(int32_t memory, int32_t device) : memory_(memory), device_(device) {
    check(sfmoe_status_word_create(to_enum<sfmoe_memory>(memory), device, &word_));
  }
  ~StatusWord() { sfmoe_status_word_destroy(word_); }
  StatusWord(const StatusWord&) = delete;
  StatusWord& operator=(const StatusWord&) = delete;

  void reset(uint64_t stream) { check(sfmoe_status_word_reset(word_, stream_pointer(stream))); }
  void snapshot(uint64_t stream) {
    check(sfmoe_status_word_snapshot(word_, stream_pointer(stream)));
  }
  nb::dict read() const {
    sfmoe_fault_report report;
    memset(&report, 0, sizeof(report));
    check(sfmoe_status_word_read(word_, &report));
    nb::dict d;
    d["flags"] = report.flags;
    d["count"] = report.count;
    d["first_group"] = report.first_group;
    d["first_value"] = report.first_value;
    return d;
  }
  sfmoe_status_word* get() const { return word_; }
  int32_t memory() const { return memory_; }
  int32_t device() const { return device_; }

 private:
  sfmoe_status_word* word_ = nullptr;
  int32_t memory_;
  int32_t device_;
};

sfmoe_status_word* word_of(nb::handle status_word) {
  if (status_word.is_none()) return nullptr;
  StatusWord* word = nullptr;
  if (!nb::try_cast(status_word, word) || word == nullptr) {
    throw nb::type_error("status_word: expected a StatusWord or None");
  }
  return word->get();
}

void grouped_amax(nb::dict input, nb::ndarray<> amax, nb::object status_word, uint64_t stream) {
  const char* function = "grouped_amax";
  std::vector<nb::ndarray<nb::ro>> keep;
  Placement placement;
  sfmoe_grouped_tensor in = describe_grouped(function, "input", input, &keep, &placement);
  const sfmoe_tensor a = describe_field(std::string(function) + ": amax", amax, SFMOE_DTYPE_FP32,
                                        std::max<int64_t>(in.num_groups, 0));
  placement.add("amax", a);
  place(&in, placement);
  sfmoe_status_word* word = word_of(status_word);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_amax(&in, static_cast<float*>(a.data), word, stream_pointer(stream));
  }
  check(status);
}

void grouped_quantize(nb::dict input, nb::dict output, nb::object config, nb::object status_word,
                      uint64_t stream) {
  const char* function = "grouped_quantize";
  std::vector<nb::ndarray<nb::ro>> keep_input;
  std::vector<nb::ndarray<>> keep_output;
  Placement placement;
  sfmoe_grouped_tensor in = describe_grouped(function, "input", input, &keep_input, &placement);
  sfmoe_grouped_tensor out = describe_grouped(function, "output", output, &keep_output, &placement);
  place(&in, placement);
  place(&out, placement);
  std::vector<nb::ndarray<nb::ro>> keep_config;
  const sfmoe_quantize_config c = describe_config(function, config, &keep_config);
  sfmoe_status_word* word = word_of(status_word);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_quantize(&in, &out, &c, word, stream_pointer(stream));
  }
  check(status);
}

void grouped_dequantize(nb::dict input, nb::dict output, int32_t source, nb::object config,
                        uint64_t stream) {
  const char* function = "grouped_dequantize";
  std::vector<nb::ndarray<nb::ro>> keep_input;
  std::vector<nb::ndarray<>> keep_output;
  Placement placement;
  sfmoe_grouped_tensor in = describe_grouped(function, "input", input, &keep_input, &placement);
  sfmoe_grouped_tensor out = describe_grouped(function, "output", output, &keep_output, &placement);
  place(&in, placement);
  place(&out, placement);
  std::vector<nb::ndarray<nb::ro>> keep_config;
  const sfmoe_quantize_config c = describe_config(function, config, &keep_config);
  const bool defaults = config.is_none();
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_dequantize(&in, &out, to_enum<sfmoe_dequantize_source>(source),
                                      defaults ? nullptr : &c, stream_pointer(stream));
  }
  check(status);
}

// The scale swizzle in either direction; the library checks both arrays' sizes itself.
void swizzle(bool inverse, nb::ndarray<nb::ro> from, int32_t from_dtype, int64_t rows,
             int64_t scale_cols, nb::ndarray<> to, int32_t to_dtype, uint64_t stream) {
  const char* function = inverse ? "unswizzle_scales" : "swizzle_scales";
  const sfmoe_tensor a = describe_array(inverse ? "swizzled" : "compact", from, from_dtype);
  const sfmoe_tensor b = describe_array(inverse ? "compact" : "swizzled", to, to_dtype);
  Placement placement;
  placement.add(std::string(function) + ": " + (inverse ? "swizzled" : "compact"), a);
  placement.add(std::string(function) + ": " + (inverse ? "compact" : "swizzled"), b);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = inverse ? sfmoe_unswizzle_scales(&a, rows, scale_cols, &b, stream_pointer(stream))
                     : sfmoe_swizzle_scales(&a, rows, scale_cols, &b, stream_pointer(stream));
  }
  check(status);
}

nb::tuple as_tuple(const std::vector<int64_t>& shape) {
  nb::list list;
  for (int64_t extent : shape) list.append(extent);
  return nb::tuple(list);
}

void validate_tensor(uint64_t data_ptr, int32_t dtype, const std::vector<int64_t>& shape,
                     int32_t memory, int32_t device, nb::object struct_size, nb::object ndim,
                     const std::string& name, bool null_descriptor) {
  const char* function = "validate_tensor";
  sfmoe_tensor t;
  memset(&t, 0, sizeof(t));
  t.struct_size = struct_size.is_none()
                      ? sizeof(sfmoe_tensor)
                      : integer_field<uint64_t>(function, "struct_size", struct_size);
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(data_ptr));
  store_enum(&t.dtype, dtype);
  t.ndim = ndim.is_none() ? static_cast<int32_t>(shape.size())
                          : integer_field<int32_t>(function, "ndim", ndim);
  for (size_t d = 0; d < shape.size() && d < SFMOE_MAX_DIMS; ++d) t.shape[d] = shape[d];
  store_enum(&t.memory, memory);
  t.device = device;
  check(sfmoe_tensor_validate(null_descriptor ? nullptr : &t, name.c_str()));
}

void validate_grouped_tensor(nb::kwargs fields) {
  const char* function = "validate_grouped_tensor";
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  std::string name = "grouped tensor";
  bool null_descriptor = false;
  for (auto item : fields) {
    const std::string key = nb::cast<std::string>(item.first);
    const nb::handle value = item.second;
    auto i32 = [&]() { return integer_field<int32_t>(function, key, value); };
    auto i64 = [&]() { return integer_field<int64_t>(function, key, value); };
    auto pointer = [&]() {
      return reinterpret_cast<void*>(
          static_cast<uintptr_t>(integer_field<uint64_t>(function, key, value)));
    };
    if (key == "struct_size") {
      t.struct_size = integer_field<uint64_t>(function, key, value);
    } else if (key == "memory") {
      store_enum(&t.memory, i32());
    } else if (key == "device") {
      t.device = i32();
    } else if (set_grouped_integer_field(t, key, i32, i64)) {
      continue;
    } else if (key == "group_offsets") {
      t.group_offsets = static_cast<int64_t*>(pointer());
    } else if (key == "rowwise_data") {
      t.rowwise_data = pointer();
    } else if (key == "rowwise_scale_inv") {
      t.rowwise_scale_inv = pointer();
    } else if (key == "columnwise_data") {
      t.columnwise_data = pointer();
    } else if (key == "columnwise_scale_inv") {
      t.columnwise_scale_inv = pointer();
    } else if (key == "amax") {
      t.amax = static_cast<float*>(pointer());
    } else if (key == "columnwise_amax") {
      t.columnwise_amax = static_cast<float*>(pointer());
    } else if (key == "name") {
      name = nb::cast<std::string>(nb::str(value));
    } else if (key == "null") {
      const int truth = PyObject_IsTrue(value.ptr());
      if (truth < 0) throw nb::python_error();
      null_descriptor = truth == 1;
    } else {
      throw nb::type_error((std::string(function) + ": unknown field '" + key + "'").c_str());
    }
  }
  check(sfmoe_grouped_tensor_validate(null_descriptor ? nullptr : &t, name.c_str()));
}

std::string bounded_string(const char* chars, size_t capacity) {
  size_t length = 0;
  while (length < capacity && chars[length] != '\0') ++length;
  return std::string(chars, length);
}

nb::dict build_info() {
  sfmoe_build_info info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  check(sfmoe_get_build_info(&info));
  nb::dict d;
  d["version"] = std::to_string(info.version_major) + "." + std::to_string(info.version_minor) +
                 "." + std::to_string(info.version_patch);
  d["version_major"] = info.version_major;
  d["version_minor"] = info.version_minor;
  d["version_patch"] = info.version_patch;
  d["has_cuda_backend"] = info.has_cuda_backend != 0;
  d["cuda_compiled_version"] = info.cuda_compiled_version;
  d["cuda_archs"] = bounded_string(info.cuda_archs, sizeof(info.cuda_archs));
  d["compiler"] = bounded_string(info.compiler, sizeof(info.compiler));
  // The headers this extension was compiled against (a mismatch with the library is a bug).
  d["binding_header_version"] = std::to_string(SFMOE_VERSION_MAJOR) + "." +
                                std::to_string(SFMOE_VERSION_MINOR) + "." +
                                std::to_string(SFMOE_VERSION_PATCH);
  return d;
}

nb::dict device_info() {
  sfmoe_device_info info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  check(sfmoe_get_device_info(&info));
  nb::dict d;
  d["device_count"] = info.device_count;
  d["runtime_version"] = info.runtime_version;
  d["driver_version"] = info.driver_version;
  d["name"] = bounded_string(info.name, sizeof(info.name));
  d["compute_capability"] = nb::make_tuple(info.compute_major, info.compute_minor);
  d["multiprocessors"] = info.multiprocessors;
  d["global_memory_bytes"] = info.global_memory_bytes;
  d["l2_cache_bytes"] = info.l2_cache_bytes;
  d["kernels_supported"] = info.kernels_supported != 0;
  return d;
}

// ---- numerics over NumPy arrays -----------------------------------------------------------------

template <class T>
using HostIn = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;
template <class T>
using HostOut = nb::ndarray<T, nb::c_contig, nb::device::cpu>;

template <class A, class B>
void require_same_size(const char* function, const A& a, const B& b) {
  if (a.size() != b.size()) {
    throw nb::value_error((std::string(function) + ": the input has " + std::to_string(a.size()) +
                           " elements but out has " + std::to_string(b.size()))
                              .c_str());
  }
}

// out[i] = f(in[i]) with the GIL released.
template <class In, class Out, class F>
void map_elements(const char* function, HostIn<In> in, HostOut<Out> out, F f) {
  require_same_size(function, in, out);
  const In* src = in.data();
  Out* dst = out.data();
  const size_t n = in.size();
  nb::gil_scoped_release release;
  for (size_t i = 0; i < n; ++i) dst[i] = f(src[i]);
}

template <class In, class Out, class F>
void def_map(nb::module_& m, const char* name, F f, const char* doc) {
  m.def(
      name, [name, f](HostIn<In> in, HostOut<Out> out) { map_elements<In, Out>(name, in, out, f); },
      "x"_a.noconvert(), "out"_a.noconvert(), doc);
}

void def_numerics(nb::module_& m) {
  namespace num = sfmoe::numerics;
  def_map<float, uint8_t>(
      m, "f32_to_e4m3", [](float x) { return num::f32_to_e4m3(x); },
      "out[i] = E4M3 code of x[i] (RN, saturating, NaN -> 0x7F).");
  def_map<float, uint8_t>(
      m, "f32_to_e5m2", [](float x) { return num::f32_to_e5m2(x); },
      "out[i] = E5M2 code of x[i] (RN, saturating, NaN -> 0x7F).");
  def_map<float, uint8_t>(
      m, "f32_to_e2m1", [](float x) { return num::f32_to_e2m1(x); },
      "out[i] = E2M1 code of x[i], one per byte (RN, saturating, NaN -> 0x7).");
  def_map<float, uint16_t>(
      m, "f32_to_bf16", [](float x) { return num::f32_to_bf16(x); },
      "out[i] = BF16 bits of x[i] (RN, IEEE overflow, NaN -> 0x7FFF).");
  def_map<float, uint16_t>(
      m, "f32_to_fp16", [](float x) { return num::f32_to_fp16(x); },
      "out[i] = FP16 bits of x[i] (RN, IEEE overflow, NaN -> 0x7FFF).");
  def_map<float, uint8_t>(
      m, "f32_to_e8m0", [](float x) { return num::f32_to_e8m0(x); },
      "out[i] = E8M0 code of |x[i]| rounded up to a power of two.");
  def_map<uint8_t, float>(
      m, "e4m3_to_f32", [](uint8_t c) { return num::e4m3_to_f32(c); },
      "out[i] = value of E4M3 code c[i].");
  def_map<uint8_t, float>(
      m, "e5m2_to_f32", [](uint8_t c) { return num::e5m2_to_f32(c); },
      "out[i] = value of E5M2 code c[i].");
  def_map<uint8_t, float>(
      m, "e2m1_to_f32", [](uint8_t c) { return num::e2m1_to_f32(c); },
      "out[i] = value of the E2M1 code in the low nibble of c[i].");
  def_map<uint16_t, float>(
      m, "bf16_to_f32", [](uint16_t c) { return num::bf16_to_f32(c); },
      "out[i] = value of BF16 bits c[i].");
  def_map<uint16_t, float>(
      m, "fp16_to_f32", [](uint16_t c) { return num::fp16_to_f32(c); },
      "out[i] = value of FP16 bits c[i].");
  def_map<uint8_t, float>(
      m, "e8m0_to_f32", [](uint8_t e) { return num::e8m0_to_f32(e); },
      "out[i] = 2^(e[i] - 127) (code 255: NaN).");
  def_map<uint8_t, float>(
      m, "mx_multiplier", [](uint8_t e) { return num::mx_multiplier(e); },
      "out[i] = the MXFP8 element multiplier 2^(127 - e[i]).");
  def_map<float, float>(
      m, "scale_inverse", [](float s) { return num::scale_inverse(s); },
      "out[i] = 1 / scale[i] (FP32, RN).");
  def_map<float, float>(
      m, "nvfp4_global_encode_scale",
      [](float amax) { return num::nvfp4_global_encode_scale(amax); },
      "out[i] = the NVFP4 global encode scale S_enc for global amax[i].");

  m.def(
      "fp8_scale_from_amax",
      [](HostIn<float> amax, HostOut<float> out, float fp8_max, bool power_of_two) {
        map_elements<float, float>("fp8_scale_from_amax", amax, out, [=](float a) {
          return num::fp8_scale_from_amax(a, fp8_max, power_of_two);
        });
      },
      "amax"_a.noconvert(), "out"_a.noconvert(), "fp8_max"_a, "power_of_two"_a,
      "out[i] = the FP8 per-tensor / blockwise scale for amax[i].");
  m.def(
      "mx_scale_from_amax",
      [](HostIn<float> amax, HostOut<uint8_t> out, float fp8_max) {
        map_elements<float, uint8_t>("mx_scale_from_amax", amax, out,
                                     [=](float a) { return num::mx_scale_from_amax(a, fp8_max); });
      },
      "amax"_a.noconvert(), "out"_a.noconvert(), "fp8_max"_a,
      "out[i] = the MXFP8 E8M0 block scale for block amax[i].");
  m.def(
      "nvfp4_block_scale",
      [](HostIn<float> amax, HostOut<uint8_t> out, float global_encode_scale) {
        map_elements<float, uint8_t>("nvfp4_block_scale", amax, out, [=](float a) {
          return num::nvfp4_block_scale(a, global_encode_scale);
        });
      },
      "amax"_a.noconvert(), "out"_a.noconvert(), "global_encode_scale"_a,
      "out[i] = the E4M3 NVFP4 block scale code for block amax[i].");
  m.def(
      "nvfp4_block_multiplier",
      [](HostIn<uint8_t> code, HostOut<float> out, float global_encode_scale) {
        map_elements<uint8_t, float>("nvfp4_block_multiplier", code, out, [=](uint8_t c) {
          return num::nvfp4_block_multiplier(c, global_encode_scale);
        });
      },
      "code"_a.noconvert(), "out"_a.noconvert(), "global_encode_scale"_a,
      "out[i] = the NVFP4 element multiplier for block scale code[i].");
  m.def(
      "philox_random_bits",
      [](uint64_t seed, uint64_t offset, HostIn<uint64_t> index, HostOut<uint32_t> out) {
        map_elements<uint64_t, uint32_t>("philox_random_bits", index, out, [=](uint64_t i) {
          return num::philox_random_bits(seed, offset, i);
        });
      },
      "seed"_a, "offset"_a, "index"_a.noconvert(), "out"_a.noconvert(),
      "out[i] = the 32 random bits of element index[i] of the stream (seed, offset).");
  m.def(
      "f32_to_e2m1_stochastic",
      [](HostIn<float> x, HostIn<uint32_t> random_bits, HostOut<uint8_t> out) {
        require_same_size("f32_to_e2m1_stochastic", x, random_bits);
        require_same_size("f32_to_e2m1_stochastic", x, out);
        const float* src = x.data();
        const uint32_t* bits = random_bits.data();
        uint8_t* dst = out.data();
        const size_t n = x.size();
        nb::gil_scoped_release release;
        for (size_t i = 0; i < n; ++i) dst[i] = num::f32_to_e2m1_stochastic(src[i], bits[i]);
      },
      "x"_a.noconvert(), "random_bits"_a.noconvert(), "out"_a.noconvert(),
      "out[i] = E2M1 code of x[i], rounded stochastically with random_bits[i].");
  m.def(
      "hadamard16_transform",
      [](HostIn<float> x, HostOut<float> out) {
        require_same_size("hadamard16_transform", x, out);
        if (x.size() % num::kHadamardSize != 0) {
          throw nb::value_error("hadamard16_transform: the size must be a multiple of 16");
        }
        const float* src = x.data();
        float* dst = out.data();
        const size_t n = x.size();
        nb::gil_scoped_release release;
        for (size_t block = 0; block < n; block += num::kHadamardSize) {
          float v[num::kHadamardSize];
          for (int i = 0; i < num::kHadamardSize; ++i) v[i] = src[block + i];
          num::hadamard16_transform(v);
          for (int i = 0; i < num::kHadamardSize; ++i) dst[block + i] = v[i];
        }
      },
      "x"_a.noconvert(), "out"_a.noconvert(),
      "out = the 16-point random Hadamard transform of each consecutive block of 16 in x.");
}

}  // namespace

// ---- router
// ----------------------------------------------------------------

// The sfmoe_router_config fields from the dict python/sfmoe/_router.py builds.
sfmoe_router_config router_config(const nb::dict& config) {
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = nb::cast<int64_t>(config["top_k"]);
  c.score = to_enum<sfmoe_router_score>(nb::cast<int32_t>(config["score"]));
  c.softmax_after_topk = nb::cast<bool>(config["softmax_after_topk"]) ? 1 : 0;
  c.num_groups = nb::cast<int64_t>(config["num_groups"]);
  c.group_topk = nb::cast<int64_t>(config["group_topk"]);
  c.group_score_topk = nb::cast<int64_t>(config["group_score_topk"]);
  c.scaling_factor = static_cast<float>(nb::cast<double>(config["scaling_factor"]));
  c.normalize = nb::cast<bool>(config["normalize"]) ? 1 : 0;
  c.aux_loss_coeff = static_cast<float>(nb::cast<double>(config["aux_loss_coeff"]));
  c.z_loss_coeff = static_cast<float>(nb::cast<double>(config["z_loss_coeff"]));
  return c;
}

void router_forward(nb::ndarray<nb::ro> logits, int32_t logits_dtype, nb::object expert_bias,
                    nb::dict config, nb::ndarray<> topk_ids, nb::ndarray<> probs,
                    nb::ndarray<> tokens_per_expert, nb::object aux_loss, nb::object z_loss,
                    nb::object workspace, uint64_t stream) {
  const sfmoe_router_config c = router_config(config);
  const sfmoe_tensor t_logits = describe_array("logits", logits, logits_dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_probs = describe_array("probs", probs, SFMOE_DTYPE_FP32);
  const sfmoe_tensor t_counts =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  nb::ndarray<nb::ro> bias_array;
  nb::ndarray<> aux_array, z_array, workspace_array;
  sfmoe_tensor t_bias{}, t_aux{}, t_z{}, t_workspace{};
  if (!workspace.is_none()) {
    workspace_array = nb::cast<nb::ndarray<>>(workspace);
    t_workspace = describe_array("workspace", workspace_array, SFMOE_DTYPE_FP32);
  }
  if (!expert_bias.is_none()) {
    bias_array = nb::cast<nb::ndarray<nb::ro>>(expert_bias);
    t_bias = describe_array("expert_bias", bias_array, SFMOE_DTYPE_FP32);
  }
  if (!aux_loss.is_none()) {
    aux_array = nb::cast<nb::ndarray<>>(aux_loss);
    t_aux = describe_array("aux_loss", aux_array, SFMOE_DTYPE_FP32);
  }
  if (!z_loss.is_none()) {
    z_array = nb::cast<nb::ndarray<>>(z_loss);
    t_z = describe_array("z_loss", z_array, SFMOE_DTYPE_FP32);
  }
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_router_forward(
        &t_logits, expert_bias.is_none() ? nullptr : &t_bias, &c, &t_ids, &t_probs, &t_counts,
        aux_loss.is_none() ? nullptr : &t_aux, z_loss.is_none() ? nullptr : &t_z,
        workspace.is_none() ? nullptr : &t_workspace, stream_pointer(stream));
  }
  check(status);
}

void router_backward(nb::ndarray<nb::ro> logits, int32_t logits_dtype, nb::ndarray<nb::ro> topk_ids,
                     nb::ndarray<nb::ro> tokens_per_expert, nb::dict config, nb::object d_probs,
                     double d_aux_loss, double d_z_loss, nb::ndarray<> d_logits, uint64_t stream) {
  const sfmoe_router_config c = router_config(config);
  const sfmoe_tensor t_logits = describe_array("logits", logits, logits_dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_counts =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dlogits = describe_array("d_logits", d_logits, SFMOE_DTYPE_FP32);
  nb::ndarray<nb::ro> dp_array;
  sfmoe_tensor t_dprobs{};
  if (!d_probs.is_none()) {
    dp_array = nb::cast<nb::ndarray<nb::ro>>(d_probs);
    t_dprobs = describe_array("d_probs", dp_array, SFMOE_DTYPE_FP32);
  }
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_router_backward(&t_logits, &t_ids, &t_counts, &c,
                                   d_probs.is_none() ? nullptr : &t_dprobs,
                                   static_cast<float>(d_aux_loss), static_cast<float>(d_z_loss),
                                   &t_dlogits, nullptr, stream_pointer(stream));
  }
  check(status);
}

// ---- permute / unpermute
// ----------------------------------------------------

// Unquantized rows [row_capacity, cols] in `num_groups` groups whose offsets are `offsets`, where
// `data` lives.
sfmoe_grouped_tensor rows_descriptor(const sfmoe_tensor& data, int64_t num_groups,
                                     int64_t row_alignment, const sfmoe_tensor& offsets) {
  sfmoe_grouped_tensor g = sfmoe_grouped_tensor_init();
  g.memory = data.memory;
  g.device = data.device;
  g.dtype = data.dtype;
  g.num_groups = num_groups;
  g.row_capacity = data.ndim == 2 ? data.shape[0] : 0;
  g.cols = data.ndim == 2 ? data.shape[1] : 0;
  g.row_alignment = row_alignment;
  g.group_offsets = static_cast<int64_t*>(offsets.data);
  g.rowwise_data = data.data;
  return g;
}

void permute(nb::ndarray<nb::ro> tokens, int32_t dtype, nb::ndarray<nb::ro> topk_ids,
             int64_t expert_capacity, nb::ndarray<> permuted, int64_t num_experts,
             int64_t alignment, nb::ndarray<> group_offsets, nb::ndarray<> row_map,
             nb::ndarray<> tokens_per_expert, nb::ndarray<> dropped_per_expert,
             nb::ndarray<> workspace, nb::object amax, uint64_t stream) {
  const sfmoe_tensor t_workspace = describe_array("workspace", workspace, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_tokens = describe_array("tokens", tokens, dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_rows = describe_array("permuted", permuted, dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_kept =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dropped =
      describe_array("dropped_per_expert", dropped_per_expert, SFMOE_DTYPE_INT64);
  sfmoe_grouped_tensor g = rows_descriptor(t_rows, num_experts, alignment, t_offsets);
  nb::ndarray<> amax_array;
  if (!amax.is_none()) {  // each expert's amax of its kept rows
    amax_array = nb::cast<nb::ndarray<>>(amax);
    const sfmoe_tensor t_amax = describe_array("amax", amax_array, SFMOE_DTYPE_FP32);
    if (t_amax.ndim != 1 || t_amax.shape[0] != num_experts)
      throw nb::value_error("permute: amax must be float32 [num_experts]");
    g.amax = static_cast<float*>(t_amax.data);
  }
  sfmoe_permute_config config = sfmoe_permute_config_init();
  config.expert_capacity = expert_capacity;
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_permute(&t_tokens, &t_ids, &config, &g, &t_map, &t_kept, &t_dropped,
                           &t_workspace, nullptr, stream_pointer(stream));
  }
  check(status);
}

// Permute with the fused quantization: `output` is a dict of the quantized grouped tensor's fields
// (as for grouped_quantize), `config` the quantize options.
void permute_quantized(nb::ndarray<nb::ro> tokens, int32_t dtype, nb::ndarray<nb::ro> topk_ids,
                       int64_t expert_capacity, nb::dict output, nb::object config,
                       nb::ndarray<> row_map, nb::ndarray<> tokens_per_expert,
                       nb::ndarray<> dropped_per_expert, nb::ndarray<> workspace, uint64_t stream) {
  const char* function = "permute";
  const sfmoe_tensor t_tokens = describe_array("tokens", tokens, dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_kept =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dropped =
      describe_array("dropped_per_expert", dropped_per_expert, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_workspace = describe_array("workspace", workspace, SFMOE_DTYPE_INT32);
  std::vector<nb::ndarray<>> keep;
  Placement placement;
  sfmoe_grouped_tensor out = describe_grouped(function, "output", output, &keep, &placement);
  place(&out, placement);
  std::vector<nb::ndarray<nb::ro>> keep_config;
  const sfmoe_quantize_config q = describe_config(function, config, &keep_config);
  sfmoe_permute_config c = sfmoe_permute_config_init();
  c.expert_capacity = expert_capacity;
  c.quantize = &q;
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_permute(&t_tokens, &t_ids, &c, &out, &t_map, &t_kept, &t_dropped, &t_workspace,
                           nullptr, stream_pointer(stream));
  }
  check(status);
}

void unpermute(nb::ndarray<nb::ro> rows, int32_t rows_dtype, nb::ndarray<nb::ro> group_offsets,
               nb::ndarray<nb::ro> row_map, nb::object probs, nb::ndarray<> out, int32_t out_dtype,
               uint64_t stream) {
  const sfmoe_tensor t_rows = describe_array("rows", rows, rows_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_out = describe_array("out", out, out_dtype);
  const sfmoe_grouped_tensor g =
      rows_descriptor(t_rows, t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0, 1, t_offsets);
  nb::ndarray<nb::ro> probs_array;
  sfmoe_tensor t_probs{};
  if (!probs.is_none()) {
    probs_array = nb::cast<nb::ndarray<nb::ro>>(probs);
    t_probs = describe_array("probs", probs_array, SFMOE_DTYPE_FP32);
  }
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_unpermute(&g, &t_map, probs.is_none() ? nullptr : &t_probs, &t_out, nullptr,
                             stream_pointer(stream));
  }
  check(status);
}

void unpermute_backward(nb::ndarray<nb::ro> d_out, int32_t d_out_dtype, nb::ndarray<nb::ro> rows,
                        int32_t rows_dtype, nb::ndarray<nb::ro> group_offsets,
                        nb::ndarray<nb::ro> row_map, nb::ndarray<nb::ro> probs,
                        nb::ndarray<nb::ro> group_rows, nb::ndarray<> d_rows, int32_t d_rows_dtype,
                        nb::ndarray<> d_probs, uint64_t stream) {
  const sfmoe_tensor t_group_rows = describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dout = describe_array("d_out", d_out, d_out_dtype);
  const sfmoe_tensor t_rows = describe_array("rows", rows, rows_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_probs = describe_array("probs", probs, SFMOE_DTYPE_FP32);
  const sfmoe_tensor t_drows = describe_array("d_rows", d_rows, d_rows_dtype);
  const sfmoe_tensor t_dprobs = describe_array("d_probs", d_probs, SFMOE_DTYPE_FP32);
  const int64_t groups = t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0;
  const sfmoe_grouped_tensor g_rows = rows_descriptor(t_rows, groups, 1, t_offsets);
  const sfmoe_grouped_tensor g_drows = rows_descriptor(t_drows, groups, 1, t_offsets);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_unpermute_backward(&t_dout, &g_rows, &t_map, &t_probs, &t_group_rows, &g_drows,
                                      &t_dprobs, nullptr, stream_pointer(stream));
  }
  check(status);
}

// ---- grouped activations
// -----------------------------------------------------

sfmoe_activation_config activation_config(int32_t kind, double limit, double alpha) {
  sfmoe_activation_config c = sfmoe_activation_config_init();
  c.kind = to_enum<sfmoe_activation>(kind);
  c.limit = static_cast<float>(limit);
  c.alpha = static_cast<float>(alpha);
  return c;
}

void grouped_activation(nb::ndarray<nb::ro> input, int32_t input_dtype,
                        nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                        int32_t kind, double limit, double alpha, nb::ndarray<> output,
                        int32_t output_dtype, nb::object amax, uint64_t stream) {
  const sfmoe_tensor t_in = describe_array("input", input, input_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_rows = describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_out = describe_array("output", output, output_dtype);
  const int64_t groups = t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0;
  const sfmoe_grouped_tensor g_in = rows_descriptor(t_in, groups, 1, t_offsets);
  sfmoe_grouped_tensor g_out = rows_descriptor(t_out, groups, 1, t_offsets);
  nb::ndarray<> amax_array;
  if (!amax.is_none()) {
    amax_array = nb::cast<nb::ndarray<>>(amax);
    g_out.amax = static_cast<float*>(describe_array("amax", amax_array, SFMOE_DTYPE_FP32).data);
  }
  const sfmoe_activation_config c = activation_config(kind, limit, alpha);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_activation(&g_in, &t_rows, &c, &g_out, nullptr, stream_pointer(stream));
  }
  check(status);
}

// The activation quantized on the fly: `output` is a dict of the quantized grouped tensor's
// fields (as for grouped_quantize), `config` the quantize options.
void grouped_activation_quantized(nb::ndarray<nb::ro> input, int32_t input_dtype,
                                  nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                                  int32_t kind, double limit, double alpha, nb::dict output,
                                  nb::object config, uint64_t stream) {
  const char* function = "grouped_activation";
  const sfmoe_tensor t_in = describe_array("input", input, input_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_rows = describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64);
  const int64_t groups = t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0;
  const sfmoe_grouped_tensor g_in = rows_descriptor(t_in, groups, 1, t_offsets);
  std::vector<nb::ndarray<>> keep;
  Placement placement;
  sfmoe_grouped_tensor g_out = describe_grouped(function, "output", output, &keep, &placement);
  place(&g_out, placement);
  std::vector<nb::ndarray<nb::ro>> keep_config;
  const sfmoe_quantize_config q = describe_config(function, config, &keep_config);
  sfmoe_activation_config c = activation_config(kind, limit, alpha);
  c.quantize = &q;
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_activation(&g_in, &t_rows, &c, &g_out, nullptr, stream_pointer(stream));
  }
  check(status);
}

void grouped_activation_backward(nb::ndarray<nb::ro> input, int32_t input_dtype,
                                 nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                                 nb::ndarray<nb::ro> d_output, int32_t d_output_dtype, int32_t kind,
                                 double limit, double alpha, nb::ndarray<> d_input,
                                 int32_t d_input_dtype, uint64_t stream) {
  const sfmoe_tensor t_in = describe_array("input", input, input_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_rows = describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dout = describe_array("d_output", d_output, d_output_dtype);
  const sfmoe_tensor t_din = describe_array("d_input", d_input, d_input_dtype);
  const int64_t groups = t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0;
  const sfmoe_grouped_tensor g_in = rows_descriptor(t_in, groups, 1, t_offsets);
  const sfmoe_grouped_tensor g_dout = rows_descriptor(t_dout, groups, 1, t_offsets);
  const sfmoe_grouped_tensor g_din = rows_descriptor(t_din, groups, 1, t_offsets);
  const sfmoe_activation_config c = activation_config(kind, limit, alpha);
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = sfmoe_grouped_activation_backward(&g_in, &t_rows, &g_dout, &c, &g_din, nullptr,
                                               stream_pointer(stream));
  }
  check(status);
}

// ---- grouped GEMM -------------------------------------------------------------------------------

// The operands and the output as dicts of sfmoe_grouped_tensor fields (see grouped_quantize): the
// Python layer describes plain arrays and quantized tensors alike.
void grouped_gemm(int32_t form, nb::dict a, nb::dict b, nb::dict out, bool accumulate,
                  bool hadamard, nb::object workspace, uint64_t stream, bool fast_accumulation) {
  const char* function = "grouped_gemm";
  std::vector<nb::ndarray<nb::ro>> keep_inputs;
  std::vector<nb::ndarray<>> keep_output;
  Placement placement;
  sfmoe_grouped_tensor ga = describe_grouped(function, "a", a, &keep_inputs, &placement);
  sfmoe_grouped_tensor gb = describe_grouped(function, "b", b, &keep_inputs, &placement);
  sfmoe_grouped_tensor go = describe_grouped(function, "out", out, &keep_output, &placement);
  place(&ga, placement);
  place(&gb, placement);
  place(&go, placement);
  nb::ndarray<> workspace_array;
  sfmoe_tensor t_workspace{};
  if (!workspace.is_none()) {
    workspace_array = nb::cast<nb::ndarray<>>(workspace);
    t_workspace = describe_array("workspace", workspace_array, SFMOE_DTYPE_INT64);
  }
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = to_enum<sfmoe_gemm_form>(form);
  config.accumulate = accumulate ? 1 : 0;
  config.hadamard_columnwise = hadamard ? 1 : 0;
  config.fp8_fast_accumulation = fast_accumulation ? 1 : 0;
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status =
        sfmoe_grouped_gemm(&ga, &gb, &config, &go, workspace.is_none() ? nullptr : &t_workspace,
                           nullptr, stream_pointer(stream));
  }
  check(status);
}

NB_MODULE(_C, m) {
  m.doc() = "sfmoe native extension: a thin binding of the sfmoe C API (use the sfmoe package)";
  nb::register_exception_translator(translate_exception);
  sfmoe_binding::register_planning(m);

  // Enum values and struct sizes, as the headers this extension was compiled with define them.
  m.attr("DTYPE_FP32") = static_cast<int>(SFMOE_DTYPE_FP32);
  m.attr("DTYPE_BF16") = static_cast<int>(SFMOE_DTYPE_BF16);
  m.attr("DTYPE_FP16") = static_cast<int>(SFMOE_DTYPE_FP16);
  m.attr("DTYPE_FP8_E4M3") = static_cast<int>(SFMOE_DTYPE_FP8_E4M3);
  m.attr("DTYPE_FP8_E5M2") = static_cast<int>(SFMOE_DTYPE_FP8_E5M2);
  m.attr("DTYPE_FP4_E2M1") = static_cast<int>(SFMOE_DTYPE_FP4_E2M1);
  m.attr("DTYPE_E8M0") = static_cast<int>(SFMOE_DTYPE_E8M0);
  m.attr("DTYPE_INT32") = static_cast<int>(SFMOE_DTYPE_INT32);
  m.attr("DTYPE_INT64") = static_cast<int>(SFMOE_DTYPE_INT64);
  m.attr("DTYPE_COUNT") = SFMOE_DTYPE_COUNT;
  m.attr("SCALING_NONE") = static_cast<int>(SFMOE_SCALING_NONE);
  m.attr("SCALING_TENSOR") = static_cast<int>(SFMOE_SCALING_TENSOR);
  m.attr("SCALING_BLOCK_1X128") = static_cast<int>(SFMOE_SCALING_BLOCK_1X128);
  m.attr("SCALING_BLOCK_128X128") = static_cast<int>(SFMOE_SCALING_BLOCK_128X128);
  m.attr("SCALING_MX_1X32") = static_cast<int>(SFMOE_SCALING_MX_1X32);
  m.attr("SCALING_NV_1X16") = static_cast<int>(SFMOE_SCALING_NV_1X16);
  m.attr("SCALING_NV_16X16") = static_cast<int>(SFMOE_SCALING_NV_16X16);
  m.attr("SCALING_COUNT") = SFMOE_SCALING_COUNT;
  m.attr("SCALE_LAYOUT_COMPACT") = static_cast<int>(SFMOE_SCALE_LAYOUT_COMPACT);
  m.attr("SCALE_LAYOUT_SWIZZLED") = static_cast<int>(SFMOE_SCALE_LAYOUT_SWIZZLED);
  m.attr("SCALE_LAYOUT_COLUMNWISE_TRANSPOSED") =
      static_cast<int>(SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED);
  m.attr("MEMORY_HOST") = static_cast<int>(SFMOE_MEMORY_HOST);
  m.attr("MEMORY_CUDA") = static_cast<int>(SFMOE_MEMORY_CUDA);
  m.attr("MAX_DIMS") = SFMOE_MAX_DIMS;
  m.attr("TENSOR_STRUCT_SIZE") = sizeof(sfmoe_tensor);
  m.attr("GROUPED_TENSOR_STRUCT_SIZE") = sizeof(sfmoe_grouped_tensor);
  m.attr("CAST_CONFIG_STRUCT_SIZE") = sizeof(sfmoe_cast_config);
  m.attr("QUANTIZE_CONFIG_STRUCT_SIZE") = sizeof(sfmoe_quantize_config);
  m.attr("DEQUANTIZE_AUTO") = static_cast<int>(SFMOE_DEQUANTIZE_AUTO);
  m.attr("DEQUANTIZE_ROWWISE") = static_cast<int>(SFMOE_DEQUANTIZE_ROWWISE);
  m.attr("DEQUANTIZE_COLUMNWISE") = static_cast<int>(SFMOE_DEQUANTIZE_COLUMNWISE);
  m.attr("FAULT_BAD_GROUP_OFFSETS") = static_cast<int>(SFMOE_FAULT_BAD_GROUP_OFFSETS);
  m.attr("FAULT_GROUP_OVER_CAPACITY") = static_cast<int>(SFMOE_FAULT_GROUP_OVER_CAPACITY);
  m.attr("FAULT_EP_OVERFLOW") = static_cast<int>(SFMOE_FAULT_EP_OVERFLOW);
  m.attr("FAULT_NAN_AMAX") = static_cast<int>(SFMOE_FAULT_NAN_AMAX);
  nb::dict statuses;
  for (int code = SFMOE_SUCCESS; code <= SFMOE_ERROR_INTERNAL; ++code) {
    statuses[sfmoe_status_name(to_enum<sfmoe_status>(code))] = code;
  }
  m.attr("STATUS_CODES") = statuses;

  m.def(
      "status_name",
      [](int32_t status) { return std::string(sfmoe_status_name(to_enum<sfmoe_status>(status))); },
      "status"_a, "The name of a status code (SFMOE_ERROR_UNKNOWN_STATUS for unknown codes).");
  m.def(
      "dtype_name",
      [](int32_t dtype) { return std::string(sfmoe_dtype_name(to_enum<sfmoe_dtype>(dtype))); },
      "dtype"_a);
  m.def(
      "scaling_name",
      [](int32_t scaling) {
        return std::string(sfmoe_scaling_name(to_enum<sfmoe_scaling>(scaling)));
      },
      "scaling"_a);
  m.def(
      "dtype_bits", [](int32_t dtype) { return sfmoe_dtype_bits(to_enum<sfmoe_dtype>(dtype)); },
      "dtype"_a, "Bits per element (4 for FP4), 0 for an unknown dtype.");
  m.def(
      "last_error", []() { return std::string(sfmoe_last_error()); },
      "The message of the last failed C API call on this thread ('' if none).");
  m.def("clear_last_error", []() { sfmoe_clear_last_error(); });
  m.def("build_info", &build_info, "sfmoe_get_build_info as a dict.");
  m.def("device_info", &device_info, "sfmoe_get_device_info as a dict.");

  m.def("cast", &cast, "input"_a.noconvert(), "input_dtype"_a, "output"_a.noconvert(),
        "output_dtype"_a, "scale"_a = 1.0, "stream"_a = 0, "scale_device"_a = nb::none(),
        "sfmoe_cast: output = encode(decode(input) * scale) on the memory both arrays live in.\n"
        "stream: a CUDA stream handle (cudaStream_t as int; 0 = the default stream).\n"
        "scale_device: optional one-element float32 array next to the data; it replaces scale.");
  nb::class_<StatusWord>(m, "StatusWord",
                         "An sfmoe_status_word: faults recorded by ops, read after a snapshot.")
      .def(nb::init<int32_t, int32_t>(), "memory"_a, "device"_a,
           "sfmoe_status_word_create (allocates and synchronizes: call outside the step).")
      .def("reset", &StatusWord::reset, "stream"_a = 0, "sfmoe_status_word_reset on `stream`.")
      .def("snapshot", &StatusWord::snapshot, "stream"_a = 0,
           "sfmoe_status_word_snapshot on `stream` (copies the word into the host mirror).")
      .def("read", &StatusWord::read,
           "sfmoe_status_word_read: the mirror as the last snapshot left it, as a dict.")
      .def_prop_ro("memory", &StatusWord::memory)
      .def_prop_ro("device", &StatusWord::device);

  m.def("router_forward", &router_forward, "logits"_a, "logits_dtype"_a, "expert_bias"_a.none(),
        "config"_a, "topk_ids"_a.noconvert(), "probs"_a.noconvert(),
        "tokens_per_expert"_a.noconvert(), "aux_loss"_a.none(), "z_loss"_a.none(),
        "workspace"_a.none(), "stream"_a = 0,
        "sfmoe_router_forward; `config` is a dict of the sfmoe_router_config fields.");
  m.def("router_backward", &router_backward, "logits"_a, "logits_dtype"_a, "topk_ids"_a,
        "tokens_per_expert"_a, "config"_a, "d_probs"_a.none(), "d_aux_loss"_a, "d_z_loss"_a,
        "d_logits"_a.noconvert(), "stream"_a = 0, "sfmoe_router_backward.");
  m.def("permute", &permute, "tokens"_a, "dtype"_a, "topk_ids"_a, "expert_capacity"_a,
        "permuted"_a.noconvert(), "num_experts"_a, "alignment"_a, "group_offsets"_a.noconvert(),
        "row_map"_a.noconvert(), "tokens_per_expert"_a.noconvert(),
        "dropped_per_expert"_a.noconvert(), "workspace"_a.noconvert(), "amax"_a.none(),
        "stream"_a = 0, "sfmoe_permute.");
  m.def("permute_quantized", &permute_quantized, "tokens"_a, "dtype"_a, "topk_ids"_a,
        "expert_capacity"_a, "output"_a, "config"_a.none(), "row_map"_a.noconvert(),
        "tokens_per_expert"_a.noconvert(), "dropped_per_expert"_a.noconvert(),
        "workspace"_a.noconvert(), "stream"_a = 0,
        "sfmoe_permute into quantized rows (the fused quantization); `output` is a dict of "
        "sfmoe_grouped_tensor fields.");
  m.def("unpermute", &unpermute, "rows"_a, "rows_dtype"_a, "group_offsets"_a, "row_map"_a,
        "probs"_a.none(), "out"_a.noconvert(), "out_dtype"_a, "stream"_a = 0, "sfmoe_unpermute.");
  m.def("unpermute_backward", &unpermute_backward, "d_out"_a, "d_out_dtype"_a, "rows"_a,
        "rows_dtype"_a, "group_offsets"_a, "row_map"_a, "probs"_a, "group_rows"_a,
        "d_rows"_a.noconvert(), "d_rows_dtype"_a, "d_probs"_a.noconvert(), "stream"_a = 0,
        "sfmoe_unpermute_backward.");
  m.def("grouped_activation", &grouped_activation, "input"_a, "input_dtype"_a, "group_offsets"_a,
        "group_rows"_a, "kind"_a, "limit"_a, "alpha"_a, "output"_a.noconvert(), "output_dtype"_a,
        "amax"_a.none() = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_activation (amax: [G] float32 for the group amax, or None).");
  m.def("grouped_activation_quantized", &grouped_activation_quantized, "input"_a, "input_dtype"_a,
        "group_offsets"_a, "group_rows"_a, "kind"_a, "limit"_a, "alpha"_a, "output"_a,
        "config"_a.none(), "stream"_a = 0,
        "sfmoe_grouped_activation into a quantized output; `output` is a dict of "
        "sfmoe_grouped_tensor fields.");
  m.def("grouped_activation_backward", &grouped_activation_backward, "input"_a, "input_dtype"_a,
        "group_offsets"_a, "group_rows"_a, "d_output"_a, "d_output_dtype"_a, "kind"_a, "limit"_a,
        "alpha"_a, "d_input"_a.noconvert(), "d_input_dtype"_a, "stream"_a = 0,
        "sfmoe_grouped_activation_backward.");
  m.def("grouped_gemm", &grouped_gemm, "form"_a, "a"_a, "b"_a, "out"_a, "accumulate"_a = false,
        "hadamard"_a = false, "workspace"_a = nb::none(), "stream"_a = 0,
        "fast_accumulation"_a = false,
        "sfmoe_grouped_gemm; a, b and out are dicts of sfmoe_grouped_tensor fields as for\n"
        "grouped_quantize; workspace: grouped_gemm_workspace_bytes(...) bytes (device only).");
  m.def("grouped_amax", &grouped_amax, "input"_a, "amax"_a.noconvert(),
        "status_word"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_amax: amax[g] = max |x| over group g of the grouped tensor `input` (a\n"
        "dict of fields, see grouped_quantize).");
  m.def("grouped_quantize", &grouped_quantize, "input"_a, "output"_a, "config"_a = nb::none(),
        "status_word"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_quantize. `input` and `output` are dicts of the sfmoe_grouped_tensor\n"
        "fields: dtype, scaling, scale_layout (int); num_groups, row_capacity, cols,\n"
        "row_alignment, uniform_group_rows (int); group_offsets, rowwise_data, rowwise_scale_inv,\n"
        "columnwise_data, columnwise_scale_inv, amax, columnwise_amax (arrays or None); memory\n"
        "and device come from the arrays. `config`: a dict of sfmoe_quantize_config fields.\n"
        "Every array must hold what the descriptor implies (docs/quantization.md).");
  m.def("grouped_dequantize", &grouped_dequantize, "input"_a, "output"_a, "source"_a = 0,
        "config"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_dequantize; dicts as for grouped_quantize (the output: scaling 0, its\n"
        "rowwise_data the [row_capacity, cols] result).");
  m.def(
      "swizzle_scales",
      [](nb::ndarray<nb::ro> compact, int32_t compact_dtype, int64_t rows, int64_t scale_cols,
         nb::ndarray<> swizzled, int32_t swizzled_dtype, uint64_t stream) {
        swizzle(false, compact, compact_dtype, rows, scale_cols, swizzled, swizzled_dtype, stream);
      },
      "compact"_a.noconvert(), "compact_dtype"_a, "rows"_a, "scale_cols"_a,
      "swizzled"_a.noconvert(), "swizzled_dtype"_a, "stream"_a = 0, "sfmoe_swizzle_scales.");
  m.def(
      "unswizzle_scales",
      [](nb::ndarray<nb::ro> swizzled, int32_t swizzled_dtype, int64_t rows, int64_t scale_cols,
         nb::ndarray<> compact, int32_t compact_dtype, uint64_t stream) {
        swizzle(true, swizzled, swizzled_dtype, rows, scale_cols, compact, compact_dtype, stream);
      },
      "swizzled"_a.noconvert(), "swizzled_dtype"_a, "rows"_a, "scale_cols"_a,
      "compact"_a.noconvert(), "compact_dtype"_a, "stream"_a = 0, "sfmoe_unswizzle_scales.");
  m.def(
      "scale_shape",
      [](int32_t scaling, int32_t scale_layout, int64_t num_groups, int64_t copy_rows,
         int64_t copy_cols) {
        return as_tuple(scale_shape(scaling, scale_layout, num_groups, copy_rows, copy_cols));
      },
      "scaling"_a, "scale_layout"_a, "num_groups"_a, "copy_rows"_a, "copy_cols"_a,
      "The shape of one copy's scale array (docs/quantization.md): [copy_rows, copy_cols] is\n"
      "[R, C] for the rowwise copy and [C, R] for the columnwise one; swizzled layouts are 1-D.");
  m.def(
      "scaling_block_size", [](int32_t scaling) { return scaling_block(scaling); }, "scaling"_a,
      "Elements per scale along a copy's rows (the side of 2D blocks); 0 for one scale per group.");
  m.def(
      "min_row_alignment",
      [](int32_t scaling, bool columnwise) {
        return sfmoe_min_row_alignment(to_enum<sfmoe_scaling>(scaling), columnwise ? 1 : 0);
      },
      "scaling"_a, "columnwise"_a,
      "The smallest output row alignment of a quantized grouped tensor (docs/quantization.md).");
  m.def(
      "scale_dtype", [](int32_t scaling) { return scale_dtype_of(scaling); }, "scaling"_a,
      "The sfmoe dtype of a scaling's scale entries (-1: none).");
  m.def(
      "swizzled_scale_padded_size",
      [](int64_t rows, int64_t scale_cols) { return swizzled_size(rows, scale_cols); }, "rows"_a,
      "scale_cols"_a, "Bytes of the swizzled layout of a [rows, scale_cols] scale matrix.");
  m.def("validate_tensor", &validate_tensor, "data_ptr"_a, "dtype"_a, "shape"_a, "memory"_a = 0,
        "device"_a = 0, "struct_size"_a = nb::none(), "ndim"_a = nb::none(), "name"_a = "tensor",
        "null"_a = false,
        "sfmoe_tensor_validate on a descriptor built from plain integers (ndim defaults to\n"
        "len(shape), struct_size to sizeof(sfmoe_tensor); null=True passes a NULL descriptor).");
  m.def("validate_grouped_tensor", &validate_grouped_tensor,
        "sfmoe_grouped_tensor_validate on sfmoe_grouped_tensor_init() with the given fields\n"
        "replaced (pointers as integers); name=... and null=True as for validate_tensor.");
  def_numerics(m);
}
