// Expert parallelism, the loopback transport on the device (docs/ep.md): every rank's buffers on
// one GPU, the routing and the row movements of src/common/ep_args.h with the CPU reference's
// bits. The routing is written for correctness first: a block per destination rank walks every
// slot in (source rank, token, slot) order with block scans to find the kept ones, then a block
// per global expert walks them again for the rows (work R N and E N over N slots; the moves are
// what a step spends its time on). The moves are a block per token over its k slots in 16-byte
// vectors, FP32 sums in slot order, and d probs in the lanes' order the CPU follows too: the CPU's
// bits everywhere.
#include <stdint.h>

#include <cub/block/block_scan.cuh>

#include "src/common/ep_args.h"
#include "src/common/fault.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/common/vector_io.h"

namespace sfmoe {
namespace cuda {
namespace {

constexpr int kRouteThreads = 1024;
constexpr int kMoveThreads = 256;

// Every rank's pointers, by value (the kernel parameter space holds them: no host array is read
// at replay, so the calls capture in a graph).
struct EpRanks {
  EpShape s;
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

__global__ void ep_clear_kernel(EpRanks r) {
  const int64_t d = blockIdx.x, E = r.s.world * r.s.experts_per_rank;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) r.dropped[d][e] = 0;
  for (int64_t e = threadIdx.x; e < r.s.experts_per_rank; e += blockDim.x) r.routed[d][e] = 0;
  for (int64_t g = threadIdx.x; g < r.s.rounds * r.s.experts_per_rank; g += blockDim.x) {
    r.kept[d][g] = 0;
  }
}

// Block d: the slots sent to rank d in order; the first receive_capacity kept in the first
// round, (SPILL) the next spill_capacity in the second (send_rank = d, send_row = the round for
// now), the others dropped and counted. Block 0 also marks the slots with invalid ids.
__global__ void __launch_bounds__(kRouteThreads)
    ep_keep_kernel(EpRanks r, bool trap, sfmoe_fault_report* word) {
  using Scan = cub::BlockScan<int64_t, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t running;
  const int64_t d = blockIdx.x, El = r.s.experts_per_rank, E = r.s.world * El;
  const int64_t total = r.slot_start[r.s.world];
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t first = 0; first < total; first += kRouteThreads) {
    const int64_t g = first + threadIdx.x;
    int64_t s = 0, slot = 0;
    int32_t e = -1;
    if (g < total) {
      s = source_of(r, g, &slot);
      e = r.ids[s][slot];
      if (e < 0 || e >= E) {
        if (d == 0) {
          r.send_rank[s][slot] = -1;
          r.send_row[s][slot] = -1;
          if (word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, s, e);
        }
        e = -1;
      }
    }
    const bool mine = e >= 0 && e / El == d;
    int64_t position = 0, count = 0;
    Scan(scan).ExclusiveSum(mine ? int64_t{1} : int64_t{0}, position, count);
    if (mine) {
      const int64_t local_expert = e % El;
      atomicAdd(reinterpret_cast<unsigned long long*>(&r.routed[d][local_expert]), 1ull);
      const int64_t round = ep_round_of(r.s, running + position);
      if (round >= 0) {
        r.send_rank[s][slot] = static_cast<int32_t>(d);
        r.send_row[s][slot] = round;
        atomicAdd(reinterpret_cast<unsigned long long*>(&r.kept[d][round * El + local_expert]),
                  1ull);
      } else {
        r.send_rank[s][slot] = -1;
        r.send_row[s][slot] = -1;
        atomicAdd(reinterpret_cast<unsigned long long*>(&r.dropped[s][e]), 1ull);
        if (trap && word != nullptr) raise_fault(word, SFMOE_FAULT_EP_OVERFLOW, d, e);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) running += count;
    __syncthreads();
  }
}

// Block d: its groups' padded blocks, round by round.
__global__ void ep_offsets_kernel(EpRanks r) {
  if (threadIdx.x != 0) return;
  const int64_t d = blockIdx.x, a = r.s.row_alignment, El = r.s.experts_per_rank;
  for (int64_t round = 0; round < r.s.rounds; ++round) {
    int64_t* offsets = r.offsets[d] + round * (El + 1);
    int64_t row = 0;
    for (int64_t e = 0; e < El; ++e) {
      offsets[e] = row;
      row += (r.kept[d][round * El + e] + a - 1) / a * a;
    }
    offsets[El] = row;
  }
}

// Block e (global expert): its kept slots in order get the rows of its blocks, both rounds in one
// scan (the first round's count in the low 32 bits, the second's above: a rank's slots fit).
__global__ void __launch_bounds__(kRouteThreads) ep_rows_kernel(EpRanks r) {
  using Scan = cub::BlockScan<int64_t, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t running;
  constexpr int64_t kSecond = int64_t{1} << 32;
  const int64_t e = blockIdx.x, El = r.s.experts_per_rank, d = e / El, local = e % El;
  const int64_t total = r.slot_start[r.s.world];
  const int64_t base0 = ep_group_begin(r.s, r.offsets[d], local);
  const int64_t base1 = r.s.rounds > 1 ? ep_group_begin(r.s, r.offsets[d], El + local) : 0;
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t first = 0; first < total; first += kRouteThreads) {
    const int64_t g = first + threadIdx.x;
    int64_t s = 0, slot = 0, round = 0;
    bool mine = false;
    if (g < total) {
      s = source_of(r, g, &slot);
      mine = r.ids[s][slot] == e && r.send_rank[s][slot] == d;
      if (mine) round = r.send_row[s][slot];
    }
    int64_t position = 0, count = 0;
    Scan(scan).ExclusiveSum(mine ? (round == 0 ? int64_t{1} : kSecond) : int64_t{0}, position,
                            count);
    if (mine) {
      const int64_t at = running + position;
      r.send_row[s][slot] = round == 0 ? base0 + (at & (kSecond - 1)) : base1 + (at >> 32);
    }
    __syncthreads();
    if (threadIdx.x == 0) running += count;
    __syncthreads();
  }
}

// The moves' per-rank pointers.
struct EpMovePointers {
  EpShape s;
  int64_t hidden, row_bytes, scale_bytes;  // (row_bytes: scatter's output rows)
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

// `bytes` bytes from src to dst (both 16-byte aligned at the row's start when the width
// allows), by the block, in the widest unit the width divides into.
__device__ __forceinline__ void copy_row_bytes(uint8_t* dst, const uint8_t* src, int64_t bytes) {
  if (bytes % 16 == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else if (bytes % 4 == 0) {
    for (int64_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) {
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
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

// Blocks [0, N tokens): each token's kept slots written at their destinations (dispatch: the
// bytes as they are, the scales beside them; combine's backward: weighted), and, with rows, each
// slot's d prob in the lanes' order of src/common/ep_args.h (a thread per lane, kVec-element
// chunks, then the halving tree in shared memory). Blocks after: each (rank, group)'s padding rows
// zeroed, their scales too.
static_assert(kMoveThreads == kEpDotLanes, "a thread per d-prob lane");
template <int kVec>
__global__ void __launch_bounds__(kMoveThreads)
    ep_scatter_kernel(EpMovePointers m, sfmoe_dtype in_dtype, sfmoe_dtype rows_dtype,
                      sfmoe_dtype out_dtype, bool bytes) {
  __shared__ float lanes[kMoveThreads];
  const int64_t b = blockIdx.x, tokens = m.token_start[m.s.world], H = m.hidden, k = m.s.top_k;
  const int64_t row_bytes = m.row_bytes;
  if (b >= tokens) {
    const int64_t groups = m.s.rounds * m.s.experts_per_rank;
    const int64_t pad = b - tokens, d = pad / groups, g = pad % groups;
    const int64_t begin = ep_group_begin(m.s, m.offsets[d], g) + m.kept[d][g];
    const int64_t end = min(ep_group_end(m.s, m.offsets[d], g), m.s.receive_rows);
    for (int64_t row = begin; row < end; ++row) {
      zero_row_bytes(static_cast<uint8_t*>(m.out_rows[d]) + row * row_bytes, row_bytes);
      if (m.scale_bytes > 0) {
        zero_row_bytes(static_cast<uint8_t*>(m.out_scales[d]) + row * m.scale_bytes, m.scale_bytes);
      }
    }
    return;
  }
  int64_t t = 0;
  const int64_t s = token_source(m, b, &t);
  const bool weighted = m.probs[s] != nullptr;
  const int64_t chunks = H / kVec;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
    if (!ep_slot_sent(d, row, m.s.world, m.s.receive_rows)) continue;
    if (bytes) {
      copy_row_bytes(static_cast<uint8_t*>(m.out_rows[d]) + row * row_bytes,
                     static_cast<const uint8_t*>(m.token_rows[s]) + t * row_bytes, row_bytes);
      if (m.scale_bytes > 0) {
        copy_row_bytes(static_cast<uint8_t*>(m.out_scales[d]) + row * m.scale_bytes,
                       static_cast<const uint8_t*>(m.token_scales[s]) + t * m.scale_bytes,
                       m.scale_bytes);
      }
      continue;
    }
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

}  // namespace

sfmoe_status ep_route(const EpRouteArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpShape& s = a.shape;
  const EpRanks r = ranks_of(s, a.tokens, a.topk_ids, a.routing);
  const unsigned R = static_cast<unsigned>(s.world);
  ep_clear_kernel<<<R, 256, 0, stream>>>(r);
  SFMOE_RETURN_IF_ERROR(check_launch("ep_clear_kernel"));
  ep_keep_kernel<<<R, kRouteThreads, 0, stream>>>(r, a.trap, a.word);
  SFMOE_RETURN_IF_ERROR(check_launch("ep_keep_kernel"));
  ep_offsets_kernel<<<R, 32, 0, stream>>>(r);
  SFMOE_RETURN_IF_ERROR(check_launch("ep_offsets_kernel"));
  ep_rows_kernel<<<static_cast<unsigned>(s.world * s.experts_per_rank), kRouteThreads, 0, stream>>>(
      r);
  return check_launch("ep_rows_kernel");
}

sfmoe_status ep_scatter(const EpScatterArgs& a, void* stream_pointer) {
  EpMovePointers m = move_pointers(a.shape, a.hidden, a.tokens, a.routing);
  m.scale_bytes = a.scale_bytes;
  m.row_bytes = a.hidden * sfmoe_dtype_bits(a.out_dtype) / 8;
  for (int64_t q = 0; q < a.shape.world; ++q) {
    m.token_scales[q] = a.token_scales != nullptr ? a.token_scales[q] : nullptr;
    m.out_scales[q] = a.out_scales != nullptr ? a.out_scales[q] : nullptr;
    m.token_rows[q] = a.token_rows[q];
    m.probs[q] = a.probs != nullptr ? a.probs[q] : nullptr;
    m.d_probs[q] = a.d_probs != nullptr ? a.d_probs[q] : nullptr;
    m.rows[q] = a.rows != nullptr ? a.rows[q] : nullptr;
    m.out_rows[q] = a.out_rows[q];
  }
  const int64_t blocks =
      m.token_start[a.shape.world] + a.shape.world * a.shape.rounds * a.shape.experts_per_rank;
  const bool bytes = a.probs == nullptr && a.token_dtype == a.out_dtype;
  const auto kernel = ep_dot_vector(a.hidden) == 8 ? ep_scatter_kernel<8> : ep_scatter_kernel<1>;
  kernel<<<static_cast<unsigned>(blocks), kMoveThreads, 0,
           static_cast<cudaStream_t>(stream_pointer)>>>(m, a.token_dtype, a.rows_dtype, a.out_dtype,
                                                        bytes);
  return check_launch("ep_scatter_kernel");
}

sfmoe_status ep_gather(const EpGatherArgs& a, void* stream_pointer) {
  EpMovePointers m = move_pointers(a.shape, a.hidden, a.tokens, a.routing);
  for (int64_t q = 0; q < a.shape.world; ++q) {
    m.rows[q] = a.rows[q];
    m.probs[q] = a.probs != nullptr ? a.probs[q] : nullptr;
    m.token_out[q] = a.out[q];
  }
  const int64_t blocks = m.token_start[a.shape.world];
  if (blocks == 0) return SFMOE_SUCCESS;
  const auto kernel = a.hidden % 8 == 0 ? ep_gather_kernel<8> : ep_gather_kernel<1>;
  kernel<<<static_cast<unsigned>(blocks), kMoveThreads, 0,
           static_cast<cudaStream_t>(stream_pointer)>>>(m, a.rows_dtype, a.out_dtype);
  return check_launch("ep_gather_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
