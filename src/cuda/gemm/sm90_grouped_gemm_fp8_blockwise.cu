// Grouped GEMM with FP8 blockwise operands on Hopper (docs/grouped_gemm.md), the DeepSeek-V3
// recipe: activations and gradients scaled per 1x128 block along K, weights per 128x128 block.
// CUTLASS's ptr-array blockwise mainloop multiplies each 128-deep K block's partial sums by
// scale_a[m, kb] * scale_b[n / 128, kb] and adds them into FP32 accumulators, so no scale is
// folded into the operands and the epilogue only converts.
//
// Each form reads its scales where the quantizer wrote them (no copies, no relayout):
//   fprop  A = X rowwise, scales [rows, k / 128] (K-major);
//          B = W rowwise, scales [G n / 128, k / 128]: K-major, group g from block row g n / 128.
//   dgrad  A = dY rowwise, scales [rows, n / 128] (K-major);
//          B = W^T (the columnwise data), with W's rowwise scales: W_g^T's block (kb_n, kb_k)
//          is W's (g n / 128 + kb_k, kb_n), i.e. the same matrix read N-major.
//   wgrad  A = dY^T, B = X^T (the columnwise data), scaled per column and 128-row block: the
//          columnwise scales in the columnwise-transposed layout [rows / 128, n or k], read
//          M/N-major from block row offsets[g] / 128 (the compact [n or k, rows / 128] layout
//          has no per-group leading dimension the mainloop could use).
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace grouped_gemm_detail;

// 1x128 scales for A (per row, per K block), 128x128 for B; A's read K-major, B's K-major
// (fprop) or N-major (dgrad).
using FpropScales = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                              cute::GMMA::Major::K>;
using DgradScales = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::K,
                                                              cute::GMMA::Major::MN>;
// wgrad: dY^T and X^T scaled per row (feature) and 128-row block, both read M/N-major.
using WgradScales = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, 128, cute::GMMA::Major::MN,
                                                              cute::GMMA::Major::MN>;

// E4M3 operands (the recipe's format for activations, gradients and weights alike), 128 x 128
// x 128 cooperative tiles (K 128: one scale block per mainloop step). (2-CTA clusters along M
// were measured and dropped: docs/KERNEL_NOTES.md.)
template <class Out, class Scales, GemmTile T>
using BlockwiseKernel = GroupedKernel<E4M3, E4M3, RowMajor, ColumnMajor, Out, T, Scales>;

template <class Out, class Scales>
sfmoe_status run_tile(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  return run_kernel<BlockwiseKernel<Out, Scales, GemmTile::kCooperative128x128>>(a, stream);
}

template <class Out>
sfmoe_status run_out(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  if (a.form == GroupedGemmForm::kFprop) return run_tile<Out, FpropScales>(a, stream);
  if (a.form == GroupedGemmForm::kDgrad) return run_tile<Out, DgradScales>(a, stream);
  return run_tile<Out, WgradScales>(a, stream);
}

template <class Out, GemmTile T>
void most_workspace_of(int64_t groups, int64_t* most) {
  most_workspace<BlockwiseKernel<Out, FpropScales, T>>(groups, most);
  most_workspace<BlockwiseKernel<Out, DgradScales, T>>(groups, most);
  most_workspace<BlockwiseKernel<Out, WgradScales, T>>(groups, most);
}

}  // namespace

int64_t grouped_gemm_blockwise_workspace_bytes(int64_t num_groups) {
  int64_t most = 0;
  most_workspace_of<Bf16, GemmTile::kCooperative128x128>(num_groups, &most);
  most_workspace_of<float, GemmTile::kCooperative128x128>(num_groups, &most);
  return most;
}

sfmoe_status grouped_gemm_blockwise(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                    cudaStream_t stream) {
  // sfmoe's own kernel where its tile is chosen and it takes the call (fprop and dgrad into BF16).
  if (is_blockwise_contiguous_tile(tile) && contiguous_blockwise_gemm_runs(a)) {
    return contiguous_blockwise_gemm(a, tile, stream);
  }
  return a.out_dtype == SFMOE_DTYPE_FP32 ? run_out<float>(a, stream) : run_out<Bf16>(a, stream);
}

}  // namespace cuda
}  // namespace sfmoe
