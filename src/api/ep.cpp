// sfmoe_ep_*: expert parallelism (include/sfmoe/ep.h, docs/ep.md). Validate once, then the
// backend's routing and row movements over every rank the process holds.
#include "sfmoe/ep.h"

#include <string.h>

#include <algorithm>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "src/api/ep_config.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/ep_args.h"
#include "src/common/error.h"
#include "src/common/permute_args.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"
#if SFMOE_WITH_CUDA
#include "src/cuda/ep/ep_exchange.h"
#endif

struct sfmoe_ep_group {
  sfmoe_ep_config config;
  sfmoe::ops::EpLayout layout;  // shape, handle layout, scales beside the rows
  sfmoe_memory memory;
  int32_t device;
#if SFMOE_WITH_CUDA
  std::unique_ptr<sfmoe::cuda::EpRankTransport> transport;  // NCCL: the exchange and staging
#endif
  const sfmoe::EpRankExchange* exchange() const {
#if SFMOE_WITH_CUDA
    if (transport != nullptr) return transport->view();
#endif
    return nullptr;
  }
};

namespace sfmoe {
namespace {

constexpr int64_t kMaxWorld = 1 << 16;

}  // namespace

sfmoe_status check_ep_config(const char* context, const sfmoe_ep_config* c, sfmoe_memory memory,
                             int32_t device) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "config", c, "sfmoe_ep_config_init()"));
  SFMOE_RETURN_IF_ERROR(validate_memory(context, "the group", memory, device));
  const int32_t transport = enum_value(c->transport), overflow = enum_value(c->overflow);
  if (transport != SFMOE_EP_TRANSPORT_LOOPBACK && transport != SFMOE_EP_TRANSPORT_NCCL &&
      transport != SFMOE_EP_TRANSPORT_EXTERNAL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown transport %d", context,
                static_cast<int>(transport));
  }
  if (overflow < SFMOE_EP_OVERFLOW_DROP || overflow > SFMOE_EP_OVERFLOW_SPILL) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown overflow policy %d", context,
                static_cast<int>(overflow));
  }
  if (c->world_size < 1 || c->world_size > kMaxWorld) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: world_size must be in [1, %lld], got %d",
                context, static_cast<long long>(kMaxWorld), static_cast<int>(c->world_size));
  }
  if (c->rank < 0 || c->rank >= c->world_size) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: rank %d is outside the world of %d ranks",
                context, static_cast<int>(c->rank), static_cast<int>(c->world_size));
  }
  if (transport == SFMOE_EP_TRANSPORT_LOOPBACK && c->rank != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: a loopback group holds every rank in this process: rank must be 0, got %d",
                context, static_cast<int>(c->rank));
  }
  if (c->experts_per_rank < 1 || c->max_tokens_per_rank < 0 || c->hidden < 1) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: experts_per_rank and hidden must be >= 1 and max_tokens_per_rank >= 0 (got "
                "%lld, %lld, %lld)",
                context, static_cast<long long>(c->experts_per_rank),
                static_cast<long long>(c->hidden), static_cast<long long>(c->max_tokens_per_rank));
  }
  if (c->receive_capacity < 1 && c->receive_capacity != SFMOE_EP_CAPACITY_WORST_CASE) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: receive_capacity must be >= 1 rows (or SFMOE_EP_CAPACITY_WORST_CASE), got "
                "%lld: a rank that keeps no row would drop every token sent to it",
                context, static_cast<long long>(c->receive_capacity));
  }
  int64_t experts = 0, slots = 0, worst = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(c->world_size), c->experts_per_rank, &experts) ||
      __builtin_mul_overflow(c->max_tokens_per_rank, c->top_k < 0 ? 0 : c->top_k, &slots) ||
      __builtin_mul_overflow(slots, static_cast<int64_t>(c->world_size), &worst) ||
      experts > INT32_MAX) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: the group's sizes overflow", context);
  }
  if (c->top_k < 1 || c->top_k > experts) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: top_k must be in [1, world_size * experts_per_rank = %lld], got %lld", context,
                static_cast<long long>(experts), static_cast<long long>(c->top_k));
  }
  const int32_t payload = enum_value(c->payload), scaling = enum_value(c->payload_scaling);
  const bool fp8 = payload == SFMOE_DTYPE_FP8_E4M3 || payload == SFMOE_DTYPE_FP8_E5M2;
  if (payload != SFMOE_DTYPE_BF16 && payload != SFMOE_DTYPE_FP16 && payload != SFMOE_DTYPE_FP32 &&
      !fp8) {
    return fail(SFMOE_ERROR_DTYPE_MISMATCH,
                "%s: payload must be bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2, got '%s'", context,
                sfmoe_dtype_name(c->payload));
  }
  if (fp8 != (scaling == SFMOE_SCALING_TENSOR || scaling == SFMOE_SCALING_BLOCK_1X128 ||
              scaling == SFMOE_SCALING_MX_1X32)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: payload_scaling must be TENSOR, BLOCK_1X128 or MX_1X32 for FP8 codes and "
                "NONE for bf16, fp16 or fp32 rows; got scaling %d with '%s'",
                context, static_cast<int>(scaling), sfmoe_dtype_name(c->payload));
  }
  const bool spill = overflow == SFMOE_EP_OVERFLOW_SPILL;
  if (spill ? c->spill_capacity < 1 && c->spill_capacity != SFMOE_EP_CAPACITY_WORST_CASE
            : c->spill_capacity != 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                spill ? "%s: with SPILL, spill_capacity must be >= 1 rows (or "
                        "SFMOE_EP_CAPACITY_WORST_CASE), got %lld"
                      : "%s: spill_capacity is the SPILL policy's second round: it must be 0 "
                        "with DROP or TRAP, got %lld",
                context, static_cast<long long>(c->spill_capacity));
  }
  if (c->pair_capacity < 0 && c->pair_capacity != SFMOE_EP_CAPACITY_WORST_CASE) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: pair_capacity must be >= 1 rows, or 0 / SFMOE_EP_CAPACITY_WORST_CASE (no "
                "bound), got %lld",
                context, static_cast<long long>(c->pair_capacity));
  }
  if (c->pair_capacity > 0 && transport == SFMOE_EP_TRANSPORT_LOOPBACK &&
      memory == SFMOE_MEMORY_CUDA) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: pair_capacity bounds what the per-rank transports move between ranks; the "
                "device loopback does not take it (the host loopback, the reference, does)",
                context);
  }
  if (!permute_alignment_is_valid(c->row_alignment)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                "%s: row_alignment must be 1, 8, 16, 32, 64 or 128, got %lld", context,
                static_cast<long long>(c->row_alignment));
  }
  if (transport == SFMOE_EP_TRANSPORT_NCCL && memory != SFMOE_MEMORY_CUDA) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the NCCL transport moves device memory: memory must be SFMOE_MEMORY_CUDA "
                "(the loopback holds every rank on the host)",
                context);
  }
  if (memory == SFMOE_MEMORY_CUDA && c->world_size > kMaxDeviceEpRanks) {
    return fail(SFMOE_ERROR_UNSUPPORTED, "%s: the device transports hold up to %lld ranks, got %d",
                context, static_cast<long long>(kMaxDeviceEpRanks),
                static_cast<int>(c->world_size));
  }
  // (the device routing counts a round's rows in 32 bits)
  if (memory == SFMOE_MEMORY_CUDA && worst >= (int64_t{1} << 31)) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the device loopback routes fewer than 2^31 rows in all, got %lld", context,
                static_cast<long long>(worst));
  }
  return SFMOE_SUCCESS;
}

