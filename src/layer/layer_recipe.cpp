// The MoE layer's recipes: the operand formats of each GEMM (src/layer/layer_recipe.h).
#include "src/layer/layer_recipe.h"

namespace sfmoe {
namespace layer {
namespace {

// An operand's part in its GEMM: the forms read a rowwise copy of X and W (fprop), of dY with
// W's columnwise one (dgrad), and columnwise copies of dY and X (wgrad).
enum class Role { kRows, kWeight, kGradient, kWeightTransposed, kGradientWgrad, kRowsWgrad };

Role role_of(GemmStep step, bool b) {
  switch (step) {
    case GemmStep::kFc1Fprop:
    case GemmStep::kFc2Fprop:
      return b ? Role::kWeight : Role::kRows;
    case GemmStep::kFc2Dgrad:
    case GemmStep::kFc1Dgrad:
      return b ? Role::kWeightTransposed : Role::kGradient;
    case GemmStep::kFc2Wgrad:
    case GemmStep::kFc1Wgrad:
      return b ? Role::kRowsWgrad : Role::kGradientWgrad;
  }
  return Role::kRows;
}

bool is_gradient(Role r) { return r == Role::kGradient || r == Role::kGradientWgrad; }
bool is_weight(Role r) { return r == Role::kWeight || r == Role::kWeightTransposed; }
bool reads_columnwise(Role r) {
  return r == Role::kWeightTransposed || r == Role::kGradientWgrad || r == Role::kRowsWgrad;
}

}  // namespace

OperandFormat operand_format(sfmoe_moe_recipe recipe, GemmStep step, bool b) {
  const Role role = role_of(step, b);
  OperandFormat f;
  if (recipe == SFMOE_MOE_RECIPE_BF16) return f;
  f.quantized = true;
  f.columnwise = reads_columnwise(role);
  switch (recipe) {
    case SFMOE_MOE_RECIPE_FP8_TENSOR:
      // Current scaling, one scale per expert; gradients in E5M2 (the hybrid format).
      f.dtype = is_gradient(role) ? SFMOE_DTYPE_FP8_E5M2 : SFMOE_DTYPE_FP8_E4M3;
      f.scaling = SFMOE_SCALING_TENSOR;
      break;
    case SFMOE_MOE_RECIPE_FP8_BLOCKWISE:
      // DeepSeek-V3: 1x128 rows and gradients, 128x128 weights, E4M3, power-of-two scales; the
      // wgrad operands' columnwise scales transposed for the kernel, the dgrad weight's rowwise
      // scales beside its columnwise codes.
      f.dtype = SFMOE_DTYPE_FP8_E4M3;
      f.scaling = is_weight(role) ? SFMOE_SCALING_BLOCK_128X128 : SFMOE_SCALING_BLOCK_1X128;
      f.power_of_two_scales = true;
      if (role == Role::kGradientWgrad || role == Role::kRowsWgrad)
        f.layout = SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED;
      f.rowwise_scales = role == Role::kWeightTransposed;
      break;
    case SFMOE_MOE_RECIPE_MXFP8:
      f.dtype = SFMOE_DTYPE_FP8_E4M3;
      f.scaling = SFMOE_SCALING_MX_1X32;
      break;
    case SFMOE_MOE_RECIPE_NVFP4:
      // 16x16 weights, 1x16 rows and gradients; stochastic rounding on the gradients, the random
      // Hadamard transform on the wgrad operands (along the rows they reduce over).
      f.dtype = SFMOE_DTYPE_FP4_E2M1;
      f.scaling = is_weight(role) ? SFMOE_SCALING_NV_16X16 : SFMOE_SCALING_NV_1X16;
      f.stochastic_rounding = is_gradient(role);
      f.hadamard = role == Role::kGradientWgrad || role == Role::kRowsWgrad;
      break;
    default:
      f.quantized = false;
      break;
  }
  return f;
}

bool written_quantized_by_producer(const OperandFormat& f) {
  return f.quantized && !f.columnwise && !f.stochastic_rounding && !f.hadamard &&
         (f.scaling == SFMOE_SCALING_BLOCK_1X128 || f.scaling == SFMOE_SCALING_MX_1X32);
}

bool recipe_is_known(int32_t recipe) {
  return recipe >= SFMOE_MOE_RECIPE_BF16 && recipe <= SFMOE_MOE_RECIPE_NVFP4;
}

const char* recipe_name(sfmoe_moe_recipe recipe) {
  switch (recipe) {
    case SFMOE_MOE_RECIPE_BF16:
      return "bf16";
    case SFMOE_MOE_RECIPE_FP8_TENSOR:
      return "fp8 per-tensor";
    case SFMOE_MOE_RECIPE_FP8_BLOCKWISE:
      return "fp8 blockwise";
    case SFMOE_MOE_RECIPE_MXFP8:
      return "mxfp8";
    case SFMOE_MOE_RECIPE_NVFP4:
      return "nvfp4";
  }
  return "unknown";
}

bool recipe_emulated_on_device(sfmoe_moe_recipe recipe) {
  return recipe == SFMOE_MOE_RECIPE_MXFP8 || recipe == SFMOE_MOE_RECIPE_NVFP4;
}

// A recipe's block: H and F must be whole blocks of it along the columns, and each expert's rows
// whole blocks of it down the rows (the columnwise copies' blocks; FP8 per-tensor: the device
// kernels' 16-byte rows and 16-row wgrad steps, nothing on the host).
int64_t recipe_block(sfmoe_moe_recipe recipe, bool on_device) {
  switch (recipe) {
    case SFMOE_MOE_RECIPE_FP8_TENSOR:
      return on_device ? 16 : 1;
    case SFMOE_MOE_RECIPE_FP8_BLOCKWISE:
      return 128;
    case SFMOE_MOE_RECIPE_MXFP8:
      return 32;
    case SFMOE_MOE_RECIPE_NVFP4:
      return 16;
    default:
      return 1;
  }
}

int64_t recipe_column_multiple(sfmoe_moe_recipe recipe, bool on_device) {
  // BF16 on the device: the grouped GEMM's 16-byte rows.
  return recipe == SFMOE_MOE_RECIPE_BF16 ? (on_device ? 8 : 1) : recipe_block(recipe, on_device);
}

int64_t recipe_row_alignment(sfmoe_moe_recipe recipe, bool on_device) {
  return recipe_block(recipe, on_device);
}

}  // namespace layer
}  // namespace sfmoe
