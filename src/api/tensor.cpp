// Descriptor construction and validation entry points.
#include <string.h>

#include "src/api/validate.h"
#include "src/common/error.h"

extern "C" {

sfmoe_tensor sfmoe_tensor_make(void* data, sfmoe_dtype dtype, int32_t ndim, const int64_t* shape,
                               sfmoe_memory memory, int32_t device) {
  sfmoe_tensor t;
  memset(&t, 0, sizeof(t));
  t.struct_size = sizeof(t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  for (int32_t d = 0; d < ndim && d < SFMOE_MAX_DIMS && shape != nullptr; ++d)
    t.shape[d] = shape[d];
  t.memory = memory;
  t.device = device;
  return t;
}

sfmoe_status sfmoe_tensor_validate(const sfmoe_tensor* tensor, const char* name) {
  return sfmoe::guarded("sfmoe_tensor_validate", [&] {
    return sfmoe::validate_tensor("sfmoe_tensor_validate", name ? name : "tensor", tensor);
  });
}

sfmoe_grouped_tensor sfmoe_grouped_tensor_init(void) {
  sfmoe_grouped_tensor t;
  memset(&t, 0, sizeof(t));
  t.struct_size = sizeof(t);
  t.row_alignment = 1;
  return t;
}

sfmoe_status sfmoe_grouped_tensor_validate(const sfmoe_grouped_tensor* tensor, const char* name) {
  return sfmoe::guarded("sfmoe_grouped_tensor_validate", [&] {
    return sfmoe::validate_grouped_tensor("sfmoe_grouped_tensor_validate",
                                          name ? name : "grouped tensor", tensor);
  });
}

}  // extern "C"
