// Expert parallelism with one rank a call on the host (docs/ep.md, "Per-rank transports"): the
// routing and the moves of src/common/ep_args.h when the ranks meet only in an EpExchange (the
// EXTERNAL transport's stages), with the loopback's bits. The same steps as the device's
// (src/cuda/ep/ep_exchange.cu), as loops: each rank counts its slots per expert; the counts are
// gathered, from which each slot's position in its destination's (source, token, slot) list
// decides kept, spilled or dropped as the loopback decides; the kept counts are gathered, from
// which every rank knows every destination's blocks; each kept slot's row there goes to the
// destination beside the rows, in fixed blocks of pair_rows rows per pair of ranks. Each part
// between two exchanges runs only when the exchange says so (EpExchange::runs).
#include <cstring>
#include <vector>

#include "sfmoe/numerics/bits.h"
#include "src/common/error.h"
#include "src/common/fault.h"
#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {
namespace {

template <class T>
T* block_of(void* staging, int64_t q, int64_t pair_rows, int64_t row_bytes) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(staging) + q * pair_rows * row_bytes);
}

// The rows a destination holds from each source: body(at, row) for source q's staging row i <
// received_from[q] (at = q P + i), row its row in the destination's buffer, or -1 outside it.
template <class Body>
void for_each_received(const EpRankRouting& h, int64_t world, int64_t pair_rows,
                       int64_t receive_rows, Body body) {
  for (int64_t q = 0; q < world; ++q) {
    for (int64_t i = 0; i < h.received_from[q] && i < pair_rows; ++i) {
      const int64_t at = q * pair_rows + i, row = h.received_row[at];
      body(at, row >= 0 && row < receive_rows ? row : -1);
    }
  }
}

// Each slot's value (probabilities) into its pair's block, at its row there.
void slot_values_to_blocks(const EpShape& s, int64_t pair_rows, int64_t slots,
                           const EpRankRouting& h, const float* in, float* blocks) {
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t d = h.send_rank[slot], row = h.send_row[slot];
    if (ep_slot_sent(d, row, s.world, pair_rows)) blocks[d * pair_rows + row] = in[slot];
  }
}
// Each slot's value back from its pair's block (0 for a slot not sent).
void slot_values_from_blocks(const EpShape& s, int64_t pair_rows, int64_t slots,
                             const EpRankRouting& h, const float* blocks, float* out) {
  for (int64_t slot = 0; slot < slots; ++slot) {
    const int64_t d = h.send_rank[slot], row = h.send_row[slot];
    out[slot] = ep_slot_sent(d, row, s.world, pair_rows) ? blocks[d * pair_rows + row] : 0.0f;
  }
}

}  // namespace

