// Grouped quantization on the GPU (docs/quantization.md; the CPU backend is the definition).
//
// Launches, all sized from host bounds and reading real sizes from device memory:
//   1. padded_offsets_kernel (one block): clamps the input groups, writes the padded output
//      offsets with a block scan, checks the input offsets, clears the amax buffers (or copies
//      the caller's group amax, config.group_amax, which then skips 2);
//   2. (TENSOR, NVFP4) the per-group amax by atomicMax on the FP32 bits: quantize_amax_rows_kernel
//      (warps streaming runs of rows), or with NVFP4's Hadamard transform (which also needs the
//      transformed columnwise amax) quantize_tiles_kernel<..., kAmaxPass = true>;
//   3. quantize_tiles_kernel<..., kAmaxPass = false>: codes and scales of both copies. TENSOR
//      with given scales skips 2: its scales do not depend on the amax, so this kernel folds the
//      group amax from the rows it encodes (one read of the input), and trap_group_amax_kernel
//      traps NaN amaxes after it when asked to.
// The tile kernel walks persistent work units (a band of 128 output rows x a run of 128-column
// tiles; eight bands for compact columnwise MXFP8 / 1x128 scales, see kUnitBands) over the real
// rows [0, out_off[G]); group offsets are staged in shared memory for the
// row maps. Rowwise-only requests (256 threads) load eight 16-byte chunks per thread straight
// into registers and encode them there, the block amax reduced by shuffles so that each block's
// scale is computed once. Columnwise requests (512 threads) copy tiles with cp.async into a ring
// of three shared buffers (chunks XOR-swizzled by 16-row segment), two tiles ahead; the rowwise
// copy is read back along the rows and the columnwise copy down the columns, two columns x 16 rows
// per thread, a warp covering four column pairs over the whole tile height so that column blocks
// reduce by shuffles. Full tiles run a copy of the encoding without bounds checks.
// docs/KERNEL_NOTES.md has the measured versions and why each changed.
//
// The parts: group_offsets_scan.cuh (1), amax_rows.cuh (2, and the standalone grouped amax),
// tile_quantize.cuh (3, and 2 with the Hadamard transform), input_chunks.cuh (the input as the
// kernels read it), recipe_encoder.cuh (scales and codes, shared with the fused quantizations of
// permute and the activations); this file chooses and launches them.
#include <stdint.h>

#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/heuristics/quantize_launch.h"
#include "src/cuda/quantize/amax_rows.cuh"
#include "src/cuda/quantize/group_offsets_scan.cuh"
#include "src/cuda/quantize/recipe_encoder.cuh"
#include "src/cuda/quantize/tile_quantize.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace numerics;
using namespace encoding;
using namespace quantizer;

// The codes kernel for the request's copies (and, NVFP4, its rounding).
template <sfmoe_dtype In, sfmoe_scaling S>
sfmoe_status launch_codes(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  const bool columnwise = a.columnwise != nullptr;
  if constexpr (Recipe<S>::kNv) {
    if (a.config.stochastic_rounding) {
      return columnwise ? launch_tiles<In, S, false, true, true>(a, stream)
                        : launch_tiles<In, S, false, false, true>(a, stream);
    }
  }
  if constexpr (S == SFMOE_SCALING_MX_1X32 || S == SFMOE_SCALING_BLOCK_1X128) {
    // Compact columnwise scales: banded units where they write whole sectors
    // (heuristics/quantize_launch.h).
    if (columnwise && a.scale_layout == SFMOE_SCALE_LAYOUT_COMPACT &&
        columnwise_scales_in_unit_bands(a.row_capacity, Recipe<S>::kBlock,
                                        S == SFMOE_SCALING_BLOCK_1X128 ? 4 : 1,
                                        a.columnwise_scale_inv))
      return launch_tiles<In, S, false, true, false, true>(a, stream);
  }
  return columnwise ? launch_tiles<In, S, false, true>(a, stream)
                    : launch_tiles<In, S, false, false>(a, stream);
}

// TENSOR with given scales: the codes kernel folds the group amax as it encodes, so NaN amaxes
// trap after it, once per group.
__global__ void trap_group_amax_kernel(GroupedQuantizeArgs a) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < a.num_groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    maybe_trap(a, a.amax[g], g, quantized_group_offset(a, g));
  }
}

