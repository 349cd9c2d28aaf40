// sfmoe_moe_layer_*: validate once, then the layer's sequences (src/layer/moe_layer.h,
// docs/moe_layer.md).
#include "sfmoe/moe_layer.h"

#include <math.h>
#include <string.h>

#include <new>
#include <vector>

#include "src/api/ep_config.h"
#include "src/api/router_config.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/common/permute_args.h"
#include "src/layer/moe_layer.h"
#include "src/ops/backend.h"

struct sfmoe_moe_layer {
  sfmoe::layer::MoeLayerShape shape;
  sfmoe::layer::MoeLayerPlan plan;
  sfmoe_memory memory;
  int32_t device;
};

namespace sfmoe {
namespace {

// An NCCL group for the layer's expert parallelism: its bounds the layer's, its capacities and
// policy taken (the layer's own ep_* fields left at their defaults).
sfmoe_status take_ep_group(const char* context, const sfmoe_moe_layer_config* c,
                           sfmoe_memory memory, int32_t device, layer::MoeLayerShape* s) {
  const sfmoe_ep_config& g = ep_group_config(c->ep_group);
  if (g.transport != SFMOE_EP_TRANSPORT_NCCL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: ep_group must be an NCCL group (a loopback layer takes ep_world_size and the "
                "ep_* fields instead)",
                context);
  }
  if (c->ep_receive_capacity != SFMOE_EP_CAPACITY_WORST_CASE ||
      c->ep_overflow != SFMOE_EP_OVERFLOW_DROP || c->ep_spill_capacity != 0 ||
      c->ep_pair_capacity != SFMOE_EP_CAPACITY_WORST_CASE) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: with ep_group the group's capacities and overflow policy apply: leave "
                "ep_receive_capacity, ep_overflow, ep_spill_capacity and ep_pair_capacity at their "
                "defaults",
                context);
  }
  const bool same = g.world_size == c->ep_world_size &&
                    g.experts_per_rank * g.world_size == c->num_experts &&
                    g.max_tokens_per_rank == c->max_tokens && g.top_k == c->router.top_k &&
                    g.hidden == c->hidden && g.row_alignment == c->row_alignment &&
                    g.payload == c->dtype && g.payload_scaling == SFMOE_SCALING_NONE;
  if (!same) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: ep_group was made for world %d, %lld experts a rank, %lld tokens, top-k "
                "%lld, hidden %lld, row alignment %lld, payload '%s' (scaling %d); the layer has "
                "ep_world_size %d, %lld experts, %lld tokens, top-k %lld, hidden %lld, alignment "
                "%lld, dtype '%s'",
                context, static_cast<int>(g.world_size), static_cast<long long>(g.experts_per_rank),
                static_cast<long long>(g.max_tokens_per_rank), static_cast<long long>(g.top_k),
                static_cast<long long>(g.hidden), static_cast<long long>(g.row_alignment),
                sfmoe_dtype_name(g.payload), static_cast<int>(g.payload_scaling),
                static_cast<int>(c->ep_world_size), static_cast<long long>(c->num_experts),
                static_cast<long long>(c->max_tokens), static_cast<long long>(c->router.top_k),
                static_cast<long long>(c->hidden), static_cast<long long>(c->row_alignment),
                sfmoe_dtype_name(c->dtype));
  }
  if (memory != SFMOE_MEMORY_CUDA || device != ep_group_device(c->ep_group)) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: ep_group is on device %d; the layer must be too",
                context, static_cast<int>(ep_group_device(c->ep_group)));
  }
  s->ep_transport = SFMOE_EP_TRANSPORT_NCCL;
  s->ep_rank = g.rank;
  s->ep_receive_capacity = g.receive_capacity;
  s->ep_overflow = g.overflow;
  s->ep_spill_capacity = g.spill_capacity;
  s->ep_pair_capacity = g.pair_capacity;
  return SFMOE_SUCCESS;
}

