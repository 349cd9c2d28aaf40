// A libFuzzer target over the C API on the CPU backend (tools/fuzz.sh builds it with clang,
// AddressSanitizer and UndefinedBehaviorSanitizer, and runs it on tests/fuzz/corpus for a bounded
// time). Each input picks a part of the API and draws its arguments: descriptors with random
// dtypes, shapes (negative, huge, zero), null, foreign and misaligned pointers, configuration
// structs of wrong sizes and random fields, random small data (NaN and Inf among it, expert ids
// in and out of range). A call either refuses with a status (and nothing below its outputs is
// touched) or succeeds; every output buffer sits between guard bytes checked after the call.
// Crashes, sanitizer reports and leaks fail the run.
#include <fuzzer/FuzzedDataProvider.h>
#include <stdint.h>
#include <string.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "sfmoe/ep.h"
#include "sfmoe/moe_layer.h"
#include "sfmoe/router.h"
#include "sfmoe/sfmoe.h"

namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xE7;
constexpr int64_t kMostBytes = int64_t{1} << 18;  // a buffer's size at most (256 KiB)

// A buffer with guard bytes before and after it.
struct Guarded {
  std::vector<uint8_t> bytes;
  size_t size;
  explicit Guarded(size_t n, FuzzedDataProvider* fdp) : bytes(n + 2 * kGuard, kGuardByte), size(n) {
    // (the input's next bytes, then zeros)
    const std::vector<uint8_t> drawn = fdp->ConsumeBytes<uint8_t>(n < 4096 ? n : 4096);
    memset(bytes.data() + kGuard, 0, n);
    if (!drawn.empty()) memcpy(bytes.data() + kGuard, drawn.data(), drawn.size());
  }
  void* data() { return bytes.data() + kGuard; }
  void check() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (bytes[i] != kGuardByte || bytes[kGuard + size + i] != kGuardByte) abort();
    }
  }
};

struct Arena {
  FuzzedDataProvider* fdp;
  std::vector<std::unique_ptr<Guarded>> buffers;
  std::vector<std::unique_ptr<sfmoe_tensor>> tensors;
  void check() const {
    for (const auto& b : buffers) b->check();
  }
  // A descriptor of `dtype` and `shape`, over a guarded buffer of the right size; now and then a
  // wrong one (other dtype, null or misaligned data, a shape that lies, host memory claimed as
  // device memory).
  const sfmoe_tensor* tensor(sfmoe_dtype dtype, std::vector<int64_t> shape) {
    if (fdp->ConsumeIntegralInRange<int>(0, 40) == 0) return nullptr;
    const int mutate = fdp->ConsumeIntegralInRange<int>(0, 24);
    if (mutate == 1) dtype = static_cast<sfmoe_dtype>(fdp->ConsumeIntegralInRange<int32_t>(-2, 40));
    if (mutate == 2 && !shape.empty() && shape[0] > -kMostBytes && shape[0] < kMostBytes) {
      shape[0] += fdp->ConsumeIntegralInRange<int64_t>(-3, 3);
    }
    if (mutate == 3) shape.push_back(1);
    int64_t elements = 1;
    for (int64_t d : shape) {
      elements = d < 0 || d > kMostBytes ? kMostBytes + 1 : elements * d;
      if (elements > kMostBytes) elements = kMostBytes + 1;  // (too large: not allocated)
    }
    const int bits = sfmoe_dtype_bits(dtype) > 0 ? sfmoe_dtype_bits(dtype) : 8;
    const bool allocated = elements <= kMostBytes;
    const int64_t bytes = allocated ? (elements * bits + 7) / 8 : 0;
    buffers.push_back(std::make_unique<Guarded>(static_cast<size_t>(bytes + 16), fdp));
    uint8_t* data = static_cast<uint8_t*>(buffers.back()->data());
    if (mutate == 4) data += 1;  // misaligned (the buffer has 16 bytes to spare)
    // A shape too large to allocate is described over no data: a host buffer's size is the
    // caller's promise, which the library cannot check, so a real buffer under a larger shape
    // would be the driver's fault, not the library's. The size checks still run first (an element
    // count that overflows is refused before the NULL data).
    if (!allocated) data = nullptr;
    auto t = std::make_unique<sfmoe_tensor>(
        sfmoe_tensor_make(mutate == 5 ? nullptr : data, dtype, static_cast<int32_t>(shape.size()),
                          shape.empty() ? nullptr : shape.data(),
                          mutate == 6 ? SFMOE_MEMORY_CUDA : SFMOE_MEMORY_HOST, 0));
    if (mutate == 7) t->struct_size = fdp->ConsumeIntegral<uint8_t>();
    if (mutate == 8) t->ndim = fdp->ConsumeIntegralInRange<int32_t>(-1, SFMOE_MAX_DIMS + 2);
    tensors.push_back(std::move(t));
    return tensors.back().get();
  }
  // Expert ids [n], mostly in [0, experts).
  const sfmoe_tensor* ids(int64_t tokens, int64_t k, int64_t experts) {
    const sfmoe_tensor* t = tensor(SFMOE_DTYPE_INT32, {tokens, k});
    int64_t n = 0;  // (the descriptor's own shape: a mutated one describes its buffer)
    if (t != nullptr && t->data != nullptr && t->dtype == SFMOE_DTYPE_INT32 && t->ndim == 2 &&
        t->shape[0] >= 0 && t->shape[1] >= 0 &&
        !__builtin_mul_overflow(t->shape[0], t->shape[1], &n) && n <= kMostBytes / 4) {
      uint8_t* v = static_cast<uint8_t*>(t->data);  // (maybe misaligned on purpose)
      for (int64_t i = 0; i < n; ++i) {
        const int32_t id = fdp->ConsumeIntegralInRange<int>(0, 20) == 0
                               ? fdp->ConsumeIntegral<int32_t>()
                               : static_cast<int32_t>(i % (experts > 0 ? experts : 1));
        memcpy(v + 4 * i, &id, 4);
      }
    }
    return t;
  }
};

