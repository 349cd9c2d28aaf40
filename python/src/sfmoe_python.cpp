// sfmoe._C: the Python binding of the C API, registered family by family (one file each in
// python/src/, sharing binding.h). It turns DLPack arrays into sfmoe descriptors, calls sfmoe_*
// functions and turns a failed status into a Python exception that carries the library's own
// message. Framework handling (allocation, dtype mapping, streams) belongs to the Python package
// (python/sfmoe/).
#include <ctype.h>

#include "binding.h"
#include "plan_binding.h"
#include "sfmoe/ep.h"

namespace {

using sfmoe_binding::CApiError;
using sfmoe_binding::to_enum;
using namespace nb::literals;

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

// "DTYPE_" + "fp8_e4m3" -> "DTYPE_FP8_E4M3".
std::string constant_name(const char* prefix, const char* name) {
  std::string constant = prefix;
  for (const char* c = name; *c != '\0'; ++c) {
    constant += static_cast<char>(toupper(static_cast<unsigned char>(*c)));
  }
  return constant;
}

void translate_exception(const std::exception_ptr& exception, void*) {
  try {
    std::rethrow_exception(exception);
  } catch (const CApiError& error) {
    raise_c_api_error(error);
  }
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "sfmoe native extension: a thin binding of the sfmoe C API (use the sfmoe package)";
  nb::register_exception_translator(translate_exception);
  sfmoe_binding::register_planning(m);

  // Enum values and struct sizes, as the headers this extension was compiled with define them.
  // DTYPE_<NAME> and SCALING_<NAME> for every value below the header's count, named after the
  // library's own names (sfmoe_dtype_name "fp8_e4m3": DTYPE_FP8_E4M3) as STATUS_CODES is below, so
  // that the list of values is written once, in the header.
  for (int dtype = 0; dtype < SFMOE_DTYPE_COUNT; ++dtype) {
    m.attr(constant_name("DTYPE_", sfmoe_dtype_name(to_enum<sfmoe_dtype>(dtype))).c_str()) = dtype;
  }
  m.attr("DTYPE_COUNT") = SFMOE_DTYPE_COUNT;
  for (int scaling = 0; scaling < SFMOE_SCALING_COUNT; ++scaling) {
    m.attr(constant_name("SCALING_", sfmoe_scaling_name(to_enum<sfmoe_scaling>(scaling))).c_str()) =
        scaling;
  }
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
  m.attr("EP_TRANSPORT_LOOPBACK") = static_cast<int>(SFMOE_EP_TRANSPORT_LOOPBACK);
  m.attr("EP_TRANSPORT_EXTERNAL") = static_cast<int>(SFMOE_EP_TRANSPORT_EXTERNAL);
  m.attr("FAULT_NAN_AMAX") = static_cast<int>(SFMOE_FAULT_NAN_AMAX);
  nb::dict statuses;
  for (int code = SFMOE_SUCCESS; code <= SFMOE_ERROR_INTERNAL; ++code) {
    statuses[sfmoe_status_name(to_enum<sfmoe_status>(code))] = code;
  }
  m.attr("STATUS_CODES") = statuses;
  sfmoe_binding::register_numerics(m);
  sfmoe_binding::register_core(m);
  sfmoe_binding::register_quantize(m);
  sfmoe_binding::register_router(m);
  sfmoe_binding::register_permute(m);
  sfmoe_binding::register_activation(m);
  sfmoe_binding::register_gemm(m);
  sfmoe_binding::register_layer(m);
}
