// Expert parallelism, the loopback transport on the device (docs/ep.md): every rank's buffers on
// one GPU, the routing and the row movements of src/common/ep_args.h with the CPU reference's
// bits. The routing takes the slots in (source rank, token, slot) order in chunks: each chunk
// ranks its slots among its own by expert and by destination (stable block sorts) and counts
// them; the counts' prefix over the chunks gives every slot its position in its destination's
// list (kept or dropped, and the round) and in its expert's (its row): work proportional to the
// slots, whatever the skew. The moves are a block per token over its k slots in 16-byte vectors,
// FP32 sums in slot order, and d probs in the lanes' order the CPU follows too: the CPU's bits
// everywhere.
#include <stdint.h>

#include "src/common/ep_args.h"
#include "src/common/fault.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/ep/ep_exchange.h"
#include "src/cuda/ep/ep_kernels.cuh"

namespace sfmoe {
namespace cuda {
namespace {

__global__ void ep_clear_kernel(EpRanks r) {
  const int64_t d = blockIdx.x, E = r.s.world * r.s.experts_per_rank;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) r.dropped[d][e] = 0;
  for (int64_t e = threadIdx.x; e < r.s.experts_per_rank; e += blockDim.x) r.routed[d][e] = 0;
  for (int64_t g = threadIdx.x; g < r.s.rounds * r.s.experts_per_rank; g += blockDim.x) {
    r.kept[d][g] = 0;
  }
}

// A thread per slot: its position in its destination's (source, token, slot) list and in its
// expert's; kept in the round the position gives (send_rank = d, send_row = the expert position
// for now) and counted, or dropped and counted.
__global__ void ep_keep_kernel(EpRanks r, const int32_t* counts, int64_t chunks, bool trap,
                               sfmoe_fault_report* word) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t El = r.s.experts_per_rank, E = r.s.world * El;
  if (g >= r.slot_start[r.s.world]) return;
  int64_t slot = 0;
  const int64_t s = source_of(r, g, &slot);
  const int32_t e = r.ids[s][slot];
  if (e < 0 || e >= E) return;  // (marked by the chunk kernel)
  const int64_t d = e / El, c = g / kEpRouteChunk;
  const int64_t position = counts[(E + d) * chunks + c] + r.send_rank[s][slot];
  const int64_t in_expert = counts[e * chunks + c] + r.send_row[s][slot];
  const int64_t round = ep_round_of(r.s, position);
  if (round < 0) {
    r.send_rank[s][slot] = -1;
    r.send_row[s][slot] = -1;
    atomicAdd(reinterpret_cast<unsigned long long*>(&r.dropped[s][e]), 1ull);
    if (trap && word != nullptr) raise_fault(word, SFMOE_FAULT_EP_OVERFLOW, d, e);
    return;
  }
  r.send_rank[s][slot] = static_cast<int32_t>(d);
  r.send_row[s][slot] = in_expert;
  atomicAdd(reinterpret_cast<unsigned long long*>(&r.kept[d][round * El + e % El]), 1ull);
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

// A thread per kept slot: its row. An expert's positions increase with its destination's, so its
// first-round rows are the first kept[round 0] of its list, the second round's the next.
__global__ void ep_rows_kernel(EpRanks r) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t El = r.s.experts_per_rank;
  if (g >= r.slot_start[r.s.world]) return;
  int64_t slot = 0;
  const int64_t s = source_of(r, g, &slot);
  const int64_t d = r.send_rank[s][slot];
  if (d < 0) return;
  const int64_t local = r.ids[s][slot] % El, j = r.send_row[s][slot];
  const int64_t first_round = r.kept[d][local];
  r.send_row[s][slot] = j < first_round
                            ? ep_group_begin(r.s, r.offsets[d], local) + j
                            : ep_group_begin(r.s, r.offsets[d], El + local) + j - first_round;
}

}  // namespace

