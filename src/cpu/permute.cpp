// Permute / unpermute CPU reference (docs/permute.md).
#include <string.h>

#include <algorithm>
#include <vector>

#include "sfmoe/numerics/scaling.h"
#include "src/cpu/backend.h"
#include "src/cpu/element_access.h"

namespace sfmoe {
namespace cpu {

namespace {

int64_t element_bytes(sfmoe_dtype dtype) { return sfmoe_dtype_bits(dtype) / 8; }

}  // namespace

namespace {

// The rows moved unquantized (permuted in the tokens' dtype), dropped_per_expert written.
void permute_rows(const PermuteArgs& a) {
  const int64_t experts = a.num_experts, k = a.top_k;
  // Which slots each expert receives, in token order (each token names an expert at most once).
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(experts));
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = a.topk_ids[t * k + i];
      a.row_map[t * k + i] = -1;
      if (e >= 0 && e < experts) slots[e].push_back(t * k + i);
    }
  }
  int64_t offset = 0;
  const int64_t row_bytes = a.hidden * element_bytes(a.dtype);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t received = static_cast<int64_t>(slots[e].size());
    const int64_t kept =
        a.expert_capacity > 0 && received > a.expert_capacity ? a.expert_capacity : received;
    a.expert_offsets[e] = offset;
    a.tokens_per_expert[e] = kept;
    a.dropped_per_expert[e] = received - kept;
    float amax = 0.0f;
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t slot = slots[e][j], row = offset + j, token = slot / k;
      a.row_map[slot] = row;
      if (a.permuted == nullptr) continue;  // (the routing only: callers pass no group_amax)
      memcpy(static_cast<uint8_t*>(a.permuted) + row * row_bytes,
             static_cast<const uint8_t*>(a.tokens) + token * row_bytes,
             static_cast<size_t>(row_bytes));
      if (a.group_amax != nullptr) {
        for (int64_t h = 0; h < a.hidden; ++h)
          amax =
              numerics::amax_accumulate(amax, load_value(a.tokens, a.dtype, token * a.hidden + h));
      }
    }
    if (a.group_amax != nullptr) a.group_amax[e] = amax;
    const int64_t padded = (kept + a.alignment - 1) / a.alignment * a.alignment;
    for (int64_t j = kept; j < padded && a.permuted != nullptr; ++j) {
      memset(static_cast<uint8_t*>(a.permuted) + (offset + j) * row_bytes, 0,
             static_cast<size_t>(row_bytes));
    }
    offset += padded;
  }
  a.expert_offsets[experts] = offset;
}

}  // namespace

void permute(const PermuteArgs& a) {
  std::vector<int64_t> dropped_scratch(a.dropped_per_expert ? 0
                                                            : static_cast<size_t>(a.num_experts));
  PermuteArgs rows = a;
  if (rows.dropped_per_expert == nullptr) rows.dropped_per_expert = dropped_scratch.data();
  if (a.quantized == nullptr) {
    permute_rows(rows);
    return;
  }
  // The fused form on the host is its definition: the rows permuted into a scratch buffer of the
  // tokens' dtype, then quantized with the grouped quantization's reference and these offsets.
  std::vector<uint8_t> scratch(
      static_cast<size_t>(a.row_capacity * a.hidden * (sfmoe_dtype_bits(a.dtype) / 8)));
  rows.permuted = scratch.data();
  rows.quantized = nullptr;
  permute_rows(rows);
  const std::vector<int64_t> offsets(a.expert_offsets, a.expert_offsets + a.num_experts + 1);
  GroupedQuantizeArgs quantized = *a.quantized;
  quantized.input = GroupedInput{scratch.data(), a.dtype, a.row_capacity, offsets.data(), 0};
  grouped_quantize(quantized);
}

void unpermute(const UnpermuteArgs& a) {
  std::vector<float> sum(static_cast<size_t>(a.hidden));
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (float& s : sum) s = 0.0f;
    for (int64_t i = 0; i < a.top_k; ++i) {
      const int64_t row = a.row_map[t * a.top_k + i];
      if (row < 0) continue;
      const float weight = a.probs ? a.probs[t * a.top_k + i] : 1.0f;
      for (int64_t h = 0; h < a.hidden; ++h) {
        const float v = load_value(a.rows, a.rows_dtype, row * a.hidden + h);
        sum[h] = numerics::add_rn(sum[h], a.probs ? numerics::mul_rn(weight, v) : v);
      }
    }
    for (int64_t h = 0; h < a.hidden; ++h)
      store_value(a.out, a.out_dtype, t * a.hidden + h, sum[h]);
  }
}

void unpermute_backward(const UnpermuteBackwardArgs& a) {
  // Each group's padding rows (after its real rows) are zeros; rows beyond the groups untouched.
  for (int64_t g = 0; g < a.num_groups; ++g) {
    for (int64_t r = a.offsets[g] + a.group_rows[g]; r < a.offsets[g + 1]; ++r) {
      for (int64_t h = 0; h < a.hidden; ++h)
        store_value(a.d_rows, a.d_rows_dtype, r * a.hidden + h, 0.0f);
    }
  }
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    for (int64_t i = 0; i < a.top_k; ++i) {
      const int64_t slot = t * a.top_k + i, row = a.row_map[slot];
      if (row < 0) {
        if (a.d_probs != nullptr) a.d_probs[slot] = 0.0f;
        continue;
      }
      const float weight = a.probs != nullptr ? a.probs[slot] : 1.0f;
      float dot = 0.0f;
      for (int64_t h = 0; h < a.hidden; ++h) {
        const float d = load_value(a.d_out, a.d_out_dtype, t * a.hidden + h);
        if (a.rows != nullptr) {
          dot = numerics::add_rn(
              dot, numerics::mul_rn(d, load_value(a.rows, a.rows_dtype, row * a.hidden + h)));
        }
        store_value(a.d_rows, a.d_rows_dtype, row * a.hidden + h, numerics::mul_rn(weight, d));
      }
      if (a.d_probs != nullptr) a.d_probs[slot] = dot;
    }
  }
}

void row_sources(const RowSourcesArgs& a) {
  std::fill(a.sources, a.sources + a.row_capacity, int32_t{-1});
  for (int64_t s = 0; s < a.num_tokens * a.top_k; ++s) {
    const int64_t row = a.row_map[s];
    if (row >= 0 && row < a.row_capacity) a.sources[row] = static_cast<int32_t>(s / a.top_k);
  }
}

void slot_values(const SlotValuesArgs& a) {
  for (int64_t s = 0; s < a.slots; ++s) {
    const int64_t row = a.row_map[s];
    const bool kept = row >= 0 && row < a.row_capacity;
    if (a.to_rows) {
      if (kept) a.out[row] = a.in[s];
    } else {
      a.out[s] = kept ? a.in[row] : 0.0f;
    }
  }
}

}  // namespace cpu
}  // namespace sfmoe
