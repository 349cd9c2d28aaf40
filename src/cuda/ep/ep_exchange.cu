// Expert parallelism with one rank a process (docs/ep.md, "Per-rank transports"): the routing and
// the moves of src/common/ep_args.h when the ranks meet only in an EpExchange (NCCL, or ranks
// emulated in one process), with the loopback's bits.
//
// Routing, on each rank s over its own slots: the chunk ranks of the loopback (by expert and by
// destination) and their prefix give each slot its place among s's slots; the ranks' per-expert
// counts are gathered, so that s knows how many rows every earlier rank sends each destination and
// each expert (its bases); each slot's position in its destination's (source, token, slot) list
// then decides kept, spilled or dropped exactly as one process holding every rank decides. The
// ranks' per-expert kept counts are gathered next, from which every rank knows every destination's
// blocks; each kept slot's row there is sent to the destination beside the rows.
//
// Moves: each pair of ranks has a block of pair_rows rows in the staging (its first rows the
// pair's kept slots in the source's (token, slot) order); blocks are exchanged whole (bytes
// proportional to the capacity, sizes fixed on the host), and the destination places each row
// at its row, or collects rows into the blocks for the way back. Sums over a token's slots run
// at the source in slot order; combine's backward d probs at the destination in the lanes' order:
// the loopback's bits.
#include <stdint.h>

#include "src/common/ep_args.h"
#include "src/common/fault.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/ep/ep_exchange.h"
#include "src/cuda/ep/ep_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

// This rank's slots as the loopback's routing kernels see them: one source, R destinations; the
// chunk scan's per-expert totals land in expert_counts.
EpRanks rank_view(const EpShape& s, int64_t rank, int64_t tokens, const int32_t* ids,
                  const EpRankRouting& routing) {
  EpRanks r{};
  r.s = s;
  r.rank_base = rank;
  r.slot_start[0] = 0;
  for (int64_t q = 1; q <= s.world; ++q) r.slot_start[q] = tokens * s.top_k;
  r.ids[0] = ids;
  r.send_rank[0] = routing.send_rank;
  r.send_row[0] = routing.send_row;
  for (int64_t q = 0; q < s.world; ++q)
    r.routed[q] = routing.expert_counts + q * s.experts_per_rank;
  return r;
}

// Also this rank into the handle (from the device with the EXTERNAL transport, whose program is
// the same on every rank), where the later kernels read it.
__global__ void rank_clear_kernel(EpRankRouting h, int64_t world, int64_t experts, int64_t rank,
                                  const int32_t* rank_device, sfmoe_fault_report* word) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *h.rank = ep_checked_rank(rank, rank_device, world, word);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < experts;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    h.dropped[e] = 0;
    h.expert_counts[e] = 0;
    h.expert_kept[2 * e] = 0;
    h.expert_kept[2 * e + 1] = 0;
  }
}

// One block: the rows ranks before this one send each expert (bases[R + e]) and each destination
// (bases[d], the sum over its experts).
__global__ void rank_bases_kernel(EpShape s, EpRankRouting h) {
  const int64_t rank = *h.rank;
  const int64_t R = s.world, El = s.experts_per_rank, E = R * El;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t before = 0;
    for (int64_t q = 0; q < rank; ++q) before += h.all_counts[q * E + e];
    h.bases[R + e] = before;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < R; d += blockDim.x) {
    int64_t before = 0;
    for (int64_t l = 0; l < El; ++l) before += h.bases[R + d * El + l];
    h.bases[d] = before;
  }
}