namespace {

// The configuration checked, and the group's layout from it.
sfmoe_status check_config(const char* context, const sfmoe_ep_config* c, sfmoe_memory memory,
                          int32_t device, sfmoe_ep_group* g) {
  SFMOE_RETURN_IF_ERROR(check_ep_config(context, c, memory, device));
  const Outcome planned = ops::plan_ep(*c, memory, &g->layout);
  if (!planned.ok()) return fail_with(context, planned);
  g->config = *c;
  g->memory = memory;
  g->device = device;
  return SFMOE_SUCCESS;
}

// The NCCL transport's exchange and staging, made at creation (`exchange` given: the ranks of a
// test emulated in one process; else NCCL from the configuration's id or communicator).
sfmoe_status make_transport(const char* context, sfmoe_ep_group* g,
                            std::unique_ptr<EpExchange> exchange) {
  const sfmoe_ep_config& c = g->config;
  if (c.transport != SFMOE_EP_TRANSPORT_NCCL) {
    if (c.nccl_unique_id != nullptr || c.nccl_comm != nullptr) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: nccl_unique_id and nccl_comm are for the NCCL transport", context);
    }
    return SFMOE_SUCCESS;
  }
#if SFMOE_WITH_CUDA
  const ops::EpLayout& l = g->layout;
  int64_t blocks = 0, bytes = 0;
  if (__builtin_mul_overflow(l.shape.world, l.pair_rows, &blocks) ||
      __builtin_mul_overflow(blocks, 2 * (l.staging_row_bytes + l.scale_bytes) + 16, &bytes)) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: the NCCL staging's size overflows", context);
  }
  if (exchange == nullptr) {
    if ((c.nccl_unique_id == nullptr) == (c.nccl_comm == nullptr)) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: the NCCL transport takes either nccl_unique_id (from "
                  "sfmoe_ep_nccl_unique_id, shared by the ranks) or nccl_comm, exactly one",
                  context);
    }
    SFMOE_RETURN_IF_ERROR(cuda::nccl_exchange_create(c.nccl_unique_id, c.nccl_comm, c.world_size,
                                                     c.rank, g->device, &exchange));
  }
  return cuda::EpRankTransport::create(l.shape.world, c.rank, l.pair_rows, l.staging_row_bytes,
                                       l.scale_bytes, g->device, std::move(exchange),
                                       &g->transport);
