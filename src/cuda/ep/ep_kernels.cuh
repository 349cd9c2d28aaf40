// The device kernels both expert-parallel transports share (src/cuda/ep/ep_loopback.cu, every rank
// in this process; src/cuda/ep/ep_exchange.cu, one rank a process): the routing's chunk ranks and
// their prefix, and the row moves between token rows and destination rows (docs/ep.md).
#pragma once

#include <stdint.h>

#include <cub/block/block_discontinuity.cuh>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "src/common/ep_args.h"
#include "src/common/fault.h"
#include "src/cuda/common/vector_io.h"

namespace sfmoe {
namespace cuda {
namespace {

constexpr int kRouteThreads = 256, kRouteItems = 4;
static_assert(kRouteThreads * kRouteItems == kEpRouteChunk, "a chunk per routing block");
constexpr int kMoveThreads = 256;

// Every rank's pointers, by value (the kernel parameter space holds them: no host array is read
// at replay, so the calls capture in a graph).
struct EpRanks {
  EpShape s;
  int64_t rank_base;  // the rank of source 0 (this process's rank with an exchange), for reports
  int64_t slot_start[kMaxDeviceEpRanks + 1];  // source r's slots are [start[r], start[r + 1])
  const int32_t* ids[kMaxDeviceEpRanks];
  int32_t* send_rank[kMaxDeviceEpRanks];
  int64_t* send_row[kMaxDeviceEpRanks];
  int64_t* offsets[kMaxDeviceEpRanks];
  int64_t* kept[kMaxDeviceEpRanks];
  int64_t* routed[kMaxDeviceEpRanks];
  int64_t* dropped[kMaxDeviceEpRanks];
};

EpRanks ranks_of(const EpShape& s, const int64_t* tokens, const int32_t* const* ids,
                 const EpRankRouting* routing) {
  EpRanks r{};
  r.s = s;
  r.slot_start[0] = 0;
  for (int64_t q = 0; q < s.world; ++q) {
    r.slot_start[q + 1] = r.slot_start[q] + tokens[q] * s.top_k;
    r.ids[q] = ids != nullptr ? ids[q] : nullptr;
    r.send_rank[q] = routing[q].send_rank;
    r.send_row[q] = routing[q].send_row;
    r.offsets[q] = routing[q].offsets;
    r.kept[q] = routing[q].kept;
    r.routed[q] = routing[q].routed;
    r.dropped[q] = routing[q].dropped;
  }
  return r;
}

// The source rank of global slot g, and its slot within that rank.
__device__ __forceinline__ int64_t source_of(const EpRanks& r, int64_t g, int64_t* local) {
  int64_t lo = 0, hi = r.s.world - 1;
  while (lo < hi) {  // the last rank whose start is <= g (ranks without slots share starts)
    const int64_t mid = (lo + hi + 1) / 2;
    if (r.slot_start[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *local = g - r.slot_start[lo];
  return lo;
}

// Chunk c (kEpRouteChunk slots, four per thread in order): each slot's rank among the chunk's
// earlier slots naming the same global expert (into send_row) and the same destination rank (into
// send_rank), by two stable block radix sorts; and the chunk's count of each key (experts, then
// ranks) into the scratch's column c. Slots with invalid ids are marked and reported here.
using RouteSort = cub::BlockRadixSort<uint32_t, kRouteThreads, kRouteItems, int32_t>;
using RouteFlags = cub::BlockDiscontinuity<uint32_t, kRouteThreads>;
using RouteScan = cub::BlockScan<int32_t, kRouteThreads>;
union RouteTemp {
  typename RouteSort::TempStorage sort;
  struct {
    typename RouteFlags::TempStorage flags;
    typename RouteScan::TempStorage scan;
  } after;
};

struct KeysDiffer {
  __device__ bool operator()(uint32_t a, uint32_t b) const { return a != b; }
};
struct Larger {
  __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

// The keys' stable ranks (keys >= limit: padding) into rank_of[item], the counts of keys < limit
// into counts[(first_key + key) chunks + c].
__device__ void rank_chunk(RouteTemp& temp, uint32_t (&keys)[kRouteItems],
                           int32_t (&items)[kRouteItems], uint32_t limit, int32_t bits,
                           int32_t* rank_of, int32_t* counts, int64_t first_key, int64_t chunks,
                           int64_t c) {
  RouteSort(temp.sort).Sort(keys, items, 0, bits);
  __syncthreads();
  int32_t heads[kRouteItems], tails[kRouteItems], start[kRouteItems];
  RouteFlags(temp.after.flags).FlagHeadsAndTails(heads, tails, keys, KeysDiffer());
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    start[i] = heads[i] ? static_cast<int32_t>(threadIdx.x) * kRouteItems + i : 0;
  }
  RouteScan(temp.after.scan).InclusiveScan(start, start, Larger());
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    const int32_t position = static_cast<int32_t>(threadIdx.x) * kRouteItems + i;
    rank_of[items[i]] = position - start[i];
    if (tails[i] && keys[i] < limit) {
      counts[(first_key + keys[i]) * chunks + c] = position - start[i] + 1;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kRouteThreads)
    ep_rank_chunks_kernel(EpRanks r, int32_t* counts, int64_t chunks, sfmoe_fault_report* word) {
  __shared__ RouteTemp temp;
  __shared__ int32_t rank_of[kEpRouteChunk];
  const int64_t c = blockIdx.x, El = r.s.experts_per_rank, R = r.s.world, E = R * El;
  const int64_t total = r.slot_start[R], first = c * kEpRouteChunk;
  for (int64_t key = threadIdx.x; key < E + R; key += kRouteThreads) counts[key * chunks + c] = 0;
  uint32_t expert[kRouteItems], dest[kRouteItems];
  int32_t items[kRouteItems];
  int64_t source[kRouteItems], slot[kRouteItems];
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    items[i] = static_cast<int32_t>(threadIdx.x) * kRouteItems + i;
    const int64_t g = first + items[i];
    expert[i] = static_cast<uint32_t>(E);  // padding: sorts last, counted nowhere
    dest[i] = static_cast<uint32_t>(R);
    source[i] = -1;
    if (g < total) {
      source[i] = source_of(r, g, &slot[i]);
      const int32_t e = r.ids[source[i]][slot[i]];
      // A token names an expert at most once: a second naming is a bad entry, skipped as an id
      // out of range is (the host refuses both), so that no (token, expert) pair has two rows.
      bool named_before = false;
      for (int64_t j = slot[i] / r.s.top_k * r.s.top_k; j < slot[i]; ++j) {
        named_before |= r.ids[source[i]][j] == e;
      }
      if (e < 0 || e >= E || named_before) {
        r.send_rank[source[i]][slot[i]] = -1;
        r.send_row[source[i]][slot[i]] = -1;
        if (word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, r.rank_base + source[i], e);
        source[i] = -1;
      } else {
        expert[i] = static_cast<uint32_t>(e);
        dest[i] = static_cast<uint32_t>(e / El);
      }
    }
  }
  int32_t bits = 1, dest_bits = 1;
  while ((int64_t{1} << bits) <= E) ++bits;
  while ((int64_t{1} << dest_bits) <= R) ++dest_bits;
  __syncthreads();  // (the counts zeroed before the tails write theirs)
  uint32_t keys[kRouteItems];
  int32_t order[kRouteItems];
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    keys[i] = expert[i];
    order[i] = items[i];
  }
  rank_chunk(temp, keys, order, static_cast<uint32_t>(E), bits, rank_of, counts, 0, chunks, c);
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    if (source[i] >= 0) r.send_row[source[i]][slot[i]] = rank_of[items[i]];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    keys[i] = dest[i];
    order[i] = items[i];
  }
  rank_chunk(temp, keys, order, static_cast<uint32_t>(R), dest_bits, rank_of, counts, E, chunks, c);
#pragma unroll
  for (int i = 0; i < kRouteItems; ++i) {
    if (source[i] >= 0) r.send_rank[source[i]][slot[i]] = rank_of[items[i]];
  }
}

// Block per key (experts, then ranks): its counts' exclusive prefix over the chunks, in place;
// an expert's total is what its rank was sent (routed).
__global__ void __launch_bounds__(kRouteThreads)
    ep_scan_chunks_kernel(EpRanks r, int32_t* counts, int64_t chunks) {
  __shared__ typename RouteScan::TempStorage scan;
  __shared__ int32_t running;
  const int64_t key = blockIdx.x, El = r.s.experts_per_rank, E = r.s.world * El;
  int32_t* row = counts + key * chunks;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t first = 0; first < chunks; first += kRouteThreads) {
    const int64_t c = first + threadIdx.x;
    const int32_t v = c < chunks ? row[c] : 0;
    int32_t prefix = 0, sum = 0;
    RouteScan(scan).ExclusiveSum(v, prefix, sum);
    if (c < chunks) row[c] = running + prefix;
    __syncthreads();
    if (threadIdx.x == 0) running += sum;
    __syncthreads();
  }
  if (threadIdx.x == 0 && key < E) r.routed[key / El][key % El] = running;
}

// The moves' per-rank pointers.
struct EpMovePointers {
  EpShape s;
  int64_t hidden, row_bytes, scale_bytes;  // (row_bytes: scatter's output rows)
  int64_t padding_blocks;                  // scatter: blocks zeroing the groups' padding rows
  const void* token_scales[kMaxDeviceEpRanks];
  void* out_scales[kMaxDeviceEpRanks];
  int64_t token_start[kMaxDeviceEpRanks + 1];  // source r's tokens are blocks [start[r], ...)
  const void* token_rows[kMaxDeviceEpRanks];
  void* token_out[kMaxDeviceEpRanks];
  const float* probs[kMaxDeviceEpRanks];
  float* d_probs[kMaxDeviceEpRanks];
  const void* rows[kMaxDeviceEpRanks];
  void* out_rows[kMaxDeviceEpRanks];
  const int32_t* send_rank[kMaxDeviceEpRanks];
  const int64_t* send_row[kMaxDeviceEpRanks];
  const int64_t* offsets[kMaxDeviceEpRanks];
  const int64_t* kept[kMaxDeviceEpRanks];
};

__device__ __forceinline__ int64_t token_source(const EpMovePointers& m, int64_t b,
                                                int64_t* token) {
  int64_t lo = 0, hi = m.s.world - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (m.token_start[mid] <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *token = b - m.token_start[lo];
  return lo;
}

// Dispatch's bytes: token t's row of `bytes` bytes (from `from[s]`) to each of its kept slots'
// rows (in `to[d]`), each unit read once and stored k times, in the widest unit the width
// divides into (rows are 16-byte aligned when the width is a multiple of 16).
template <class Unit>
__device__ __forceinline__ void scatter_units(const EpMovePointers& m, int64_t s, int64_t t,
                                              const void* from, void* const* to, int64_t bytes) {
  constexpr int kInFlight = 4;  // units loaded by a thread before its stores
  const int64_t units = bytes / static_cast<int64_t>(sizeof(Unit)), k = m.s.top_k;
  const int64_t step = blockDim.x;
  const Unit* src = reinterpret_cast<const Unit*>(static_cast<const uint8_t*>(from) + t * bytes);
  for (int64_t first = threadIdx.x; first < units; first += kInFlight * step) {
    Unit v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      if (first + j * step < units) v[j] = src[first + j * step];
    }
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
      if (!ep_slot_sent(d, row, m.s.world, m.s.receive_rows)) continue;
      Unit* dst = reinterpret_cast<Unit*>(static_cast<uint8_t*>(to[d]) + row * bytes);
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        if (first + j * step < units) dst[first + j * step] = v[j];
      }
    }
  }
}
__device__ __forceinline__ void scatter_bytes(const EpMovePointers& m, int64_t s, int64_t t,
                                              const void* from, void* const* to, int64_t bytes) {
  if (bytes % 16 == 0) {
    scatter_units<uint4>(m, s, t, from, to, bytes);
  } else if (bytes % 4 == 0) {
    scatter_units<uint32_t>(m, s, t, from, to, bytes);
  } else {
    scatter_units<uint8_t>(m, s, t, from, to, bytes);
  }
}
__device__ __forceinline__ void zero_row_bytes(uint8_t* dst, int64_t bytes) {
  if (bytes % 16 == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = 0;
  }
}

// The first m.padding_blocks blocks: each (rank, group)'s padding rows zeroed, their scales too
// (first, so that they run beside the tokens' blocks rather than as a tail after them). The
// blocks after, one per token: its kept slots written at their destinations (dispatch: the bytes
// as they are, the scales beside them; combine's backward: weighted), and, with rows, each slot's
// d prob in the lanes' order of src/common/ep_args.h (a thread per lane, kVec-element chunks, then
// the halving tree in shared memory).
static_assert(kMoveThreads == kEpDotLanes, "a thread per d-prob lane");
// (kBytes: dispatch's form, compiled apart so that its registers do not bound the other's
// occupancy: measured 10% on combine's backward when the two shared a kernel)
template <int kVec, bool kBytes>
__global__ void __launch_bounds__(kMoveThreads)
    ep_scatter_kernel(EpMovePointers m, sfmoe_dtype in_dtype, sfmoe_dtype rows_dtype,
                      sfmoe_dtype out_dtype) {
  __shared__ float lanes[kMoveThreads];
  const int64_t H = m.hidden, k = m.s.top_k;
  const int64_t row_bytes = m.row_bytes;
  if (blockIdx.x < m.padding_blocks) {
    const int64_t groups = m.s.rounds * m.s.experts_per_rank;
    const int64_t pad = blockIdx.x, d = pad / groups, g = pad % groups;
    const EpRows padding = ep_group_padding(m.s, m.offsets[d], m.kept[d], g);
    for (int64_t row = padding.begin; row < padding.end; ++row) {
      zero_row_bytes(static_cast<uint8_t*>(m.out_rows[d]) + row * row_bytes, row_bytes);
      if (m.scale_bytes > 0) {
        zero_row_bytes(static_cast<uint8_t*>(m.out_scales[d]) + row * m.scale_bytes, m.scale_bytes);
      }
    }
    return;
  }
  int64_t t = 0;
  const int64_t s = token_source(m, blockIdx.x - m.padding_blocks, &t);
  if (kBytes) {
    scatter_bytes(m, s, t, m.token_rows[s], m.out_rows, row_bytes);
    if (m.scale_bytes > 0) scatter_bytes(m, s, t, m.token_scales[s], m.out_scales, m.scale_bytes);
    return;
  }
  // Each slot's weighted row, then (with rows) each slot's d prob. (Measured: one pass doing
  // both was 3% slower at DeepSeek-V3 EP8, docs/KERNEL_NOTES.md.)
  const bool weighted = m.probs[s] != nullptr;
  const int64_t chunks = H / kVec;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
    if (!ep_slot_sent(d, row, m.s.world, m.s.receive_rows)) continue;
    const float w = weighted ? m.probs[s][slot] : 1.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
      float v[kVec];
      load_vector<kVec>(m.token_rows[s], in_dtype, t * H + c * kVec, v);
      if (weighted) {
#pragma unroll
        for (int q = 0; q < kVec; ++q) v[q] = numerics::mul_rn(w, v[q]);
      }
      store_vector<kVec>(m.out_rows[d], out_dtype, row * H + c * kVec, v);
    }
  }
  if (m.d_probs[s] == nullptr) return;
  for (int64_t i = 0; i < k; ++i) {  // (the block agrees on every branch below: one token)
    const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
    const bool sent = ep_slot_sent(d, row, m.s.world, m.s.receive_rows);
    float lane = 0.0f;
    if (sent && m.rows[d] != nullptr) {
      for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
        float v[kVec], y[kVec];
        load_vector<kVec>(m.token_rows[s], in_dtype, t * H + c * kVec, v);
        load_vector<kVec>(m.rows[d], rows_dtype, row * H + c * kVec, y);
#pragma unroll
        for (int q = 0; q < kVec; ++q) lane = numerics::add_rn(lane, numerics::mul_rn(v[q], y[q]));
      }
    }
    lanes[threadIdx.x] = lane;
    __syncthreads();
    for (int w = kMoveThreads / 2; w >= 1; w /= 2) {
      if (threadIdx.x < w)
        lanes[threadIdx.x] = numerics::add_rn(lanes[threadIdx.x], lanes[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) m.d_probs[s][slot] = sent ? lanes[0] : 0.0f;
    __syncthreads();
  }
}