// Mostly a size in [0, most]; now and then any value (kept 4 away from the int64 limits, so the
// driver's own small arithmetic on it stays defined).
int64_t small(FuzzedDataProvider* fdp, int64_t most) {
  return fdp->ConsumeIntegralInRange<int>(0, 30) == 0
             ? fdp->ConsumeIntegralInRange<int64_t>(INT64_MIN + 4, INT64_MAX - 4)
             : fdp->ConsumeIntegralInRange<int64_t>(0, most);
}

void fuzz_router(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  const int64_t T = small(&f, 40), E = small(&f, 24) + 1;
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = small(&f, 6);
  c.score = static_cast<sfmoe_router_score>(f.ConsumeIntegralInRange<int32_t>(-1, 2));
  c.softmax_after_topk = f.ConsumeBool();
  c.num_groups = small(&f, 4);
  c.group_topk = small(&f, 4);
  c.group_score_topk = small(&f, 3);
  c.scaling_factor = f.ConsumeFloatingPoint<float>();
  c.normalize = f.ConsumeBool();
  c.aux_loss_coeff = f.ConsumeBool() ? 0.0f : f.ConsumeFloatingPoint<float>();
  c.z_loss_coeff = f.ConsumeBool() ? 0.0f : f.ConsumeFloatingPoint<float>();
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint16_t>();
  const sfmoe_tensor* logits =
      a.tensor(f.ConsumeBool() ? SFMOE_DTYPE_FP32 : SFMOE_DTYPE_BF16, {T, E});
  const sfmoe_tensor* bias = f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP32, {E}) : nullptr;
  const sfmoe_tensor* ids = a.tensor(SFMOE_DTYPE_INT32, {T, c.top_k});
  const sfmoe_tensor* probs = a.tensor(SFMOE_DTYPE_FP32, {T, c.top_k});
  const sfmoe_tensor* counts = a.tensor(SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor* aux = c.aux_loss_coeff != 0.0f ? a.tensor(SFMOE_DTYPE_FP32, {1}) : nullptr;
  const sfmoe_tensor* z = c.z_loss_coeff != 0.0f ? a.tensor(SFMOE_DTYPE_FP32, {1}) : nullptr;
  const sfmoe_status s =
      sfmoe_router_forward(logits, bias, &c, ids, probs, counts, aux, z, nullptr, nullptr);
  a.check();
  const sfmoe_tensor* d_logits = a.tensor(SFMOE_DTYPE_FP32, {T, E});
  const sfmoe_tensor* d_probs =
      f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP32, {T, c.top_k}) : nullptr;
  // (after a refused forward the ids are whatever the draw left: the backward checks them)
  (void)s;
  sfmoe_router_backward(logits, ids, counts, &c, d_probs, 1.0f, 1.0f, d_logits, nullptr, nullptr);
  a.check();
}

