/* Grouped GEMM, the three training forms of an MoE FFN (docs/grouped_gemm.md):
 *   fprop  Y_g  = X_g . W_g^T       a = X [rows, K] (grouped by offsets), b = W, out = Y [rows, N]
 *   dgrad  dX_g = dY_g . W_g        a = dY [rows, N],                      b = W, out = dX [rows,
 * K] wgrad  dW_g (+)= dY_g^T . X_g   a = dY [rows, N], b = X [rows, K] (same offsets), out = dW W
 * and dW are uniform grouped tensors: num_groups groups of N rows (uniform_group_rows = N) and K
 * cols. Rows carry group offsets; out shares a's (fprop, dgrad) and is written for every row of
 * every group, padding rows included (their inputs are zeros).
 *
 * Quantized operands (any recipe of sfmoe/quantize.h) are read from the copy each form's Hopper
 * kernel reads (K-major): fprop X rowwise and W rowwise; dgrad dY rowwise and W columnwise; wgrad
 * dY columnwise and X columnwise. The copy must be present.
 *
 * Backends: the CPU reference runs on host memory (quantized operands are dequantized from those
 * copies, then multiplied in FP32). On CUDA memory (builds with CUTLASS, Hopper): BF16 x BF16
 * operands (scaling NONE; n and k multiples of 8); FP8 per-tensor ones (E4M3 or E5M2 x E4M3; n
 * and k multiples of 16; FP8 wgrad needs row_alignment >= 16); or FP8 blockwise ones (a E4M3
 * BLOCK_1X128; b = W E4M3 BLOCK_128X128 with its rowwise scales, or in wgrad X E4M3 BLOCK_1X128;
 * wgrad's dY and X in SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED with row_alignment >= 128; n and k
 * multiples of 128). Out BF16 or FP32, 16-byte aligned data; the group sizes stay on the device
 * (a's offsets; in wgrad they are taken for b's as well) and the kernels' work follows them.
 * Offsets outside [0, row_capacity] or decreasing (or, in FP8 wgrad, not multiples of 16) are
 * clamped or skipped and raise SFMOE_FAULT_BAD_GROUP_OFFSETS / SFMOE_FAULT_GROUP_OVER_CAPACITY in
 * `word`. MXFP8 (MX_1X32) and NVFP4 (NV_1X16, NV_16X16) operands, in any pairing of the two,
 * are emulated on Hopper, which has no tensor-core instruction for their scales: the copy each
 * form reads is dequantized into BF16 in the workspace (MXFP8 values exactly, but for BF16
 * subnormals; NVFP4 values with their global scale, rounded once), then the BF16 kernels run
 * (docs/grouped_gemm.md); their
 * workspace is larger (sfmoe_grouped_gemm_workspace_bytes). FP16 and other pairings are
 * SFMOE_ERROR_UNSUPPORTED on the device.
 */
#ifndef SFMOE_GROUPED_GEMM_H_
#define SFMOE_GROUPED_GEMM_H_

#include "sfmoe/sfmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sfmoe_gemm_form SFMOE_ENUM_INT32 {
  SFMOE_GEMM_FPROP = 0,
  SFMOE_GEMM_DGRAD = 1,
  SFMOE_GEMM_WGRAD = 2
} sfmoe_gemm_form;

typedef struct sfmoe_grouped_gemm_config {
  size_t struct_size;
  sfmoe_gemm_form form;
  int32_t accumulate; /* wgrad only: dW += (dW must be FP32); an empty group leaves it alone */
  int32_t hadamard_columnwise;   /* the NV_1X16 operands' columnwise copies carry the Hadamard
                                    transform (sfmoe_quantize_config.hadamard_columnwise) */
  int32_t fp8_fast_accumulation; /* FP8 per-tensor on the device: the tensor cores accumulate
                                    over all of K on their own (faster; sums less precise than
                                    with the default periodic promotion into FP32). Ignored
                                    elsewhere: the host reference always sums in FP32 */
  /* fprop and dgrad with unquantized a: A's rows gathered from a's data instead of read as they
   * lie (a permutation's rows read straight from the tokens, never written out). NULL: as they
   * lie. Else [a.row_capacity] int32 in a's memory: A's row r is row a_row_index[r] of
   * a.rowwise_data, which then holds a_source_rows rows of a.cols (a.row_capacity and
   * a.group_offsets describe the gathered rows, as they do out's); an index outside
   * [0, a_source_rows) gives a zero row (padding rows: -1). On the device: BF16 a, b and out, n
   * and k multiples of 8, at most 768 groups (sfmoe's own fprop / dgrad kernel). */
  const int32_t* a_row_index;
  int64_t a_source_rows;
} sfmoe_grouped_gemm_config;

SFMOE_API sfmoe_grouped_gemm_config sfmoe_grouped_gemm_config_init(void);

/* Bytes of the device workspace for a call with these operands (a and b's scaling, row_capacity
 * and cols): the kernels' per-group arguments, plus, when both operands are emulated (MXFP8 /
 * NVFP4), room for their BF16 values. Allocate it once, outside the step. 0 in builds without the
 * CUDA kernels (the host needs none), -1 for negative sizes or sizes whose bytes overflow.
 * workspace: a 1-D tensor (any dtype) of at least that many bytes in a's device memory, required
 * on the device, ignored on the host. `word` may be NULL. */
SFMOE_API int64_t sfmoe_grouped_gemm_workspace_bytes(int64_t num_groups, sfmoe_scaling a_scaling,
                                                     int64_t a_rows, int64_t a_cols,
                                                     sfmoe_scaling b_scaling, int64_t b_rows,
                                                     int64_t b_cols);

SFMOE_API sfmoe_status sfmoe_grouped_gemm(const sfmoe_grouped_tensor* a,
                                          const sfmoe_grouped_tensor* b,
                                          const sfmoe_grouped_gemm_config* config,
                                          const sfmoe_grouped_tensor* out,
                                          const sfmoe_tensor* workspace, sfmoe_status_word* word,
                                          void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SFMOE_GROUPED_GEMM_H_ */