// A thread per slot: its position in its destination's list and its expert's; kept (send_row =
// its row in the pair's block: the position past what earlier ranks send there) or dropped.
__global__ void rank_keep_kernel(EpShape s, int64_t slots, const int32_t* ids, EpRankRouting h,
                                 const int32_t* counts, int64_t chunks, int64_t pair_rows,
                                 bool trap, sfmoe_fault_report* word) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t R = s.world, El = s.experts_per_rank, E = R * El;
  if (g >= slots) return;
  const int32_t e = ids[g];
  if (e < 0 || e >= E) return;  // (marked by the chunk kernel)
  const int64_t d = e / El, c = g / kEpRouteChunk;
  const int64_t position = h.bases[d] + counts[(E + d) * chunks + c] + h.send_rank[g];
  // (among this rank's slots to e: every earlier one is kept when this one is, the drops being a
  // suffix of the destination's list and of each pair's; the earlier ranks' kept rows of e are
  // added once every rank's kept counts are known, rank_blocks_kernel)
  const int64_t in_expert = counts[e * chunks + c] + h.send_row[g];
  // (a pair's block holds every row a source can send one rank, min(T k, T E_l), the capacity
  // and the pair capacity; past it only if a token names an expert twice)
  const EpKeep keep = ep_keep_of(s, position, position - h.bases[d], pair_rows);
  const int64_t round = keep.round;
  if (!keep.kept) {
    h.send_rank[g] = -1;
    h.send_row[g] = -1;
    atomicAdd(reinterpret_cast<unsigned long long*>(&h.dropped[e]), 1ull);
    if (keep.bad_index && word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, d, e);
    if (keep.overflow && trap && word != nullptr) raise_fault(word, SFMOE_FAULT_EP_OVERFLOW, d, e);
    return;
  }
  h.send_rank[g] = static_cast<int32_t>(d);
  h.send_row[g] = position - h.bases[d];
  h.expert_position[g] = in_expert;
  atomicAdd(reinterpret_cast<unsigned long long*>(&h.expert_kept[2 * e + round]), 1ull);
}

// One block, from every rank's kept counts: each expert's rows kept per round (all sources), each
// destination's padded blocks (every expert's first row per round), and this rank's own offsets,
// counts and the rows it keeps from each source.
__global__ void rank_blocks_kernel(EpShape s, EpRankRouting h) {
  const int64_t rank = *h.rank;
  const int64_t R = s.world, El = s.experts_per_rank, E = R * El;
  int64_t* kept0 = h.expert_rows + 2 * E;
  int64_t* kept1 = h.expert_rows + 3 * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t first = 0, second = 0;
    for (int64_t q = 0; q < R; ++q) {
      first += h.all_kept[(q * E + e) * 2];
      second += h.all_kept[(q * E + e) * 2 + 1];
    }
    kept0[e] = first;
    kept1[e] = second;
    int64_t before = 0;  // the rows of e kept from the ranks before this one
    for (int64_t q = 0; q < rank; ++q) {
      before += h.all_kept[(q * E + e) * 2] + h.all_kept[(q * E + e) * 2 + 1];
    }
    h.bases[R + e] = before;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < R; d += blockDim.x) ep_destination_blocks(s, h, d, rank);
  for (int64_t l = threadIdx.x; l < El; l += blockDim.x) {
    int64_t routed = 0;
    for (int64_t q = 0; q < R; ++q) routed += h.all_counts[q * E + rank * El + l];
    h.routed[l] = routed;
  }
  for (int64_t q = threadIdx.x; q < R; q += blockDim.x) {
    int64_t from = 0;
    for (int64_t l = 0; l < El; ++l) {
      from += h.all_kept[(q * E + rank * El + l) * 2] + h.all_kept[(q * E + rank * El + l) * 2 + 1];
    }
    h.received_from[q] = from;
  }
}

// A thread per kept slot: its row at its destination, into the pair's index block (an expert's
// first-round rows are the first kept0 of its list, the second round's the next).
__global__ void rank_rows_kernel(EpShape s, int64_t slots, const int32_t* ids, EpRankRouting h,
                                 int64_t pair_rows, int64_t* send_index) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t E = s.world * s.experts_per_rank;
  if (g >= slots) return;
  const int64_t d = h.send_rank[g];
  if (d < 0) return;
  const int64_t e = ids[g], j = h.bases[s.world + e] + h.expert_position[g];
  const int64_t first_round = h.expert_rows[2 * E + e];
  send_index[d * pair_rows + h.send_row[g]] =
      j < first_round ? h.expert_rows[e] + j : h.expert_rows[E + e] + (j - first_round);
}

