// What the binding's files share (python/src/): DLPack arrays as sfmoe tensors, grouped tensors
// from dicts of plain fields (the framework-free descriptor builder: it knows nanobind's arrays,
// not torch's or JAX's, so the JAX FFI handlers can build the same descriptors), enums stored as
// raw integers, the status word. A thin layer: the library judges every descriptor; the binding
// only makes sure no array is smaller than the descriptor says.
//
// Arrays: the sfmoe dtype of every array is passed explicitly. An array's items must be exactly
// as wide as the dtype's elements, except FP4 E2M1, which is carried in a byte array holding two
// elements per byte (element 2i in the low nibble): a byte array of shape [..., n] is an FP4
// tensor of shape [..., 2n]. Arrays must be C-contiguous; host (CPU, CUDA-pinned) arrays map to
// SFMOE_MEMORY_HOST and CUDA (or managed) arrays to SFMOE_MEMORY_CUDA on their device.
// Grouped tensors arrive as dicts of integers and arrays; their descriptors carry pointers but no
// buffer sizes, so the binding checks each array against the layout the descriptor implies.
#pragma once

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
#include "sfmoe/activation.h"
#include "sfmoe/cast.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/moe_layer.h"
#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "sfmoe/sfmoe.h"

namespace nb = nanobind;

