// sfmoe_permute / sfmoe_unpermute / sfmoe_unpermute_backward: validate, then run the backend
// where the tensors live (docs/permute.md).
#include "sfmoe/permute.h"

#include <string.h>

#include <vector>

#include "src/api/quantize_common.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/common/permute_args.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {
namespace {

// A grouped tensor of unquantized rows: `cols` columns, a row dtype, rowwise data only, in the
// memory space of `home`.
sfmoe_status expect_rows(const char* context, const char* name, const sfmoe_grouped_tensor* g,
                         int64_t cols, const sfmoe_tensor* home) {
  SFMOE_RETURN_IF_ERROR(expect_unquantized_rows(context, name, g, cols));
  if (g->memory != home->memory || g->device != home->device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the same memory space as the tokens",
                context, name);
  }
  return SFMOE_SUCCESS;
}

// row_map entries are rows of `row_capacity`, each named by one slot at most (as permute writes
// them; the backward writes each named row once), or -1: checked before anything is written.
sfmoe_status check_row_map(const char* context, const sfmoe_tensor* row_map, int64_t row_capacity) {
  const int64_t* rows = static_cast<const int64_t*>(row_map->data);
  const int64_t count = tensor_element_count(row_map);
  std::vector<bool> named(static_cast<size_t>(row_capacity), false);
  for (int64_t i = 0; i < count; ++i) {
    if (rows[i] < -1 || rows[i] >= row_capacity) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: row_map[%lld] = %lld is neither -1 nor a row of %lld", context,
                  static_cast<long long>(i), static_cast<long long>(rows[i]),
                  static_cast<long long>(row_capacity));
    }
    if (rows[i] >= 0) {
      if (named[rows[i]]) {
        return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: row_map names row %lld twice (entry %lld)",
                    context, static_cast<long long>(rows[i]), static_cast<long long>(i));
      }
      named[rows[i]] = true;
    }
  }
  return SFMOE_SUCCESS;
}

// The device kernels stage a token's k slots in shared memory.
sfmoe_status check_device_top_k(const char* context, int64_t k) {
  if (k > kMaxDevicePermuteTopK) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the CUDA kernels handle up to %d slots per token (k = %lld)", context,
                kMaxDevicePermuteTopK, static_cast<long long>(k));
  }
  return SFMOE_SUCCESS;
}

}  // namespace
}  // namespace sfmoe