// The moves' view of this rank: one source (its tokens), R destinations whose rows are the
// pairs' blocks of `block` (each pair_rows rows of row_bytes).
EpMovePointers rank_moves(const EpShape& s, int64_t pair_rows, int64_t hidden, int64_t tokens,
                          const EpRankRouting& h) {
  EpMovePointers m{};
  m.s = s;
  m.s.receive_rows = pair_rows;  // (a slot's row is its row in the block)
  m.hidden = hidden;
  m.token_start[0] = 0;
  for (int64_t q = 1; q <= s.world; ++q) m.token_start[q] = tokens;
  m.send_rank[0] = h.send_rank;
  m.send_row[0] = h.send_row;
  return m;
}
template <class T>
T* block_of(void* staging, int64_t q, int64_t pair_rows, int64_t row_bytes) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(staging) + q * pair_rows * row_bytes);
}

// The rows a destination holds from each source, block by block: blockIdx.y = the source, rows
// i < received_from[source] strided over blockIdx.x; the row there bounds-checked (a handle no
// dispatch wrote gives wrong rows, never an access outside the buffers).
struct StagedRow {
  int64_t at;   // the row's place in the staging: source pair_rows + i
  int64_t row;  // its row in the destination's buffer, or -1
};
template <class Body>
__device__ __forceinline__ void for_each_received(const EpRankRouting& h, int64_t pair_rows,
                                                  int64_t receive_rows, Body body) {
  const int64_t q = blockIdx.y, n = h.received_from[q];
  for (int64_t i = blockIdx.x; i < n && i < pair_rows; i += gridDim.x) {
    const int64_t at = q * pair_rows + i, row = h.received_row[at];
    body(StagedRow{at, row >= 0 && row < receive_rows ? row : -1});
  }
}

template <class Unit>
__device__ __forceinline__ void copy_units(uint8_t* to, const uint8_t* from, int64_t bytes) {
  const Unit* src = reinterpret_cast<const Unit*>(from);
  Unit* dst = reinterpret_cast<Unit*>(to);
  for (int64_t u = threadIdx.x; u < bytes / static_cast<int64_t>(sizeof(Unit)); u += blockDim.x) {
    dst[u] = src[u];
  }
}
__device__ __forceinline__ void copy_row_bytes(uint8_t* to, const uint8_t* from, int64_t bytes) {
  if (bytes % 16 == 0) {
    copy_units<uint4>(to, from, bytes);
  } else if (bytes % 4 == 0) {
    copy_units<uint32_t>(to, from, bytes);
  } else {
    copy_units<uint8_t>(to, from, bytes);
  }
}

struct PlaceArgs {
  EpRankRouting h;
  int64_t pair_rows, receive_rows, row_bytes, scale_bytes;
  uint8_t* staged_rows;          // [R, P, row_bytes]
  const uint8_t* staged_scales;  // [R, P, scale_bytes] or NULL
  uint8_t* rows;                 // [receive_rows, row_bytes]: the received buffer
  uint8_t* scales;               // or NULL
  bool to_staging;               // collect: rows -> staging (combine's way back)
};

// Dispatch: each received row (and its scales) from the staging to its row; combine: each row
// the destination holds into the staging, for its source.
__global__ void __launch_bounds__(kMoveThreads) rank_place_kernel(PlaceArgs p) {
  for_each_received(p.h, p.pair_rows, p.receive_rows, [&](const StagedRow& r) {
    if (r.row < 0) return;
    uint8_t* staged = p.staged_rows + r.at * p.row_bytes;
    uint8_t* row = p.rows + r.row * p.row_bytes;
    if (p.to_staging) {
      copy_row_bytes(staged, row, p.row_bytes);
      return;
    }
    copy_row_bytes(row, staged, p.row_bytes);
    if (p.scales != nullptr) {
      copy_row_bytes(p.scales + r.row * p.scale_bytes, p.staged_scales + r.at * p.scale_bytes,
                     p.scale_bytes);
    }
  });
}