sfmoe_status check_config(const char* context, const sfmoe_moe_layer_config* c, sfmoe_memory memory,
                          int32_t device, layer::MoeLayerShape* s) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "config", c, "sfmoe_moe_layer_config_init()"));
  SFMOE_RETURN_IF_ERROR(validate_memory(context, "the layer", memory, device));
  if (c->hidden < 1 || c->ffn_hidden < 1 || c->num_experts < 1 || c->max_tokens < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: hidden, ffn_hidden and num_experts must be >= 1 and max_tokens >= 0 (got "
                "%lld, %lld, %lld, %lld)",
                context, static_cast<long long>(c->hidden), static_cast<long long>(c->ffn_hidden),
                static_cast<long long>(c->num_experts), static_cast<long long>(c->max_tokens));
  }
  SFMOE_RETURN_IF_ERROR(check_router_config(context, &c->router, c->num_experts, &s->router));
  {
    // Every size the planner forms fits in 64 bits with room for its byte and scale factors: the
    // weights (E x 2F x H), the expert rows ((T k + E (a - 1)) x max(2F, H)).
    const int64_t E = c->num_experts;
    int64_t two_f = 0, weights = 0, padding = 0, rows = 0, row_elements = 0;
    const bool overflows =
        __builtin_mul_overflow(c->ffn_hidden, int64_t{2}, &two_f) ||
        __builtin_mul_overflow(E, two_f, &weights) ||
        __builtin_mul_overflow(weights, c->hidden, &weights) ||
        __builtin_mul_overflow(weights, int64_t{64}, &weights) ||
        __builtin_mul_overflow(E, int64_t{128}, &padding) ||
        __builtin_mul_overflow(c->max_tokens, c->router.top_k, &rows) ||
        __builtin_add_overflow(rows, padding, &rows) ||
        __builtin_mul_overflow(rows, two_f > c->hidden ? two_f : c->hidden, &row_elements) ||
        __builtin_mul_overflow(row_elements, int64_t{64}, &row_elements);
    if (overflows) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: the layer's sizes overflow (hidden %lld, ffn_hidden %lld, num_experts %lld, "
                  "max_tokens %lld, top_k %lld)",
                  context, static_cast<long long>(c->hidden), static_cast<long long>(c->ffn_hidden),
                  static_cast<long long>(E), static_cast<long long>(c->max_tokens),
                  static_cast<long long>(c->router.top_k));
    }
  }
  const int32_t kind = enum_value(c->activation);
  if (kind < SFMOE_ACTIVATION_SWIGLU || kind > SFMOE_ACTIVATION_CLAMPED_SWIGLU) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown activation %d", context,
                static_cast<int>(kind));
  }
  if (!(isfinite(c->activation_limit) && c->activation_limit > 0.0f &&
        isfinite(c->activation_alpha))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: activation_limit must be positive and finite, activation_alpha finite",
                context);
  }
  if (c->expert_capacity < 0 || !permute_alignment_is_valid(c->row_alignment)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: expert_capacity must be >= 0 and row_alignment 1, 8, 16, 32, 64 or 128 (got "
                "%lld, %lld)",
                context, static_cast<long long>(c->expert_capacity),
                static_cast<long long>(c->row_alignment));
  }
  const bool on_device = memory == SFMOE_MEMORY_CUDA;
  if (!layer::recipe_is_known(enum_value(c->recipe))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown recipe %d", context,
                static_cast<int>(enum_value(c->recipe)));
  }
  const sfmoe_moe_recipe recipe = c->recipe;
  if (recipe != SFMOE_MOE_RECIPE_BF16) {
    const int64_t cols = layer::recipe_column_multiple(recipe, on_device);
    const int64_t rows = layer::recipe_row_alignment(recipe, on_device);
    if (c->hidden % cols != 0 || c->ffn_hidden % cols != 0) {
      return fail(SFMOE_ERROR_UNSUPPORTED,
                  "%s: the %s recipe needs hidden and ffn_hidden to be multiples of %lld (its "
                  "blocks along the columns; got %lld, %lld)",
                  context, layer::recipe_name(recipe), static_cast<long long>(cols),
                  static_cast<long long>(c->hidden), static_cast<long long>(c->ffn_hidden));
    }
    if (c->row_alignment % rows != 0) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: the %s recipe needs row_alignment to be a multiple of %lld (its blocks "
                  "down each expert's rows; got %lld)",
                  context, layer::recipe_name(recipe), static_cast<long long>(rows),
                  static_cast<long long>(c->row_alignment));
    }
  }
  if (c->dtype != SFMOE_DTYPE_BF16 && !(c->dtype == SFMOE_DTYPE_FP32 && !on_device)) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH,
                "%s: the layer's dtype must be bf16 (or fp32 on the host), not '%s'", context,
                sfmoe_dtype_name(c->dtype));
  }
  if (on_device) {
    SFMOE_RETURN_IF_ERROR(check_router_device_bounds(context, s->router));
    if (c->router.top_k > kMaxDevicePermuteTopK || c->num_experts > kMaxDevicePermuteExperts) {
      return fail(SFMOE_ERROR_UNSUPPORTED,
                  "%s: the CUDA permute handles top_k up to %d and %d experts", context,
                  kMaxDevicePermuteTopK, kMaxDevicePermuteExperts);
    }
    if (c->hidden % 8 != 0 || c->ffn_hidden % 8 != 0) {
      return fail(SFMOE_ERROR_UNSUPPORTED,
                  "%s: on the device hidden and ffn_hidden must be multiples of 8 (the grouped "
                  "GEMM's 16-byte rows; got %lld, %lld)",
                  context, static_cast<long long>(c->hidden),
                  static_cast<long long>(c->ffn_hidden));
    }
  }
  const int32_t transport = enum_value(c->ep_transport);
  if (transport != SFMOE_EP_TRANSPORT_LOOPBACK && transport != SFMOE_EP_TRANSPORT_EXTERNAL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: ep_transport must be LOOPBACK (an NCCL layer names its group in ep_group) "
                "or EXTERNAL, got %d",
                context, static_cast<int>(transport));
  }
  if (transport == SFMOE_EP_TRANSPORT_EXTERNAL) {
    if (c->ep_group != nullptr) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: an EXTERNAL layer takes ep_world_size and the ep_* fields, no ep_group",
                  context);
    }
    s->ep_transport = SFMOE_EP_TRANSPORT_EXTERNAL;
  }
  if (c->ep_group != nullptr) SFMOE_RETURN_IF_ERROR(take_ep_group(context, c, memory, device, s));
  if (c->ep_world_size < 1 || c->num_experts % c->ep_world_size != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: ep_world_size must be >= 1 and divide num_experts (got %d ranks, %lld "
                "experts)",
                context, static_cast<int>(c->ep_world_size),
                static_cast<long long>(c->num_experts));
  }
  if (c->ep_world_size > 1 && c->expert_capacity != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: with expert parallelism the capacity is the ranks' receive capacity "
                "(ep_receive_capacity); expert_capacity must be 0, got %lld",
                context, static_cast<long long>(c->expert_capacity));
  }
  s->ep_world = c->ep_world_size;
  if (c->ep_group == nullptr) {
    s->ep_receive_capacity = c->ep_receive_capacity;
    s->ep_overflow = c->ep_overflow;
    s->ep_spill_capacity = c->ep_spill_capacity;
    s->ep_pair_capacity = c->ep_pair_capacity;
  }
  s->hidden = c->hidden;
  s->ffn = c->ffn_hidden;
  s->experts = c->num_experts;
  s->top_k = c->router.top_k;
  s->max_tokens = c->max_tokens;
  s->expert_capacity = c->expert_capacity;
  s->row_alignment = c->row_alignment;
  s->activation.kind = static_cast<ActivationKind>(kind);
  s->activation.limit = c->activation_limit;
  s->activation.alpha = c->activation_alpha;
  s->dtype = c->dtype;
  s->accumulate_weight_grads = c->accumulate_weight_grads != 0;
  s->recipe = recipe;
  s->seed = c->seed;
  if (s->expert_parallel()) {
    // The ep_* fields as the EP group's configuration, checked by its own rules.
    char group_context[192];
    snprintf(group_context, sizeof(group_context),
             "%s: the layer's expert-parallel group (ep_world_size, ep_receive_capacity, "
             "ep_overflow, ep_spill_capacity, ep_pair_capacity):",
             context);
    const sfmoe_ep_config group = layer::ep_config_of(*s);
    SFMOE_RETURN_IF_ERROR(check_ep_config(group_context, &group, memory, device));
  }
  return SFMOE_SUCCESS;
}

