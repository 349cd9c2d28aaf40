// Grouped GEMM on Hopper (docs/grouped_gemm.md): the BF16 and FP8 per-tensor kernels, the
// dispatch by recipe, output dtype and tile, and the workspace size. The machinery they share
// with the blockwise kernels (grouped_gemm_blockwise.cu) is in grouped_gemm_kernels.cuh.
#include "src/cuda/gemm/grouped_gemm_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace grouped_gemm_detail;

template <class Out, GemmTile T>
using Bf16Fprop = GroupedKernel<Bf16, Bf16, RowMajor, ColumnMajor, Out, T>;
template <class Out, GemmTile T>
using Bf16Dgrad = GroupedKernel<Bf16, Bf16, RowMajor, RowMajor, Out, T>;
template <class Out, GemmTile T>
using Bf16Wgrad = GroupedKernel<Bf16, Bf16, ColumnMajor, RowMajor, Out, T>;
// FP8: every form reads K-major copies; A is E4M3 (activations) or E5M2 (gradients), B E4M3.
template <class ElementA, class Out, GemmTile T>
using Fp8Kernel = GroupedKernel<ElementA, E4M3, RowMajor, ColumnMajor, Out, T>;

template <class Out, GemmTile T>
sfmoe_status run_tile(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  if (a.a.dtype == SFMOE_DTYPE_FP8_E4M3) return run_kernel<Fp8Kernel<E4M3, Out, T>>(a, stream);
  if (a.a.dtype == SFMOE_DTYPE_FP8_E5M2) return run_kernel<Fp8Kernel<E5M2, Out, T>>(a, stream);
  switch (a.form) {
    case GroupedGemmForm::kFprop:
      return run_kernel<Bf16Fprop<Out, T>>(a, stream);
    case GroupedGemmForm::kDgrad:
      return run_kernel<Bf16Dgrad<Out, T>>(a, stream);
    case GroupedGemmForm::kWgrad:
      return run_kernel<Bf16Wgrad<Out, T>>(a, stream);
  }
  return SFMOE_ERROR_INTERNAL;
}

// The tile from the bounds the host knows: the GEMM's M per group (rows over groups in fprop and
// dgrad; n in wgrad) and N.
template <class Out>
sfmoe_status run_out(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  const bool wgrad = a.form == GroupedGemmForm::kWgrad;
  const int64_t rows_per_group = a.row_capacity / (a.num_groups > 0 ? a.num_groups : 1);
  const int64_t m_per_group = wgrad ? a.n : rows_per_group;
  const int64_t gemm_n = a.form == GroupedGemmForm::kFprop ? a.n : a.k;
  const int64_t gemm_k = a.form == GroupedGemmForm::kDgrad ? a.n : (wgrad ? rows_per_group : a.k);
  const bool fp8 = a.a.dtype == SFMOE_DTYPE_FP8_E4M3 || a.a.dtype == SFMOE_DTYPE_FP8_E5M2;
  switch (choose_gemm_tile(fp8, m_per_group, gemm_n, gemm_k)) {
    case GemmTile::kCooperative128x128:
      return run_tile<Out, GemmTile::kCooperative128x128>(a, stream);
    case GemmTile::kCooperative128x256:
      return run_tile<Out, GemmTile::kCooperative128x256>(a, stream);
    case GemmTile::kPingpong64x128:
      return run_tile<Out, GemmTile::kPingpong64x128>(a, stream);
  }
  return SFMOE_ERROR_INTERNAL;
}

}  // namespace

bool grouped_gemm_available() { return true; }

template <GemmTile T>
void most_workspace_of_tile(int64_t groups, int64_t* most) {
  most_workspace<Bf16Fprop<Bf16, T>>(groups, most);
  most_workspace<Bf16Dgrad<Bf16, T>>(groups, most);
  most_workspace<Bf16Wgrad<Bf16, T>>(groups, most);
  most_workspace<Bf16Fprop<float, T>>(groups, most);
  most_workspace<Bf16Dgrad<float, T>>(groups, most);
  most_workspace<Bf16Wgrad<float, T>>(groups, most);
  most_workspace<Fp8Kernel<E4M3, Bf16, T>>(groups, most);
  most_workspace<Fp8Kernel<E5M2, Bf16, T>>(groups, most);
  most_workspace<Fp8Kernel<E4M3, float, T>>(groups, most);
  most_workspace<Fp8Kernel<E5M2, float, T>>(groups, most);
}

int64_t grouped_gemm_workspace_bytes(int64_t num_groups) {
  int64_t most = 0;
  most_workspace_of_tile<GemmTile::kCooperative128x128>(num_groups, &most);
  most_workspace_of_tile<GemmTile::kCooperative128x256>(num_groups, &most);
  most_workspace_of_tile<GemmTile::kPingpong64x128>(num_groups, &most);
  const int64_t blockwise = grouped_gemm_blockwise_workspace_bytes(num_groups);
  return blockwise > most ? blockwise : most;
}

sfmoe_status grouped_gemm(const GroupedGemmDeviceArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  if (a.num_groups == 0) return SFMOE_SUCCESS;
  if (a.a.scaling == SFMOE_SCALING_BLOCK_1X128) return grouped_gemm_blockwise(a, stream);
  return a.out_dtype == SFMOE_DTYPE_FP32 ? run_out<float>(a, stream) : run_out<Bf16>(a, stream);
}

}  // namespace cuda
}  // namespace sfmoe