#else
  (void)exchange;
  return fail(SFMOE_ERROR_NO_BACKEND, "%s: the NCCL transport needs the CUDA backend", context);
#endif
}

EpRankRouting routing_of(const sfmoe_ep_group* g, const sfmoe_tensor* handle) {
  return ops::ep_routing_at(g->layout, handle->data);
}

int64_t ranks_of(const sfmoe_ep_group* g) {
  return g->config.transport == SFMOE_EP_TRANSPORT_LOOPBACK ? g->config.world_size : 1;
}

// The per-rank array `list` (local ranks entries), each a tensor of `dtype` (or one of them) and
// exactly `shape(r)`; `optional`: the array may be NULL as a whole.
template <class Shape>
sfmoe_status expect_ranks(const char* context, const char* name, const sfmoe_tensor* const* list,
                          const sfmoe_ep_group* g, std::initializer_list<sfmoe_dtype> dtypes,
                          Shape shape, bool optional = false) {
  if (list == nullptr) {
    if (optional) return SFMOE_SUCCESS;
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s is NULL (an array of %lld tensors, one per rank)",
                context, name, static_cast<long long>(ranks_of(g)));
  }
  for (int64_t r = 0; r < ranks_of(g); ++r) {
    char label[64];
    snprintf(label, sizeof(label), "%s[%lld]", name, static_cast<long long>(r));
    const sfmoe_tensor* t = list[r];
    if (t == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s is NULL", context, label);
    SFMOE_RETURN_IF_ERROR(validate_tensor(context, label, t));
    const std::vector<int64_t> want = shape(r);
    bool same = t->ndim == static_cast<int32_t>(want.size());
    for (size_t i = 0; same && i < want.size(); ++i) same = t->shape[i] == want[i];
    bool dtype_ok = false;
    for (sfmoe_dtype d : dtypes) dtype_ok = dtype_ok || t->dtype == d;
    if (!same || !dtype_ok) {
      char expected[96] = "";
      size_t used = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        used += snprintf(expected + used, sizeof(expected) - used, "%s%lld", i ? ", " : "",
                         static_cast<long long>(want[i]));
      }
      return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s must be a '%s' tensor of shape [%s]", context,
                  label, sfmoe_dtype_name(*dtypes.begin()), expected);
    }
    if (t->memory != g->memory || t->device != g->device) {
      return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: %s is not in the group's memory space", context,
                  label);
    }
  }
  return SFMOE_SUCCESS;
}

// 1-D buffers of at least `bytes`, one per rank.
sfmoe_status expect_handles(const char* context, const sfmoe_tensor* const* list,
                            const sfmoe_ep_group* g) {
  if (list == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: handle is NULL (one per rank, %lld bytes each)",
                context, static_cast<long long>(g->layout.handle.bytes));
  }
  for (int64_t r = 0; r < ranks_of(g); ++r) {
    char label[32];
    snprintf(label, sizeof(label), "handle[%lld]", static_cast<long long>(r));
    SFMOE_RETURN_IF_ERROR(expect_planned_buffer(context, label, list[r], g->layout.handle.bytes,
                                                "sfmoe_ep_group_get_plan", g->memory, g->device));
  }
  // Each rank's routing in a buffer of its own: shared ones would mix the ranks' counts and send
  // rows past a rank's capacity.
  std::vector<std::pair<uintptr_t, int64_t>> spans;
  for (int64_t r = 0; r < ranks_of(g); ++r) {
    spans.emplace_back(reinterpret_cast<uintptr_t>(list[r]->data), r);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first - spans[i - 1].first < static_cast<uintptr_t>(g->layout.handle.bytes)) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: handle[%lld] and handle[%lld] overlap",
                  context, static_cast<long long>(spans[i - 1].second),
                  static_cast<long long>(spans[i].second));
    }
  }
  return SFMOE_SUCCESS;
}