// A 1-D buffer of at least `bytes` in the layer's memory.
// A buffer the layer's plan sizes (saved, workspace), in the layer's memory.
sfmoe_status expect_buffer(const char* context, const char* name, const sfmoe_tensor* t,
                           int64_t bytes, const sfmoe_moe_layer* layer) {
  return expect_planned_buffer(context, name, t, bytes, "sfmoe_moe_layer_get_plan", layer->memory,
                               layer->device);
}

// A tensor in the layer's memory: `dtypes`, exactly `shape`.
sfmoe_status expect_layer_tensor(const char* context, const char* name, const sfmoe_tensor* t,
                                 std::initializer_list<sfmoe_dtype> dtypes,
                                 std::initializer_list<int64_t> shape,
                                 const sfmoe_moe_layer* layer) {
  SFMOE_RETURN_IF_ERROR(expect_tensor(context, name, t, dtypes, shape, nullptr, nullptr));
  if (t->memory != layer->memory || t->device != layer->device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the layer's memory space", context,
                name);
  }
  return SFMOE_SUCCESS;
}

// The call's token count: x's (or d_y's) rows, at most the layer's bound.
sfmoe_status tokens_of(const char* context, const char* name, const sfmoe_tensor* t,
                       const sfmoe_moe_layer* layer, int64_t* tokens) {
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, name, t));
  if (t->ndim != 2 || t->shape[0] > layer->shape.max_tokens) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s must be [T, H] with T at most the layer's max_tokens = %lld", context, name,
                static_cast<long long>(layer->shape.max_tokens));
  }
  *tokens = t->shape[0];
  return SFMOE_SUCCESS;
}

// What both calls take: the token count from `rows` ([T, H]: x or d_y), the logits, the weights
// and the two buffers, checked against the layer.
sfmoe_status expect_step(const char* context, const char* rows_name, const sfmoe_tensor* rows,
                         const sfmoe_tensor* logits, const sfmoe_tensor* w1, const sfmoe_tensor* w2,
                         const sfmoe_tensor* saved, const sfmoe_tensor* workspace,
                         int64_t workspace_bytes, const sfmoe_moe_layer* layer, int64_t* tokens) {
  const layer::MoeLayerShape& s = layer->shape;
  const layer::MoeLayerPlan& p = layer->plan;
  SFMOE_RETURN_IF_ERROR(tokens_of(context, rows_name, rows, layer, tokens));
  const int64_t T = *tokens, E = s.experts, El = s.local_experts(), H = s.hidden;
  SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, rows_name, rows, {s.dtype}, {T, H}, layer));
  SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "logits", logits,
                                            {SFMOE_DTYPE_FP32, SFMOE_DTYPE_BF16}, {T, E}, layer));
  SFMOE_RETURN_IF_ERROR(
      expect_layer_tensor(context, "w1", w1, {s.dtype}, {El, p.fc1_cols, H}, layer));
  SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "w2", w2, {s.dtype}, {El, H, s.ffn}, layer));
  SFMOE_RETURN_IF_ERROR(expect_buffer(context, "saved", saved, p.saved_bytes, layer));
  return expect_buffer(context, "workspace", workspace, workspace_bytes, layer);
}

// A call's weight cache (sfmoe_moe_forward_args.weight_cache): NULL, or a buffer of the plan's
// weight_cache_bytes (a layer that quantizes no weight takes one and leaves it alone).
sfmoe_status take_weight_cache(const char* context, const sfmoe_moe_layer* layer,
                               const sfmoe_tensor* cache, int32_t filled, uint8_t** data,
                               bool* cache_filled) {
  *data = nullptr;
  *cache_filled = false;
  if (filled != 0 && filled != 1) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: weight_cache_filled must be 0 or 1 (got %d)",
                context, static_cast<int>(filled));
  }
  if (cache == nullptr) {
    if (filled != 0) {
      return fail(SFMOE_ERROR_NULL_POINTER,
                  "%s: weight_cache_filled is set but weight_cache is NULL", context);
    }
    return SFMOE_SUCCESS;
  }
  SFMOE_RETURN_IF_ERROR(
      expect_buffer(context, "weight_cache", cache, layer->plan.weight_cache_bytes, layer));
  if (layer->plan.weight_cache_bytes > 0) {
    *data = static_cast<uint8_t*>(cache->data);
    *cache_filled = filled != 0;
  }
  return SFMOE_SUCCESS;
}

sfmoe_fault_report* word_of(const sfmoe_status_word* word) {
  return word != nullptr ? word->word : nullptr;
}

