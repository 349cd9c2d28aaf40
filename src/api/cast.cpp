// sfmoe_cast: validate, pick the backend from where the tensors live, run.
#include "sfmoe/cast.h"

#include <string.h>

#include "src/api/validate.h"
#include "src/common/cast_args.h"
#include "src/common/element_codec.h"
#include "src/common/error.h"
#include "src/ops/backend.h"

extern "C" {

sfmoe_cast_config sfmoe_cast_config_init(void) {
  sfmoe_cast_config c = sfmoe::sized_zero_config<sfmoe_cast_config>();
  c.scale = 1.0f;
  return c;
}

sfmoe_status sfmoe_cast(const sfmoe_tensor* input, const sfmoe_tensor* output,
                        const sfmoe_cast_config* config, void* stream) {
  const char* context = "sfmoe_cast";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "input", input));
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "output", output));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "config", config, "sfmoe_cast_config_init()"));
    const sfmoe_tensor* tensors[] = {input, output};
    const char* names[] = {"input", "output"};
    for (int i = 0; i < 2; ++i) {
      if (!sfmoe::is_float_dtype(tensors[i]->dtype)) {
        return sfmoe::fail(SFMOE_ERROR_DTYPE_MISMATCH,
                           "%s: %s dtype '%s' is not a floating-point dtype this op converts",
                           context, names[i], sfmoe_dtype_name(tensors[i]->dtype));
      }
    }
    if (input->memory != output->memory || input->device != output->device) {
      return sfmoe::fail(SFMOE_ERROR_MEMORY_SPACE,
                         "%s: input and output are in different memory spaces or devices", context);
    }
    const int64_t count = sfmoe::tensor_element_count(input);
    if (count != sfmoe::tensor_element_count(output)) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: input has %lld elements but output has %lld", context,
                         static_cast<long long>(count),
                         static_cast<long long>(sfmoe::tensor_element_count(output)));
    }
    if (config->scale_device != nullptr &&
        (reinterpret_cast<uintptr_t>(config->scale_device) % alignof(float)) != 0) {
      return sfmoe::fail(SFMOE_ERROR_MISALIGNED, "%s: config->scale_device is not 4-byte aligned",
                         context);
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_pointer_memory(
        context, "config", "scale_device", config->scale_device, input->memory, input->device));
    if (count == 0) return SFMOE_SUCCESS;
    const sfmoe::CastArgs args{input->data, input->dtype,  output->data,        output->dtype,
                               count,       config->scale, config->scale_device};
    return sfmoe::ops::backend_for(input->memory).cast(args, stream);
  });
}

}  // extern "C"