// Each rank's token count from `list` (rows), at most the group's bound.
sfmoe_status token_counts(const char* context, const char* name, const sfmoe_tensor* const* list,
                          const sfmoe_ep_group* g, std::vector<int64_t>* tokens) {
  if (list == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s is NULL (an array of %lld tensors, one per rank)",
                context, name, static_cast<long long>(ranks_of(g)));
  }
  tokens->assign(static_cast<size_t>(ranks_of(g)), 0);
  for (int64_t r = 0; r < ranks_of(g); ++r) {
    if (list[r] == nullptr) {
      return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s[%lld] is NULL", context, name,
                  static_cast<long long>(r));
    }
    SFMOE_RETURN_IF_ERROR(validate_tensor(context, name, list[r]));
    if (list[r]->ndim != 2 || list[r]->shape[0] > g->config.max_tokens_per_rank) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: %s[%lld] must be [T, cols] with T at most max_tokens_per_rank = %lld",
                  context, name, static_cast<long long>(r),
                  static_cast<long long>(g->config.max_tokens_per_rank));
    }
    (*tokens)[r] = list[r]->shape[0];
  }
  return SFMOE_SUCCESS;
}

// Host ids: each in [0, E) and named at most once per token, checked before anything is written.
sfmoe_status check_host_ids(const char* context, const sfmoe_tensor* const* ids,
                            const std::vector<int64_t>& tokens, const sfmoe_ep_group* g) {
  const int64_t k = g->layout.shape.top_k,
                E = g->layout.shape.world * g->layout.shape.experts_per_rank;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const int32_t* v = static_cast<const int32_t*>(ids[r]->data);
    for (int64_t t = 0; t < tokens[r]; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        const int32_t e = v[t * k + i];
        if (e < 0 || e >= E) {
          return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                      "%s: topk_ids[%zu] names expert %d at token %lld; experts are [0, %lld)",
                      context, r, static_cast<int>(e), static_cast<long long>(t),
                      static_cast<long long>(E));
        }
        for (int64_t j = 0; j < i; ++j) {
          if (v[t * k + j] == e) {
            return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                        "%s: topk_ids[%zu] names expert %d twice at token %lld", context, r,
                        static_cast<int>(e), static_cast<long long>(t));
          }
        }
      }
    }
  }
  return SFMOE_SUCCESS;
}

std::vector<EpRankRouting> routings(const sfmoe_ep_group* g, const sfmoe_tensor* const* handle) {
  std::vector<EpRankRouting> out;
  for (int64_t r = 0; r < ranks_of(g); ++r) out.push_back(routing_of(g, handle[r]));
  return out;
}

template <class T>
std::vector<T> data_of(const sfmoe_tensor* const* list, int64_t ranks) {
  std::vector<T> out(static_cast<size_t>(ranks), nullptr);
  for (int64_t r = 0; list != nullptr && r < ranks; ++r) out[r] = static_cast<T>(list[r]->data);
  return out;
}

// NCCL: rows of `cols` values fit the staging's rows.
sfmoe_status check_staged_width(const char* context, const sfmoe_ep_group* g, int64_t cols,
                                sfmoe_dtype dtype) {
  const int64_t bytes = cols * sfmoe_dtype_bits(dtype) / 8;
  if (!g->layout.per_rank || bytes <= g->layout.staging_row_bytes) return SFMOE_SUCCESS;
  return fail(SFMOE_ERROR_UNSUPPORTED,
              "%s: with NCCL, rows of %lld '%s' values (%lld bytes) do not fit the group's "
              "staging rows of %lld bytes (hidden %lld values of the wider of the payload and 16 "
              "bits)",
              context, static_cast<long long>(cols), sfmoe_dtype_name(dtype),
              static_cast<long long>(bytes), static_cast<long long>(g->layout.staging_row_bytes),
              static_cast<long long>(g->config.hidden));
}

