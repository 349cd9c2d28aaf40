// sfmoe_router_forward / sfmoe_router_backward: validate, then run the backend where the tensors
// live (docs/router.md).
#include "sfmoe/router.h"

#include <math.h>
#include <string.h>

#include <vector>

#include "src/api/router_config.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/common/router_args.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {

sfmoe_status check_router_config(const char* context, const sfmoe_router_config* c, int64_t experts,
                                 RouterConfig* out) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "config", c, "sfmoe_router_config_init()"));
  const int32_t score = enum_value(c->score);
  if (score != SFMOE_ROUTER_SCORE_SOFTMAX && score != SFMOE_ROUTER_SCORE_SIGMOID) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown score function %d", context,
                static_cast<int>(score));
  }
  if (c->top_k < 1 || c->top_k > experts) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: top_k = %lld must be in [1, num_experts = %lld]",
                context, static_cast<long long>(c->top_k), static_cast<long long>(experts));
  }
  if (c->softmax_after_topk && c->score != SFMOE_ROUTER_SCORE_SOFTMAX) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: softmax_after_topk needs the softmax score function", context);
  }
  if (c->softmax_after_topk && c->normalize) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: normalize does nothing after a softmax over the selected experts; leave it 0",
                context);
  }
  if (c->num_groups > 1) {
    const int64_t per_group = experts % c->num_groups == 0 ? experts / c->num_groups : 0;
    if (per_group == 0) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: num_groups = %lld does not divide num_experts = %lld", context,
                  static_cast<long long>(c->num_groups), static_cast<long long>(experts));
    }
    if (c->group_topk < 1 || c->group_topk > c->num_groups ||
        c->group_topk * per_group < c->top_k) {
      return fail(
          SFMOE_ERROR_INVALID_ARGUMENT,
          "%s: group_topk = %lld must be in [1, num_groups] and keep at least top_k = %lld experts",
          context, static_cast<long long>(c->group_topk), static_cast<long long>(c->top_k));
    }
    if (c->group_score_topk < 1 || c->group_score_topk > per_group) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: group_score_topk = %lld must be in [1, experts per group = %lld]", context,
                  static_cast<long long>(c->group_score_topk), static_cast<long long>(per_group));
    }
  } else if (c->num_groups < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: num_groups must be >= 0", context);
  }
  if (!(isfinite(c->scaling_factor) && c->scaling_factor > 0.0f)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: scaling_factor must be positive and finite",
                context);
  }
  if (!(isfinite(c->aux_loss_coeff) && c->aux_loss_coeff >= 0.0f && isfinite(c->z_loss_coeff) &&
        c->z_loss_coeff >= 0.0f)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: loss coefficients must be finite and >= 0",
                context);
  }
  out->num_experts = experts;
  out->top_k = c->top_k;
  out->sigmoid = c->score == SFMOE_ROUTER_SCORE_SIGMOID;
  out->softmax_after_topk = c->softmax_after_topk != 0;
  out->num_groups = c->num_groups > 1 ? c->num_groups : 0;
  out->group_topk = c->group_topk;
  out->group_score_topk = c->group_score_topk;
  out->scaling_factor = c->scaling_factor;
  out->normalize = c->normalize != 0;
  out->aux_loss_coeff = c->aux_loss_coeff;
  out->z_loss_coeff = c->z_loss_coeff;
  return SFMOE_SUCCESS;
}

sfmoe_status check_router_logits(const char* context, const sfmoe_tensor* logits) {
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, "logits", logits));
  if (logits->ndim != 2 || logits->shape[1] < 1) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: logits must be [tokens, experts] with experts >= 1", context);
  }
  if (logits->dtype != SFMOE_DTYPE_FP32 && logits->dtype != SFMOE_DTYPE_BF16) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: logits must be fp32 or bf16, not '%s'", context,
                sfmoe_dtype_name(logits->dtype));
  }
  return SFMOE_SUCCESS;
}

// The CUDA router's bounds (registers and shared memory hold a token's scores and picks).
sfmoe_status check_router_device_bounds(const char* context, const RouterConfig& c) {
  if (c.num_experts > kMaxDeviceExperts || c.num_groups > kMaxDeviceGroups ||
      c.top_k > kMaxDeviceTopK) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the CUDA router handles up to %d experts, %d groups and top_k %d (got %lld, "
                "%lld, %lld)",
                context, kMaxDeviceExperts, kMaxDeviceGroups, kMaxDeviceTopK,
                static_cast<long long>(c.num_experts), static_cast<long long>(c.num_groups),
                static_cast<long long>(c.top_k));
  }
  return SFMOE_SUCCESS;
}

}  // namespace sfmoe