extern "C" {

sfmoe_permute_config sfmoe_permute_config_init(void) {
  sfmoe_permute_config c = sfmoe::sized_zero_config<sfmoe_permute_config>();
  return c;
}

sfmoe_status sfmoe_permute(const sfmoe_tensor* tokens, const sfmoe_tensor* topk_ids,
                           const sfmoe_permute_config* config, const sfmoe_grouped_tensor* permuted,
                           const sfmoe_tensor* row_map, const sfmoe_tensor* tokens_per_expert,
                           const sfmoe_tensor* dropped_per_expert, const sfmoe_tensor* workspace,
                           sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_permute";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "tokens", tokens));
    if (tokens->ndim != 2 || !sfmoe::is_high_precision(tokens->dtype)) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: tokens must be [T, H] of fp32, bf16 or fp16", context);
    }
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "config", config, "sfmoe_permute_config_init()"));
    if (config->expert_capacity < 0) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: expert_capacity must be >= 0", context);
    }
    const int64_t t_count = tokens->shape[0], hidden = tokens->shape[1];
    // Quantized permuted rows: the fused quantization (permute, then sfmoe_grouped_quantize of
    // the rows with these offsets), for the rowwise recipes whose blocks lie within a row.
    const bool fused = permuted != nullptr && permuted->scaling != SFMOE_SCALING_NONE;
    sfmoe::GroupedQuantizeArgs quantized;
    if (fused) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_rowwise_fusion(context, "permuted", permuted, hidden,
                                                        tokens->memory, tokens->device,
                                                        config->quantize, false, &quantized));
    } else {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_rows(context, "permuted", permuted, hidden, tokens));
      if (permuted->dtype != tokens->dtype) {
        return sfmoe::fail(SFMOE_ERROR_DTYPE_MISMATCH,
                           "%s: permuted must have the tokens' dtype (rows are moved)", context);
      }
    }
    // Unquantized rows: permuted->amax, when set, receives each expert's amax of its kept rows
    // (with the fused quantization it is the recipe's own amax output). Its alignment and memory
    // space were checked with the descriptor.
    float* const group_amax = fused ? nullptr : permuted->amax;
    const int64_t experts = permuted->num_groups, a = permuted->row_alignment;
    if (!sfmoe::permute_alignment_is_valid(a)) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                         "%s: permuted.row_alignment must be 1, 8, 16, 32, 64 or 128", context);
    }
    if (permuted->group_offsets == nullptr || permuted->uniform_group_rows != 0) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER,
                         "%s: permuted needs group_offsets (written by this op)", context);
    }
    if (topk_ids == nullptr || topk_ids->ndim != 2) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: topk_ids must be [T, k]", context);
    }
    const int64_t k = topk_ids->shape[1];
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "topk_ids", topk_ids, {SFMOE_DTYPE_INT32},
                                               {t_count, k}, tokens, "tokens"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "row_map", row_map, {SFMOE_DTYPE_INT64},
                                               {t_count, k}, tokens, "tokens"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "tokens_per_expert", tokens_per_expert,
                                               {SFMOE_DTYPE_INT64}, {experts}, tokens, "tokens"));
    if (dropped_per_expert != nullptr) {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "dropped_per_expert", dropped_per_expert,
                                                 {SFMOE_DTYPE_INT64}, {experts}, tokens, "tokens"));
    }
    // The worst case must fit: every kept row plus each expert's padding (the planner's rule).
    int64_t needed = 0;
    const sfmoe::Outcome bound = sfmoe::ops::permute_row_capacity_bound(
        t_count, k, experts, a, config->expert_capacity, &needed);
    if (!bound.ok()) return sfmoe::fail_with(context, bound);
    if (permuted->row_capacity < needed) {
      return sfmoe::fail(
          SFMOE_ERROR_SHAPE_MISMATCH,
          "%s: permuted.row_capacity = %lld cannot hold the worst case %lld (kept rows + experts x "
          "(row_alignment - 1); sfmoe_plan_permute gives the layout)",
          context, static_cast<long long>(permuted->row_capacity), static_cast<long long>(needed));
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, tokens->memory, tokens->device));
    const sfmoe::PermuteArgs args{
        tokens->data,
        tokens->dtype,
        t_count,
        hidden,
        k,
        experts,
        static_cast<const int32_t*>(topk_ids->data),
        a,
        config->expert_capacity,
        permuted->row_capacity,
        permuted->rowwise_data,
        permuted->group_offsets,
        static_cast<int64_t*>(row_map->data),
        static_cast<int64_t*>(tokens_per_expert->data),
        dropped_per_expert ? static_cast<int64_t*>(dropped_per_expert->data) : nullptr,
        word ? word->word : nullptr,
        workspace ? static_cast<int32_t*>(workspace->data) : nullptr,
        fused ? &quantized : nullptr,
        group_amax};
    if (tokens->memory == SFMOE_MEMORY_CUDA) {
      // The ids stay on the device: an id outside [0, E), or a token's second naming of an
      // expert, is skipped there (row -1) and raises SFMOE_FAULT_BAD_INDEX.
      SFMOE_RETURN_IF_ERROR(sfmoe::check_device_top_k(context, k));
      if (experts > sfmoe::kMaxDevicePermuteExperts) {
        return sfmoe::fail(SFMOE_ERROR_UNSUPPORTED,
                           "%s: the CUDA kernels handle up to %d experts (got %lld)", context,
                           sfmoe::kMaxDevicePermuteExperts, static_cast<long long>(experts));
      }
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_workspace(
          context, workspace, sfmoe::ops::permute_workspace_bytes(t_count, experts),
          "sfmoe_permute_workspace_bytes", tokens, "tokens"));
    } else {
      // Ids name experts, each at most once per token: checked before anything is written.
      const int32_t* ids = args.topk_ids;
      for (int64_t t = 0; t < t_count; ++t) {
        for (int64_t i = 0; i < k; ++i) {
          const int32_t e = ids[t * k + i];
          if (e < 0 || e >= experts) {
            return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                               "%s: topk_ids[%lld][%lld] = %d is not an expert of %lld", context,
                               static_cast<long long>(t), static_cast<long long>(i), e,
                               static_cast<long long>(experts));
          }
          for (int64_t j = 0; j < i; ++j) {
            if (ids[t * k + j] == e) {
              return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                                 "%s: token %lld names expert %d twice", context,
                                 static_cast<long long>(t), e);
            }
          }
        }
      }
    }
    return sfmoe::ops::backend_for(tokens->memory).permute(args, stream);
  });
}