sfmoe_status check_ep_group(const char* context, const sfmoe_ep_group* g) {
  if (g == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: group is NULL", context);
  return SFMOE_SUCCESS;
}

}  // namespace
}  // namespace sfmoe

extern "C" {

sfmoe_ep_config sfmoe_ep_config_init(void) {
  sfmoe_ep_config c = sfmoe::sized_zero_config<sfmoe_ep_config>();
  c.transport = SFMOE_EP_TRANSPORT_LOOPBACK;
  c.world_size = 1;
  c.row_alignment = 1;
  c.payload = SFMOE_DTYPE_BF16;
  c.overflow = SFMOE_EP_OVERFLOW_DROP;
  c.receive_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
  c.pair_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
  return c;
}

sfmoe_ep_plan sfmoe_ep_plan_init(void) { return sfmoe::sized_zero_config<sfmoe_ep_plan>(); }
sfmoe_ep_dispatch_args sfmoe_ep_dispatch_args_init(void) {
  return sfmoe::sized_zero_config<sfmoe_ep_dispatch_args>();
}
sfmoe_ep_combine_args sfmoe_ep_combine_args_init(void) {
  return sfmoe::sized_zero_config<sfmoe_ep_combine_args>();
}
sfmoe_ep_combine_backward_args sfmoe_ep_combine_backward_args_init(void) {
  return sfmoe::sized_zero_config<sfmoe_ep_combine_backward_args>();
}

}  // extern "C"

namespace sfmoe {

sfmoe_status ep_group_create_with_exchange(const sfmoe_ep_config* config, sfmoe_memory memory,
                                           int32_t device, std::unique_ptr<EpExchange> exchange,
                                           sfmoe_ep_group** out) {
  const char* context = "sfmoe_ep_group_create";
  return guarded(context, [&]() -> sfmoe_status {
    if (out == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: out is NULL", context);
    *out = nullptr;
    std::unique_ptr<sfmoe_ep_group> g(new sfmoe_ep_group{});
    if (config != nullptr && config->transport == SFMOE_EP_TRANSPORT_EXTERNAL) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: the EXTERNAL transport runs through an MoE layer's stages "
                  "(sfmoe_moe_layer_forward_stage), not a group",
                  context);
    }
    SFMOE_RETURN_IF_ERROR(check_config(context, config, memory, device, g.get()));
    SFMOE_RETURN_IF_ERROR(make_transport(context, g.get(), std::move(exchange)));
    *out = g.release();
    return SFMOE_SUCCESS;
  });
}

const sfmoe_ep_config& ep_group_config(const sfmoe_ep_group* g) { return g->config; }
const ops::EpLayout& ep_group_layout(const sfmoe_ep_group* g) { return g->layout; }
const EpRankExchange* ep_group_exchange(const sfmoe_ep_group* g) { return g->exchange(); }
int32_t ep_group_device(const sfmoe_ep_group* g) { return g->device; }

}  // namespace sfmoe

extern "C" {

sfmoe_status sfmoe_ep_group_create(const sfmoe_ep_config* config, sfmoe_memory memory,
                                   int32_t device, sfmoe_ep_group** out) {
  return sfmoe::ep_group_create_with_exchange(config, memory, device, nullptr, out);
}

sfmoe_status sfmoe_ep_nccl_unique_id(uint8_t* out) {
  const char* context = "sfmoe_ep_nccl_unique_id";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (out == nullptr) return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: out is NULL", context);
#if SFMOE_WITH_CUDA
    return sfmoe::cuda::nccl_unique_id(out);
#else
    return sfmoe::fail(SFMOE_ERROR_NO_BACKEND, "%s: NCCL needs the CUDA backend", context);
#endif
  });
}

sfmoe_status sfmoe_ep_group_destroy(sfmoe_ep_group* group) {
  delete group;
  return SFMOE_SUCCESS;
}