sfmoe_status ep_route_rank(const EpRouteArgs& a) {
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, El = s.experts_per_rank, E = R * El, P = x.pair_rows;
  const int64_t slots = a.tokens[0] * s.top_k;
  const int32_t* ids = a.topk_ids[0];
  // Each slot's place among this rank's slots to its destination (send_rank) and to its expert
  // (send_row), for now; this rank's slots per expert.
  if (x.exchange->runs()) {
    *h.rank = ep_checked_rank(x.rank, x.rank_device, R, a.word);
    for (int64_t e = 0; e < E; ++e) {
      h.dropped[e] = 0;
      h.expert_counts[e] = 0;
      h.expert_kept[2 * e] = 0;
      h.expert_kept[2 * e + 1] = 0;
    }
    std::vector<int32_t> to_rank(static_cast<size_t>(R), 0);
    for (int64_t slot = 0; slot < slots; ++slot) {
      const int32_t e = ids[slot];
      if (e < 0 || e >= E) {
        h.send_rank[slot] = -1;
        h.send_row[slot] = -1;
        if (a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, x.rank, e);
        continue;
      }
      h.send_rank[slot] = to_rank[e / El]++;
      h.send_row[slot] = h.expert_counts[e]++;
    }
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_gather(h.expert_counts, h.all_counts, E * 8, nullptr));
  // The rows earlier ranks send each expert and each destination; each slot kept or dropped by
  // its position in its destination's list.
  if (x.exchange->runs()) {
    const int64_t rank = *h.rank;
    for (int64_t e = 0; e < E; ++e) {
      int64_t before = 0;
      for (int64_t q = 0; q < rank; ++q) before += h.all_counts[q * E + e];
      h.bases[R + e] = before;
    }
    for (int64_t d = 0; d < R; ++d) {
      int64_t before = 0;
      for (int64_t l = 0; l < El; ++l) before += h.bases[R + d * El + l];
      h.bases[d] = before;
    }
    for (int64_t slot = 0; slot < slots; ++slot) {
      const int32_t e = ids[slot];
      if (e < 0 || e >= E) continue;
      const int64_t d = e / El;
      const int64_t position = h.bases[d] + h.send_rank[slot];
      // (among this rank's slots to e; the earlier ranks' kept rows of e added below, once known)
      const int64_t in_expert = h.send_row[slot];
      const EpKeep keep = ep_keep_of(s, position, position - h.bases[d], P);
      if (!keep.kept) {
        h.send_rank[slot] = -1;
        h.send_row[slot] = -1;
        ++h.dropped[e];
        if (keep.bad_index && a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, d, e);
        if (keep.overflow && a.trap && a.word != nullptr) {
          raise_fault(a.word, SFMOE_FAULT_EP_OVERFLOW, d, e);
        }
        continue;
      }
      const int64_t round = keep.round;
      h.send_rank[slot] = static_cast<int32_t>(d);
      h.send_row[slot] = position - h.bases[d];
      h.expert_position[slot] = in_expert;
      ++h.expert_kept[2 * e + round];
    }
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_gather(h.expert_kept, h.all_kept, E * 16, nullptr));
  // Every destination's blocks from every rank's kept counts; this rank's own; each kept slot's
  // row at its destination into the pair's index block.
  if (x.exchange->runs()) {
    const int64_t rank = *h.rank;
    int64_t* begin0 = h.expert_rows;
    int64_t* begin1 = h.expert_rows + E;
    int64_t* kept0 = h.expert_rows + 2 * E;
    int64_t* kept1 = h.expert_rows + 3 * E;
    for (int64_t e = 0; e < E; ++e) {
      kept0[e] = kept1[e] = 0;
      for (int64_t q = 0; q < R; ++q) {
        kept0[e] += h.all_kept[(q * E + e) * 2];
        kept1[e] += h.all_kept[(q * E + e) * 2 + 1];
      }
      h.bases[R + e] = 0;  // the rows of e kept from the ranks before this one
      for (int64_t q = 0; q < rank; ++q) {
        h.bases[R + e] += h.all_kept[(q * E + e) * 2] + h.all_kept[(q * E + e) * 2 + 1];
      }
    }
    for (int64_t d = 0; d < R; ++d) ep_destination_blocks(s, h, d, rank);
    for (int64_t l = 0; l < El; ++l) {
      h.routed[l] = 0;
      for (int64_t q = 0; q < R; ++q) h.routed[l] += h.all_counts[q * E + rank * El + l];
    }
    for (int64_t q = 0; q < R; ++q) {
      h.received_from[q] = 0;
      for (int64_t l = 0; l < El; ++l) {
        const int64_t e = rank * El + l;
        h.received_from[q] += h.all_kept[(q * E + e) * 2] + h.all_kept[(q * E + e) * 2 + 1];
      }
    }
    for (int64_t slot = 0; slot < slots; ++slot) {
      const int64_t d = h.send_rank[slot];
      if (d < 0) continue;
      const int64_t e = ids[slot], j = h.bases[R + e] + h.expert_position[slot];
      const int64_t first_round = kept0[e];
      x.send_index[d * P + h.send_row[slot]] =
          j < first_round ? begin0[e] + j : begin1[e] + (j - first_round);
    }
  }
  return x.exchange->all_to_all(x.send_index, h.received_row, P * 8, nullptr);
}