// Where the forward's counts come from in the saved state, and where they go.
struct ForwardCounts {
  const sfmoe_tensor* out[3] = {nullptr, nullptr, nullptr};
  const void* from[3] = {nullptr, nullptr, nullptr};
  const int64_t* plus[3] = {nullptr, nullptr, nullptr};  // added to `from` (SPILL's 2nd round)
  int64_t size[3] = {0, 0, 0};
};

// A forward's arguments checked against the layer, and the call they give.
sfmoe_status prepare_forward(const char* context, const sfmoe_moe_layer* layer,
                             const sfmoe_moe_forward_args* a, layer::MoeForwardCall* call,
                             ForwardCounts* counts) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "args", a, "sfmoe_moe_forward_args_init()"));
  const layer::MoeLayerShape& s = layer->shape;
  const layer::MoeLayerPlan& p = layer->plan;
  int64_t T = 0;
  SFMOE_RETURN_IF_ERROR(expect_step(context, "x", a->x, a->logits, a->w1, a->w2, a->saved,
                                    a->workspace, p.forward_workspace_bytes, layer, &T));
  const int64_t E = s.experts, H = s.hidden;
  if (a->expert_bias != nullptr) {
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "expert_bias", a->expert_bias,
                                              {SFMOE_DTYPE_FP32}, {E}, layer));
  }
  SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "y", a->y, {s.dtype}, {T, H}, layer));
  const bool aux = s.router.aux_loss_coeff > 0.0f, z = s.router.z_loss_coeff > 0.0f;
  if ((a->aux_loss != nullptr) != aux || (a->z_loss != nullptr) != z) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: aux_loss (z_loss) is written exactly when the router's "
                "aux_loss_coeff (z_loss_coeff) is > 0: pass it then, NULL otherwise",
                context);
  }
  if (aux) {
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "aux_loss", a->aux_loss, {SFMOE_DTYPE_FP32}, {1}, layer));
  }
  if (z) {
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "z_loss", a->z_loss, {SFMOE_DTYPE_FP32}, {1}, layer));
  }
  // The counts' sources in the saved state: permute's, or (EP) the rank's handle's and its
  // router's.
  const char* count_names[] = {"tokens_per_expert", "dropped_per_expert", "routed_per_expert"};
  counts->out[0] = a->tokens_per_expert;
  counts->out[1] = a->dropped_per_expert;
  counts->out[2] = a->routed_per_expert;
  uint8_t* saved = static_cast<uint8_t*>(a->saved->data);
  if (s.expert_parallel()) {
    const EpRankRouting routing = ops::ep_routing_at(p.ep, saved + p.ep_handle.offset);
    counts->from[0] = routing.kept;
    // (SPILL: the kept counts are round-major, [2 E_l]; an expert kept the rows of both rounds)
    if (p.ep.shape.rounds == 2) counts->plus[0] = routing.kept + s.local_experts();
    counts->from[1] = routing.dropped;
    counts->size[0] = s.local_experts();
  } else {
    counts->from[0] = saved + p.kept.offset;
    counts->from[1] = saved + p.dropped.offset;
    counts->size[0] = E;
  }
  counts->from[2] = saved + p.router_counts.offset;
  counts->size[1] = counts->size[2] = E;
  for (int i = 0; i < 3; ++i) {
    if (counts->out[i] == nullptr) continue;
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, count_names[i], counts->out[i],
                                              {SFMOE_DTYPE_INT64}, {counts->size[i]}, layer));
  }
  SFMOE_RETURN_IF_ERROR(check_word(context, a->word, layer->memory, layer->device));

  call->tokens = T;
  call->x = a->x->data;
  call->logits = a->logits->data;
  call->logits_dtype = a->logits->dtype;
  call->expert_bias =
      a->expert_bias != nullptr ? static_cast<const float*>(a->expert_bias->data) : nullptr;
  call->w1 = a->w1->data;
  call->w2 = a->w2->data;
  call->y = a->y->data;
  call->aux_loss = aux ? static_cast<float*>(a->aux_loss->data) : nullptr;
  call->z_loss = z ? static_cast<float*>(a->z_loss->data) : nullptr;
  call->saved = static_cast<uint8_t*>(a->saved->data);
  call->workspace = static_cast<uint8_t*>(a->workspace->data);
  SFMOE_RETURN_IF_ERROR(take_weight_cache(context, layer, a->weight_cache, a->weight_cache_filled,
                                          &call->weight_cache, &call->weight_cache_filled));
  call->memory = layer->memory;
  call->word = word_of(a->word);
  call->stream = a->stream;
  return SFMOE_SUCCESS;
}

// The counts copied out of the saved state, ordered after the forward on the stream.
sfmoe_status copy_counts(const sfmoe_moe_layer* layer, const ForwardCounts& counts, void* stream) {
  CopySpan spans[3];
  size_t n = 0;
  for (int i = 0; i < 3; ++i) {
    if (counts.out[i] == nullptr) continue;
    spans[n++] = CopySpan{counts.out[i]->data, counts.from[i],
                          static_cast<size_t>(counts.size[i]) * 8, counts.plus[i]};
  }
  return ops::backend_for(layer->memory).copy_spans(spans, n, stream);
}