sfmoe_status sfmoe_ep_group_get_plan(const sfmoe_ep_group* group, sfmoe_ep_plan* plan) {
  const char* context = "sfmoe_ep_group_get_plan";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_ep_group(context, group));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_struct(context, "plan", plan, "sfmoe_ep_plan_init()"));
    plan->local_ranks = static_cast<int32_t>(sfmoe::ranks_of(group));
    plan->receive_capacity = group->layout.shape.receive_capacity;
    plan->receive_rows = group->layout.shape.receive_rows;
    plan->handle_bytes = group->layout.handle.bytes;
    plan->rounds = static_cast<int32_t>(group->layout.shape.rounds);
    plan->spill_capacity = group->layout.shape.spill_capacity;
    plan->spill_row_base = group->layout.shape.spill_row_base;
    const sfmoe::EpShape& shape = group->layout.shape;
    plan->spill_rows = shape.rounds > 1 ? shape.receive_rows - shape.spill_row_base : 0;
    plan->scale_columns = group->layout.scale_columns;
    plan->scale_dtype = group->layout.scale_dtype;
    if (group->layout.per_rank) {
      const sfmoe::ops::EpLayout& l = group->layout;
      plan->pair_rows = l.pair_rows;
      plan->staging_bytes =
          l.shape.world * l.pair_rows * (2 * (l.staging_row_bytes + l.scale_bytes) + 16);
    }
    return SFMOE_SUCCESS;
  });
}

sfmoe_status sfmoe_ep_dispatch(const sfmoe_ep_group* g, const sfmoe_ep_dispatch_args* a) {
  const char* context = "sfmoe_ep_dispatch";
  using sfmoe::expect_ranks;
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_ep_group(context, g));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_struct(context, "args", a, "sfmoe_ep_dispatch_args_init()"));
    const sfmoe::EpShape& s = g->layout.shape;
    const int64_t R = sfmoe::ranks_of(g), H = g->config.hidden, El = s.experts_per_rank;
    const int64_t E = s.world * El, k = s.top_k;
    const sfmoe_dtype payload = g->config.payload;
    std::vector<int64_t> T;
    SFMOE_RETURN_IF_ERROR(sfmoe::token_counts(context, "tokens", a->tokens, g, &T));
    auto tokens_shape = [&](int64_t r) { return std::vector<int64_t>{T[r], H}; };
    auto slots_shape = [&](int64_t r) { return std::vector<int64_t>{T[r], k}; };
    auto rows_shape = [&](int64_t) { return std::vector<int64_t>{s.receive_rows, H}; };
    auto local_shape = [&](int64_t) { return std::vector<int64_t>{El}; };
    const int64_t groups = s.rounds * El, S = g->layout.scale_columns;
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "tokens", a->tokens, g, {payload}, tokens_shape));
    SFMOE_RETURN_IF_ERROR(
        expect_ranks(context, "topk_ids", a->topk_ids, g, {SFMOE_DTYPE_INT32}, slots_shape));
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "received", a->received, g, {payload}, rows_shape));
    SFMOE_RETURN_IF_ERROR(
        expect_ranks(context, "group_offsets", a->group_offsets, g, {SFMOE_DTYPE_INT64},
                     [&](int64_t) { return std::vector<int64_t>{s.rounds * (El + 1)}; }));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_handles(context, a->handle, g));
    SFMOE_RETURN_IF_ERROR(expect_ranks(
        context, "tokens_per_expert", a->tokens_per_expert, g, {SFMOE_DTYPE_INT64},
        [&](int64_t) { return std::vector<int64_t>{groups}; }, true));
    if (S == 0 && (a->token_scales != nullptr || a->received_scales != nullptr)) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                         "%s: token_scales and received_scales are for FP8 payloads; this group "
                         "moves '%s' rows without scales",
                         context, sfmoe_dtype_name(payload));
    }
    if (S > 0) {
      const sfmoe_dtype sd = g->layout.scale_dtype;
      SFMOE_RETURN_IF_ERROR(
          expect_ranks(context, "token_scales", a->token_scales, g, {sd}, [&](int64_t r) {
            return std::vector<int64_t>{T[r], S};
          }));
      SFMOE_RETURN_IF_ERROR(
          expect_ranks(context, "received_scales", a->received_scales, g, {sd}, [&](int64_t) {
            return std::vector<int64_t>{s.receive_rows, S};
          }));
    }
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "routed_per_expert", a->routed_per_expert, g,
                                       {SFMOE_DTYPE_INT64}, local_shape, true));
    SFMOE_RETURN_IF_ERROR(expect_ranks(
        context, "dropped_per_expert", a->dropped_per_expert, g, {SFMOE_DTYPE_INT64},
        [&](int64_t) { return std::vector<int64_t>{E}; }, true));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, a->word, g->memory, g->device));
    // (device ids are checked by the routing, which skips bad ones and reports them in the word)
    if (g->memory == SFMOE_MEMORY_HOST) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_host_ids(context, a->topk_ids, T, g));
    }

    const sfmoe::ops::Backend& backend = sfmoe::ops::backend_for(g->memory);
    const std::vector<sfmoe::EpRankRouting> routing = sfmoe::routings(g, a->handle);
    const std::vector<const int32_t*> ids = sfmoe::data_of<const int32_t*>(a->topk_ids, R);
    sfmoe_fault_report* word = a->word != nullptr ? a->word->word : nullptr;
    sfmoe::EpRouteArgs route{s,
                             T.data(),
                             ids.data(),
                             routing.data(),
                             g->config.overflow != SFMOE_EP_OVERFLOW_DROP,
                             word,
                             g->exchange()};
    SFMOE_RETURN_IF_ERROR(backend.ep_route(route, a->stream));
    const std::vector<const void*> tokens = sfmoe::data_of<const void*>(a->tokens, R);
    const std::vector<void*> received = sfmoe::data_of<void*>(a->received, R);
    const std::vector<const void*> token_scales = sfmoe::data_of<const void*>(a->token_scales, R);
    const std::vector<void*> received_scales = sfmoe::data_of<void*>(a->received_scales, R);
    sfmoe::EpScatterArgs scatter{s,
                                 H,
                                 T.data(),
                                 tokens.data(),
                                 payload,
                                 nullptr,
                                 nullptr,
                                 payload,
                                 nullptr,
                                 routing.data(),
                                 received.data(),
                                 payload,
                                 S * sfmoe_dtype_bits(g->layout.scale_dtype) / 8,
                                 S > 0 ? token_scales.data() : nullptr,
                                 S > 0 ? received_scales.data() : nullptr,
                                 g->exchange()};
    SFMOE_RETURN_IF_ERROR(backend.ep_scatter(scatter, a->stream));
    // The routing's counts out of the handles, ordered after the routing on the stream (in one
    // launch: a copy call per array and rank measured about 0.1 ms of a DeepSeek-V3 EP8 dispatch).
    std::vector<sfmoe::CopySpan> spans;
    for (int64_t r = 0; r < R; ++r) {
      spans.push_back({a->group_offsets[r]->data, routing[r].offsets,
                       static_cast<size_t>(s.rounds * (El + 1)) * 8});
      if (a->tokens_per_expert != nullptr) {
        spans.push_back(
            {a->tokens_per_expert[r]->data, routing[r].kept, static_cast<size_t>(groups) * 8});
      }
      if (a->routed_per_expert != nullptr) {
        spans.push_back(
            {a->routed_per_expert[r]->data, routing[r].routed, static_cast<size_t>(El) * 8});
      }
      if (a->dropped_per_expert != nullptr) {
        spans.push_back(
            {a->dropped_per_expert[r]->data, routing[r].dropped, static_cast<size_t>(E) * 8});
      }
    }
    return backend.copy_spans(spans.data(), spans.size(), a->stream);
  });
}

