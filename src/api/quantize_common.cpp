// Quantization checks shared by the ops that write quantized grouped tensors (quantize, and the
// fused quantization of permute).
#include "src/api/quantize_common.h"

#include <string.h>

#include "src/api/validate.h"
#include "src/common/error.h"

namespace sfmoe {

sfmoe_status check_quantize_config(const char* context, const sfmoe_quantize_config* config) {
  return check_struct(context, "config", config, "sfmoe_quantize_config_init()");
}

sfmoe_status check_high_precision(const char* context, const char* name,
                                  const sfmoe_grouped_tensor* t) {
  if (t->scaling != SFMOE_SCALING_NONE || !is_high_precision(t->dtype)) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH,
                "%s: %s must hold fp32, bf16 or fp16 values with scaling 'none' (got %s, '%s')",
                context, name, sfmoe_dtype_name(t->dtype), sfmoe_scaling_name(t->scaling));
  }
  if (t->rowwise_data == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s needs rowwise_data", context, name);
  }
  return SFMOE_SUCCESS;
}

GroupedInput input_of(const sfmoe_grouped_tensor* x) {
  return GroupedInput{x->rowwise_data, x->dtype, x->row_capacity, x->group_offsets,
                      x->group_offsets ? 0 : x->uniform_group_rows};
}

namespace {

// A per-group float array the config points at (tensor_scales, group_amax): 4-byte aligned and in
// the quantized tensor's memory space.
sfmoe_status check_group_floats(const char* context, const char* field, const float* values,
                                const sfmoe_grouped_tensor* q) {
  if (reinterpret_cast<uintptr_t>(values) % alignof(float) != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: config %s must be 4-byte aligned", context,
                field);
  }
  return validate_pointer_memory(context, "config", field, values, q->memory, q->device);
}

}  // namespace

// Checks a quantized tensor's recipe-specific requirements and fills the backend arguments.
sfmoe_status describe_quantized(const char* context, const char* name,
                                const sfmoe_grouped_tensor* q, const sfmoe_quantize_config& config,
                                GroupedQuantizeArgs* args) {
  if (q->scaling == SFMOE_SCALING_NONE) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH,
                "%s: %s must be a quantized tensor (fp8 or fp4 with a scaling), got '%s'", context,
                name, sfmoe_dtype_name(q->dtype));
  }
  const bool columnwise = q->columnwise_data != nullptr;
  const int64_t block = scaling_block_size(q->scaling);
  const int64_t min_alignment = min_row_alignment(q->scaling, columnwise);
  if (q->row_alignment % min_alignment != 0) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s: scaling '%s'%s needs row_alignment to be a multiple of %lld (got %lld)",
                context, name, sfmoe_scaling_name(q->scaling),
                columnwise ? " with a columnwise copy" : "", static_cast<long long>(min_alignment),
                static_cast<long long>(q->row_alignment));
  }
  if (block > 0 && (columnwise || scaling_is_2d(q->scaling)) && q->row_capacity % block != 0) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s: row_capacity %lld must be a multiple of the %lld-row block of '%s'",
                context, name, static_cast<long long>(q->row_capacity),
                static_cast<long long>(block), sfmoe_scaling_name(q->scaling));
  }
  const bool needs_amax = q->scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(q->scaling);
  if (needs_amax && q->amax == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER,
                "%s: %s: scaling '%s' needs amax ([num_groups] floats): it holds the group amax",
                context, name, sfmoe_scaling_name(q->scaling));
  }
  if (config.hadamard_columnwise && q->scaling != SFMOE_SCALING_NV_1X16) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the Hadamard transform applies to nv_1x16 only (scaling is '%s')", context,
                sfmoe_scaling_name(q->scaling));
  }
  if (config.hadamard_columnwise && columnwise && q->columnwise_amax == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER,
                "%s: %s: the Hadamard transform needs columnwise_amax ([num_groups] floats)",
                context, name);
  }
  if (config.stochastic_rounding && !scaling_is_nvfp4(q->scaling)) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: stochastic rounding applies to nvfp4 recipes only (scaling is '%s')", context,
                sfmoe_scaling_name(q->scaling));
  }
  if (config.power_of_two_scales &&
      (q->scaling == SFMOE_SCALING_MX_1X32 || scaling_is_nvfp4(q->scaling))) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: power_of_two_scales applies to fp8 tensor and blockwise scaling only",
                context);
  }
  if (config.tensor_scales != nullptr) {
    if (q->scaling != SFMOE_SCALING_TENSOR) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: tensor_scales applies to fp8 per-tensor scaling only (scaling is '%s')",
                  context, sfmoe_scaling_name(q->scaling));
    }
    SFMOE_RETURN_IF_ERROR(check_group_floats(context, "tensor_scales", config.tensor_scales, q));
  }
  if (config.group_amax != nullptr) {
    if (q->scaling != SFMOE_SCALING_TENSOR && !scaling_is_nvfp4(q->scaling)) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: group_amax applies to fp8 per-tensor and nvfp4 scaling only (scaling is "
                  "'%s')",
                  context, sfmoe_scaling_name(q->scaling));
    }
    if (config.tensor_scales != nullptr) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: group_amax and tensor_scales are exclusive (given scales do not depend on "
                  "the amax)",
                  context);
    }
    if (config.hadamard_columnwise && q->columnwise_data != nullptr) {
      return fail(SFMOE_ERROR_UNSUPPORTED,
                  "%s: group_amax with the Hadamard-transformed columnwise copy: that copy's "
                  "scales come from the amax of the transformed values, which is computed",
                  context);
    }
    SFMOE_RETURN_IF_ERROR(check_group_floats(context, "group_amax", config.group_amax, q));
  }
  if (config.offset_device != nullptr) {
    if (reinterpret_cast<uintptr_t>(config.offset_device) % alignof(uint64_t) != 0) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: config offset_device must be 8-byte aligned",
                  context);
    }
    SFMOE_RETURN_IF_ERROR(validate_pointer_memory(context, "config", "offset_device",
                                                  config.offset_device, q->memory, q->device));
  }
  if (q->scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && !scaling_is_swizzlable(q->scaling)) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: %s: the swizzled scale layout exists for mx_1x32 and nv_1x16 only", context,
                name);
  }
  if (!scaling_has_layout(q->scaling, q->scale_layout)) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: %s: the columnwise-transposed scale layout exists for block_1x128 only",
                context, name);
  }
  memset(args, 0, sizeof(*args));
  args->num_groups = q->num_groups;
  args->cols = q->cols;
  args->dtype = q->dtype;
  args->scaling = q->scaling;
  args->scale_layout = q->scale_layout;
  args->row_capacity = q->row_capacity;
  args->row_alignment = q->row_alignment;
  args->offsets = q->group_offsets;
  args->uniform_rows = q->group_offsets ? 0 : q->uniform_group_rows;
  args->rowwise = q->rowwise_data;
  args->rowwise_scale_inv = q->rowwise_scale_inv;
  args->columnwise = q->columnwise_data;
  args->columnwise_scale_inv = q->columnwise_scale_inv;
  args->amax = q->amax;
  args->columnwise_amax = q->columnwise_amax;
  args->config = config;
  return SFMOE_SUCCESS;
}