// A backward's arguments checked against the layer, and the call they give.
sfmoe_status prepare_backward(const char* context, const sfmoe_moe_layer* layer,
                              const sfmoe_moe_backward_args* a, layer::MoeBackwardCall* call) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "args", a, "sfmoe_moe_backward_args_init()"));
  const layer::MoeLayerShape& s = layer->shape;
  const layer::MoeLayerPlan& p = layer->plan;
  const int32_t part = enum_value(a->part);
  if (part < SFMOE_MOE_BACKWARD_ALL || part > SFMOE_MOE_BACKWARD_FC2_WGRAD) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown backward part %d", context,
                static_cast<int>(part));
  }
  const bool split = part == SFMOE_MOE_BACKWARD_FC2_DGRAD || part == SFMOE_MOE_BACKWARD_FC2_WGRAD;
  if (split && s.expert_parallel()) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the three-part backward (FC2_DGRAD, FC1, FC2_WGRAD) runs without expert "
                "parallelism; this layer's parts are FC2 then FC1",
                context);
  }
  // What each part reads and writes (sfmoe_moe_backward_part).
  const bool fc1 = part == SFMOE_MOE_BACKWARD_ALL || part == SFMOE_MOE_BACKWARD_FC1;
  const bool reads_d_y = part != SFMOE_MOE_BACKWARD_FC1;
  const bool reads_w2 = reads_d_y && part != SFMOE_MOE_BACKWARD_FC2_WGRAD;
  const bool writes_d_w2 = reads_d_y && part != SFMOE_MOE_BACKWARD_FC2_DGRAD;
  const bool reads_saved = part != SFMOE_MOE_BACKWARD_FC2_WGRAD;
  const int64_t E = s.experts, El = s.local_experts(), H = s.hidden;
  // The token count from d y or x (the FC1 part); the other must agree.
  int64_t T = 0;
  SFMOE_RETURN_IF_ERROR(
      tokens_of(context, reads_d_y ? "d_y" : "x", reads_d_y ? a->d_y : a->x, layer, &T));
  if (reads_d_y) {
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "d_y", a->d_y, {s.dtype}, {T, H}, layer));
  }
  if (reads_w2) {
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "w2", a->w2, {s.dtype}, {El, H, s.ffn}, layer));
  }
  if (fc1) {
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "x", a->x, {s.dtype}, {T, H}, layer));
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "logits", a->logits,
                                              {SFMOE_DTYPE_FP32, SFMOE_DTYPE_BF16}, {T, E}, layer));
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "w1", a->w1, {s.dtype}, {El, p.fc1_cols, H}, layer));
  }
  if (reads_saved) {
    SFMOE_RETURN_IF_ERROR(expect_buffer(context, "saved", a->saved, p.saved_bytes, layer));
  }
  SFMOE_RETURN_IF_ERROR(expect_buffer(
      context, "workspace", a->workspace,
      part == SFMOE_MOE_BACKWARD_FC1 ? p.fc1_backward_workspace_bytes : p.workspace_bytes, layer));
  if (fc1 && !(isfinite(a->d_aux_loss) && isfinite(a->d_z_loss))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: d_aux_loss and d_z_loss must be finite",
                context);
  }
  const sfmoe_dtype grads = s.accumulate_weight_grads ? SFMOE_DTYPE_FP32 : s.dtype;
  if (fc1) {
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "d_x", a->d_x, {s.dtype}, {T, H}, layer));
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "d_logits", a->d_logits, {SFMOE_DTYPE_FP32}, {T, E}, layer));
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "d_w1", a->d_w1, {grads}, {El, p.fc1_cols, H}, layer));
  }
  if (writes_d_w2) {
    SFMOE_RETURN_IF_ERROR(
        expect_layer_tensor(context, "d_w2", a->d_w2, {grads}, {El, H, s.ffn}, layer));
  }
  if (a->rng_offset_device != nullptr) {
    SFMOE_RETURN_IF_ERROR(expect_layer_tensor(context, "rng_offset_device", a->rng_offset_device,
                                              {SFMOE_DTYPE_INT64}, {1}, layer));
  }
  SFMOE_RETURN_IF_ERROR(check_word(context, a->word, layer->memory, layer->device));

  call->part = static_cast<sfmoe_moe_backward_part>(part);
  call->tokens = T;
  call->x = fc1 ? a->x->data : nullptr;
  call->d_y = reads_d_y ? a->d_y->data : nullptr;
  call->logits = fc1 ? a->logits->data : nullptr;
  call->logits_dtype = fc1 ? a->logits->dtype : SFMOE_DTYPE_FP32;
  call->w1 = fc1 ? a->w1->data : nullptr;
  call->w2 = reads_w2 ? a->w2->data : nullptr;
  call->d_aux_loss = a->d_aux_loss;
  call->d_z_loss = a->d_z_loss;
  call->rng_offset = a->rng_offset;
  call->rng_offset_device =
      a->rng_offset_device ? static_cast<const uint64_t*>(a->rng_offset_device->data) : nullptr;
  call->d_x = fc1 ? a->d_x->data : nullptr;
  call->d_logits = fc1 ? static_cast<float*>(a->d_logits->data) : nullptr;
  call->d_w1 = fc1 ? a->d_w1->data : nullptr;
  call->d_w2 = writes_d_w2 ? a->d_w2->data : nullptr;
  call->saved = reads_saved ? static_cast<uint8_t*>(a->saved->data) : nullptr;
  call->workspace = static_cast<uint8_t*>(a->workspace->data);
  SFMOE_RETURN_IF_ERROR(take_weight_cache(context, layer, a->weight_cache, a->weight_cache_filled,
                                          &call->weight_cache, &call->weight_cache_filled));
  call->memory = layer->memory;
  call->word = word_of(a->word);
  call->stream = a->stream;
  return SFMOE_SUCCESS;
}