sfmoe_status ep_scatter_rank(const EpScatterArgs& a) {
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, k = s.top_k, H = a.hidden, T = a.tokens[0];
  const int64_t in_bytes = H * sfmoe_dtype_bits(a.token_dtype) / 8;
  const int64_t out_bytes = H * sfmoe_dtype_bits(a.out_dtype) / 8;
  const int64_t scale_bytes = a.scale_bytes;
  // The token rows into the pairs' blocks as they are (and the scales, and the probabilities).
  if (x.exchange->runs()) {
    for (int64_t slot = 0; slot < T * k; ++slot) {
      const int64_t d = h.send_rank[slot], row = h.send_row[slot];
      if (!ep_slot_sent(d, row, R, P)) continue;
      std::memcpy(block_of<uint8_t>(x.send_rows, d, P, in_bytes) + row * in_bytes,
                  static_cast<const uint8_t*>(a.token_rows[0]) + (slot / k) * in_bytes,
                  static_cast<size_t>(in_bytes));
      if (a.token_scales != nullptr) {
        std::memcpy(block_of<uint8_t>(x.send_scales, d, P, scale_bytes) + row * scale_bytes,
                    static_cast<const uint8_t*>(a.token_scales[0]) + (slot / k) * scale_bytes,
                    static_cast<size_t>(scale_bytes));
      }
    }
    if (a.probs != nullptr) slot_values_to_blocks(s, P, T * k, h, a.probs[0], x.send_values);
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_rows, x.recv_rows, P * in_bytes, nullptr));
  if (a.token_scales != nullptr) {
    SFMOE_RETURN_IF_ERROR(
        x.exchange->all_to_all(x.send_scales, x.recv_scales, P * scale_bytes, nullptr));
  }
  if (a.probs != nullptr) {
    SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, nullptr));
  }
  // At the destination: each row to its row, weighted or as it is (and combine's backward d
  // probs, in the lanes' order, into the blocks for their sources); padding rows zero.
  if (x.exchange->runs()) {
    uint8_t* out_rows = static_cast<uint8_t*>(a.out_rows[0]);
    uint8_t* out_scales =
        a.out_scales != nullptr ? static_cast<uint8_t*>(a.out_scales[0]) : nullptr;
    const bool bytes = a.probs == nullptr && a.token_dtype == a.out_dtype;
    const int64_t V = ep_dot_vector(H);
    for_each_received(h, R, P, s.receive_rows, [&](int64_t at, int64_t row) {
      const uint8_t* staged = static_cast<const uint8_t*>(x.recv_rows) + at * in_bytes;
      if (row >= 0 && bytes) {
        std::memcpy(out_rows + row * out_bytes, staged, static_cast<size_t>(in_bytes));
        if (out_scales != nullptr) {
          std::memcpy(out_scales + row * scale_bytes,
                      static_cast<const uint8_t*>(x.recv_scales) + at * scale_bytes,
                      static_cast<size_t>(scale_bytes));
        }
      } else if (row >= 0) {
        const float p = a.probs != nullptr ? x.recv_values[at] : 1.0f;
        for (int64_t c = 0; c < H; ++c) {
          const float v = load_value(staged, a.token_dtype, c);
          store_value(out_rows, a.out_dtype, row * H + c,
                      a.probs != nullptr ? numerics::mul_rn(p, v) : v);
        }
      }
      if (a.d_probs == nullptr) return;
      float lane[kEpDotLanes] = {};
      if (row >= 0 && a.rows != nullptr) {
        for (int64_t c = 0; c < H; ++c) {
          const float v = load_value(staged, a.token_dtype, c);
          const float y = load_value(a.rows[0], a.rows_dtype, row * H + c);
          float& sum = lane[(c / V) % kEpDotLanes];
          sum = numerics::add_rn(sum, numerics::mul_rn(v, y));
        }
      }
      for (int64_t w = kEpDotLanes / 2; w >= 1; w /= 2) {
        for (int64_t j = 0; j < w; ++j) lane[j] = numerics::add_rn(lane[j], lane[j + w]);
      }
      x.send_values[at] = row >= 0 ? lane[0] : 0.0f;
    });
    for (int64_t g = 0; g < s.rounds * s.experts_per_rank; ++g) {
      const EpRows padding = ep_group_padding(s, h.offsets, h.kept, g);
      for (int64_t row = padding.begin; row < padding.end; ++row) {
        std::memset(out_rows + row * out_bytes, 0, static_cast<size_t>(out_bytes));
        if (out_scales != nullptr) {
          std::memset(out_scales + row * scale_bytes, 0, static_cast<size_t>(scale_bytes));
        }
      }
    }
  }
  if (a.d_probs == nullptr) return SFMOE_SUCCESS;
  // The d probs back to their slots (0 for a slot not sent).
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, nullptr));
  if (x.exchange->runs()) slot_values_from_blocks(s, P, T * k, h, x.recv_values, a.d_probs[0]);
  return SFMOE_SUCCESS;
}

