// Permute / unpermute as the backends see them: plain pointers and sizes (docs/permute.md).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"
#include "src/common/quantize_args.h"

namespace sfmoe {

// The device kernels stage a token's slots in shared memory: top_k up to this on the device.
constexpr int kMaxDevicePermuteTopK = 64;
// A chunk's expert bitmap lives in shared memory: 8 bytes per expert.
constexpr int kMaxDevicePermuteExperts = 6144;

// The device ranks tokens in chunks of 64: its workspace holds one count per chunk and expert.
constexpr int64_t kPermuteChunkTokens = 64;
inline int64_t permute_chunks(int64_t num_tokens) {
  return (num_tokens + kPermuteChunkTokens - 1) / kPermuteChunkTokens;
}
inline int64_t permute_workspace_elements(int64_t num_tokens, int64_t num_experts) {
  const int64_t elements = permute_chunks(num_tokens) * num_experts;
  return elements > 0 ? elements : 1;
}

// The block alignments permute (and everything that pads rows like it: the MoE layer, EP) takes.
inline bool permute_alignment_is_valid(int64_t a) {
  return a == 1 || a == 8 || a == 16 || a == 32 || a == 64 || a == 128;
}

// Token rows -> expert-sorted rows, each expert's block padded to `alignment` rows with zeros.
// Internal (the MoE layer, which gathers FC1's rows from the tokens): `permuted` NULL with no
// fused quantization writes the routing only -- offsets, row map, counts -- and moves no row; it
// reads no row either, so group_amax must then be NULL.
struct PermuteArgs {
  const void* tokens;  // [num_tokens, hidden]
  sfmoe_dtype dtype;   // FP32, BF16 or FP16 (rows are moved, not converted)
  int64_t num_tokens, hidden, top_k, num_experts;
  const int32_t* topk_ids;      // [num_tokens, top_k]; each token names an expert at most once
  int64_t alignment;            // 1, 8, 16, 32, 64 or 128
  int64_t expert_capacity;      // > 0: an expert keeps at most this many tokens; 0: no limit
  int64_t row_capacity;         // rows of `permuted`
  void* permuted;               // [row_capacity, hidden], rows [0, offsets[E]) written
  int64_t* expert_offsets;      // [num_experts + 1], written: padded block starts
  int64_t* row_map;             // [num_tokens, top_k], written: destination row, or -1 (dropped)
  int64_t* tokens_per_expert;   // [num_experts], written: rows kept per expert
  int64_t* dropped_per_expert;  // [num_experts], written: rows dropped by the capacity (device:
                                // or NULL)
  sfmoe_fault_report* word;     // device: bad ids are skipped and reported here (or NULL)
  int32_t* workspace;           // device: permute_workspace_elements(...) int32 (per-chunk counts)
  // Fused quantization (device): the permuted rows' recipe, rowwise MX_1X32 or BLOCK_1X128 (its
  // rowwise codes, scales, layout and options); NULL: the rows are moved unquantized.
  const GroupedQuantizeArgs* quantized;
  // Unquantized rows: [num_experts], written: each expert's amax of its kept rows (the amax rule of
  // numerics/scaling.h: propagating NaN; 0 for an expert without rows), or NULL.
  float* group_amax;
};

// Expert rows -> token rows: out[t] = sum_i probs[t, i] * rows[row_map[t, i]], FP32 sums in slot
// order (deterministic: a gather, no atomics). Dropped slots (row -1) add nothing.
struct UnpermuteArgs {
  const void* rows;  // [row_capacity, hidden]
  sfmoe_dtype rows_dtype;
  int64_t num_tokens, hidden, top_k;
  const int64_t* row_map;  // [num_tokens, top_k] from permute
  const float* probs;      // [num_tokens, top_k], or NULL: weight 1 (permute's backward)
  void* out;               // [num_tokens, hidden]
  sfmoe_dtype out_dtype;
  int64_t row_capacity;      // rows of `rows`
  sfmoe_fault_report* word;  // device: rows outside the capacity are skipped and reported here
};

// Unpermute's backward: d_rows[row_map[t, i]] = probs[t, i] * d_out[t], each group's padding rows
// (after its group_rows real rows) zero, rows beyond the groups untouched; and
// d_probs[t, i] = sum_h d_out[t, h] * rows[row_map[t, i], h].
// Internal forms (the MoE layer): probs NULL is weight 1 and rows NULL with d_probs NULL writes
// no d probs, so the call gathers token rows into expert rows under an existing row map.
struct UnpermuteBackwardArgs {
  const void* d_out;  // [num_tokens, hidden]
  sfmoe_dtype d_out_dtype;
  const void* rows;  // [row_capacity, hidden], the forward's input (or NULL, internal)
  sfmoe_dtype rows_dtype;
  int64_t num_tokens, hidden, top_k, row_capacity;
  const int64_t* row_map;
  const float* probs;  // or NULL (internal): weight 1
  void* d_rows;        // [row_capacity, hidden], every row written
  sfmoe_dtype d_rows_dtype;
  float* d_probs;             // [num_tokens, top_k] (or NULL, internal)
  const int64_t* offsets;     // [num_groups + 1], the rows' group offsets
  const int64_t* group_rows;  // [num_groups], real rows of each group (permute's tokens_per_expert)
  int64_t num_groups;
  sfmoe_fault_report* word;  // device: rows outside the capacity are skipped and reported here
};

// Each expert row's source token under a permute's row map (internal: the MoE layer's FC1 reads
// its rows from the tokens through it, GroupedGemmArgs::a_row_index): sources[row_map[t k + i]]
// = t for every kept slot, -1 for every other row of [0, row_capacity) (padding, rows past the
// groups). A row outside [-1, row_capacity) is skipped and reported in `word` on the device.
struct RowSourcesArgs {
  const int64_t* row_map;  // [num_tokens, top_k], from permute
  int64_t num_tokens, top_k, row_capacity;
  int32_t* sources;  // [row_capacity], written
  sfmoe_fault_report* word = nullptr;
};

// Values moved between a permute's slots and its rows under its row map (internal: the MoE
// layer's routing probabilities as row weights, and their gradients back). To rows:
// rows[row_map[s]] = slots[s] for every kept slot, other rows untouched; to slots:
// slots[s] = rows[row_map[s]], 0 for a dropped slot. A row outside [-1, row_capacity) is
// skipped (a dropped slot's 0) and reported in `word` on the device.
struct SlotValuesArgs {
  const int64_t* row_map;  // [slots], from permute
  int64_t slots;           // num_tokens * top_k
  int64_t row_capacity;
  bool to_rows;
  const float* in;  // [slots] (to rows) or [row_capacity]
  float* out;       // [row_capacity] (to rows) or [slots]
  sfmoe_fault_report* word = nullptr;
};

}  // namespace sfmoe