sfmoe_status sfmoe_ep_combine(const sfmoe_ep_group* g, const sfmoe_ep_combine_args* a) {
  const char* context = "sfmoe_ep_combine";
  using sfmoe::expect_ranks;
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_ep_group(context, g));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_struct(context, "args", a, "sfmoe_ep_combine_args_init()"));
    const sfmoe::EpShape& s = g->layout.shape;
    const int64_t R = sfmoe::ranks_of(g), k = s.top_k;
    std::vector<int64_t> T;
    SFMOE_RETURN_IF_ERROR(sfmoe::token_counts(context, "out", a->out, g, &T));
    if (a->rows == nullptr || a->rows[0] == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: rows is NULL (one per rank)", context);
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::validate_tensor(context, "rows[0]", a->rows[0]));
    const int64_t cols = a->rows[0]->ndim == 2 ? a->rows[0]->shape[1] : -1;
    const sfmoe_dtype dtype = a->rows[0]->dtype;
    if (dtype != SFMOE_DTYPE_BF16 && dtype != SFMOE_DTYPE_FP16 && dtype != SFMOE_DTYPE_FP32) {
      return sfmoe::fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: rows must be bf16, fp16 or fp32",
                         context);
    }
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "rows", a->rows, g, {dtype}, [&](int64_t) {
      return std::vector<int64_t>{s.receive_rows, cols};
    }));
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "out", a->out, g, {dtype}, [&](int64_t r) {
      return std::vector<int64_t>{T[r], cols};
    }));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_staged_width(context, g, cols, dtype));
    SFMOE_RETURN_IF_ERROR(expect_ranks(
        context, "probs", a->probs, g, {SFMOE_DTYPE_FP32},
        [&](int64_t r) {
          return std::vector<int64_t>{T[r], k};
        },
        true));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_handles(context, a->handle, g));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, a->word, g->memory, g->device));
    const std::vector<sfmoe::EpRankRouting> routing = sfmoe::routings(g, a->handle);
    const std::vector<const void*> rows = sfmoe::data_of<const void*>(a->rows, R);
    const std::vector<const float*> probs = sfmoe::data_of<const float*>(a->probs, R);
    const std::vector<void*> out = sfmoe::data_of<void*>(a->out, R);
    sfmoe::EpGatherArgs gather{s,
                               cols,
                               T.data(),
                               rows.data(),
                               dtype,
                               a->probs != nullptr ? probs.data() : nullptr,
                               routing.data(),
                               out.data(),
                               dtype,
                               g->exchange()};
    return sfmoe::ops::backend_for(g->memory).ep_gather(gather, a->stream);
  });
}