// Block per group of this rank: its padding rows zero (and their scales).
__global__ void rank_padding_kernel(EpShape s, EpRankRouting h, uint8_t* rows, int64_t row_bytes,
                                    uint8_t* scales, int64_t scale_bytes) {
  const EpRows padding = ep_group_padding(s, h.offsets, h.kept, blockIdx.x);
  for (int64_t row = padding.begin; row < padding.end; ++row) {
    zero_row_bytes(rows + row * row_bytes, row_bytes);
    if (scales != nullptr) zero_row_bytes(scales + row * scale_bytes, scale_bytes);
  }
}

struct WeighArgs {
  EpRankRouting h;
  int64_t pair_rows, receive_rows, hidden;
  const void* staged;         // [R, P, hidden] in_dtype: the sources' d out rows
  const float* staged_probs;  // [R, P], or NULL: weight 1
  const void* rows;           // [receive_rows, hidden] rows_dtype: combine's forward rows, or NULL
  void* d_rows;               // [receive_rows, hidden] out_dtype
  float* d_probs;             // [R, P], or NULL
  sfmoe_dtype in_dtype, rows_dtype, out_dtype;
};

// Combine's backward at the destination: each received row weighted into d rows, and its d prob
// <d out, rows[row]> in the lanes' order (ep_args.h), into the staging for its source.
template <int kVec>
__global__ void __launch_bounds__(kMoveThreads) rank_weigh_kernel(WeighArgs w) {
  __shared__ float lanes[kMoveThreads];
  const int64_t H = w.hidden, chunks = H / kVec;
  for_each_received(w.h, w.pair_rows, w.receive_rows, [&](const StagedRow& r) {
    // (the block agrees on every branch: one row)
    if (r.row >= 0) {
      const float p = w.staged_probs != nullptr ? w.staged_probs[r.at] : 1.0f;
      for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
        float v[kVec];
        load_vector<kVec>(w.staged, w.in_dtype, r.at * H + c * kVec, v);
        if (w.staged_probs != nullptr) {
#pragma unroll
          for (int q = 0; q < kVec; ++q) v[q] = numerics::mul_rn(p, v[q]);
        }
        store_vector<kVec>(w.d_rows, w.out_dtype, r.row * H + c * kVec, v);
      }
    }
    if (w.d_probs == nullptr) return;
    float lane = 0.0f;
    if (r.row >= 0 && w.rows != nullptr) {
      for (int64_t c = threadIdx.x; c < chunks; c += kMoveThreads) {
        float v[kVec], y[kVec];
        load_vector<kVec>(w.staged, w.in_dtype, r.at * H + c * kVec, v);
        load_vector<kVec>(w.rows, w.rows_dtype, r.row * H + c * kVec, y);
#pragma unroll
        for (int q = 0; q < kVec; ++q) lane = numerics::add_rn(lane, numerics::mul_rn(v[q], y[q]));
      }
    }
    lanes[threadIdx.x] = lane;
    __syncthreads();
    for (int half = kMoveThreads / 2; half >= 1; half /= 2) {
      if (threadIdx.x < half) {
        lanes[threadIdx.x] = numerics::add_rn(lanes[threadIdx.x], lanes[threadIdx.x + half]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) w.d_probs[r.at] = r.row >= 0 ? lanes[0] : 0.0f;
    __syncthreads();
  });
}

// One value per received row between the staging and the destination's rows.
__global__ void rank_values_kernel(EpRankRouting h, int64_t pair_rows, int64_t receive_rows,
                                   float* staged, float* rows, bool to_rows) {
  const int64_t q = blockIdx.y, n = h.received_from[q];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n && i < pair_rows; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = q * pair_rows + i, row = h.received_row[at];
    const bool inside = row >= 0 && row < receive_rows;
    if (to_rows) {
      if (inside) rows[row] = staged[at];
    } else {
      staged[at] = inside ? rows[row] : 0.0f;
    }
  }
}

