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
  int64_t world, experts_per_rank, top_k, row_alignment, receive_capacity;
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
  r.world = s.world;
  r.experts_per_rank = s.experts_per_rank;
  r.top_k = s.top_k;
  r.row_alignment = s.row_alignment;
  r.receive_capacity = s.receive_capacity;
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
  int64_t lo = 0, hi = r.world - 1;
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
  const int64_t d = blockIdx.x, E = r.world * r.experts_per_rank;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) r.dropped[d][e] = 0;
  for (int64_t e = threadIdx.x; e < r.experts_per_rank; e += blockDim.x) {
    r.kept[d][e] = 0;
    r.routed[d][e] = 0;
  }
}

// Block d: the slots sent to rank d in order; the first receive_capacity kept (send_rank = d),
// the others dropped and counted. Block 0 also marks the slots with invalid ids.
__global__ void __launch_bounds__(kRouteThreads)
    ep_keep_kernel(EpRanks r, bool trap, sfmoe_fault_report* word) {
  using Scan = cub::BlockScan<int64_t, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t running;
  const int64_t d = blockIdx.x, El = r.experts_per_rank, E = r.world * El;
  const int64_t total = r.slot_start[r.world];
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
      if (running + position < r.receive_capacity) {
        r.send_rank[s][slot] = static_cast<int32_t>(d);
        atomicAdd(reinterpret_cast<unsigned long long*>(&r.kept[d][local_expert]), 1ull);
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

// Block d: its local experts' padded blocks.
__global__ void ep_offsets_kernel(EpRanks r) {
  if (threadIdx.x != 0) return;
  const int64_t d = blockIdx.x, a = r.row_alignment;
  int64_t row = 0;
  for (int64_t e = 0; e < r.experts_per_rank; ++e) {
    r.offsets[d][e] = row;
    row += (r.kept[d][e] + a - 1) / a * a;
  }
  r.offsets[d][r.experts_per_rank] = row;
}

// Block e (global expert): its kept slots in order get the rows of its block.
__global__ void __launch_bounds__(kRouteThreads) ep_rows_kernel(EpRanks r) {
  using Scan = cub::BlockScan<int64_t, kRouteThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t running;
  const int64_t e = blockIdx.x, El = r.experts_per_rank, d = e / El;
  const int64_t total = r.slot_start[r.world], base = r.offsets[d][e % El];
  if (threadIdx.x == 0) running = 0;
  __syncthreads();
  for (int64_t first = 0; first < total; first += kRouteThreads) {
    const int64_t g = first + threadIdx.x;
    int64_t s = 0, slot = 0;
    bool mine = false;
    if (g < total) {
      s = source_of(r, g, &slot);
      mine = r.ids[s][slot] == e && r.send_rank[s][slot] == d;
    }
    int64_t position = 0, count = 0;
    Scan(scan).ExclusiveSum(mine ? int64_t{1} : int64_t{0}, position, count);
    if (mine) r.send_row[s][slot] = base + running + position;
    __syncthreads();
    if (threadIdx.x == 0) running += count;
    __syncthreads();
  }
}

// The moves' per-rank pointers.
struct EpMovePointers {
  int64_t world, top_k, hidden, experts_per_rank, receive_rows;
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
  int64_t lo = 0, hi = m.world - 1;
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

// Blocks [0, N tokens): each token's kept slots written at their destinations (weighted), and,
// with rows, each slot's d prob in the lanes' order of src/common/ep_args.h (a thread per lane,
// kVec-element chunks, then the halving tree in shared memory). Blocks after: each (rank, local
// expert)'s padding rows zeroed.
static_assert(kMoveThreads == kEpDotLanes, "a thread per d-prob lane");
template <int kVec>
__global__ void __launch_bounds__(kMoveThreads)
    ep_scatter_kernel(EpMovePointers m, sfmoe_dtype in_dtype, sfmoe_dtype rows_dtype,
                      sfmoe_dtype out_dtype) {
  __shared__ float lanes[kMoveThreads];
  const int64_t b = blockIdx.x, tokens = m.token_start[m.world], H = m.hidden, k = m.top_k;
  if (b >= tokens) {
    const int64_t pad = b - tokens, d = pad / m.experts_per_rank, e = pad % m.experts_per_rank;
    const int64_t begin = m.offsets[d][e] + m.kept[d][e], end = m.offsets[d][e + 1];
    for (int64_t i = begin * H + threadIdx.x; i < end * H; i += kMoveThreads) {
      store_element(m.out_rows[d], out_dtype, i, 0.0f);
    }
    return;
  }
  int64_t t = 0;
  const int64_t s = token_source(m, b, &t);
  const bool weighted = m.probs[s] != nullptr;
  const int64_t chunks = H / kVec;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
    if (!ep_slot_sent(d, row, m.world, m.receive_rows)) continue;
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
    const bool sent = ep_slot_sent(d, row, m.world, m.receive_rows);
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
  const int64_t b = blockIdx.x, H = m.hidden, k = m.top_k, chunks = H / kVec;
  int64_t t = 0;
  const int64_t s = token_source(m, b, &t);
  for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
    float sum[kVec];
#pragma unroll
    for (int q = 0; q < kVec; ++q) sum[q] = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = t * k + i, d = m.send_rank[s][slot], row = m.send_row[s][slot];
      if (!ep_slot_sent(d, row, m.world, m.receive_rows)) continue;
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
  m.world = s.world;
  m.top_k = s.top_k;
  m.hidden = hidden;
  m.experts_per_rank = s.experts_per_rank;
  m.receive_rows = s.receive_rows;
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
  for (int64_t q = 0; q < a.shape.world; ++q) {
    m.token_rows[q] = a.token_rows[q];
    m.probs[q] = a.probs != nullptr ? a.probs[q] : nullptr;
    m.d_probs[q] = a.d_probs != nullptr ? a.d_probs[q] : nullptr;
    m.rows[q] = a.rows != nullptr ? a.rows[q] : nullptr;
    m.out_rows[q] = a.out_rows[q];
  }
  const int64_t blocks = m.token_start[a.shape.world] + a.shape.world * a.shape.experts_per_rank;
  const auto kernel = ep_dot_vector(a.hidden) == 8 ? ep_scatter_kernel<8> : ep_scatter_kernel<1>;
  kernel<<<static_cast<unsigned>(blocks), kMoveThreads, 0,
           static_cast<cudaStream_t>(stream_pointer)>>>(m, a.token_dtype, a.rows_dtype,
                                                        a.out_dtype);
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
