// Grouped GEMM with FP8 per-tensor operands on Hopper (docs/grouped_gemm.md): one scale per group
// and operand, alpha_g = scale_inv_a[g] scale_inv_b[g] applied in the epilogue. Every form reads
// K-major copies (sm90_grouped_gemm_kernels.cuh); A is E4M3 (activations) or E5M2 (gradients), B
// E4M3. Two accumulations: the accurate one (CUTLASS promotes the tensor cores' partial sums into a
// second FP32 accumulator every 4 MMAs) and, when the caller asks, the fast one (the tensor
// cores' own accumulation over all of K: fewer instructions and registers, less precise sums).
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace grouped_gemm_detail;

template <class ElementA, class Out, GemmTile T, bool kFast>
using Fp8Kernel = GroupedKernel<ElementA, E4M3, RowMajor, ColumnMajor, Out, T, void, kFast>;

template <class Out, GemmTile T, bool kFast>
sfmoe_status run_tile(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  if (a.a.dtype == SFMOE_DTYPE_FP8_E5M2) {
    return run_kernel<Fp8Kernel<E5M2, Out, T, kFast>>(a, stream);
  }
  return run_kernel<Fp8Kernel<E4M3, Out, T, kFast>>(a, stream);
}

// The compiled tiles: accurate 128x128 (default), 128x256, 64x128; fast 128x256 (the fallback),
// 128x128, 256x128 (2 x 2 clusters), 128x128 ping-pong (2 x 1 clusters; the default for K <= 4096
// and N >= 2048).
template <class Out>
sfmoe_status run_out(const GroupedGemmDeviceArgs& a, GemmTile tile, cudaStream_t stream) {
  if (a.fast_accumulation) {
    switch (tile) {
      case GemmTile::kCooperative128x128:
        return run_tile<Out, GemmTile::kCooperative128x128, true>(a, stream);
      case GemmTile::kCooperative256x128:
        return run_tile<Out, GemmTile::kCooperative256x128, true>(a, stream);
      case GemmTile::kPingpong128x128:
        return run_tile<Out, GemmTile::kPingpong128x128, true>(a, stream);
      default:
        return run_tile<Out, GemmTile::kCooperative128x256, true>(a, stream);
    }
  }
  switch (tile) {
    case GemmTile::kCooperative128x256:
      return run_tile<Out, GemmTile::kCooperative128x256, false>(a, stream);
    case GemmTile::kPingpong64x128:
      return run_tile<Out, GemmTile::kPingpong64x128, false>(a, stream);
    default:
      return run_tile<Out, GemmTile::kCooperative128x128, false>(a, stream);
  }
}

template <class Out, GemmTile T, bool kFast>
void most_workspace_of(int64_t groups, int64_t* most) {
  most_workspace<Fp8Kernel<E4M3, Out, T, kFast>>(groups, most);
  most_workspace<Fp8Kernel<E5M2, Out, T, kFast>>(groups, most);
}

template <class Out>
void most_workspace_of_out(int64_t groups, int64_t* most) {
  most_workspace_of<Out, GemmTile::kCooperative128x128, false>(groups, most);
  most_workspace_of<Out, GemmTile::kCooperative128x256, false>(groups, most);
  most_workspace_of<Out, GemmTile::kPingpong64x128, false>(groups, most);
  most_workspace_of<Out, GemmTile::kCooperative128x128, true>(groups, most);
  most_workspace_of<Out, GemmTile::kCooperative128x256, true>(groups, most);
  most_workspace_of<Out, GemmTile::kCooperative256x128, true>(groups, most);
  most_workspace_of<Out, GemmTile::kPingpong128x128, true>(groups, most);
}

}  // namespace

int64_t grouped_gemm_fp8_tensor_workspace_bytes(int64_t num_groups) {
  int64_t most = 0;
  most_workspace_of_out<Bf16>(num_groups, &most);
  most_workspace_of_out<float>(num_groups, &most);
  return most;
}

sfmoe_status grouped_gemm_fp8_tensor(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                     cudaStream_t stream) {
  return a.out_dtype == SFMOE_DTYPE_FP32 ? run_out<float>(a, tile, stream)
                                         : run_out<Bf16>(a, tile, stream);
}

}  // namespace cuda
}  // namespace sfmoe