// Grids over the received rows: (blocks per source, sources).
dim3 received_grid(int64_t world, int64_t pair_rows, int64_t rows_per_block) {
  const int64_t wanted = 2048 / world + 1, most = (pair_rows + rows_per_block - 1) / rows_per_block;
  return dim3(static_cast<unsigned>(most < wanted ? (most > 0 ? most : 1) : wanted),
              static_cast<unsigned>(world));
}

sfmoe_status check_rows(const EpRankExchange& x, int64_t row_bytes, const char* what) {
  if (row_bytes > x.staging_row_bytes) {
    return report(SFMOE_ERROR_UNSUPPORTED,
                  "%s: rows of %lld bytes do not fit the group's staging (%lld bytes a row: the "
                  "hidden size in the wider of the payload and 16-bit values)",
                  what, static_cast<long long>(row_bytes),
                  static_cast<long long>(x.staging_row_bytes));
  }
  return SFMOE_SUCCESS;
}

// Scatter's last part: combine's backward d probs back to their slots (0 for a slot not sent).
sfmoe_status finish_values(const EpScatterArgs& a, EpMovePointers& m, cudaStream_t stream) {
  if (a.d_probs == nullptr) return SFMOE_SUCCESS;
  const EpRankExchange& x = *a.exchange;
  const int64_t R = a.shape.world, P = x.pair_rows, T = a.tokens[0];
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, stream));
  if (T == 0 || !x.exchange->runs()) return SFMOE_SUCCESS;
  for (int64_t q = 0; q < R; ++q) m.probs[q] = block_of<float>(x.recv_values, q, P, 4);
  m.d_probs[0] = a.d_probs[0];
  ep_slot_values_kernel<<<static_cast<unsigned>((T * a.shape.top_k + 255) / 256), 256, 0, stream>>>(
      m, false);
  return check_launch("ep_slot_values_kernel");
}

}  // namespace

sfmoe_status ep_route_exchange(const EpRouteArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, E = R * s.experts_per_rank, slots = a.tokens[0] * s.top_k;
  const int64_t chunks = ep_route_chunks(slots);
  const EpRanks view = rank_view(s, x.rank, a.tokens[0], a.topk_ids[0], h);
  const unsigned clear_blocks = static_cast<unsigned>((E + 255) / 256);
  const unsigned slot_blocks = static_cast<unsigned>((slots + 255) / 256);
  // (each part between two exchanges runs when the exchange says so: always, but for a staged
  // exchange, which runs one a call)
  if (x.exchange->runs()) {
    rank_clear_kernel<<<clear_blocks, 256, 0, stream>>>(h, R, E, x.rank, x.rank_device, a.word);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_clear_kernel"));
  }
  if (slots > 0 && x.exchange->runs()) {
    ep_rank_chunks_kernel<<<static_cast<unsigned>(chunks), kRouteThreads, 0, stream>>>(
        view, h.route_scratch, chunks, a.word);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_rank_chunks_kernel"));
    ep_scan_chunks_kernel<<<static_cast<unsigned>(E + R), kRouteThreads, 0, stream>>>(
        view, h.route_scratch, chunks);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_scan_chunks_kernel"));
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_gather(h.expert_counts, h.all_counts, E * 8, stream));
  if (x.exchange->runs()) {
    rank_bases_kernel<<<1, 256, 0, stream>>>(s, h);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_bases_kernel"));
  }
  if (slots > 0 && x.exchange->runs()) {
    rank_keep_kernel<<<slot_blocks, 256, 0, stream>>>(s, slots, a.topk_ids[0], h, h.route_scratch,
                                                      chunks, x.pair_rows, a.trap, a.word);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_keep_kernel"));
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_gather(h.expert_kept, h.all_kept, E * 16, stream));
  if (x.exchange->runs()) {
    rank_blocks_kernel<<<1, 256, 0, stream>>>(s, h);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_blocks_kernel"));
  }
  if (slots > 0 && x.exchange->runs()) {
    rank_rows_kernel<<<slot_blocks, 256, 0, stream>>>(s, slots, a.topk_ids[0], h, x.pair_rows,
                                                      x.send_index);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_rows_kernel"));
  }
  return x.exchange->all_to_all(x.send_index, h.received_row, x.pair_rows * 8, stream);
}