sfmoe_status sfmoe_unpermute(const sfmoe_grouped_tensor* rows, const sfmoe_tensor* row_map,
                             const sfmoe_tensor* probs, const sfmoe_tensor* out,
                             sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_unpermute";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "out", out));
    if (out->ndim != 2 || !sfmoe::is_high_precision(out->dtype)) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: out must be [T, H] of fp32, bf16 or fp16",
                         context);
    }
    const int64_t t_count = out->shape[0], hidden = out->shape[1];
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_rows(context, "rows", rows, hidden, out));
    if (row_map == nullptr || row_map->ndim != 2) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: row_map must be [T, k]", context);
    }
    const int64_t k = row_map->shape[1];
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "row_map", row_map, {SFMOE_DTYPE_INT64},
                                               {t_count, k}, out, "out"));
    if (probs != nullptr) {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "probs", probs, {SFMOE_DTYPE_FP32},
                                                 {t_count, k}, out, "out"));
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, out->memory, out->device));
    const sfmoe::UnpermuteArgs args{rows->rowwise_data,
                                    rows->dtype,
                                    t_count,
                                    hidden,
                                    k,
                                    static_cast<const int64_t*>(row_map->data),
                                    probs ? static_cast<const float*>(probs->data) : nullptr,
                                    out->data,
                                    out->dtype,
                                    rows->row_capacity,
                                    word ? word->word : nullptr};
    if (out->memory == SFMOE_MEMORY_CUDA) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_device_top_k(context, k));
    } else {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_row_map(context, row_map, rows->row_capacity));
    }
    return sfmoe::ops::backend_for(out->memory).unpermute(args, stream);
  });
}

sfmoe_status sfmoe_unpermute_backward(const sfmoe_tensor* d_out, const sfmoe_grouped_tensor* rows,
                                      const sfmoe_tensor* row_map, const sfmoe_tensor* probs,
                                      const sfmoe_tensor* group_rows,
                                      const sfmoe_grouped_tensor* d_rows,
                                      const sfmoe_tensor* d_probs, sfmoe_status_word* word,
                                      void* stream) {
  const char* context = "sfmoe_unpermute_backward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "d_out", d_out));
    if (d_out->ndim != 2 || !sfmoe::is_high_precision(d_out->dtype)) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: d_out must be [T, H] of fp32, bf16 or fp16", context);
    }
    const int64_t t_count = d_out->shape[0], hidden = d_out->shape[1];
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_rows(context, "rows", rows, hidden, d_out));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_rows(context, "d_rows", d_rows, hidden, d_out));
    if (d_rows->row_capacity != rows->row_capacity) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: d_rows and rows must have the same row_capacity", context);
    }
    if (row_map == nullptr || row_map->ndim != 2) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: row_map must be [T, k]", context);
    }
    const int64_t k = row_map->shape[1];
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "row_map", row_map, {SFMOE_DTYPE_INT64},
                                               {t_count, k}, d_out, "d_out"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "probs", probs, {SFMOE_DTYPE_FP32},
                                               {t_count, k}, d_out, "d_out"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "d_probs", d_probs, {SFMOE_DTYPE_FP32},
                                               {t_count, k}, d_out, "d_out"));
    if (rows->group_offsets == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: rows needs its group_offsets", context);
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "group_rows", group_rows,
                                               {SFMOE_DTYPE_INT64}, {rows->num_groups}, d_out,
                                               "d_out"));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, d_out->memory, d_out->device));
    const sfmoe::UnpermuteBackwardArgs args{d_out->data,
                                            d_out->dtype,
                                            rows->rowwise_data,
                                            rows->dtype,
                                            t_count,
                                            hidden,
                                            k,
                                            rows->row_capacity,
                                            static_cast<const int64_t*>(row_map->data),
                                            static_cast<const float*>(probs->data),
                                            d_rows->rowwise_data,
                                            d_rows->dtype,
                                            static_cast<float*>(d_probs->data),
                                            rows->group_offsets,
                                            static_cast<const int64_t*>(group_rows->data),
                                            rows->num_groups,
                                            word ? word->word : nullptr};
    if (d_out->memory == SFMOE_MEMORY_CUDA) {
      // Rows and offsets stay on the device: a row outside the capacity is skipped and raises
      // SFMOE_FAULT_BAD_INDEX; with a word the offsets are checked on the stream as well.
      SFMOE_RETURN_IF_ERROR(sfmoe::check_device_top_k(context, k));
      SFMOE_RETURN_IF_ERROR(sfmoe::check_offsets_on_stream(rows, word, stream));
      return sfmoe::ops::backend_for(d_out->memory).unpermute_backward(args, stream);
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::check_row_map(context, row_map, rows->row_capacity));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_host_group_offsets(context, "rows", rows));
    const int64_t* real = static_cast<const int64_t*>(group_rows->data);
    for (int64_t g = 0; g < rows->num_groups; ++g) {
      const int64_t block = rows->group_offsets[g + 1] - rows->group_offsets[g];
      if (real[g] < 0 || real[g] > block) {
        return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                           "%s: group_rows[%lld] = %lld does not fit its block of %lld rows",
                           context, static_cast<long long>(g), static_cast<long long>(real[g]),
                           static_cast<long long>(block));
      }
    }
    return sfmoe::ops::backend_for(d_out->memory).unpermute_backward(args, stream);
  });
}

}  // extern "C"
