// The binding of the core API: status names, build and device information, the status word,
// descriptor validation and sfmoe_cast.
#include "binding.h"

namespace sfmoe_binding {
namespace {

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
  call_released([&] { return sfmoe_cast(&in, &out, &config, stream_pointer(stream)); });
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
    const int array_index = grouped_array_index(key);
    if (key == "struct_size") {
      t.struct_size = integer_field<uint64_t>(function, key, value);
    } else if (key == "memory") {
      store_enum(&t.memory, i32());
    } else if (key == "device") {
      t.device = i32();
    } else if (set_grouped_integer_field(t, key, i32, i64)) {
      continue;
    } else if (array_index >= 0) {  // pointers arrive as integers here, not as arrays
      const uint64_t address = integer_field<uint64_t>(function, key, value);
      set_grouped_array(t, array_index, reinterpret_cast<void*>(static_cast<uintptr_t>(address)));
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

std::string version_string(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// The struct an sfmoe_get_*_info query fills: zeroed, with struct_size set, as the query needs.
template <class Info>
Info queried(sfmoe_status (*query)(Info*)) {
  Info info;
  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  check(query(&info));
  return info;
}

nb::dict build_info() {
  const sfmoe_build_info info = queried(sfmoe_get_build_info);
  nb::dict d;
  d["version"] = version_string(info.version_major, info.version_minor, info.version_patch);
  d["version_major"] = info.version_major;
  d["version_minor"] = info.version_minor;
  d["version_patch"] = info.version_patch;
  d["has_cuda_backend"] = info.has_cuda_backend != 0;
  d["cuda_compiled_version"] = info.cuda_compiled_version;
  d["cuda_archs"] = bounded_string(info.cuda_archs, sizeof(info.cuda_archs));
  d["compiler"] = bounded_string(info.compiler, sizeof(info.compiler));
  // The headers this extension was compiled against (a mismatch with the library is a bug).
  d["binding_header_version"] =
      version_string(SFMOE_VERSION_MAJOR, SFMOE_VERSION_MINOR, SFMOE_VERSION_PATCH);
  return d;
}

nb::dict device_info() {
  const sfmoe_device_info info = queried(sfmoe_get_device_info);
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

}  // namespace

void register_core(nb::module_& m) {
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
  m.def("validate_tensor", &validate_tensor, "data_ptr"_a, "dtype"_a, "shape"_a, "memory"_a = 0,
        "device"_a = 0, "struct_size"_a = nb::none(), "ndim"_a = nb::none(), "name"_a = "tensor",
        "null"_a = false,
        "sfmoe_tensor_validate on a descriptor built from plain integers (ndim defaults to\n"
        "len(shape), struct_size to sizeof(sfmoe_tensor); null=True passes a NULL descriptor).");
  m.def("validate_grouped_tensor", &validate_grouped_tensor,
        "sfmoe_grouped_tensor_validate on sfmoe_grouped_tensor_init() with the given fields\n"
        "replaced (pointers as integers); name=... and null=True as for validate_tensor.");
}

}  // namespace sfmoe_binding