// An EP layer's calls take every rank's arguments, the others one set; an EXTERNAL layer's run
// in stages.
sfmoe_status expect_ranks_call(const char* context, const sfmoe_moe_layer* layer, bool ranks) {
  if (layer == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: layer is NULL", context);
  if (layer->shape.ep_transport == SFMOE_EP_TRANSPORT_EXTERNAL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: this layer's transport is EXTERNAL: its calls run in stages "
                "(sfmoe_moe_layer_forward_stage, sfmoe_moe_layer_backward_stage)",
                context);
  }
  if (!ranks && layer->shape.local_ranks() > 1) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: this layer is expert-parallel over %lld loopback ranks: call %s_ranks with "
                "every rank's arguments",
                context, static_cast<long long>(layer->shape.ep_world), context);
  }
  return SFMOE_SUCCESS;
}

// Each rank's saved state and workspace its own: ranks sharing one would overwrite each other's
// routing and rows.
template <class Call>
sfmoe_status expect_distinct_buffers(const char* context, const std::vector<Call>& calls) {
  for (size_t i = 0; i < calls.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (calls[i].saved == calls[j].saved || calls[i].workspace == calls[j].workspace ||
          (calls[i].weight_cache != nullptr && calls[i].weight_cache == calls[j].weight_cache)) {
        return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                    "%s: ranks %zu and %zu share a saved state, workspace or weight cache; each "
                    "rank needs its own",
                    context, j, i);
      }
    }
  }
  return SFMOE_SUCCESS;
}

// Every rank's arguments checked (`prepare`, worded with the rank) into its call, the ranks'
// buffers apart.
template <class Args, class Call, class Prepare>
sfmoe_status prepare_ranks(const char* context, const sfmoe_moe_layer* layer,
                           const Args* const* args, std::vector<Call>* calls, Prepare prepare) {
  SFMOE_RETURN_IF_ERROR(expect_ranks_call(context, layer, true));
  if (args == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: args is NULL (one per rank)", context);
  }
  calls->assign(static_cast<size_t>(layer->shape.local_ranks()), Call{});
  for (size_t r = 0; r < calls->size(); ++r) {
    char label[64];
    snprintf(label, sizeof(label), "%s (rank %zu)", context, r);
    if (args[r] == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: args is NULL", label);
    SFMOE_RETURN_IF_ERROR(prepare(label, args[r], &(*calls)[r]));
  }
  return expect_distinct_buffers(context, *calls);
}

// An EXTERNAL layer's collectives into the C struct.
sfmoe_status stages_of(const char* context, const std::vector<ops::EpCollective>& collectives,
                       sfmoe_moe_stages* stages) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "stages", stages, "sfmoe_moe_stages_init()"));
  const size_t n = collectives.size();
  if (n > SFMOE_MOE_MAX_COLLECTIVES) {
    return fail(SFMOE_ERROR_INTERNAL, "%s: %zu collectives", context, n);
  }
  stages->collectives = static_cast<int32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    stages->collective[i].kind =
        collectives[i].all_to_all ? SFMOE_EP_COLLECTIVE_ALL_TO_ALL : SFMOE_EP_COLLECTIVE_ALL_GATHER;
    stages->collective[i].bytes = collectives[i].bytes;
  }
  return SFMOE_SUCCESS;
}

sfmoe_status expect_external(const char* context, const sfmoe_moe_layer* layer) {
  if (layer == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: layer is NULL", context);
  if (layer->shape.ep_transport != SFMOE_EP_TRANSPORT_EXTERNAL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: stages are an EXTERNAL layer's (config.ep_transport); call "
                "sfmoe_moe_layer_forward / _backward (or their _ranks forms) instead",
                context);
  }
  return SFMOE_SUCCESS;
}

// A stage's arguments against its sequence's collectives, as the layer takes them.
sfmoe_status prepare_stage(const char* context, const sfmoe_moe_layer* layer,
                           const std::vector<ops::EpCollective>& collectives,
                           const sfmoe_moe_stage* st, layer::MoeStage* stage) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "stage", st, "sfmoe_moe_stage_init()"));
  const int64_t n = static_cast<int64_t>(collectives.size()), world = layer->shape.ep_world;
  if (st->index < 0 || st->index > n) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: stage index %d is outside [0, %lld]", context,
                static_cast<int>(st->index), static_cast<long long>(n));
  }
  SFMOE_RETURN_IF_ERROR(
      expect_layer_tensor(context, "stage.rank", st->rank, {SFMOE_DTYPE_INT32}, {1}, layer));
  stage->index = st->index;
  stage->rank = static_cast<const int32_t*>(st->rank->data);
  stage->received = nullptr;
  stage->sent = nullptr;
  const char* what[2] = {"stage.received", "stage.sent"};
  const sfmoe_tensor* given[2] = {st->received, st->sent};
  for (int side = 0; side < 2; ++side) {
    const int64_t i = side == 0 ? st->index - 1 : st->index;
    if (i < 0 || i >= n) {
      if (given[side] != nullptr) {
        return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: stage %d has no %s: pass NULL", context,
                    static_cast<int>(st->index), what[side] + 6);
      }
      continue;
    }
    const int64_t bytes =
        side == 0 ? collectives[i].received_bytes(world) : collectives[i].sent_bytes(world);
    SFMOE_RETURN_IF_ERROR(expect_planned_buffer(context, what[side], given[side], bytes,
                                                "sfmoe_moe_layer_get_forward_stages", layer->memory,
                                                layer->device));
  }
  stage->received = st->received != nullptr ? st->received->data : nullptr;
  stage->sent = st->sent != nullptr ? st->sent->data : nullptr;
  return SFMOE_SUCCESS;
}

}  // namespace
}  // namespace sfmoe