void fuzz_ep(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = static_cast<int32_t>(small(&f, 5));
  c.rank = static_cast<int32_t>(small(&f, 1));
  c.experts_per_rank = small(&f, 6);
  c.max_tokens_per_rank = small(&f, 24);
  c.top_k = small(&f, 4);
  c.hidden = small(&f, 40);
  c.payload = static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int32_t>(0, 12));
  c.row_alignment = f.ConsumeBool() ? 1 : small(&f, 130);
  c.receive_capacity = f.ConsumeBool() ? SFMOE_EP_CAPACITY_WORST_CASE : small(&f, 60) - 1;
  c.overflow = static_cast<sfmoe_ep_overflow>(f.ConsumeIntegralInRange<int32_t>(-1, 3));
  c.spill_capacity = c.overflow == SFMOE_EP_OVERFLOW_SPILL ? small(&f, 30) - 1 : 0;
  c.payload_scaling = static_cast<sfmoe_scaling>(f.ConsumeIntegralInRange<int32_t>(0, 8));
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint16_t>();
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.transport = SFMOE_EP_TRANSPORT_NCCL;
  sfmoe_ep_group* g = nullptr;
  if (sfmoe_ep_group_create(&c, SFMOE_MEMORY_HOST, 0, &g) != SFMOE_SUCCESS) return;
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  int64_t rows_bytes = 0;
  if (sfmoe_ep_group_get_plan(g, &plan) != SFMOE_SUCCESS || c.hidden > kMostBytes ||
      __builtin_mul_overflow(plan.receive_rows, c.hidden * 4, &rows_bytes) ||
      rows_bytes > kMostBytes || plan.handle_bytes > kMostBytes) {
    sfmoe_ep_group_destroy(g);
    return;
  }
  const int64_t R = plan.local_ranks, E = c.world_size * c.experts_per_rank, H = c.hidden;
  std::vector<const sfmoe_tensor*> x, ids, rec, off, handle, rows, out, probs, kept;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t T = small(&f, c.max_tokens_per_rank + 1);
    x.push_back(a.tensor(c.payload, {T, H}));
    ids.push_back(a.ids(T, c.top_k, E));
    rec.push_back(a.tensor(c.payload, {plan.receive_rows, H}));
    off.push_back(a.tensor(SFMOE_DTYPE_INT64, {plan.rounds * (c.experts_per_rank + 1)}));
    handle.push_back(a.tensor(SFMOE_DTYPE_FP8_E4M3, {plan.handle_bytes}));
    kept.push_back(a.tensor(SFMOE_DTYPE_INT64, {plan.rounds * c.experts_per_rank}));
    rows.push_back(a.tensor(SFMOE_DTYPE_BF16, {plan.receive_rows, H}));
    out.push_back(a.tensor(SFMOE_DTYPE_BF16, {T, H}));
    probs.push_back(a.tensor(SFMOE_DTYPE_FP32, {T, c.top_k}));
  }
  sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
  d.tokens = x.data();
  d.topk_ids = ids.data();
  d.received = rec.data();
  d.group_offsets = off.data();
  d.handle = handle.data();
  d.tokens_per_expert = f.ConsumeBool() ? kept.data() : nullptr;
  sfmoe_ep_dispatch(g, &d);
  a.check();
  // (combine reads whatever handle is there: dispatched, or the draw's bytes)
  sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
  cb.rows = rows.data();
  cb.probs = f.ConsumeBool() ? probs.data() : nullptr;
  cb.handle = handle.data();
  cb.out = out.data();
  sfmoe_ep_combine(g, &cb);
  a.check();
  sfmoe_ep_group_destroy(g);
}

