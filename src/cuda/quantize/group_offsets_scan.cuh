// Launch 1 of the grouped quantization: the padded output offsets (grouped_quantize.cu).
#pragma once

#include <stdint.h>

#include <cub/block/block_scan.cuh>

#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/common/quantize_args.h"
#include "src/cuda/quantize/input_chunks.cuh"

namespace sfmoe {
namespace cuda {
namespace quantizer {

// ---- 1. padded offsets -------------------------------------------------------------------------
constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads)
    padded_offsets_kernel(GroupedQuantizeArgs a, bool init_amax, bool clear_columnwise_amax) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t groups = a.num_groups;
  const int64_t per_thread = (groups + kScanThreads - 1) / kScanThreads;
  const int64_t first = threadIdx.x * per_thread;
  const int64_t last = first + per_thread < groups ? first + per_thread : groups;
  const int64_t align = a.row_alignment;
  int64_t sum = 0;
  for (int64_t g = first; g < last; ++g) {
    if (a.word != nullptr && a.input.offsets != nullptr) {
      check_group(a.input.offsets, g, a.input.row_capacity, 1, a.word);
    }
    sum += (input_span(a.input, g).rows + align - 1) / align * align;
  }
  int64_t prefix = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(sum, prefix, total);
  // Good offsets always fit (the API checks the capacity bound). Bad ones (overlapping clamped
  // groups) can exceed it: offsets are clamped to the last row that keeps the row-running blocks
  // whole, and a group whose rows no longer fit raises GROUP_OVER_CAPACITY. min(prefix, limit)
  // equals the sequential rule out_off[g+1] = min(out_off[g] + padded_g, limit).
  const int64_t block_height = min_row_alignment(a.scaling, a.columnwise != nullptr);
  const int64_t limit = a.row_capacity - a.row_capacity % block_height;
  if (a.offsets != nullptr) {
    for (int64_t g = first; g < last; ++g) {
      const int64_t rows = input_span(a.input, g).rows;
      const int64_t start = prefix < limit ? prefix : limit;
      if (a.word != nullptr && start + rows > limit) {
        raise_fault(a.word, SFMOE_FAULT_GROUP_OVER_CAPACITY, g, start + rows);
      }
      a.offsets[g] = start;
      prefix += (rows + align - 1) / align * align;
    }
    if (threadIdx.x == 0) a.offsets[groups] = total < limit ? total : limit;
  }
  for (int64_t g = threadIdx.x; g < groups; g += kScanThreads) {
    // The amax starts at 0 for the amax pass, or is the given one (config.group_amax), which the
    // codes kernel then reads.
    if (init_amax) a.amax[g] = a.config.group_amax != nullptr ? a.config.group_amax[g] : 0.0f;
    if (clear_columnwise_amax && a.columnwise_amax) a.columnwise_amax[g] = 0.0f;
  }
}

}  // namespace quantizer
}  // namespace cuda
}  // namespace sfmoe