template <sfmoe_dtype In, sfmoe_scaling S>
sfmoe_status run_recipe(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  if constexpr (S == SFMOE_SCALING_TENSOR) {
    if (a.config.tensor_scales != nullptr) {  // one pass: the amax is folded while encoding
      SFMOE_RETURN_IF_ERROR((launch_codes<In, S>(a, stream)));
      if (!a.config.trap_nan_amax || a.word == nullptr) return SFMOE_SUCCESS;
      trap_group_amax_kernel<<<grid_for(a.num_groups, kThreads), kThreads, 0, stream>>>(a);
      return check_launch("trap_group_amax_kernel");
    }
  }
  if constexpr (Recipe<S>::kGroupAmax) {
    // A given group amax (config.group_amax; the API keeps it from the Hadamard case) is already
    // in a.amax: one pass.
    if (a.config.group_amax != nullptr) return launch_codes<In, S>(a, stream);
    if constexpr (S == SFMOE_SCALING_NV_1X16) {
      if (a.config.hadamard_columnwise && a.columnwise != nullptr) {
        SFMOE_RETURN_IF_ERROR((launch_tiles<In, S, true, true>(a, stream)));
      } else {
        SFMOE_RETURN_IF_ERROR((launch_amax_rows<In>(a, stream)));
      }
    } else {
      SFMOE_RETURN_IF_ERROR((launch_amax_rows<In>(a, stream)));
    }
  }
  return launch_codes<In, S>(a, stream);
}

template <sfmoe_dtype In>
sfmoe_status run_input(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  switch (a.scaling) {
    case SFMOE_SCALING_TENSOR:
      return run_recipe<In, SFMOE_SCALING_TENSOR>(a, stream);
    case SFMOE_SCALING_BLOCK_1X128:
      return run_recipe<In, SFMOE_SCALING_BLOCK_1X128>(a, stream);
    case SFMOE_SCALING_BLOCK_128X128:
      return run_recipe<In, SFMOE_SCALING_BLOCK_128X128>(a, stream);
    case SFMOE_SCALING_MX_1X32:
      return run_recipe<In, SFMOE_SCALING_MX_1X32>(a, stream);
    case SFMOE_SCALING_NV_1X16:
      return run_recipe<In, SFMOE_SCALING_NV_1X16>(a, stream);
    case SFMOE_SCALING_NV_16X16:
      return run_recipe<In, SFMOE_SCALING_NV_16X16>(a, stream);
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "no kernel for this scaling");
  }
}

}  // namespace

sfmoe_status grouped_quantize(const GroupedQuantizeArgs& a, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const bool clear_columnwise =
      a.columnwise_amax != nullptr && a.config.hadamard_columnwise && a.columnwise != nullptr;
  const bool init_amax = a.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(a.scaling);
  padded_offsets_kernel<<<1, kScanThreads, 0, stream>>>(a, init_amax, clear_columnwise);
  SFMOE_RETURN_IF_ERROR(check_launch("padded_offsets_kernel"));
  switch (a.input.dtype) {
    case SFMOE_DTYPE_FP32:
      return run_input<SFMOE_DTYPE_FP32>(a, stream);
    case SFMOE_DTYPE_BF16:
      return run_input<SFMOE_DTYPE_BF16>(a, stream);
    case SFMOE_DTYPE_FP16:
      return run_input<SFMOE_DTYPE_FP16>(a, stream);
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "no kernel for the input dtype");
  }
}

sfmoe_status grouped_amax(const GroupedInput& in, int64_t groups, int64_t cols, float* amax,
                          sfmoe_fault_report* word, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  clear_amax_kernel<<<grid_for(groups, kThreads), kThreads, 0, stream>>>(in, groups, amax, word);
  SFMOE_RETURN_IF_ERROR(check_launch("clear_amax_kernel"));
  const dim3 grid(static_cast<unsigned>(groups < 65535 ? groups : 65535), 8);
  switch (in.dtype) {
    case SFMOE_DTYPE_FP32:
      group_amax_kernel<SFMOE_DTYPE_FP32><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax);
      break;
    case SFMOE_DTYPE_BF16:
      group_amax_kernel<SFMOE_DTYPE_BF16><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax);
      break;
    case SFMOE_DTYPE_FP16:
      group_amax_kernel<SFMOE_DTYPE_FP16><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax);
      break;
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "no kernel for the input dtype");
  }
  return check_launch("group_amax_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