void fuzz_layer(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  sfmoe_moe_layer_config c = sfmoe_moe_layer_config_init();
  c.hidden = small(&f, 24);
  c.ffn_hidden = small(&f, 16);
  c.num_experts = small(&f, 8);
  c.max_tokens = small(&f, 24);
  c.router.top_k = small(&f, 3);
  c.activation = static_cast<sfmoe_activation>(f.ConsumeIntegralInRange<int32_t>(-1, 6));
  c.expert_capacity = f.ConsumeBool() ? 0 : small(&f, 20);
  c.row_alignment = f.ConsumeBool() ? 16 : small(&f, 130);
  c.dtype = f.ConsumeBool() ? SFMOE_DTYPE_FP32 : SFMOE_DTYPE_BF16;
  c.recipe = static_cast<sfmoe_moe_recipe>(f.ConsumeIntegralInRange<int32_t>(-1, 5));
  c.accumulate_weight_grads = f.ConsumeBool();
  c.ep_world_size =
      f.ConsumeIntegralInRange<int>(0, 20) == 0 ? static_cast<int32_t>(small(&f, 3)) : 1;
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint16_t>();
  sfmoe_moe_layer* layer = nullptr;
  if (sfmoe_moe_layer_create(&c, SFMOE_MEMORY_HOST, 0, &layer) != SFMOE_SUCCESS) return;
  sfmoe_moe_layer_plan p = sfmoe_moe_layer_plan_init();
  if (sfmoe_moe_layer_get_plan(layer, &p) != SFMOE_SUCCESS || p.local_ranks != 1 ||
      p.saved_bytes > kMostBytes || p.workspace_bytes > kMostBytes) {
    sfmoe_moe_layer_destroy(layer);
    return;
  }
  const int64_t T = small(&f, c.max_tokens + 1), H = c.hidden, E = c.num_experts;
  sfmoe_moe_forward_args fw = sfmoe_moe_forward_args_init();
  fw.x = a.tensor(c.dtype, {T, H});
  fw.logits = a.tensor(SFMOE_DTYPE_FP32, {T, E});
  fw.w1 = a.tensor(c.dtype, {E, p.fc1_cols, H});
  fw.w2 = a.tensor(c.dtype, {E, H, c.ffn_hidden});
  fw.y = a.tensor(c.dtype, {T, H});
  fw.saved = a.tensor(SFMOE_DTYPE_FP8_E4M3, {p.saved_bytes});
  fw.workspace = a.tensor(SFMOE_DTYPE_FP8_E4M3, {p.workspace_bytes});
  fw.tokens_per_expert = f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_INT64, {E}) : nullptr;
  const bool forward_ran = sfmoe_moe_layer_forward(layer, &fw) == SFMOE_SUCCESS;
  a.check();
  if (forward_ran) {
    const sfmoe_dtype grads = c.accumulate_weight_grads ? SFMOE_DTYPE_FP32 : c.dtype;
    sfmoe_moe_backward_args bw = sfmoe_moe_backward_args_init();
    bw.part = static_cast<sfmoe_moe_backward_part>(f.ConsumeIntegralInRange<int32_t>(0, 4));
    bw.x = fw.x;
    bw.d_y = a.tensor(c.dtype, {T, H});
    bw.logits = fw.logits;
    bw.w1 = fw.w1;
    bw.w2 = fw.w2;
    bw.saved = fw.saved;
    bw.workspace = fw.workspace;
    bw.d_x = a.tensor(c.dtype, {T, H});
    bw.d_logits = a.tensor(SFMOE_DTYPE_FP32, {T, E});
    bw.d_w1 = a.tensor(grads, {E, p.fc1_cols, H});
    bw.d_w2 = a.tensor(grads, {E, H, c.ffn_hidden});
    if (bw.part == SFMOE_MOE_BACKWARD_FC2_WGRAD) {
      // (its documented order: it reads the routing FC2_DGRAD copies into the workspace)
      const sfmoe_moe_backward_part wgrad = bw.part;
      bw.part = SFMOE_MOE_BACKWARD_FC2_DGRAD;
      const bool dgrad_ran = sfmoe_moe_layer_backward(layer, &bw) == SFMOE_SUCCESS;
      bw.part = SFMOE_MOE_BACKWARD_FC1;
      if (dgrad_ran && sfmoe_moe_layer_backward(layer, &bw) == SFMOE_SUCCESS) {
        bw.part = wgrad;
        sfmoe_moe_layer_backward(layer, &bw);
      }
    } else {
      sfmoe_moe_layer_backward(layer, &bw);
    }
    a.check();
  }
  sfmoe_moe_layer_destroy(layer);
}

void fuzz_descriptors(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  std::vector<int64_t> shape;
  const int ndim = f.ConsumeIntegralInRange<int>(0, SFMOE_MAX_DIMS);
  for (int i = 0; i < ndim; ++i) shape.push_back(small(&f, 64));
  const sfmoe_tensor* t =
      a.tensor(static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int32_t>(-1, 40)), shape);
  sfmoe_tensor_validate(t, "fuzzed");
  sfmoe_dtype scale = SFMOE_DTYPE_FP32;
  sfmoe_scale_dtype(static_cast<sfmoe_scaling>(f.ConsumeIntegralInRange<int32_t>(-1, 10)), &scale);
  a.check();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  Arena arena{&fdp, {}, {}};
  switch (fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      fuzz_router(arena);
      break;
    case 1:
      fuzz_ep(arena);
      break;
    case 2:
      fuzz_layer(arena);
      break;
    default:
      fuzz_descriptors(arena);
  }
  sfmoe_clear_last_error();
  return 0;
}