extern "C" {

sfmoe_moe_stages sfmoe_moe_stages_init(void) {
  return sfmoe::sized_zero_config<sfmoe_moe_stages>();
}

sfmoe_moe_stage sfmoe_moe_stage_init(void) { return sfmoe::sized_zero_config<sfmoe_moe_stage>(); }

sfmoe_status sfmoe_moe_layer_get_forward_stages(const sfmoe_moe_layer* layer,
                                                sfmoe_moe_stages* stages) {
  const char* context = "sfmoe_moe_layer_get_forward_stages";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_external(context, layer));
    return sfmoe::stages_of(context, layer->plan.forward_collectives, stages);
  });
}

sfmoe_status sfmoe_moe_layer_get_backward_stages(const sfmoe_moe_layer* layer,
                                                 sfmoe_moe_backward_part part,
                                                 sfmoe_moe_stages* stages) {
  const char* context = "sfmoe_moe_layer_get_backward_stages";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_external(context, layer));
    const int32_t p = sfmoe::enum_value(part);
    if (p == SFMOE_MOE_BACKWARD_FC2_DGRAD || p == SFMOE_MOE_BACKWARD_FC2_WGRAD) {
      return sfmoe::fail(SFMOE_ERROR_UNSUPPORTED,
                         "%s: the three-part backward runs without expert parallelism", context);
    }
    if (p < SFMOE_MOE_BACKWARD_ALL || p > SFMOE_MOE_BACKWARD_FC1) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown backward part %d", context,
                         static_cast<int>(p));
    }
    return sfmoe::stages_of(context, layer->plan.backward_collectives[p], stages);
  });
}

sfmoe_status sfmoe_moe_layer_forward_stage(const sfmoe_moe_layer* layer,
                                           const sfmoe_moe_forward_args* a,
                                           const sfmoe_moe_stage* st) {
  const char* context = "sfmoe_moe_layer_forward_stage";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_external(context, layer));
    sfmoe::layer::MoeStage stage{};
    SFMOE_RETURN_IF_ERROR(
        sfmoe::prepare_stage(context, layer, layer->plan.forward_collectives, st, &stage));
    sfmoe::layer::MoeForwardCall call{};
    sfmoe::ForwardCounts counts;
    SFMOE_RETURN_IF_ERROR(sfmoe::prepare_forward(context, layer, a, &call, &counts));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::layer::moe_layer_forward_stage(layer->shape, layer->plan, call, stage));
    const bool last = stage.index == static_cast<int64_t>(layer->plan.forward_collectives.size());
    return last ? sfmoe::copy_counts(layer, counts, a->stream) : SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_moe_layer_backward_stage(const sfmoe_moe_layer* layer,
                                            const sfmoe_moe_backward_args* a,
                                            const sfmoe_moe_stage* st) {
  const char* context = "sfmoe_moe_layer_backward_stage";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_external(context, layer));
    sfmoe::layer::MoeBackwardCall call{};
    SFMOE_RETURN_IF_ERROR(sfmoe::prepare_backward(context, layer, a, &call));
    sfmoe::layer::MoeStage stage{};
    SFMOE_RETURN_IF_ERROR(sfmoe::prepare_stage(
        context, layer, layer->plan.backward_collectives[call.part], st, &stage));
    return sfmoe::layer::moe_layer_backward_stage(layer->shape, layer->plan, call, stage);
  });
}

sfmoe_moe_layer_config sfmoe_moe_layer_config_init(void) {
  sfmoe_moe_layer_config c = sfmoe::sized_zero_config<sfmoe_moe_layer_config>();
  c.router = sfmoe_router_config_init();
  c.activation = SFMOE_ACTIVATION_SWIGLU;
  c.activation_limit = 7.0f;
  c.activation_alpha = 1.702f;
  c.row_alignment = 16;
  c.dtype = SFMOE_DTYPE_BF16;
  c.recipe = SFMOE_MOE_RECIPE_BF16;
  c.ep_world_size = 1;
  c.ep_receive_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
  c.ep_overflow = SFMOE_EP_OVERFLOW_DROP;
  c.ep_pair_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
  return c;
}

sfmoe_moe_layer_plan sfmoe_moe_layer_plan_init(void) {
  return sfmoe::sized_zero_config<sfmoe_moe_layer_plan>();
}

sfmoe_moe_forward_args sfmoe_moe_forward_args_init(void) {
  return sfmoe::sized_zero_config<sfmoe_moe_forward_args>();
}

sfmoe_moe_backward_args sfmoe_moe_backward_args_init(void) {
  sfmoe_moe_backward_args a = sfmoe::sized_zero_config<sfmoe_moe_backward_args>();
  a.d_aux_loss = 1.0f;
  a.d_z_loss = 1.0f;
  return a;
}

sfmoe_status sfmoe_moe_layer_create(const sfmoe_moe_layer_config* config, sfmoe_memory memory,
                                    int32_t device, sfmoe_moe_layer** out) {
  const char* context = "sfmoe_moe_layer_create";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (out == nullptr) return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: out is NULL", context);
    *out = nullptr;
    sfmoe::layer::MoeLayerShape shape;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_config(context, config, memory, device, &shape));
    sfmoe::layer::MoeLayerPlan plan;
    const sfmoe::Outcome planned = sfmoe::layer::plan_moe_layer(shape, memory, &plan);
    if (!planned.ok()) return sfmoe::fail_with(context, planned);
    if (config->ep_group != nullptr) plan.ep_exchange = sfmoe::ep_group_exchange(config->ep_group);
    *out = new sfmoe_moe_layer{shape, plan, memory, device};
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_moe_layer_destroy(sfmoe_moe_layer* layer) {
  delete layer;
  return SFMOE_SUCCESS;
}