sfmoe_status ep_scatter_exchange(const EpScatterArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, T = a.tokens[0], H = a.hidden;
  const int64_t in_bytes = H * sfmoe_dtype_bits(a.token_dtype) / 8;
  const int64_t out_bytes = H * sfmoe_dtype_bits(a.out_dtype) / 8;
  SFMOE_RETURN_IF_ERROR(check_rows(x, in_bytes, "the expert-parallel scatter"));
  // The token rows into the pairs' blocks as they are (and the scales, and the probabilities).
  EpMovePointers m = rank_moves(s, P, H, T, h);
  m.row_bytes = in_bytes;
  m.scale_bytes = a.scale_bytes;
  m.token_rows[0] = a.token_rows[0];
  m.token_scales[0] = a.token_scales != nullptr ? a.token_scales[0] : nullptr;
  for (int64_t q = 0; q < R; ++q) {
    m.out_rows[q] = block_of<uint8_t>(x.send_rows, q, P, in_bytes);
    m.out_scales[q] =
        a.token_scales != nullptr ? block_of<uint8_t>(x.send_scales, q, P, a.scale_bytes) : nullptr;
    m.d_probs[q] = block_of<float>(x.send_values, q, P, 4);
  }
  if (T > 0 && x.exchange->runs()) {
    ep_scatter_kernel<1, true><<<static_cast<unsigned>(T), kMoveThreads, 0, stream>>>(
        m, a.token_dtype, a.token_dtype, a.token_dtype);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_scatter_kernel"));
    if (a.probs != nullptr) {
      m.probs[0] = a.probs[0];
      ep_slot_values_kernel<<<static_cast<unsigned>((T * s.top_k + 255) / 256), 256, 0, stream>>>(
          m, true);
      SFMOE_RETURN_IF_ERROR(check_launch("ep_slot_values_kernel"));
    }
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_rows, x.recv_rows, P * in_bytes, stream));
  if (a.token_scales != nullptr) {
    SFMOE_RETURN_IF_ERROR(
        x.exchange->all_to_all(x.send_scales, x.recv_scales, P * a.scale_bytes, stream));
  }
  if (a.probs != nullptr) {
    SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, stream));
  }
  // At the destination: each row to its row, weighted or as it is; padding rows zero.
  if (!x.exchange->runs()) return finish_values(a, m, stream);
  uint8_t* out_rows = static_cast<uint8_t*>(a.out_rows[0]);
  uint8_t* out_scales = a.out_scales != nullptr ? static_cast<uint8_t*>(a.out_scales[0]) : nullptr;
  const dim3 grid = received_grid(R, P, 1);
  const bool bytes = a.probs == nullptr && a.token_dtype == a.out_dtype;
  if (bytes) {
    PlaceArgs p{h,
                P,
                s.receive_rows,
                in_bytes,
                a.scale_bytes,
                static_cast<uint8_t*>(x.recv_rows),
                static_cast<const uint8_t*>(x.recv_scales),
                out_rows,
                out_scales,
                false};
    rank_place_kernel<<<grid, kMoveThreads, 0, stream>>>(p);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_place_kernel"));
  } else {
    WeighArgs w{h,
                P,
                s.receive_rows,
                H,
                x.recv_rows,
                a.probs != nullptr ? x.recv_values : nullptr,
                a.rows != nullptr ? a.rows[0] : nullptr,
                a.out_rows[0],
                a.d_probs != nullptr ? x.send_values : nullptr,
                a.token_dtype,
                a.rows_dtype,
                a.out_dtype};
    const auto kernel = ep_dot_vector(H) == 8 ? rank_weigh_kernel<8> : rank_weigh_kernel<1>;
    kernel<<<grid, kMoveThreads, 0, stream>>>(w);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_weigh_kernel"));
  }
  const int64_t groups = s.rounds * s.experts_per_rank;
  rank_padding_kernel<<<static_cast<unsigned>(groups), kMoveThreads, 0, stream>>>(
      s, h, out_rows, out_bytes, out_scales, a.scale_bytes);
  SFMOE_RETURN_IF_ERROR(check_launch("rank_padding_kernel"));
  return finish_values(a, m, stream);
}

