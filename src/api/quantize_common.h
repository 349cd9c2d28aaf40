// Quantization checks shared by the ops that write quantized grouped tensors (quantize, and the
// fused quantization of permute).
#pragma once

#include "sfmoe/quantize.h"
#include "src/common/quantize_args.h"

namespace sfmoe {

bool is_high_precision(sfmoe_dtype d);
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

}  // namespace sfmoe