extern "C" {

sfmoe_router_config sfmoe_router_config_init(void) {
  sfmoe_router_config c = sfmoe::sized_zero_config<sfmoe_router_config>();
  c.score = SFMOE_ROUTER_SCORE_SOFTMAX;
  c.group_score_topk = 2;
  c.scaling_factor = 1.0f;
  return c;
}

sfmoe_status sfmoe_router_forward(const sfmoe_tensor* logits, const sfmoe_tensor* expert_bias,
                                  const sfmoe_router_config* config, const sfmoe_tensor* topk_ids,
                                  const sfmoe_tensor* probs, const sfmoe_tensor* tokens_per_expert,
                                  const sfmoe_tensor* aux_loss, const sfmoe_tensor* z_loss,
                                  const sfmoe_tensor* workspace, void* stream) {
  const char* context = "sfmoe_router_forward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_router_logits(context, logits));
    const int64_t tokens = logits->shape[0], experts = logits->shape[1];
    sfmoe::RouterConfig c;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_router_config(context, config, experts, &c));
    if (expert_bias != nullptr) {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "expert_bias", expert_bias,
                                                 {SFMOE_DTYPE_FP32}, {experts}, logits, "logits"));
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "topk_ids", topk_ids, {SFMOE_DTYPE_INT32},
                                               {tokens, c.top_k}, logits, "logits"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "probs", probs, {SFMOE_DTYPE_FP32},
                                               {tokens, c.top_k}, logits, "logits"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "tokens_per_expert", tokens_per_expert,
                                               {SFMOE_DTYPE_INT64}, {experts}, logits, "logits"));
    if (c.aux_loss_coeff != 0.0f && aux_loss == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: aux_loss_coeff is set but aux_loss is NULL",
                         context);
    }
    if (c.z_loss_coeff != 0.0f && z_loss == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: z_loss_coeff is set but z_loss is NULL",
                         context);
    }
    if (aux_loss != nullptr)
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_scalar(context, "aux_loss", aux_loss, logits, "logits"));
    if (z_loss != nullptr)
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_scalar(context, "z_loss", z_loss, logits, "logits"));
    sfmoe::RouterForwardArgs args{
        logits->data,
        logits->dtype,
        expert_bias ? static_cast<const float*>(expert_bias->data) : nullptr,
        tokens,
        c,
        static_cast<int32_t*>(topk_ids->data),
        static_cast<float*>(probs->data),
        static_cast<int64_t*>(tokens_per_expert->data),
        aux_loss ? static_cast<float*>(aux_loss->data) : nullptr,
        z_loss ? static_cast<float*>(z_loss->data) : nullptr,
        nullptr};
    if (logits->memory == SFMOE_MEMORY_CUDA) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_router_device_bounds(context, c));
      if (aux_loss != nullptr || z_loss != nullptr) {
        // A loss on the device needs the per-block partials' workspace.
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_workspace(
            context, workspace, sfmoe::ops::router_workspace_bytes(tokens, experts),
            "sfmoe_router_workspace_bytes", logits, "logits"));
        args.aux_partials = static_cast<float*>(workspace->data);
      }
    }
    return sfmoe::ops::backend_for(logits->memory).router_forward(args, stream);
  });
}

sfmoe_status sfmoe_router_backward(const sfmoe_tensor* logits, const sfmoe_tensor* topk_ids,
                                   const sfmoe_tensor* tokens_per_expert,
                                   const sfmoe_router_config* config, const sfmoe_tensor* d_probs,
                                   float d_aux_loss, float d_z_loss, const sfmoe_tensor* d_logits,
                                   sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_router_backward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_router_logits(context, logits));
    const int64_t tokens = logits->shape[0], experts = logits->shape[1];
    sfmoe::RouterConfig c;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_router_config(context, config, experts, &c));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "topk_ids", topk_ids, {SFMOE_DTYPE_INT32},
                                               {tokens, c.top_k}, logits, "logits"));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "tokens_per_expert", tokens_per_expert,
                                               {SFMOE_DTYPE_INT64}, {experts}, logits, "logits"));
    if (d_probs != nullptr) {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "d_probs", d_probs, {SFMOE_DTYPE_FP32},
                                                 {tokens, c.top_k}, logits, "logits"));
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_tensor(context, "d_logits", d_logits, {SFMOE_DTYPE_FP32},
                                               {tokens, experts}, logits, "logits"));
    if (!isfinite(d_aux_loss) || !isfinite(d_z_loss)) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: d_aux_loss and d_z_loss must be finite",
                         context);
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, logits->memory, logits->device));
    const sfmoe::RouterBackwardArgs args{
        logits->data,
        logits->dtype,
        static_cast<const int32_t*>(topk_ids->data),
        static_cast<const int64_t*>(tokens_per_expert->data),
        tokens,
        c,
        d_probs ? static_cast<const float*>(d_probs->data) : nullptr,
        d_aux_loss,
        d_z_loss,
        static_cast<float*>(d_logits->data),
        word ? word->word : nullptr};
    if (logits->memory == SFMOE_MEMORY_CUDA) {
      // Ids are checked by the kernel: one outside [0, E) takes no part and raises
      // SFMOE_FAULT_BAD_INDEX.
      SFMOE_RETURN_IF_ERROR(sfmoe::check_router_device_bounds(context, c));
      return sfmoe::ops::backend_for(logits->memory).router_backward(args, stream);
    }
    // The ids index the logits' rows: an id outside [0, E) (not a forward's output) is refused
    // before anything is written.
    const int32_t* ids = static_cast<const int32_t*>(topk_ids->data);
    for (int64_t i = 0; i < tokens * c.top_k; ++i) {
      if (ids[i] < 0 || ids[i] >= experts) {
        return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                           "%s: topk_ids[%lld] = %d is not an expert of %lld", context,
                           static_cast<long long>(i), ids[i], static_cast<long long>(experts));
      }
    }
    return sfmoe::ops::backend_for(logits->memory).router_backward(args, stream);
  });
}

}  // extern "C"