sfmoe_status ep_gather_rank(const EpGatherArgs& a) {
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, k = s.top_k, H = a.hidden, T = a.tokens[0];
  const int64_t row_bytes = H * sfmoe_dtype_bits(a.rows_dtype) / 8;
  // Each row this rank holds into the staging, for its source.
  if (x.exchange->runs()) {
    const uint8_t* rows = static_cast<const uint8_t*>(a.rows[0]);
    for_each_received(h, R, P, s.receive_rows, [&](int64_t at, int64_t row) {
      if (row < 0) return;
      std::memcpy(static_cast<uint8_t*>(x.send_rows) + at * row_bytes, rows + row * row_bytes,
                  static_cast<size_t>(row_bytes));
    });
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_rows, x.recv_rows, P * row_bytes, nullptr));
  if (!x.exchange->runs()) return SFMOE_SUCCESS;
  // At the source: each token's slots summed in slot order.
  std::vector<float> sum(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    for (float& v : sum) v = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t slot = t * k + i, d = h.send_rank[slot], row = h.send_row[slot];
      if (!ep_slot_sent(d, row, R, P)) continue;
      const void* block = block_of<uint8_t>(x.recv_rows, d, P, row_bytes);
      for (int64_t c = 0; c < H; ++c) {
        const float v = load_value(block, a.rows_dtype, row * H + c);
        sum[c] = numerics::add_rn(sum[c],
                                  a.probs != nullptr ? numerics::mul_rn(a.probs[0][slot], v) : v);
      }
    }
    for (int64_t c = 0; c < H; ++c) store_value(a.out[0], a.out_dtype, t * H + c, sum[c]);
  }
  return SFMOE_SUCCESS;
}

sfmoe_status ep_slot_values_rank(const EpSlotValuesArgs& a) {
  const EpRankExchange& x = *a.exchange;
  const EpShape& s = a.shape;
  const EpRankRouting& h = a.routing[0];
  const int64_t R = s.world, P = x.pair_rows, slots = a.tokens[0] * s.top_k;
  if (a.to_rows) {
    if (x.exchange->runs()) slot_values_to_blocks(s, P, slots, h, a.in[0], x.send_values);
    SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, nullptr));
    if (!x.exchange->runs()) return SFMOE_SUCCESS;
    for_each_received(h, R, P, s.receive_rows, [&](int64_t at, int64_t row) {
      if (row >= 0) a.out[0][row] = x.recv_values[at];
    });
    return SFMOE_SUCCESS;
  }
  if (x.exchange->runs()) {
    for_each_received(h, R, P, s.receive_rows, [&](int64_t at, int64_t row) {
      x.send_values[at] = row >= 0 ? a.in[0][row] : 0.0f;
    });
  }
  SFMOE_RETURN_IF_ERROR(x.exchange->all_to_all(x.send_values, x.recv_values, P * 4, nullptr));
  if (x.exchange->runs()) slot_values_from_blocks(s, P, slots, h, x.recv_values, a.out[0]);
  return SFMOE_SUCCESS;
}

}  // namespace cpu
}  // namespace sfmoe
