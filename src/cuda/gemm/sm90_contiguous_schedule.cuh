// The work of sfmoe's contiguous grouped GEMM kernels (sm90_contiguous_grouped_gemm.cu for BF16,
// sm90_contiguous_blockwise_gemm.cu for FP8 blockwise; docs/grouped_gemm.md): each group's rows in
// 128-row tiles from the group's own first row (the offsets need no alignment and nothing is
// padded), numbered as units of work on the device, and a persistent CTA's (or cluster's) walk
// over them. A tile's last rows may belong to the next group or lie past the capacity; the kernels
// compute them and never store them.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/arch/barrier.h>

#include <cute/tensor.hpp>

#include "src/common/group_offsets.h"
#include "src/common/grouped_gemm_args.h"
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"
#include "src/cuda/gemm/sm90_warp_specialized.cuh"

namespace sfmoe {
namespace cuda {
namespace contiguous {

constexpr int kTileM = 128;

// One tile of work: its group, N block, first row and the group's rows in it (at most kTileM;
// none or fewer than a warp group's 64 for a group's last tile: see the consumers), and whether
// the cluster's CTAs share its A tile (else its B tile).
struct WorkTile {
  int group, n_block, row0, rows;
  bool share_a;
};

// A group's units of work, one tile per CTA of the cluster each. One CTA: its M x N tiles. Two:
// pairs of neighbouring M tiles for each N block (the pair shares B), then for an odd M tile count
// the last M tile in pairs of neighbouring N blocks (the pair shares A; when the N blocks are odd
// too, the last of these leaves one CTA without a tile).
template <int kCluster>
__device__ __forceinline__ int units_of_group(int m_tiles, int n_tiles) {
  if (kCluster == 1) return m_tiles * n_tiles;
  return (m_tiles / 2) * n_tiles + (m_tiles % 2) * ((n_tiles + 1) / 2);
}

// The tile of unit `unit` for the CTA of rank `rank` in its cluster; unit_start: each group's
// first unit (an exclusive prefix of units_of_group).
template <int kCluster>
__device__ __forceinline__ WorkTile locate(const int* unit_start, const int* row_begin,
                                           const int* row_end, int groups, int n_tiles, int unit,
                                           int rank) {
  // The group is the last whose first unit is at most `unit` (empty groups skipped).
  const int lo = static_cast<int>(group_of_offset_row(unit_start, groups, unit));
  const int local = unit - unit_start[lo];
  const int m_tiles = (row_end[lo] - row_begin[lo] + kTileM - 1) / kTileM;
  WorkTile w;
  w.group = lo;
  int m_tile;
  if (kCluster == 1) {  // M tiles fastest: the CTAs of a wave share B tiles and rows in L2
    w.n_block = local / m_tiles;
    m_tile = local % m_tiles;
    w.share_a = false;
  } else if (local < (m_tiles / 2) * n_tiles) {
    const int pairs = m_tiles / 2;
    w.n_block = local / pairs;
    m_tile = (local % pairs) * 2 + rank;
    w.share_a = false;
  } else {
    w.n_block = (local - (m_tiles / 2) * n_tiles) * 2 + rank;
    m_tile = m_tiles - 1;
    w.share_a = true;
  }
  w.row0 = row_begin[lo] + m_tile * kTileM;
  w.rows = w.n_block < n_tiles ? min(kTileM, row_end[lo] - w.row0) : 0;
  return w;
}

// Each group's rows (clamped into the capacity as the other kernels do; block 0 reports bad
// offsets) and the exclusive prefix of their units of work for n_tiles N blocks, written to shared
// memory by all of the CTA's threads. The caller synchronizes before reading them.
template <int kCluster>
__device__ __forceinline__ void schedule_groups(const GroupedGemmDeviceArgs& args, int thread,
                                                int n_tiles,
                                                warp_specialized::GroupScan::TempStorage& scan,
                                                int* unit_start, int* row_begin, int* row_end) {
  GroupedGemmDeviceArgs a = args;
  if (blockIdx.x != 0) a.word = nullptr;
  warp_specialized::prefix_units(
      thread, static_cast<int>(a.num_groups), scan, unit_start, [&](int g) {
        int64_t lo, hi;
        grouped_gemm_detail::group_rows(a, g, &lo, &hi);
        row_begin[g] = static_cast<int>(lo);
        row_end[g] = static_cast<int>(hi);
        const int m_tiles = static_cast<int>((hi - lo + kTileM - 1) / kTileM);
        return units_of_group<kCluster>(m_tiles, n_tiles);
      });
}

// The epilogue of a tile: consumer warp group `consumer`'s 64 rows of the FP32 accumulators
// converted to BF16 into the staging buffer (`staged`, kTileM x kN at row pitch kPitch: 16 bytes of
// padding put a fragment's 8 rows on distinct banks; `staged_of_thread`, the thread's part of it
// as the MMA partitions it), then the group's rows of them (w.rows) stored to `out` (row pitch
// ld_out, gemm_n columns), 16 bytes a store, a warp writing 512 contiguous bytes (one asynchronous
// bulk copy per row instead measured 1.2% slower over the benchmark's cases). in_group: the
// thread's index in its warp group.
template <int kN, int kPitch, class Accumulators, class StagedOfThread>
__device__ __forceinline__ void store_tile_rows(const Accumulators& accumulators,
                                                StagedOfThread& staged_of_thread,
                                                const grouped_gemm_detail::Bf16* staged,
                                                const WorkTile& w, int consumer, int in_group,
                                                grouped_gemm_detail::Bf16* out, int64_t ld_out,
                                                int gemm_n) {
  using grouped_gemm_detail::Bf16;
  constexpr int kChunksPerRow = kN / 8;  // 16-byte chunks
  // The previous tile's rows of this warp group have left the staging buffer.
  cutlass::arch::NamedBarrier::arrive_and_wait(128, consumer);
  auto converted = cute::make_tensor_like<Bf16>(accumulators);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < cute::size(accumulators); ++i) converted(i) = Bf16(accumulators(i));
  cute::copy(converted, staged_of_thread);
  cutlass::arch::NamedBarrier::arrive_and_wait(128, consumer);
  const int col0 = w.n_block * kN;
#pragma unroll 4
  for (int c = in_group; c < 64 * kChunksPerRow; c += 128) {
    const int r = consumer * 64 + c / kChunksPerRow;
    const int chunk = c % kChunksPerRow;
    const int col = col0 + chunk * 8;
    if (r < w.rows && col < gemm_n) {
      const uint4 v = *reinterpret_cast<const uint4*>(&staged[r * kPitch + chunk * 8]);
      *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(w.row0) + r) * ld_out + col) = v;
    }
  }
}

// A bound on the units of a call (every group adds at most one partial M tile), which the launch
// takes as its grid's bound: no more clusters than units.
inline int64_t unit_bound(int64_t row_capacity, int64_t groups, int64_t n_tiles) {
  return ((row_capacity + kTileM - 1) / kTileM + groups) * n_tiles;
}

}  // namespace contiguous
}  // namespace cuda
}  // namespace sfmoe
