// Status names, the last-error accessors, and dtype/scaling names.
#include <stdint.h>
#include <stdio.h>

#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/common/quantize_args.h"
#include "src/ops/layout_plan.h"

extern "C" {

const char* sfmoe_last_error(void) { return sfmoe::last_error_message(); }
void sfmoe_clear_last_error(void) { sfmoe::clear_last_error_message(); }

const char* sfmoe_status_name(sfmoe_status status) {
  switch (status) {
    case SFMOE_SUCCESS:
      return "SFMOE_SUCCESS";
    case SFMOE_ERROR_INVALID_ARGUMENT:
      return "SFMOE_ERROR_INVALID_ARGUMENT";
    case SFMOE_ERROR_NULL_POINTER:
      return "SFMOE_ERROR_NULL_POINTER";
    case SFMOE_ERROR_MISALIGNED:
      return "SFMOE_ERROR_MISALIGNED";
    case SFMOE_ERROR_SHAPE_MISMATCH:
      return "SFMOE_ERROR_SHAPE_MISMATCH";
    case SFMOE_ERROR_DTYPE_MISMATCH:
      return "SFMOE_ERROR_DTYPE_MISMATCH";
    case SFMOE_ERROR_UNSUPPORTED:
      return "SFMOE_ERROR_UNSUPPORTED";
    case SFMOE_ERROR_MEMORY_SPACE:
      return "SFMOE_ERROR_MEMORY_SPACE";
    case SFMOE_ERROR_NO_BACKEND:
      return "SFMOE_ERROR_NO_BACKEND";
    case SFMOE_ERROR_CUDA:
      return "SFMOE_ERROR_CUDA";
    case SFMOE_ERROR_OUT_OF_MEMORY:
      return "SFMOE_ERROR_OUT_OF_MEMORY";
    case SFMOE_ERROR_STRUCT_SIZE:
      return "SFMOE_ERROR_STRUCT_SIZE";
    case SFMOE_ERROR_INTERNAL:
      return "SFMOE_ERROR_INTERNAL";
    case SFMOE_ERROR_COMMUNICATION:
      return "SFMOE_ERROR_COMMUNICATION";
  }
  return "SFMOE_ERROR_UNKNOWN_STATUS";
}

const char* sfmoe_dtype_name(sfmoe_dtype dtype) {
  switch (dtype) {
    case SFMOE_DTYPE_FP32:
      return "fp32";
    case SFMOE_DTYPE_BF16:
      return "bf16";
    case SFMOE_DTYPE_FP16:
      return "fp16";
    case SFMOE_DTYPE_FP8_E4M3:
      return "fp8_e4m3";
    case SFMOE_DTYPE_FP8_E5M2:
      return "fp8_e5m2";
    case SFMOE_DTYPE_FP4_E2M1:
      return "fp4_e2m1";
    case SFMOE_DTYPE_E8M0:
      return "e8m0";
    case SFMOE_DTYPE_INT32:
      return "int32";
    case SFMOE_DTYPE_INT64:
      return "int64";
  }
  return "unknown-dtype";
}

const char* sfmoe_scaling_name(sfmoe_scaling scaling) {
  switch (scaling) {
    case SFMOE_SCALING_NONE:
      return "none";
    case SFMOE_SCALING_TENSOR:
      return "tensor";
    case SFMOE_SCALING_BLOCK_1X128:
      return "block_1x128";
    case SFMOE_SCALING_BLOCK_128X128:
      return "block_128x128";
    case SFMOE_SCALING_MX_1X32:
      return "mx_1x32";
    case SFMOE_SCALING_NV_1X16:
      return "nv_1x16";
    case SFMOE_SCALING_NV_16X16:
      return "nv_16x16";
  }
  return "unknown-scaling";
}

int sfmoe_dtype_bits(sfmoe_dtype dtype) {
  switch (dtype) {
    case SFMOE_DTYPE_FP32:
    case SFMOE_DTYPE_INT32:
      return 32;
    case SFMOE_DTYPE_BF16:
    case SFMOE_DTYPE_FP16:
      return 16;
    case SFMOE_DTYPE_FP8_E4M3:
    case SFMOE_DTYPE_FP8_E5M2:
    case SFMOE_DTYPE_E8M0:
      return 8;
    case SFMOE_DTYPE_FP4_E2M1:
      return 4;
    case SFMOE_DTYPE_INT64:
      return 64;
  }
  return 0;
}

int64_t sfmoe_scaling_block_size(sfmoe_scaling scaling) {
  return sfmoe::scaling_block_size(scaling);
}

int64_t sfmoe_min_row_alignment(sfmoe_scaling scaling, int32_t has_columnwise) {
  return sfmoe::min_row_alignment(scaling, has_columnwise != 0);
}

sfmoe_status sfmoe_scale_dtype(sfmoe_scaling scaling, sfmoe_dtype* dtype) {
  if (dtype == nullptr)
    return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "sfmoe_scale_dtype: dtype is NULL");
  const sfmoe_dtype d = sfmoe::scale_dtype_of(scaling);
  if (d == static_cast<sfmoe_dtype>(SFMOE_DTYPE_COUNT)) {
    return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                       "sfmoe_scale_dtype: scaling '%s' has no scales",
                       sfmoe_scaling_name(scaling));
  }
  *dtype = d;
  return SFMOE_SUCCESS;
}

sfmoe_status sfmoe_scale_shape(sfmoe_scaling scaling, sfmoe_scale_layout layout, int64_t num_groups,
                               int64_t copy_rows, int64_t copy_cols, int32_t* ndim,
                               int64_t shape[2]) {
  constexpr const char* kContext = "sfmoe_scale_shape";
  if (ndim == nullptr || shape == nullptr) {
    return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: ndim and shape must not be NULL", kContext);
  }
  const sfmoe::Outcome outcome =
      sfmoe::ops::plan_scale_shape(scaling, layout, num_groups, copy_rows, copy_cols, ndim, shape);
  return outcome.ok() ? SFMOE_SUCCESS : sfmoe::fail_with(kContext, outcome);
}

}  // extern "C"