sfmoe_status check_rowwise_fusion(const char* context, const char* name,
                                  const sfmoe_grouped_tensor* q, int64_t cols, sfmoe_memory memory,
                                  int32_t device, const sfmoe_quantize_config* options,
                                  bool allow_nvfp4, GroupedQuantizeArgs* args) {
  SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, name, q));
  if (q->memory != memory || q->device != device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the inputs' memory space", context,
                name);
  }
  const sfmoe_quantize_config defaults = sfmoe_quantize_config_init();
  if (options == nullptr) options = &defaults;
  SFMOE_RETURN_IF_ERROR(check_quantize_config(context, options));  // before reading its fields
  if (options->group_amax != nullptr) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: config group_amax applies to sfmoe_grouped_quantize only (the fused "
                "quantizations take given scales, tensor_scales)",
                context);
  }
  if (options->offset_device != nullptr) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: config offset_device applies to sfmoe_grouped_quantize only (the fused "
                "quantizations round to nearest)",
                context);
  }
  const bool given_tensor = q->scaling == SFMOE_SCALING_TENSOR && options->tensor_scales != nullptr;
  const bool nvfp4 = allow_nvfp4 && q->scaling == SFMOE_SCALING_NV_1X16;
  if (q->scaling != SFMOE_SCALING_MX_1X32 && q->scaling != SFMOE_SCALING_BLOCK_1X128 &&
      !given_tensor && !nvfp4) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: %s can be quantized on the fly into mx_1x32 or block_1x128 rows%s, or "
                "per-tensor fp8 with given scales (config tensor_scales) only (got '%s'; a current "
                "per-tensor%s scale needs the group amax before the cast: quantize the rows "
                "afterwards)",
                context, name, allow_nvfp4 ? ", nv_1x16 (NVFP4)" : "",
                sfmoe_scaling_name(q->scaling), allow_nvfp4 ? "" : " or NVFP4");
  }
  if (nvfp4 && q->dtype != SFMOE_DTYPE_FP4_E2M1) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s: NVFP4 rows must be fp4_e2m1, not '%s'",
                context, name, sfmoe_dtype_name(q->dtype));
  }
  if (!nvfp4 && q->dtype != SFMOE_DTYPE_FP8_E4M3 && q->dtype != SFMOE_DTYPE_FP8_E5M2) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s: quantized rows must be fp8, not '%s'", context,
                name, sfmoe_dtype_name(q->dtype));
  }
  if (q->rowwise_data == nullptr || q->rowwise_scale_inv == nullptr ||
      q->columnwise_data != nullptr) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: %s: the fused quantization writes the rowwise copy only (rowwise_data and "
                "rowwise_scale_inv, no columnwise_data)",
                context, name);
  }
  const int64_t block =
      given_tensor ? 8 : scaling_block_size(q->scaling);  // TENSOR: 8-wide vectors
  if (q->cols != cols || cols % block != 0) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s must have %lld columns, a multiple of the %lld-element block", context,
                name, static_cast<long long>(cols), static_cast<long long>(block));
  }
  if (options->stochastic_rounding || options->hadamard_columnwise || options->trap_nan_amax) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the fused quantization takes power_of_two_scales only", context);
  }
  return describe_quantized(context, name, q, *options, args);
}

}  // namespace sfmoe