sfmoe_status sfmoe_ep_combine_backward(const sfmoe_ep_group* g,
                                       const sfmoe_ep_combine_backward_args* a) {
  const char* context = "sfmoe_ep_combine_backward";
  using sfmoe::expect_ranks;
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(sfmoe::check_ep_group(context, g));
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "args", a, "sfmoe_ep_combine_backward_args_init()"));
    const sfmoe::EpShape& s = g->layout.shape;
    const int64_t R = sfmoe::ranks_of(g), k = s.top_k;
    std::vector<int64_t> T;
    SFMOE_RETURN_IF_ERROR(sfmoe::token_counts(context, "d_out", a->d_out, g, &T));
    const int64_t cols = a->d_out[0]->shape[1];
    const sfmoe_dtype dtype = a->d_out[0]->dtype;
    if (dtype != SFMOE_DTYPE_BF16 && dtype != SFMOE_DTYPE_FP16 && dtype != SFMOE_DTYPE_FP32) {
      return sfmoe::fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: d_out must be bf16, fp16 or fp32",
                         context);
    }
    auto tokens_shape = [&](int64_t r) { return std::vector<int64_t>{T[r], cols}; };
    auto rows_shape = [&](int64_t) { return std::vector<int64_t>{s.receive_rows, cols}; };
    auto slots_shape = [&](int64_t r) { return std::vector<int64_t>{T[r], k}; };
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "d_out", a->d_out, g, {dtype}, tokens_shape));
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "rows", a->rows, g, {dtype}, rows_shape));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_staged_width(context, g, cols, dtype));
    SFMOE_RETURN_IF_ERROR(
        expect_ranks(context, "probs", a->probs, g, {SFMOE_DTYPE_FP32}, slots_shape));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_handles(context, a->handle, g));
    SFMOE_RETURN_IF_ERROR(expect_ranks(context, "d_rows", a->d_rows, g, {dtype}, rows_shape));
    SFMOE_RETURN_IF_ERROR(
        expect_ranks(context, "d_probs", a->d_probs, g, {SFMOE_DTYPE_FP32}, slots_shape));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, a->word, g->memory, g->device));
    const std::vector<sfmoe::EpRankRouting> routing = sfmoe::routings(g, a->handle);
    const std::vector<const void*> d_out = sfmoe::data_of<const void*>(a->d_out, R);
    const std::vector<const void*> rows = sfmoe::data_of<const void*>(a->rows, R);
    const std::vector<const float*> probs = sfmoe::data_of<const float*>(a->probs, R);
    std::vector<float*> d_probs = sfmoe::data_of<float*>(a->d_probs, R);
    const std::vector<void*> d_rows = sfmoe::data_of<void*>(a->d_rows, R);
    sfmoe::EpScatterArgs scatter{
        s,           cols,    T.data(),       d_out.data(),   dtype,         probs.data(),
        rows.data(), dtype,   d_probs.data(), routing.data(), d_rows.data(), dtype,
        0,           nullptr, nullptr,        g->exchange()};
    return sfmoe::ops::backend_for(g->memory).ep_scatter(scatter, a->stream);
  });
}

}  // extern "C"
