// Quantization checks shared by the ops that write quantized grouped tensors (quantize, and the
// fused quantization of permute).
#pragma once

#include "sfmoe/quantize.h"
#include "src/common/quantize_args.h"

namespace sfmoe {

// A config made by sfmoe_quantize_config_init() (struct_size).
sfmoe_status check_quantize_config(const char* context, const sfmoe_quantize_config* config);
// FP32 / BF16 / FP16 values, scaling NONE, with rowwise data.
sfmoe_status check_high_precision(const char* context, const char* name,
                                  const sfmoe_grouped_tensor* t);
GroupedInput input_of(const sfmoe_grouped_tensor* x);
// Checks a quantized tensor's recipe-specific requirements and fills the backend arguments.
sfmoe_status describe_quantized(const char* context, const char* name,
                                const sfmoe_grouped_tensor* q, const sfmoe_quantize_config& config,
                                GroupedQuantizeArgs* args);

// A grouped tensor an op quantizes as it writes its rows (the fused quantization of permute and
// of the activations): FP8 codes with rowwise MX_1X32 or BLOCK_1X128 scales (compact, or swizzled
// for MX), or per-tensor FP8 with given scales; with `allow_nvfp4` (an op that computes the group
// amax first) also NVFP4 1x16 codes. No columnwise copy (it would run down the groups' rows, which
// a row-parallel pass does not see), `cols` columns, a multiple of the block, in the given memory
// space; options may be NULL (the defaults); only power_of_two_scales applies.
sfmoe_status check_rowwise_fusion(const char* context, const char* name,
                                  const sfmoe_grouped_tensor* q, int64_t cols, sfmoe_memory memory,
                                  int32_t device, const sfmoe_quantize_config* options,
                                  bool allow_nvfp4, GroupedQuantizeArgs* args);

}  // namespace sfmoe