namespace sfmoe_binding {

using namespace nb::literals;

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

inline std::string shape_string(size_t ndim, const int64_t* shape) {
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
inline void* stream_pointer(uint64_t stream) {
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
inline int64_t size_mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  return a > kSizeLimit / b ? kSizeLimit : a * b;
}

inline int64_t size_ceil_div(int64_t a, int64_t b) {
  return a <= 0 ? 0 : a / b + (a % b != 0 ? 1 : 0);
}

inline int64_t scaling_block(int32_t scaling) {
  return sfmoe_scaling_block_size(to_enum<sfmoe_scaling>(scaling));
}

// The sfmoe dtype of a scaling's scale entries, or -1 when it has none (NONE, unknown values):
// the library's rule (sfmoe_scale_dtype).
inline int32_t scale_dtype_of(int32_t scaling) {
  sfmoe_dtype dtype;
  if (sfmoe_scale_dtype(to_enum<sfmoe_scaling>(scaling), &dtype) != SFMOE_SUCCESS) return -1;
  return dtype;
}

// Bytes of the swizzled layout of a [rows, scale_cols] scale matrix: the formula of
// numerics/scale_swizzle.h, saturating where it would overflow.
inline int64_t swizzled_size(int64_t rows, int64_t scale_cols) {
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
inline std::vector<int64_t> scale_shape(int32_t scaling, int32_t scale_layout, int64_t num_groups,
                                        int64_t copy_rows, int64_t copy_cols) {
  int32_t ndim = 0;
  int64_t shape[2] = {0, 0};
  check(sfmoe_scale_shape(to_enum<sfmoe_scaling>(scaling),
                          to_enum<sfmoe_scale_layout>(scale_layout), num_groups, copy_rows,
                          copy_cols, &ndim, shape));
  return std::vector<int64_t>(shape, shape + ndim);
}

inline int64_t shape_elements(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count = extent <= 0 ? 0 : size_mul(count, extent);
  return count;
}

inline int64_t tensor_elements(const sfmoe_tensor& t) {
  int64_t count = 1;
  for (int32_t d = 0; d < t.ndim; ++d) count = size_mul(count, t.shape[d]);
  return count;
}

inline std::string place_name(sfmoe_memory memory, int32_t device) {
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

// The array (pointer) fields of a grouped-tensor descriptor, in the order describe_grouped checks
// them; set_grouped_array stores field i. Shared by the op wrappers and validate_grouped_tensor.
constexpr int kGroupedArrayCount = 7;
inline constexpr const char* kGroupedArrayNames[kGroupedArrayCount] = {
    "group_offsets",        "rowwise_data", "rowwise_scale_inv", "columnwise_data",
    "columnwise_scale_inv", "amax",         "columnwise_amax"};

// The index of `key` in kGroupedArrayNames, or -1.
inline int grouped_array_index(const std::string& key) {
  for (int i = 0; i < kGroupedArrayCount; ++i) {
    if (key == kGroupedArrayNames[i]) return i;
  }
  return -1;
}

inline void set_grouped_array(sfmoe_grouped_tensor& t, int i, void* pointer) {
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
  nb::handle arrays[kGroupedArrayCount] = {};
  for (auto item : fields) {
    const std::string key = nb::cast<std::string>(nb::str(item.first));
    const nb::handle value = item.second;
    const std::string field = what + "." + key;
    auto i32 = [&]() { return integer_field<int32_t>(function, field, value); };
    auto i64 = [&]() { return integer_field<int64_t>(function, field, value); };
    const int array_index = grouped_array_index(key);
    if (array_index >= 0) {
      arrays[array_index] = value;
      continue;
    }
    if (!set_grouped_integer_field(t, key, i32, i64)) {
      throw nb::type_error((std::string(function) + ": unknown field '" + field + "'").c_str());
    }
  }
  const int32_t scaling = static_cast<int32_t>(t.scaling);
  const int32_t dtype = static_cast<int32_t>(t.dtype);
  const int32_t layout = static_cast<int32_t>(t.scale_layout);
  const int64_t data_elements = size_mul(t.row_capacity, t.cols);
  for (int i = 0; i < kGroupedArrayCount; ++i) {
    if (!arrays[i].is_valid() || arrays[i].is_none()) continue;
    const std::string name = std::string(function) + ": " + what + "." + kGroupedArrayNames[i];
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
    placement->add(what + "." + kGroupedArrayNames[i], d);
    set_grouped_array(t, i, d.data);
    keep->push_back(std::move(array));
  }
  return t;
}

inline void place(sfmoe_grouped_tensor* t, const Placement& placement) {
  t->memory = placement.memory;
  t->device = placement.device;
}

// `keep` holds the arrays the config points at (tensor_scales, group_amax) until the call returns.
inline sfmoe_quantize_config describe_config(const char* function, nb::handle config,
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

// A quantized grouped output, described from its dict (see above) in its own placement, with the
// quantize options that produce it; the arrays stay referenced for the call.
struct QuantizedOutput {
  std::vector<nb::ndarray<>> keep_output;
  std::vector<nb::ndarray<nb::ro>> keep_config;
  sfmoe_grouped_tensor out;
  sfmoe_quantize_config config;

  QuantizedOutput(const char* function, nb::dict output, nb::handle options) {
    Placement placement;
    out = describe_grouped(function, "output", output, &keep_output, &placement);
    place(&out, placement);
    config = describe_config(function, options, &keep_config);
  }
};

// An array argument that may be None, described as a tensor of `dtype` when given; the array stays
// referenced for the call. get() is what the C API takes for it: NULL for None.
template <class Array>
struct OptionalArray {
  Array array;
  sfmoe_tensor tensor{};
  bool given = false;

  OptionalArray(const char* what, nb::handle value, int32_t dtype) {
    if (value.is_none()) return;
    array = nb::cast<Array>(value);
    tensor = describe_array(what, array, dtype);
    given = true;
  }
  const sfmoe_tensor* get() const { return given ? &tensor : nullptr; }
};

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

inline sfmoe_status_word* word_of(nb::handle status_word) {
  if (status_word.is_none()) return nullptr;
  StatusWord* word = nullptr;
  if (!nb::try_cast(status_word, word) || word == nullptr) {
    throw nb::type_error("status_word: expected a StatusWord or None");
  }
  return word->get();
}

inline nb::tuple as_tuple(const std::vector<int64_t>& shape) {
  nb::list list;
  for (int64_t extent : shape) list.append(extent);
  return nb::tuple(list);
}

// Unquantized rows [row_capacity, cols] in `num_groups` groups whose offsets are `offsets`, where
// `data` lives.
inline sfmoe_grouped_tensor rows_descriptor(const sfmoe_tensor& data, int64_t num_groups,
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

// The sfmoe_router_config fields from the dict python/sfmoe/_router.py builds (router_binding.cpp).
sfmoe_router_config router_config(const nb::dict& config);

// Runs a C API call with the GIL released (the host backend's loops can be long; a device call
// only enqueues) and raises its failure as sfmoe.Error.
template <class Call>
void call_released(Call&& call) {
  sfmoe_status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  check(status);
}

// The families' registrations (one file each), called from the module file.
void register_core(nb::module_& m);
void register_numerics(nb::module_& m);
void register_quantize(nb::module_& m);
void register_router(nb::module_& m);
void register_permute(nb::module_& m);
void register_activation(nb::module_& m);
void register_gemm(nb::module_& m);
void register_layer(nb::module_& m);

}  // namespace sfmoe_binding