sfmoe_status sfmoe_moe_layer_get_plan(const sfmoe_moe_layer* layer, sfmoe_moe_layer_plan* plan) {
  const char* context = "sfmoe_moe_layer_get_plan";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (layer == nullptr)
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: layer is NULL", context);
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "plan", plan, "sfmoe_moe_layer_plan_init()"));
    plan->saved_bytes = layer->plan.saved_bytes;
    plan->weight_cache_bytes = layer->plan.weight_cache_bytes;
    plan->workspace_bytes = layer->plan.workspace_bytes;
    plan->forward_workspace_bytes = layer->plan.forward_workspace_bytes;
    plan->fc1_backward_workspace_bytes = layer->plan.fc1_backward_workspace_bytes;
    plan->row_capacity = layer->plan.row_capacity;
    plan->fc1_cols = layer->plan.fc1_cols;
    plan->emulated = layer->memory == SFMOE_MEMORY_CUDA &&
                     sfmoe::layer::recipe_emulated_on_device(layer->shape.recipe);
    plan->local_ranks = static_cast<int32_t>(layer->shape.local_ranks());
    plan->local_experts = layer->shape.local_experts();
    plan->backward_peak_bytes_two_parts = layer->plan.backward_peak_two_parts;
    plan->backward_peak_bytes_three_parts = layer->plan.backward_peak_three_parts;
    plan->three_part_backward = layer->plan.three_part_backward ? 1 : 0;
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_moe_layer_forward(const sfmoe_moe_layer* layer,
                                     const sfmoe_moe_forward_args* a) {
  const char* context = "sfmoe_moe_layer_forward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_ranks_call(context, layer, false));
    sfmoe::layer::MoeForwardCall call{};
    sfmoe::ForwardCounts counts;
    SFMOE_RETURN_IF_ERROR(sfmoe::prepare_forward(context, layer, a, &call, &counts));
    SFMOE_RETURN_IF_ERROR(sfmoe::layer::moe_layer_forward(layer->shape, layer->plan, call));
    return sfmoe::copy_counts(layer, counts, a->stream);
  });
}

sfmoe_status sfmoe_moe_layer_fill_weight_cache(const sfmoe_moe_layer* layer, const sfmoe_tensor* w1,
                                               const sfmoe_tensor* w2,
                                               const sfmoe_tensor* weight_cache,
                                               sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_moe_layer_fill_weight_cache";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (layer == nullptr)
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: layer is NULL", context);
    const sfmoe::layer::MoeLayerShape& s = layer->shape;
    const sfmoe::layer::MoeLayerPlan& p = layer->plan;
    const int64_t El = s.local_experts(), H = s.hidden;
    SFMOE_RETURN_IF_ERROR(
        sfmoe::expect_layer_tensor(context, "w1", w1, {s.dtype}, {El, p.fc1_cols, H}, layer));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::expect_layer_tensor(context, "w2", w2, {s.dtype}, {El, H, s.ffn}, layer));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::expect_buffer(context, "weight_cache", weight_cache, p.weight_cache_bytes, layer));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, layer->memory, layer->device));
    return sfmoe::layer::moe_layer_fill_weight_cache(s, p, w1->data, w2->data,
                                                     static_cast<uint8_t*>(weight_cache->data),
                                                     layer->memory, sfmoe::word_of(word), stream);
  });
}

sfmoe_status sfmoe_moe_layer_backward(const sfmoe_moe_layer* layer,
                                      const sfmoe_moe_backward_args* a) {
  const char* context = "sfmoe_moe_layer_backward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_ranks_call(context, layer, false));
    sfmoe::layer::MoeBackwardCall call{};
    SFMOE_RETURN_IF_ERROR(sfmoe::prepare_backward(context, layer, a, &call));
    return sfmoe::layer::moe_layer_backward(layer->shape, layer->plan, call);
  });
}

sfmoe_status sfmoe_moe_layer_forward_ranks(const sfmoe_moe_layer* layer,
                                           const sfmoe_moe_forward_args* const* args) {
  const char* context = "sfmoe_moe_layer_forward_ranks";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    std::vector<sfmoe::layer::MoeForwardCall> calls;
    std::vector<sfmoe::ForwardCounts> counts;
    SFMOE_RETURN_IF_ERROR(
        sfmoe::prepare_ranks(context, layer, args, &calls,
                             [&](const char* label, const sfmoe_moe_forward_args* a,
                                 sfmoe::layer::MoeForwardCall* call) {
                               counts.emplace_back();
                               return sfmoe::prepare_forward(label, layer, a, call, &counts.back());
                             }));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::layer::moe_layer_forward_ranks(layer->shape, layer->plan, calls.data()));
    for (const sfmoe::ForwardCounts& c : counts) {
      SFMOE_RETURN_IF_ERROR(sfmoe::copy_counts(layer, c, args[0]->stream));
    }
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_moe_layer_backward_ranks(const sfmoe_moe_layer* layer,
                                            const sfmoe_moe_backward_args* const* args) {
  const char* context = "sfmoe_moe_layer_backward_ranks";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    std::vector<sfmoe::layer::MoeBackwardCall> calls;
    SFMOE_RETURN_IF_ERROR(
        sfmoe::prepare_ranks(context, layer, args, &calls,
                             [&](const char* label, const sfmoe_moe_backward_args* a,
                                 sfmoe::layer::MoeBackwardCall* call) {
                               return sfmoe::prepare_backward(label, layer, a, call);
                             }));
    for (const sfmoe::layer::MoeBackwardCall& call : calls) {
      if (call.part != calls[0].part) {
        return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                           "%s: every rank runs the same backward part", context);
      }
    }
    return sfmoe::layer::moe_layer_backward_ranks(layer->shape, layer->plan, calls.data());
  });
}

}  // extern "C"