sfmoe_status ep_route(const EpRouteArgs& a, void* stream_pointer) {
  if (a.exchange != nullptr) return ep_route_exchange(a, stream_pointer);
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const EpShape& s = a.shape;
  const EpRanks r = ranks_of(s, a.tokens, a.topk_ids, a.routing);
  const unsigned R = static_cast<unsigned>(s.world);
  const int64_t slots = r.slot_start[s.world], chunks = ep_route_chunks(slots);
  int32_t* counts = a.routing[0].route_scratch;
  ep_clear_kernel<<<R, 256, 0, stream>>>(r);
  SFMOE_RETURN_IF_ERROR(check_launch("ep_clear_kernel"));
  if (slots > 0) {
    ep_rank_chunks_kernel<<<static_cast<unsigned>(chunks), kRouteThreads, 0, stream>>>(
        r, counts, chunks, a.word);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_rank_chunks_kernel"));
    ep_scan_chunks_kernel<<<static_cast<unsigned>(s.world * s.experts_per_rank + s.world),
                            kRouteThreads, 0, stream>>>(r, counts, chunks);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_scan_chunks_kernel"));
    const unsigned blocks = static_cast<unsigned>((slots + 255) / 256);
    ep_keep_kernel<<<blocks, 256, 0, stream>>>(r, counts, chunks, a.trap, a.word);
    SFMOE_RETURN_IF_ERROR(check_launch("ep_keep_kernel"));
  }
  ep_offsets_kernel<<<R, 32, 0, stream>>>(r);
  SFMOE_RETURN_IF_ERROR(check_launch("ep_offsets_kernel"));
  if (slots == 0) return SFMOE_SUCCESS;
  ep_rows_kernel<<<static_cast<unsigned>((slots + 255) / 256), 256, 0, stream>>>(r);
  return check_launch("ep_rows_kernel");
}

sfmoe_status ep_scatter(const EpScatterArgs& a, void* stream_pointer) {
  if (a.exchange != nullptr) return ep_scatter_exchange(a, stream_pointer);
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
  m.padding_blocks = a.shape.world * a.shape.rounds * a.shape.experts_per_rank;
  const int64_t blocks = m.token_start[a.shape.world] + m.padding_blocks;
  const bool bytes = a.probs == nullptr && a.token_dtype == a.out_dtype;
  const auto kernel = bytes                          ? ep_scatter_kernel<1, true>
                      : ep_dot_vector(a.hidden) == 8 ? ep_scatter_kernel<8, false>
                                                     : ep_scatter_kernel<1, false>;
  kernel<<<static_cast<unsigned>(blocks), kMoveThreads, 0,
           static_cast<cudaStream_t>(stream_pointer)>>>(m, a.token_dtype, a.rows_dtype,
                                                        a.out_dtype);
  return check_launch("ep_scatter_kernel");
}

sfmoe_status ep_gather(const EpGatherArgs& a, void* stream_pointer) {
  if (a.exchange != nullptr) return ep_gather_exchange(a, stream_pointer);
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

// (the values in through `probs`, out through `d_probs`: one float per slot or row)
sfmoe_status ep_slot_values(const EpSlotValuesArgs& a, void* stream_pointer) {
  if (a.exchange != nullptr) return ep_slot_values_exchange(a, stream_pointer);
  EpMovePointers m = move_pointers(a.shape, 1, a.tokens, a.routing);
  for (int64_t q = 0; q < a.shape.world; ++q) {
    m.probs[q] = a.in[q];
    m.d_probs[q] = a.out[q];
  }
  const int64_t slots = m.token_start[a.shape.world] * a.shape.top_k;
  if (slots == 0) return SFMOE_SUCCESS;
  ep_slot_values_kernel<<<static_cast<unsigned>((slots + 255) / 256), 256, 0,
                          static_cast<cudaStream_t>(stream_pointer)>>>(m, a.to_rows);
  return check_launch("ep_slot_values_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