sfmoe_status ep_gather_exchange(const EpGatherArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, T = a.tokens[0], H = a.hidden;
  const int64_t row_bytes = H * sfmoe_dtype_bits(a.rows_dtype) / 8;
  SFMOE_RETURN_IF_ERROR(check_rows(x, row_bytes, "the expert-parallel gather"));
  PlaceArgs p{h,
              P,
              s.receive_rows,
              row_bytes,
              0,
              static_cast<uint8_t*>(x.send_rows),
              nullptr,
              const_cast<uint8_t*>(static_cast<const uint8_t*>(a.rows[0])),
              nullptr,
              true};
  if (x.exchange->runs()) {
    rank_place_kernel<<<received_grid(R, P, 1), kMoveThreads, 0, stream>>>(p);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_place_kernel"));
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_rows, x.recv_rows, P * row_bytes, stream));
  if (T == 0 || !x.exchange->runs()) return SFMOE_SUCCESS;
  EpMovePointers m = rank_moves(s, P, H, T, h);
  for (int64_t q = 0; q < R; ++q) m.rows[q] = block_of<uint8_t>(x.recv_rows, q, P, row_bytes);
  m.probs[0] = a.probs != nullptr ? a.probs[0] : nullptr;
  m.token_out[0] = a.out[0];
  const auto kernel = H % 8 == 0 ? ep_gather_kernel<8> : ep_gather_kernel<1>;
  kernel<<<static_cast<unsigned>(T), kMoveThreads, 0, stream>>>(m, a.rows_dtype, a.out_dtype);
  return check_launch("ep_gather_kernel");
}

sfmoe_status ep_slot_values_exchange(const EpSlotValuesArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, T = a.tokens[0], slots = T * s.top_k;
  EpMovePointers m = rank_moves(s, P, 1, T, h);
  const unsigned slot_blocks = static_cast<unsigned>((slots + 255) / 256);
  const dim3 grid = received_grid(R, P, 256);
  if (a.to_rows) {
    m.probs[0] = a.in[0];
    for (int64_t q = 0; q < R; ++q) m.d_probs[q] = block_of<float>(x.send_values, q, P, 4);
    if (slots > 0 && x.exchange->runs()) {
      ep_slot_values_kernel<<<slot_blocks, 256, 0, stream>>>(m, true);
      SFMOE_RETURN_IF_ERROR(check_launch("ep_slot_values_kernel"));
    }
    SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, stream));
    if (!x.exchange->runs()) return SFMOE_SUCCESS;
    rank_values_kernel<<<grid, 256, 0, stream>>>(h, P, s.receive_rows, x.recv_values, a.out[0],
                                                 true);
    return check_launch("rank_values_kernel");
  }
  if (x.exchange->runs()) {
    rank_values_kernel<<<grid, 256, 0, stream>>>(h, P, s.receive_rows, x.send_values,
                                                 const_cast<float*>(a.in[0]), false);
    SFMOE_RETURN_IF_ERROR(check_launch("rank_values_kernel"));
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, stream));
  if (slots == 0 || !x.exchange->runs()) return SFMOE_SUCCESS;
  for (int64_t q = 0; q < R; ++q) m.probs[q] = block_of<float>(x.recv_values, q, P, 4);
  m.d_probs[0] = a.out[0];
  ep_slot_values_kernel<<<slot_blocks, 256, 0, stream>>>(m, false);
  return check_launch("ep_slot_values_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
