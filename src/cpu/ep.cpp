// Expert parallelism, CPU reference (docs/ep.md): the routing and the two row movements of every
// rank held by this process, with the rules of src/common/ep_args.h. It is the definition the
// device transports are checked against, bit for bit.
#include <algorithm>
#include <cstring>
#include <vector>

#include "sfmoe/numerics/bits.h"
#include "src/common/fault.h"
#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {

void ep_route(const EpRouteArgs& a) {
  const EpShape& s = a.shape;
  const int64_t R = s.world, El = s.experts_per_rank, E = R * El, k = s.top_k;
  const int64_t groups = s.rounds * El;
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    for (int64_t g = 0; g < groups; ++g) q.kept[g] = 0;
    for (int64_t e = 0; e < El; ++e) q.routed[e] = 0;
    for (int64_t e = 0; e < E; ++e) q.dropped[e] = 0;
  }
  // Keep or drop, in (source rank, token, slot) order: each destination keeps its first
  // receive_capacity rows in the first round, (SPILL) the next spill_capacity in the second.
  // send_row holds the group for now.
  // (and a slot past its source's pair_capacity rows to its destination is dropped the same way,
  // its place in the destination's list taken all the same)
  std::vector<int64_t> received(static_cast<size_t>(R), 0), in_pair(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    std::fill(in_pair.begin(), in_pair.end(), 0);
    for (int64_t slot = 0; slot < a.tokens[r] * k; ++slot) {
      const int32_t e = a.topk_ids[r][slot];
      q.send_rank[slot] = -1;
      q.send_row[slot] = -1;
      if (e < 0 || e >= E) {
        if (a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, r, e);
        continue;
      }
      const int64_t d = e / El, local = e % El;
      ++a.routing[d].routed[local];
      const int64_t round = ep_round_of(s, received[d]++), pair_index = in_pair[d]++;
      if (round < 0 || pair_index >= s.pair_capacity) {
        ++q.dropped[e];
        if (a.trap && a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_EP_OVERFLOW, d, e);
        continue;
      }
      ++a.routing[d].kept[round * El + local];
      q.send_rank[slot] = static_cast<int32_t>(d);
      q.send_row[slot] = round * El + local;
    }
  }
  // Each destination's padded blocks, round by round, then the rows in the same order (so, within
  // a group, by source rank and token).
  std::vector<std::vector<int64_t>> cursor(static_cast<size_t>(R));
  for (int64_t d = 0; d < R; ++d) {
    const EpRankRouting& q = a.routing[d];
    cursor[d].assign(static_cast<size_t>(groups), 0);
    for (int64_t round = 0; round < s.rounds; ++round) {
      int64_t* offsets = q.offsets + round * (El + 1);
      offsets[0] = 0;
      for (int64_t e = 0; e < El; ++e) {
        const int64_t kept = q.kept[round * El + e];
        offsets[e + 1] =
            offsets[e] + (kept + s.row_alignment - 1) / s.row_alignment * s.row_alignment;
      }
    }
    for (int64_t g = 0; g < groups; ++g) cursor[d][g] = ep_group_begin(s, q.offsets, g);
  }
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    for (int64_t slot = 0; slot < a.tokens[r] * k; ++slot) {
      if (q.send_rank[slot] < 0) continue;
      q.send_row[slot] = cursor[q.send_rank[slot]][q.send_row[slot]]++;
    }
  }
}

