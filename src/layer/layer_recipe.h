// The MoE layer's recipes (docs/moe_layer.md, "Recipes"): for each of the six grouped GEMMs, the
// format each operand is quantized into before the GEMM reads it. The layer keeps its rows and
// gradients in its dtype (BF16) between the steps; a quantized recipe quantizes the GEMM operands
// from them (the weights too, each call) into two workspace regions, one per operand.
#pragma once

#include <stdint.h>

#include "sfmoe/moe_layer.h"
#include "sfmoe/sfmoe.h"
#include "src/common/grouped_gemm_args.h"

namespace sfmoe {
namespace layer {

// The six GEMMs, in the order the layer runs them.
enum class GemmStep {
  kFc1Fprop,  // FC1 rows [R, fc1] = x rows [R, H] W1^T
  kFc2Fprop,  // FC2 rows [R, H] = act rows [R, F] W2^T
  kFc2Dgrad,  // g [R, F] = d y rows [R, H] W2
  kFc2Wgrad,  // d W2 [E, H, F] = d y rows^T (p act rows)
  kFc1Dgrad,  // d x rows [R, H] = d FC1 rows [R, fc1] W1
  kFc1Wgrad,  // d W1 [E, fc1, H] = d FC1 rows^T x rows
};
constexpr int kGemmSteps = 6;

// What one operand is quantized into: the copy the GEMM form reads (and, for FP8 128x128 weights in
// dgrad, the rowwise scales too, which the kernel reads), with the quantizer's options.
struct OperandFormat {
  bool quantized = false;  // false: the layer's rows as they are (BF16 recipe)
  sfmoe_dtype dtype = SFMOE_DTYPE_BF16;
  sfmoe_scaling scaling = SFMOE_SCALING_NONE;
  sfmoe_scale_layout layout = SFMOE_SCALE_LAYOUT_COMPACT;
  bool columnwise = false;  // the GEMM reads the columnwise copy
  // The rowwise copy's scales beside the columnwise codes (2D blocks: the same values), without
  // the rowwise codes.
  bool rowwise_scales = false;
  bool power_of_two_scales = false;
  bool stochastic_rounding = false;  // NVFP4 gradients
  bool hadamard = false;             // NVFP4 wgrad operands' columnwise copies
};

// The recipe's format of operand a (false) or b (true) of `step`.
OperandFormat operand_format(sfmoe_moe_recipe recipe, GemmStep step, bool b);

// Whether the step that writes a GEMM's rows (permute, the activation) can write them in format
// `f` itself (its fused quantization: rowwise FP8 1x128 or MXFP8, codes and scales), so that they
// are never written unquantized and read back.
bool written_quantized_by_producer(const OperandFormat& f);

// Whether `recipe` is known to the layer.
bool recipe_is_known(int32_t recipe);
const char* recipe_name(sfmoe_moe_recipe recipe);
// The recipe's GEMMs run emulated on Hopper (MXFP8, NVFP4: their operands decoded to BF16).
bool recipe_emulated_on_device(sfmoe_moe_recipe recipe);
// The recipe's block size (1 for BF16), which both rules below follow.
int64_t recipe_block(sfmoe_moe_recipe recipe, bool on_device);
// H and F must be multiples of this (the recipe's block along the columns; on the device also
// the kernels' 16-byte rows).
int64_t recipe_column_multiple(sfmoe_moe_recipe recipe, bool on_device);
// row_alignment must be a multiple of this (blocks that run down the rows stay inside an
// expert's rows; FP8 wgrad on the device reads 16-row steps).
int64_t recipe_row_alignment(sfmoe_moe_recipe recipe, bool on_device);

}  // namespace layer
}  // namespace sfmoe
