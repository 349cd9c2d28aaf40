// The group amax without the tile kernel: the row stream of grouped quantization's amax pass
// (TENSOR, NVFP4 without the Hadamard transform) and the standalone grouped amax.
#pragma once

#include <stdint.h>

#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/common/quantize_args.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/heuristics/launch_overrides.h"
#include "src/cuda/heuristics/quantize_launch.h"
#include "src/cuda/quantize/input_chunks.cuh"

namespace sfmoe {
namespace cuda {
namespace quantizer {

using namespace numerics;

// ---- the amax pass of TENSOR and NVFP4 without the Hadamard transform ---------------------------
// A stream over the output rows [0, out_off[G]) with the tile kernel's row map (output row ->
// group -> input row, padding skipped), so that it reads exactly the rows that kernel will encode.
// Each warp takes a contiguous run of rows and walks the groups along it, keeping the running
// amax in registers and folding it into amax[g] (atomicMax on the FP32 bits) when the group
// changes and at the end: no shared memory, no block barriers (the tile kernel's amax pass spent
// over half its cycles at barriers: docs/KERNEL_NOTES.md), kAmaxBatch chunks
// in flight per lane (one 16-byte load each; two for FP32 input).
constexpr int kAmaxThreads = 256;
constexpr int kAmaxBatch = 4;
template <sfmoe_dtype In>
__global__ void __launch_bounds__(kAmaxThreads)
    quantize_amax_rows_kernel(GroupedQuantizeArgs a, int64_t forced_rows_per_warp) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kAmaxThreads + threadIdx.x) / 32;
  const int64_t groups = a.num_groups, cols = a.cols;
  const int64_t* out_off = a.offsets;
  const int64_t total = out_off != nullptr ? out_off[groups] : groups * a.uniform_rows;
  // The real rows split evenly over the launched warps (the capacity may be far above them).
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kAmaxThreads / 32);
  const int64_t rows_per_warp =
      forced_rows_per_warp > 0 ? forced_rows_per_warp : (total + warps - 1) / warps;
  const int64_t r_begin = warp * rows_per_warp;
  const int64_t r_end = r_begin + rows_per_warp < total ? r_begin + rows_per_warp : total;
  if (r_begin >= r_end) return;
  auto group_start = [&](int64_t g) {
    return out_off != nullptr ? out_off[g] : g * a.uniform_rows;
  };
  int64_t g =
      out_off != nullptr ? group_of_offset_row(out_off, groups, r_begin) : r_begin / a.uniform_rows;
  int64_t start = group_start(g);
  InputSpan span = input_span(a.input, g);
  uint32_t m = 0;
  auto flush = [&]() {
    const uint32_t warp_max = __reduce_max_sync(0xFFFFFFFFu, m);
    if (lane == 0 && warp_max != 0) atomicMax(reinterpret_cast<unsigned*>(a.amax + g), warp_max);
    m = 0;
  };
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
  for (int64_t r = r_begin; r < r_end; ++r) {
    if (g + 1 < groups && group_start(g + 1) <= r) {  // the last group starting at or before r
      flush();
      do {
        ++g;
      } while (g + 1 < groups && group_start(g + 1) <= r);
      start = group_start(g);
      span = input_span(a.input, g);
    }
    const int64_t inside = r - start;
    if (inside >= span.rows) continue;  // alignment padding
    const int64_t src = span.begin + inside;
    for (int64_t q0 = lane; q0 < chunks; q0 += 32 * kAmaxBatch) {
      RawChunk<In> raw[kAmaxBatch];
#pragma unroll
      for (int b = 0; b < kAmaxBatch; ++b) {
        const int64_t q = q0 + 32 * b;
        if (q < chunks) {
          load_raw<In>(a.input.data, src, q * kChunk, cols, raw[b]);
        } else {
          zero_raw<In>(raw[b]);
        }
      }
#pragma unroll
      for (int b = 0; b < kAmaxBatch; ++b) m = max(m, raw_amax_bits<In>(raw[b]));
    }
  }
  flush();
}

template <sfmoe_dtype In>
sfmoe_status launch_amax_rows(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  auto kernel = quantize_amax_rows_kernel<In>;
  const int64_t wave = resident_wave(reinterpret_cast<const void*>(kernel), kAmaxThreads, 0);
  // (Tests set the run length, so that runs cross group boundaries.)
  const int64_t rows_per_warp = launch_overrides().amax_rows_per_warp;
  const int64_t blocks = amax_rows_blocks(a.row_capacity, wave, kAmaxThreads / 32, rows_per_warp);
  kernel<<<static_cast<unsigned>(blocks), kAmaxThreads, 0, stream>>>(a, rows_per_warp);
  return check_launch("quantize_amax_rows_kernel");
}

// ---- standalone amax: one block row-slice per (group, split) -----------------------------------
template <sfmoe_dtype In>
__global__ void __launch_bounds__(kThreads)
    group_amax_kernel(GroupedInput in, int64_t groups, int64_t cols, float* amax) {
  __shared__ unsigned block_max;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    if (threadIdx.x == 0) block_max = 0;
    __syncthreads();
    const InputSpan span = input_span(in, g);
    const int64_t chunks_per_row = (cols + 7) / 8;
    const int64_t chunks = span.rows * chunks_per_row;
    const int64_t per_split = (chunks + gridDim.y - 1) / gridDim.y;
    const int64_t begin = blockIdx.y * per_split;
    const int64_t end = begin + per_split < chunks ? begin + per_split : chunks;
    unsigned m = 0;
    for (int64_t q = begin + threadIdx.x; q < end; q += kThreads) {
      RawChunk<In> raw;
      load_raw<In>(in.data, span.begin + q / chunks_per_row, (q % chunks_per_row) * 8, cols, raw);
      m = max(m, raw_amax_bits<In>(raw));
    }
    for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1)
      m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, lane_mask));
    if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(&block_max, m);
    __syncthreads();
    if (threadIdx.x == 0 && block_max != 0)
      atomicMax(reinterpret_cast<unsigned*>(amax + g), block_max);
    __syncthreads();
  }
}

__global__ void clear_amax_kernel(GroupedInput in, int64_t groups, float* amax,
                                  sfmoe_fault_report* word) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    amax[g] = 0.0f;
    if (word != nullptr && in.offsets != nullptr)
      check_group(in.offsets, g, in.row_capacity, 1, word);
  }
}

}  // namespace quantizer
}  // namespace cuda
}  // namespace sfmoe
