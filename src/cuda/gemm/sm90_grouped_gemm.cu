// Grouped GEMM on Hopper (docs/grouped_gemm.md): the BF16 kernels, the dispatch by recipe, output
// dtype and tile (heuristics/gemm_tiles.h), and the workspace size. The FP8 recipes compile in
// their own translation units (sm90_grouped_gemm_fp8_tensor.cu,
// sm90_grouped_gemm_fp8_blockwise.cu); the machinery all share is in sm90_grouped_gemm_kernels.cuh.
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace grouped_gemm_detail;

// BF16 operands are read as the rows lie (16-bit GMMA takes M/N-major operands too).
template <class Out, GemmTile T>
using Bf16Fprop = GroupedKernel<Bf16, Bf16, RowMajor, ColumnMajor, Out, T>;
template <class Out, GemmTile T>
using Bf16Dgrad = GroupedKernel<Bf16, Bf16, RowMajor, RowMajor, Out, T>;
template <class Out, GemmTile T>
using Bf16Wgrad = GroupedKernel<Bf16, Bf16, ColumnMajor, RowMajor, Out, T>;

template <class Out, GemmTile T>
sfmoe_status run_bf16_tile(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
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

// The compiled BF16 tiles: 128x256 (default), 128x128, 64x128, 256x128 (2 x 2 clusters), 128x128
// ping-pong (2 x 1 clusters).
template <class Out>
sfmoe_status run_bf16(const GroupedGemmDeviceArgs& a, GemmTile tile, cudaStream_t stream) {
  switch (tile) {
    case GemmTile::kCooperative128x128:
      return run_bf16_tile<Out, GemmTile::kCooperative128x128>(a, stream);
    case GemmTile::kPingpong64x128:
      return run_bf16_tile<Out, GemmTile::kPingpong64x128>(a, stream);
    case GemmTile::kCooperative256x128:
      return run_bf16_tile<Out, GemmTile::kCooperative256x128>(a, stream);
    case GemmTile::kPingpong128x128:
      return run_bf16_tile<Out, GemmTile::kPingpong128x128>(a, stream);
    default:
      return run_bf16_tile<Out, GemmTile::kCooperative128x256>(a, stream);
  }
}

template <GemmTile T>
void most_bf16_workspace(int64_t groups, int64_t* most) {
  most_workspace<Bf16Fprop<Bf16, T>>(groups, most);
  most_workspace<Bf16Dgrad<Bf16, T>>(groups, most);
  most_workspace<Bf16Wgrad<Bf16, T>>(groups, most);
  most_workspace<Bf16Fprop<float, T>>(groups, most);
  most_workspace<Bf16Dgrad<float, T>>(groups, most);
  most_workspace<Bf16Wgrad<float, T>>(groups, most);
}

GemmRecipe recipe_of(const GroupedGemmDeviceArgs& a) {
  if (a.a.scaling == SFMOE_SCALING_BLOCK_1X128) return GemmRecipe::kFp8Blockwise;
  if (a.a.scaling == SFMOE_SCALING_TENSOR) {
    return a.fast_accumulation ? GemmRecipe::kFp8TensorFast : GemmRecipe::kFp8Tensor;
  }
  return GemmRecipe::kBf16;
}

}  // namespace

bool grouped_gemm_available() { return true; }

int64_t grouped_gemm_workspace_bytes(int64_t num_groups) {
  int64_t most = 0;
  most_bf16_workspace<GemmTile::kCooperative128x128>(num_groups, &most);
  most_bf16_workspace<GemmTile::kCooperative128x256>(num_groups, &most);
  most_bf16_workspace<GemmTile::kPingpong64x128>(num_groups, &most);
  most_bf16_workspace<GemmTile::kCooperative256x128>(num_groups, &most);
  most_bf16_workspace<GemmTile::kPingpong128x128>(num_groups, &most);
  const int64_t fp8 = grouped_gemm_fp8_tensor_workspace_bytes(num_groups);
  const int64_t blockwise = grouped_gemm_blockwise_workspace_bytes(num_groups);
  const int64_t own_wgrad = wgrad_grouped_gemm_workspace_bytes(num_groups);
  most = fp8 > most ? fp8 : most;
  most = own_wgrad > most ? own_wgrad : most;
  return blockwise > most ? blockwise : most;
}

sfmoe_status launch_grouped_gemm(const GroupedGemmDeviceArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  if (a.num_groups == 0) return SFMOE_SUCCESS;
  // The tile from the bounds the host knows (heuristics/gemm_tiles.h), unless SFMOE_GEMM_TILE
  // named one at load.
  const GemmRecipe recipe = recipe_of(a);
  const GemmTile chosen =
      choose_gemm_tile_for(a.form, recipe, a.row_capacity, a.num_groups, a.n, a.k);
  const GemmTile cutlass_tile =
      choose_cutlass_tile_for(a.form, recipe, a.row_capacity, a.num_groups, a.n, a.k);
  GemmTile tile = launch_overrides().gemm_tile.value_or(chosen);
  switch (recipe) {
    case GemmRecipe::kFp8Blockwise:
      return grouped_gemm_blockwise(a, tile, stream);
    case GemmRecipe::kFp8Tensor:
    case GemmRecipe::kFp8TensorFast:
      return grouped_gemm_fp8_tensor(a, tile, stream);
    case GemmRecipe::kBf16:
      break;
  }
  if (a.a_row_index != nullptr) {
    // Gathered rows: only the contiguous kernel's producer gathers (a forced tile of it is kept).
    if (!contiguous_grouped_gemm_runs(a)) {
      return report(SFMOE_ERROR_UNSUPPORTED,
                    "the grouped GEMM gathers A's rows in BF16 fprop and dgrad into BF16, with at "
                    "most %lld groups, n and k multiples of 8 and 16-byte aligned operands",
                    static_cast<long long>(kGatheredGemmMaxGroups));
    }
    if (!is_contiguous_tile(tile)) tile = contiguous_tile_for(a.form, a.n, a.k);
    return contiguous_grouped_gemm(a, tile, stream);
  }
  // sfmoe's own kernels where they take the operands. An own kernel's tile, forced or chosen, on a
  // call that kernel does not take (the other own kernel's forms, FP32 results, wgrad
  // accumulation) runs the heuristic's choice, or its CUTLASS tile where that is an own kernel's
  // that does not take the call either: a study of one own kernel leaves the other calls as they
  // run.
  auto runs = [&a](GemmTile t) {
    if (is_blockwise_contiguous_tile(t)) return false;  // (FP8 blockwise's own)
    if (is_contiguous_tile(t)) return contiguous_grouped_gemm_runs(a);
    if (is_wgrad_tile(t)) return wgrad_grouped_gemm_runs(a);
    return true;
  };
  if (!runs(tile)) tile = runs(chosen) ? chosen : cutlass_tile;
  if (is_contiguous_tile(tile)) return contiguous_grouped_gemm(a, tile, stream);
  if (is_wgrad_tile(tile)) return wgrad_grouped_gemm(a, tile, stream);
  return a.out_dtype == SFMOE_DTYPE_FP32 ? run_bf16<float>(a, tile, stream)
                                         : run_bf16<Bf16>(a, tile, stream);
}

}  // namespace cuda
}  // namespace sfmoe