// A block per token: the sum of its kept slots' rows, per element in slot order.
template <int kVec>
__global__ void __launch_bounds__(kMoveThreads)
    ep_gather_kernel(EpMovePointers m, sfmoe_dtype rows_dtype, sfmoe_dtype out_dtype) {
  const int64_t b = blockIdx.x, H = m.hidden, k = m.s.top_k, chunks = H / kVec;
  int64_t t = 0;
  const int64_t s = token_source(m, b, &t);
  for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
    float sum[kVec];
#pragma unroll
    for (int q = 0; q < kVec; ++q) sum[q] = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
      if (!ep_slot_sent(d, row, m.s.world, m.s.receive_rows)) continue;
      float v[kVec];
      load_vector<kVec>(m.rows[d], rows_dtype, row * H + c * kVec, v);
      const float p = m.probs[s] != nullptr ? m.probs[s][slot] : 1.0f;
#pragma unroll
      for (int q = 0; q < kVec; ++q) {
        sum[q] = numerics::add_rn(sum[q], m.probs[s] != nullptr ? numerics::mul_rn(p, v[q]) : v[q]);
      }
    }
    store_vector<kVec>(m.token_out[s], out_dtype, t * H + c * kVec, sum);
  }
}

EpMovePointers move_pointers(const EpShape& s, int64_t hidden, const int64_t* tokens,
                             const EpRankRouting* routing) {
  EpMovePointers m{};
  m.s = s;
  m.hidden = hidden;
  m.token_start[0] = 0;
  for (int64_t q = 0; q < s.world; ++q) {
    m.token_start[q + 1] = m.token_start[q] + tokens[q];
    m.send_rank[q] = routing[q].send_rank;
    m.send_row[q] = routing[q].send_row;
    m.offsets[q] = routing[q].offsets;
    m.kept[q] = routing[q].kept;
  }
  return m;
}

// A thread per slot: one value between the slot and its row (EpSlotValuesArgs).
__global__ void ep_slot_values_kernel(EpMovePointers m, bool to_rows) {
  const int64_t k = m.s.top_k, slots = m.token_start[m.s.world] * k;
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (g >= slots) return;
  int64_t t = 0;
  const int64_t s = token_source(m, g / k, &t), slot = t * k + g % k;
  const int64_t d = m.send_rank[s][slot], row = m.send_row[s][slot];
  const bool sent = ep_slot_sent(d, row, m.s.world, m.s.receive_rows);
  if (to_rows) {
    if (sent) m.d_probs[d][row] = m.probs[s][slot];
  } else {
    m.d_probs[s][slot] = sent ? m.probs[d][row] : 0.0f;
  }
}

}  // namespace
}  // namespace cuda
}  // namespace sfmoe