void ep_scatter(const EpScatterArgs& a) {
  const EpShape& s = a.shape;
  const int64_t R = s.world, El = s.experts_per_rank, k = s.top_k, H = a.hidden;
  // Dispatch moves the bytes as they are (FP8 codes and their scales among them).
  const bool bytes = a.probs == nullptr && a.token_dtype == a.out_dtype;
  const size_t row_bytes = static_cast<size_t>(H) * sfmoe_dtype_bits(a.out_dtype) / 8;
  const size_t scale_bytes = static_cast<size_t>(a.scale_bytes);
  // Each destination's padding rows (after each group's kept rows) are zeros, their scales too.
  for (int64_t d = 0; d < R; ++d) {
    const EpRankRouting& q = a.routing[d];
    for (int64_t g = 0; g < s.rounds * El; ++g) {
      const EpRows padding = ep_group_padding(s, q.offsets, q.kept, g);
      for (int64_t row = padding.begin; row < padding.end; ++row) {
        std::memset(static_cast<uint8_t*>(a.out_rows[d]) + row * row_bytes, 0, row_bytes);
        if (scale_bytes > 0) {
          std::memset(static_cast<uint8_t*>(a.out_scales[d]) + row * scale_bytes, 0, scale_bytes);
        }
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    for (int64_t slot = 0; slot < a.tokens[r] * k; ++slot) {
      const int64_t t = slot / k, d = q.send_rank[slot], row = q.send_row[slot];
      if (!ep_slot_sent(d, row, R, s.receive_rows)) {
        if (a.d_probs != nullptr) a.d_probs[r][slot] = 0.0f;
        continue;
      }
      if (bytes) {
        std::memcpy(static_cast<uint8_t*>(a.out_rows[d]) + row * row_bytes,
                    static_cast<const uint8_t*>(a.token_rows[r]) + t * row_bytes, row_bytes);
        if (scale_bytes > 0) {
          std::memcpy(static_cast<uint8_t*>(a.out_scales[d]) + row * scale_bytes,
                      static_cast<const uint8_t*>(a.token_scales[r]) + t * scale_bytes,
                      scale_bytes);
        }
        continue;
      }
      const float weight = a.probs != nullptr ? a.probs[r][slot] : 1.0f;
      for (int64_t h = 0; h < H; ++h) {
        const float v = load_value(a.token_rows[r], a.token_dtype, t * H + h);
        store_value(a.out_rows[d], a.out_dtype, row * H + h,
                    a.probs != nullptr ? numerics::mul_rn(weight, v) : v);
      }
      if (a.d_probs == nullptr) continue;
      // d probs in the lanes' order (src/common/ep_args.h).
      float lane[kEpDotLanes] = {};
      if (a.rows != nullptr) {
        const int64_t V = ep_dot_vector(H);
        for (int64_t h = 0; h < H; ++h) {
          const float v = load_value(a.token_rows[r], a.token_dtype, t * H + h);
          const float y = load_value(a.rows[d], a.rows_dtype, row * H + h);
          float& sum = lane[(h / V) % kEpDotLanes];
          sum = numerics::add_rn(sum, numerics::mul_rn(v, y));
        }
      }
      for (int64_t w = kEpDotLanes / 2; w >= 1; w /= 2) {
        for (int64_t j = 0; j < w; ++j) lane[j] = numerics::add_rn(lane[j], lane[j + w]);
      }
      a.d_probs[r][slot] = lane[0];
    }
  }
}

void ep_gather(const EpGatherArgs& a) {
  const int64_t R = a.shape.world, k = a.shape.top_k, H = a.hidden;
  std::vector<float> sum(static_cast<size_t>(H));
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    for (int64_t t = 0; t < a.tokens[r]; ++t) {
      for (float& v : sum) v = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t slot = t * k + i, d = q.send_rank[slot], row = q.send_row[slot];
        if (!ep_slot_sent(d, row, R, a.shape.receive_rows)) continue;
        for (int64_t h = 0; h < H; ++h) {
          const float v = load_value(a.rows[d], a.rows_dtype, row * H + h);
          sum[h] = numerics::add_rn(sum[h],
                                    a.probs != nullptr ? numerics::mul_rn(a.probs[r][slot], v) : v);
        }
      }
      for (int64_t h = 0; h < H; ++h) store_value(a.out[r], a.out_dtype, t * H + h, sum[h]);
    }
  }
}

void ep_slot_values(const EpSlotValuesArgs& a) {
  const int64_t R = a.shape.world, k = a.shape.top_k;
  for (int64_t r = 0; r < R; ++r) {
    const EpRankRouting& q = a.routing[r];
    for (int64_t slot = 0; slot < a.tokens[r] * k; ++slot) {
      const int64_t d = q.send_rank[slot], row = q.send_row[slot];
      const bool sent = ep_slot_sent(d, row, R, a.shape.receive_rows);
      if (a.to_rows) {
        if (sent) a.out[d][row] = a.in[r][slot];
      } else {
        a.out[r][slot] = sent ? a.in[d][row] : 0.0f;
      }
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe
