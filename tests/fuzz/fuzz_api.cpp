// A libFuzzer target over the C API on the CPU backend (tools/fuzz.sh builds it with clang,
// AddressSanitizer and UndefinedBehaviorSanitizer, and runs it on tests/fuzz/corpus for a bounded
// time). Each input picks a part of the API (the router, EP, the layer, descriptors, permute,
// quantization, the grouped GEMM, the activations, the cast) and draws its arguments: grouped
// descriptors from the library's own planners, then now and then mutated; descriptors with random
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

#include "sfmoe/activation.h"
#include "sfmoe/cast.h"
#include "sfmoe/ep.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/moe_layer.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "sfmoe/sfmoe.h"

namespace {

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xE7;
constexpr int64_t kMostBytes = int64_t{1} << 18;  // a buffer's size at most (256 KiB)

// Mostly a size in [0, most]; now and then any value (kept 4 away from the int64 limits, so the
// driver's own small arithmetic on it stays defined).
int64_t small(FuzzedDataProvider* fdp, int64_t most) {
  return fdp->ConsumeIntegralInRange<int>(0, 30) == 0
             ? fdp->ConsumeIntegralInRange<int64_t>(INT64_MIN + 4, INT64_MAX - 4)
             : fdp->ConsumeIntegralInRange<int64_t>(0, most);
}

// x * y, or a size too large for any plan where that overflows (a rare draw of small() is huge).
int64_t times(int64_t x, int64_t y) {
  int64_t n = 0;
  return __builtin_mul_overflow(x, y, &n) ? INT64_MAX / 4 : n;
}

// A buffer with guard bytes before and after it (its start a multiple of `align`: the grouped
// tensors' planned buffers are bound at SFMOE_PLAN_ALIGNMENT).
struct Guarded {
  std::vector<uint8_t> bytes;
  size_t lead, size;
  explicit Guarded(size_t n, FuzzedDataProvider* fdp, size_t align = 1)
      : bytes(n + 2 * kGuard + align, kGuardByte), size(n) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(bytes.data()) + kGuard;
    lead = kGuard + (align - at % align) % align;
    // (the input's next bytes, then zeros)
    const std::vector<uint8_t> drawn = fdp->ConsumeBytes<uint8_t>(n < 4096 ? n : 4096);
    memset(bytes.data() + lead, 0, n);
    if (!drawn.empty()) memcpy(bytes.data() + lead, drawn.data(), drawn.size());
  }
  void* data() { return bytes.data() + lead; }
  void check() const {
    for (size_t i = 0; i < lead; ++i) {
      if (bytes[i] != kGuardByte) abort();
    }
    for (size_t i = lead + size; i < bytes.size(); ++i) {
      if (bytes[i] != kGuardByte) abort();
    }
  }
};

// The buffers of a grouped tensor, in the order of sfmoe_grouped_tensor_plan's fields.
enum GroupedField { kOffsets, kRowData, kRowScale, kColData, kColScale, kAmax, kColAmax, kFields };

void* field_pointer(const sfmoe_grouped_tensor& t, int f) {
  switch (f) {
    case kOffsets:
      return t.group_offsets;
    case kRowData:
      return t.rowwise_data;
    case kRowScale:
      return t.rowwise_scale_inv;
    case kColData:
      return t.columnwise_data;
    case kColScale:
      return t.columnwise_scale_inv;
    case kAmax:
      return t.amax;
    default:
      return t.columnwise_amax;
  }
}

void clear_field(sfmoe_grouped_tensor* t, int f) {
  switch (f) {
    case kOffsets:
      t->group_offsets = nullptr;
      break;
    case kRowData:
      t->rowwise_data = nullptr;
      break;
    case kRowScale:
      t->rowwise_scale_inv = nullptr;
      break;
    case kColData:
      t->columnwise_data = nullptr;
      break;
    case kColScale:
      t->columnwise_scale_inv = nullptr;
      break;
    case kAmax:
      t->amax = nullptr;
      break;
    default:
      t->columnwise_amax = nullptr;
  }
}

constexpr int64_t kTooMany = INT64_MAX;

int64_t product_bytes(int64_t rows, int64_t cols, int bits) {
  int64_t n = 0;
  if (__builtin_mul_overflow(rows, cols, &n) || __builtin_mul_overflow(n, int64_t{bits}, &n) ||
      n > INT64_MAX - 7) {
    return kTooMany;
  }
  return (n + 7) / 8;
}

// The bytes a grouped descriptor says buffer f holds, by the layout rules the planner follows
// (sfmoe_scale_shape for scales). Negative sizes and a zero group count claim nothing: the
// validator refuses them before any buffer is touched.
int64_t claimed_bytes(const sfmoe_grouped_tensor& t, int f) {
  const int64_t G = t.num_groups, R = t.row_capacity, C = t.cols;
  if (G <= 0 || R < 0 || C <= 0) return 0;
  const int bits = sfmoe_dtype_bits(t.dtype) > 0 ? sfmoe_dtype_bits(t.dtype) : 8;
  switch (f) {
    case kOffsets:
      return G < INT64_MAX / 8 - 1 ? (G + 1) * 8 : kTooMany;
    case kRowData:
    case kColData:
      return product_bytes(R, C, bits);
    case kAmax:
    case kColAmax:
      return G < INT64_MAX / 4 ? G * 4 : kTooMany;
    default: {
      sfmoe_dtype scale = SFMOE_DTYPE_FP32;
      if (t.scaling == SFMOE_SCALING_NONE) return 0;  // (set scales over NONE are refused)
      if (sfmoe_scale_dtype(t.scaling, &scale) != SFMOE_SUCCESS) return 0;  // (unknown: refused)
      const bool row = f == kRowScale;
      int32_t ndim = 0;
      int64_t shape[2] = {1, 1};
      if (sfmoe_scale_shape(t.scaling, t.scale_layout, G, row ? R : C, row ? C : R, &ndim, shape) !=
              SFMOE_SUCCESS &&
          sfmoe_scale_shape(t.scaling, SFMOE_SCALE_LAYOUT_COMPACT, G, row ? R : C, row ? C : R,
                            &ndim, shape) != SFMOE_SUCCESS) {
        return kTooMany;
      }
      return product_bytes(shape[0], ndim == 2 ? shape[1] : 1, sfmoe_dtype_bits(scale));
    }
  }
}

// A grouped tensor bound over one guarded buffer, and the bytes each of its pointers has there.
struct Grouped {
  sfmoe_grouped_tensor t;
  int64_t held[kFields];
  // Each pointer whose buffer is smaller than the descriptor now claims becomes NULL: a host
  // buffer's size is the caller's promise, so a mutation may shrink a claim, never grow it.
  void fit() {
    for (int f = 0; f < kFields; ++f) {
      if (field_pointer(t, f) != nullptr && claimed_bytes(t, f) > held[f]) clear_field(&t, f);
    }
  }
};

struct Arena {
  FuzzedDataProvider* fdp;
  std::vector<std::unique_ptr<Guarded>> buffers;
  std::vector<std::unique_ptr<sfmoe_tensor>> tensors;
  std::vector<std::unique_ptr<Grouped>> groupeds;
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
  // `n` guarded bytes (NULL beyond kMostBytes or for a negative count).
  void* raw(int64_t n, size_t align = 16) {
    if (n < 0 || n > kMostBytes) return nullptr;
    buffers.push_back(std::make_unique<Guarded>(static_cast<size_t>(n), fdp, align));
    return buffers.back()->data();
  }
  // The honest descriptor of `plan` over a buffer of plan.total_bytes (NULL when the plan failed
  // or is too large to allocate), its offsets drawn by offsets().
  Grouped* grouped(const sfmoe_grouped_tensor_plan& plan, bool planned) {
    if (!planned || plan.total_bytes < 0 || plan.total_bytes > kMostBytes) return nullptr;
    // (16 bytes to spare for a misaligned pointer, as in tensor())
    void* base = raw(plan.total_bytes + 16, SFMOE_PLAN_ALIGNMENT);
    auto g = std::make_unique<Grouped>();
    if (sfmoe_grouped_tensor_bind(&plan, SFMOE_MEMORY_HOST, 0, base, &g->t) != SFMOE_SUCCESS) {
      abort();  // (the library's own plan, bound as documented)
    }
    const sfmoe_buffer_plan* b[kFields] = {&plan.group_offsets,        &plan.rowwise_data,
                                           &plan.rowwise_scale_inv,    &plan.columnwise_data,
                                           &plan.columnwise_scale_inv, &plan.amax,
                                           &plan.columnwise_amax};
    for (int f = 0; f < kFields; ++f) g->held[f] = b[f]->ndim == 0 ? 0 : b[f]->bytes;
    offsets(g.get());
    groupeds.push_back(std::move(g));
    return groupeds.back().get();
  }
  // Group offsets that keep the contract (starts aligned, the end within the capacity), drawn
  // small; now and then one entry broken: on the host the ops check or clamp them (docs/*.md).
  void offsets(Grouped* g) {
    const sfmoe_grouped_tensor& t = g->t;
    if (t.group_offsets == nullptr || t.num_groups < 1 ||
        claimed_bytes(t, kOffsets) > g->held[kOffsets]) {
      return;
    }
    const int64_t align = t.row_alignment > 0 ? t.row_alignment : 1;
    int64_t* off = t.group_offsets;
    off[0] = 0;
    for (int64_t i = 0; i < t.num_groups; ++i) {
      const int64_t room = t.row_capacity - off[i];
      int64_t end = off[i] + fdp->ConsumeIntegralInRange<int64_t>(0, room < 40 ? room : 40);
      if ((i + 1 < t.num_groups || fdp->ConsumeBool()) && end % align != 0 &&
          __builtin_add_overflow(end - end % align, align, &end)) {
        end = INT64_MAX;
      }
      off[i + 1] = end <= t.row_capacity ? end : off[i];
    }
    if (fdp->ConsumeIntegralInRange<int>(0, 12) == 0) {
      const int64_t i = fdp->ConsumeIntegralInRange<int64_t>(0, t.num_groups);
      off[i] = fdp->ConsumeBool() ? off[i] + fdp->ConsumeIntegralInRange<int64_t>(-2, 2)
                                  : fdp->ConsumeIntegral<int64_t>();
    }
  }
  // Now and then a wrong descriptor: one field changed (fit() then drops each pointer whose
  // buffer no longer covers the claim).
  sfmoe_grouped_tensor* mutate(Grouped* g) {
    if (g == nullptr) return nullptr;
    sfmoe_grouped_tensor& t = g->t;
    switch (fdp->ConsumeIntegralInRange<int>(0, 30)) {
      case 1:
        t.dtype = static_cast<sfmoe_dtype>(fdp->ConsumeIntegralInRange<int32_t>(-1, 9));
        break;
      case 2:
        t.scaling = static_cast<sfmoe_scaling>(fdp->ConsumeIntegralInRange<int32_t>(-1, 7));
        break;
      case 3:
        t.scale_layout =
            static_cast<sfmoe_scale_layout>(fdp->ConsumeIntegralInRange<int32_t>(-1, 3));
        break;
      case 4:
        t.num_groups = small(fdp, t.num_groups + 1) - 1;
        break;
      case 5:
        t.row_capacity = small(fdp, t.row_capacity + 1) - 1;
        break;
      case 6:
        t.cols = small(fdp, t.cols + 1) - 1;
        break;
      case 7:
        t.row_alignment = small(fdp, 256);
        break;
      case 8:
        t.uniform_group_rows = small(fdp, t.row_capacity + 1) - 1;
        break;
      case 9:
        clear_field(&t, fdp->ConsumeIntegralInRange<int>(0, kFields - 1));
        break;
      case 10:
        t.struct_size = fdp->ConsumeIntegral<uint8_t>();
        break;
      case 11:
        t.memory = SFMOE_MEMORY_CUDA;
        break;
      case 12: {
        // (misaligned by one byte: refused for these, which need 8- or 16-byte alignment)
        uint8_t** p =
            reinterpret_cast<uint8_t**>(fdp->ConsumeBool() ? &t.rowwise_data : &t.columnwise_data);
        if (*p != nullptr) *p += 1;
        break;
      }
      case 13:
        if (t.group_offsets != nullptr) {
          t.group_offsets =
              reinterpret_cast<int64_t*>(reinterpret_cast<uint8_t*>(t.group_offsets) + 4);
        }
        break;
      default:
        break;
    }
    g->fit();
    return &t;
  }
  // `n` floats for a config's per-group array (NULL when n is not a small count).
  float* floats(int64_t n) {
    return n >= 0 && n <= 4096 ? static_cast<float*>(raw(4 * n)) : nullptr;
  }
  // value(i) into each element of an INT64 vector whose descriptor describes its buffer (maybe
  // misaligned on purpose, hence memcpy).
  template <class Value>
  void fill_int64(const sfmoe_tensor* t, Value value) {
    if (t == nullptr || t->data == nullptr || t->dtype != SFMOE_DTYPE_INT64 || t->ndim != 1 ||
        t->shape[0] < 0 || t->shape[0] > kMostBytes / 8) {
      return;
    }
    for (int64_t i = 0; i < t->shape[0]; ++i) {
      const int64_t v = value(i);
      memcpy(static_cast<uint8_t*>(t->data) + 8 * i, &v, 8);
    }
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
  // (the forward in a workspace of its own size, as the plan allows, or the whole one)
  const sfmoe_tensor* workspace = a.tensor(SFMOE_DTYPE_FP8_E4M3, {p.workspace_bytes});
  fw.workspace =
      f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP8_E4M3, {p.forward_workspace_bytes}) : workspace;
  fw.tokens_per_expert = f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_INT64, {E}) : nullptr;
  // A weight cache now and then: of the plan's size or a byte short, filled first or not, the
  // calls' flags 0, 1 or out of range (the guards around every buffer catch a write past it).
  const sfmoe_tensor* cache = nullptr;
  int32_t forward_filled = 0, backward_filled = 0;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0 && p.weight_cache_bytes <= kMostBytes) {
    const int64_t bytes = p.weight_cache_bytes - (f.ConsumeIntegralInRange<int>(0, 7) == 0);
    cache = a.tensor(SFMOE_DTYPE_FP8_E4M3, {bytes < 0 ? 0 : bytes});
    if (f.ConsumeBool())
      sfmoe_moe_layer_fill_weight_cache(layer, fw.w1, fw.w2, cache, nullptr, nullptr);
    forward_filled = f.ConsumeIntegralInRange<int32_t>(-1, 2);
    backward_filled = f.ConsumeIntegralInRange<int32_t>(-1, 2);
    fw.weight_cache = f.ConsumeIntegralInRange<int>(0, 7) == 0 ? nullptr : cache;
    fw.weight_cache_filled = forward_filled;
  }
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
    bw.workspace = workspace;
    bw.weight_cache = cache;
    bw.weight_cache_filled = backward_filled;
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

// FP32, BF16 or FP16 mostly; now and then any value.
sfmoe_dtype float_dtype(FuzzedDataProvider& f) {
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) {
    return static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int32_t>(-1, 9));
  }
  return static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int32_t>(0, 2));
}

// A power of two up to 128 mostly; now and then any value.
int64_t alignment(FuzzedDataProvider& f) {
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) return small(&f, 200);
  return int64_t{1} << f.ConsumeIntegralInRange<int>(0, 7);
}

// A host status word half the time (the faults' path); destroyed with the input.
struct Word {
  sfmoe_status_word* w = nullptr;
  explicit Word(FuzzedDataProvider& f) {
    if (f.ConsumeBool()) sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &w);
  }
  ~Word() {
    if (w != nullptr) sfmoe_status_word_destroy(w);
  }
};

// Unquantized grouped rows [capacity, cols], planned as a SiLU's output (which keeps the cols).
Grouped* plain_rows(Arena& a, int64_t groups, int64_t capacity, int64_t cols, int64_t align,
                    sfmoe_dtype dtype) {
  sfmoe_activation_plan_request r = sfmoe_activation_plan_request_init();
  r.kind = SFMOE_ACTIVATION_SILU;
  r.num_groups = groups;
  r.row_capacity = capacity;
  r.input_cols = cols;
  r.row_alignment = align;
  r.dtype = dtype;
  sfmoe_grouped_tensor_plan p;
  p.struct_size = sizeof(p);
  return a.grouped(p, sfmoe_plan_grouped_activation(&r, &p) == SFMOE_SUCCESS);
}

// A weight: `groups` uniform groups of `rows` rows (its offsets dropped: a smaller claim).
Grouped* plain_weight(Arena& a, int64_t groups, int64_t rows, int64_t cols, sfmoe_dtype dtype) {
  int64_t capacity = 0;
  if (__builtin_mul_overflow(groups, rows, &capacity)) return nullptr;
  Grouped* g = plain_rows(a, groups, capacity, cols, 1, dtype);
  if (g != nullptr) {
    g->t.uniform_group_rows = rows;
    g->t.group_offsets = nullptr;
  }
  return g;
}

// A quantized grouped tensor of `scaling` (codes of the recipe's dtype, mostly the compact
// layout), planned by sfmoe_plan_grouped_quantize; NULL where the plan refuses.
Grouped* quantized(Arena& a, sfmoe_scaling scaling, int64_t groups, int64_t rows, int64_t cols,
                   int64_t uniform, int64_t align, bool rowwise, bool columnwise) {
  FuzzedDataProvider& f = *a.fdp;
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  const bool nvfp4 = scaling == SFMOE_SCALING_NV_1X16 || scaling == SFMOE_SCALING_NV_16X16;
  r.dtype = nvfp4 ? SFMOE_DTYPE_FP4_E2M1
                  : (f.ConsumeBool() ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP8_E5M2);
  r.scaling = scaling;
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) {
    r.scale_layout = static_cast<sfmoe_scale_layout>(f.ConsumeIntegralInRange<int32_t>(0, 2));
  }
  r.rowwise = rowwise;
  r.columnwise = columnwise;
  r.hadamard_columnwise = scaling == SFMOE_SCALING_NV_1X16 && columnwise && f.ConsumeBool();
  r.num_groups = groups;
  r.cols = cols;
  r.input_rows = rows;
  r.input_row_alignment = align;
  r.uniform_group_rows = uniform;
  r.row_alignment = align;
  sfmoe_grouped_tensor_plan p;
  p.struct_size = sizeof(p);
  return a.grouped(p, sfmoe_plan_grouped_quantize(&r, &p) == SFMOE_SUCCESS);
}

// A recipe of sfmoe/quantize.h (TENSOR .. NV_16X16); now and then any value.
sfmoe_scaling recipe(FuzzedDataProvider& f) {
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) {
    return static_cast<sfmoe_scaling>(f.ConsumeIntegralInRange<int32_t>(-1, 8));
  }
  return static_cast<sfmoe_scaling>(f.ConsumeIntegralInRange<int32_t>(1, 6));
}

void fuzz_permute(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  Word word(f);
  sfmoe_permute_plan_request r = sfmoe_permute_plan_request_init();
  r.num_tokens = small(&f, 32);
  r.topk = small(&f, 4);
  r.num_experts = small(&f, 8);
  r.hidden = small(&f, 40);
  r.row_alignment = alignment(f);
  r.expert_capacity = f.ConsumeBool() ? 0 : small(&f, 12);
  const int64_t T = r.num_tokens, K = r.topk, E = r.num_experts;
  const sfmoe_dtype x_dtype = float_dtype(f);
  r.dtype = x_dtype;
  if (f.ConsumeIntegralInRange<int>(0, 2) == 0) {  // a fused quantization
    static const sfmoe_scaling kFused[] = {SFMOE_SCALING_MX_1X32, SFMOE_SCALING_BLOCK_1X128,
                                           SFMOE_SCALING_TENSOR};
    r.scaling = f.ConsumeIntegralInRange<int>(0, 10) == 0 ? recipe(f)
                                                          : kFused[f.ConsumeIntegralInRange(0, 2)];
    r.dtype = f.ConsumeBool() ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP8_E5M2;
    r.scale_layout = static_cast<sfmoe_scale_layout>(f.ConsumeIntegralInRange<int32_t>(0, 1));
    const int64_t block = r.scaling == SFMOE_SCALING_BLOCK_1X128 ? 128
                          : r.scaling == SFMOE_SCALING_MX_1X32   ? 32
                                                                 : 8;
    r.hidden = times(block, small(&f, 1) + 1);
  }
  r.group_amax = f.ConsumeBool();
  sfmoe_permute_plan plan;
  plan.struct_size = sizeof(plan);
  const bool planned = sfmoe_plan_permute(&r, &plan) == SFMOE_SUCCESS;
  Grouped* pg = a.grouped(plan.permuted, planned);
  const sfmoe_grouped_tensor* permuted = a.mutate(pg);
  const int64_t H = r.hidden;
  const sfmoe_tensor* x = a.tensor(x_dtype, {T, H});
  const sfmoe_tensor* ids = a.ids(T, K, E);
  const sfmoe_tensor* row_map = a.tensor(SFMOE_DTYPE_INT64, {T, K});
  const sfmoe_tensor* kept = a.tensor(SFMOE_DTYPE_INT64, {E});
  const sfmoe_tensor* dropped = f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_INT64, {E}) : nullptr;
  // (-1 for sizes whose workspace overflows int64: a negative shape, refused)
  const int64_t workspace_bytes =
      f.ConsumeBool() ? sfmoe_permute_workspace_bytes(T, E) : small(&f, 64);
  const sfmoe_tensor* workspace =
      f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP8_E4M3, {workspace_bytes}) : nullptr;
  // (per-expert arrays sized for the larger of E and the output's groups: a count that differs
  // is refused, whichever the library reads by)
  const int64_t experts =
      permuted != nullptr && permuted->num_groups > E ? permuted->num_groups : E;
  sfmoe_quantize_config q = sfmoe_quantize_config_init();
  q.power_of_two_scales = f.ConsumeBool();
  q.stochastic_rounding = f.ConsumeIntegralInRange<int>(0, 10) == 0;  // (refused when fused)
  if (f.ConsumeBool()) q.tensor_scales = a.floats(experts);
  if (f.ConsumeIntegralInRange<int>(0, 10) == 0) q.group_amax = a.floats(experts);
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) q.struct_size = f.ConsumeIntegral<uint8_t>();
  sfmoe_permute_config c = sfmoe_permute_config_init();
  c.expert_capacity =
      f.ConsumeIntegralInRange<int>(0, 10) == 0 ? small(&f, 12) - 1 : r.expert_capacity;
  c.quantize = f.ConsumeBool() ? &q : nullptr;
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint8_t>();
  sfmoe_permute(x, ids, f.ConsumeIntegralInRange<int>(0, 20) == 0 ? nullptr : &c, permuted, row_map,
                kept, dropped, workspace, word.w, nullptr);
  a.check();
  // (after a refused permute the row map, counts and offsets are whatever the draw left: the host
  // checks them)
  const sfmoe_tensor* probs = f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP32, {T, K}) : nullptr;
  sfmoe_unpermute(permuted, row_map, probs, a.tensor(float_dtype(f), {T, H}), word.w, nullptr);
  a.check();
  sfmoe_permute_plan_request dr = r;
  dr.dtype = float_dtype(f);
  dr.scaling = SFMOE_SCALING_NONE;
  dr.scale_layout = SFMOE_SCALE_LAYOUT_COMPACT;
  sfmoe_permute_plan dplan;
  dplan.struct_size = sizeof(dplan);
  Grouped* dg = a.grouped(dplan.permuted, sfmoe_plan_permute(&dr, &dplan) == SFMOE_SUCCESS);
  if (dg != nullptr && pg != nullptr && f.ConsumeIntegralInRange<int>(0, 7) != 0) {
    dg->t.group_offsets = pg->t.group_offsets;  // (the rows' offsets, as a caller would pass)
    dg->held[kOffsets] = pg->held[kOffsets];
  }
  const sfmoe_grouped_tensor* d_rows = a.mutate(dg);
  const sfmoe_tensor* d_out = a.tensor(float_dtype(f), {T, H});
  const sfmoe_tensor* d_probs = a.tensor(SFMOE_DTYPE_FP32, {T, K});
  sfmoe_unpermute_backward(d_out, permuted, row_map, probs, kept, d_rows, d_probs, word.w, nullptr);
  a.check();
}

void fuzz_quantize(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  Word word(f);
  const sfmoe_scaling scaling = recipe(f);
  const int64_t block = sfmoe_scaling_block_size(scaling);
  // (128-row blocks make large tensors: fewer groups there)
  const int64_t G = small(&f, block >= 128 ? 1 : 4) + 1;
  const int64_t C = block > 0 ? times(block, small(&f, 1) + 1) : small(&f, 40) + 1;
  const bool uniform = f.ConsumeIntegralInRange<int>(0, 3) == 0;
  const int64_t n = f.ConsumeBool() ? small(&f, 24)
                                    : times(sfmoe_min_row_alignment(scaling, 1), small(&f, 1) + 1);
  const int64_t R = uniform ? times(G, n) : small(&f, 64);
  const int64_t align = uniform ? 1 : alignment(f);
  Grouped* in = plain_rows(a, G, R, C, align, float_dtype(f));
  if (in != nullptr && uniform) {
    in->t.uniform_group_rows = n;
    in->t.group_offsets = nullptr;
  }
  const sfmoe_grouped_tensor* x = a.mutate(in);
  sfmoe_grouped_amax(x, a.floats(x != nullptr ? x->num_groups : G), word.w, nullptr);
  a.check();

  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  const bool nvfp4 = scaling == SFMOE_SCALING_NV_1X16 || scaling == SFMOE_SCALING_NV_16X16;
  r.dtype = nvfp4 ? SFMOE_DTYPE_FP4_E2M1
                  : (f.ConsumeBool() ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP8_E5M2);
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) {
    r.dtype = static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int32_t>(-1, 9));
  }
  r.scaling = scaling;
  if (f.ConsumeIntegralInRange<int>(0, 2) == 0) {
    r.scale_layout = static_cast<sfmoe_scale_layout>(f.ConsumeIntegralInRange<int32_t>(-1, 3));
  }
  r.rowwise = f.ConsumeIntegralInRange<int>(0, 2) != 0;
  r.columnwise = !r.rowwise || f.ConsumeBool();
  r.hadamard_columnwise = scaling == SFMOE_SCALING_NV_1X16 && f.ConsumeBool();
  r.num_groups = G;
  r.cols = C;
  r.input_rows = R;
  r.input_row_alignment = f.ConsumeBool() ? align : 0;
  r.uniform_group_rows = uniform ? n : 0;
  r.row_alignment = f.ConsumeBool() ? 0 : alignment(f);
  r.row_capacity = f.ConsumeIntegralInRange<int>(0, 4) == 0 ? small(&f, 600) : 0;
  sfmoe_grouped_tensor_plan qp;
  qp.struct_size = sizeof(qp);
  const bool planned = sfmoe_plan_grouped_quantize(&r, &qp) == SFMOE_SUCCESS;
  const sfmoe_grouped_tensor* q = a.mutate(a.grouped(qp, planned));
  const int64_t groups = q != nullptr ? q->num_groups : G;
  sfmoe_quantize_config c = sfmoe_quantize_config_init();
  c.power_of_two_scales = f.ConsumeBool();
  c.stochastic_rounding = f.ConsumeIntegralInRange<int>(0, 3) == 0;
  c.seed = f.ConsumeIntegral<uint64_t>();
  c.offset = f.ConsumeIntegral<uint64_t>();
  c.hadamard_columnwise = r.hadamard_columnwise ? f.ConsumeIntegralInRange<int>(0, 4) != 0
                                                : f.ConsumeIntegralInRange<int>(0, 10) == 0;
  c.trap_nan_amax = f.ConsumeBool();
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) c.tensor_scales = a.floats(groups);
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) c.group_amax = a.floats(groups);
  if (f.ConsumeIntegralInRange<int>(0, 4) == 0) {
    c.offset_device = static_cast<const uint64_t*>(a.raw(8));
  }
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint8_t>();
  sfmoe_grouped_quantize(x, q, f.ConsumeIntegralInRange<int>(0, 20) == 0 ? nullptr : &c, word.w,
                         nullptr);
  a.check();
  // (after a refused quantize the codes and scales are the draw's, the offsets offsets()'s)
  const sfmoe_grouped_tensor* out =
      planned ? a.mutate(plain_rows(a, qp.num_groups, qp.row_capacity, qp.cols, 1, float_dtype(f)))
              : nullptr;
  sfmoe_grouped_dequantize(
      q, out, static_cast<sfmoe_dequantize_source>(f.ConsumeIntegralInRange<int32_t>(-1, 3)),
      f.ConsumeBool() ? &c : nullptr, nullptr);
  a.check();
}

void fuzz_gemm(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  Word word(f);
  sfmoe_grouped_gemm_config c = sfmoe_grouped_gemm_config_init();
  c.form = static_cast<sfmoe_gemm_form>(f.ConsumeIntegralInRange<int>(0, 20) == 0
                                            ? f.ConsumeIntegralInRange<int32_t>(-1, 3)
                                            : f.ConsumeIntegralInRange<int32_t>(0, 2));
  const bool wgrad = c.form == SFMOE_GEMM_WGRAD, dgrad = c.form == SFMOE_GEMM_DGRAD;
  // Each operand unquantized, or quantized with the copy its form reads (now and then the other).
  const sfmoe_scaling sa =
      f.ConsumeIntegralInRange<int>(0, 2) == 0 ? recipe(f) : SFMOE_SCALING_NONE;
  const sfmoe_scaling sb =
      f.ConsumeIntegralInRange<int>(0, 2) == 0 ? recipe(f) : SFMOE_SCALING_NONE;
  const bool flip = f.ConsumeIntegralInRange<int>(0, 10) == 0;
  const bool a_columnwise = wgrad != flip, b_columnwise = (wgrad || dgrad) != flip;
  const int64_t block_a = sfmoe_scaling_block_size(sa), block_b = sfmoe_scaling_block_size(sb);
  const int64_t grain = block_a > block_b ? block_a : block_b;
  const int64_t G = small(&f, grain >= 128 ? 1 : 3) + 1;
  const int64_t N =
      grain > 1 ? times(grain, small(&f, grain >= 128 ? 0 : 1) + 1) : small(&f, 16) + 1;
  const int64_t K =
      grain > 1 ? times(grain, small(&f, grain >= 128 ? 0 : 1) + 1) : small(&f, 16) + 1;
  // The rows' alignment: at least what a quantized rows operand's columnwise copy needs.
  int64_t align = alignment(f);
  const int64_t need_a = sa != SFMOE_SCALING_NONE ? sfmoe_min_row_alignment(sa, a_columnwise) : 1;
  const int64_t need_b =
      wgrad && sb != SFMOE_SCALING_NONE ? sfmoe_min_row_alignment(sb, b_columnwise) : 1;
  if (align > 0 && align < need_a) align = need_a;
  if (align > 0 && align < need_b) align = need_b;
  const int64_t R = align >= 16 ? times(align, small(&f, align >= 128 ? 1 : 2)) : small(&f, 40);
  const int64_t a_cols = c.form == SFMOE_GEMM_FPROP ? K : N;
  Grouped* ag = sa == SFMOE_SCALING_NONE
                    ? plain_rows(a, G, R, a_cols, align, float_dtype(f))
                    : quantized(a, sa, G, R, a_cols, 0, align, !a_columnwise, a_columnwise);
  Grouped* bg = nullptr;
  if (wgrad) {  // b = X, grouped like a (its offsets a's own, mostly)
    bg = sb == SFMOE_SCALING_NONE
             ? plain_rows(a, G, R, K, align, float_dtype(f))
             : quantized(a, sb, G, R, K, 0, align, !b_columnwise, b_columnwise);
    if (bg != nullptr && ag != nullptr && f.ConsumeIntegralInRange<int>(0, 7) != 0) {
      bg->t.group_offsets = ag->t.group_offsets;
      bg->held[kOffsets] = ag->held[kOffsets];
    }
  } else {  // b = W, G uniform groups of N rows and K cols
    bg = sb == SFMOE_SCALING_NONE
             ? plain_weight(a, G, N, K, float_dtype(f))
             : quantized(a, sb, G, times(G, N), K, N, 0, !b_columnwise, b_columnwise);
  }
  sfmoe_grouped_tensor* A = a.mutate(ag);
  const sfmoe_grouped_tensor* B = a.mutate(bg);
  c.accumulate = wgrad && f.ConsumeIntegralInRange<int>(0, 3) == 0;
  sfmoe_dtype out_dtype = f.ConsumeBool() ? SFMOE_DTYPE_FP32 : SFMOE_DTYPE_BF16;
  if (f.ConsumeIntegralInRange<int>(0, 10) == 0) out_dtype = float_dtype(f);
  Grouped* og = nullptr;
  const int64_t rows = ag != nullptr ? ag->t.row_capacity : R;  // (the planned capacity)
  if (wgrad) {
    og = plain_weight(a, G, N, K, out_dtype);
  } else {
    og = plain_rows(a, G, rows, dgrad ? K : N, align > 0 ? align : 1, out_dtype);
    if (og != nullptr && ag != nullptr && f.ConsumeBool()) {
      og->t.group_offsets = ag->t.group_offsets;
      og->held[kOffsets] = ag->held[kOffsets];
    }
  }
  const sfmoe_grouped_tensor* out = a.mutate(og);
  c.hadamard_columnwise = f.ConsumeIntegralInRange<int>(0, 3) == 0;
  c.fp8_fast_accumulation = f.ConsumeBool();
  if (A != nullptr && f.ConsumeIntegralInRange<int>(0, 2) == 0) {
    // Gathered rows: a's data becomes a_source_rows rows of a.cols, A's rows picked by an index
    // of a.row_capacity entries whose values the library bounds (outside the source: zero rows).
    const int64_t source = small(&f, 24);
    const int bits = sfmoe_dtype_bits(A->dtype) > 0 ? sfmoe_dtype_bits(A->dtype) : 8;
    const int64_t bytes = A->cols > 0 && source >= 0 ? product_bytes(source, A->cols, bits) : -1;
    void* data =
        A->rowwise_data != nullptr && A->scaling == SFMOE_SCALING_NONE ? a.raw(bytes) : nullptr;
    int32_t* index = A->row_capacity >= 0 && A->row_capacity <= kMostBytes / 4
                         ? static_cast<int32_t*>(a.raw(4 * A->row_capacity))
                         : nullptr;
    if (index != nullptr) {
      for (int64_t r = 0; r < A->row_capacity; ++r) {
        index[r] =
            f.ConsumeIntegralInRange<int>(0, 15) == 0
                ? f.ConsumeIntegral<int32_t>()
                : f.ConsumeIntegralInRange<int32_t>(-1, source >= 0 && source <= 24 ? source : 0);
      }
    }
    c.a_row_index = index;
    if (data != nullptr) {
      A->rowwise_data = data;
      c.a_source_rows = f.ConsumeIntegralInRange<int64_t>(0, source);
    }
    // (a source count the library refuses: negative, or 2^31 and more; bounded draws, as small()'s
    // rare huge one would overflow the sums)
    if (f.ConsumeIntegralInRange<int>(0, 10) == 0) {
      const int64_t step = f.ConsumeIntegralInRange<int64_t>(0, 4);
      c.a_source_rows = f.ConsumeBool() ? -1 - step : (int64_t{1} << 31) + step;
    }
  }
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint8_t>();
  const sfmoe_tensor* workspace =
      f.ConsumeBool() ? a.tensor(SFMOE_DTYPE_FP8_E4M3, {small(&f, 64)}) : nullptr;
  sfmoe_grouped_gemm(A, B, f.ConsumeIntegralInRange<int>(0, 20) == 0 ? nullptr : &c, out, workspace,
                     word.w, nullptr);
  a.check();
}

void fuzz_activation(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  Word word(f);
  sfmoe_activation_plan_request r = sfmoe_activation_plan_request_init();
  r.kind = static_cast<sfmoe_activation>(f.ConsumeIntegralInRange<int32_t>(-1, 6));
  const bool gated = r.kind == SFMOE_ACTIVATION_SWIGLU || r.kind == SFMOE_ACTIVATION_GEGLU ||
                     r.kind == SFMOE_ACTIVATION_CLAMPED_SWIGLU;
  r.dtype = float_dtype(f);
  if (f.ConsumeIntegralInRange<int>(0, 2) == 0) {  // a fused quantization
    static const sfmoe_scaling kFused[] = {SFMOE_SCALING_MX_1X32, SFMOE_SCALING_BLOCK_1X128,
                                           SFMOE_SCALING_TENSOR, SFMOE_SCALING_NV_1X16};
    r.scaling = f.ConsumeIntegralInRange<int>(0, 10) == 0 ? recipe(f)
                                                          : kFused[f.ConsumeIntegralInRange(0, 3)];
    r.dtype = r.scaling == SFMOE_SCALING_NV_1X16
                  ? SFMOE_DTYPE_FP4_E2M1
                  : (f.ConsumeBool() ? SFMOE_DTYPE_FP8_E4M3 : SFMOE_DTYPE_FP8_E5M2);
    r.scale_layout = static_cast<sfmoe_scale_layout>(f.ConsumeIntegralInRange<int32_t>(0, 1));
  }
  const int64_t block = r.scaling == SFMOE_SCALING_NONE     ? 1
                        : r.scaling == SFMOE_SCALING_TENSOR ? 8
                        : sfmoe_scaling_block_size(r.scaling) > 0
                            ? sfmoe_scaling_block_size(r.scaling)
                            : 1;
  const int64_t F = block > 1 ? times(block, small(&f, 1) + 1) : small(&f, 24) + 1;
  r.num_groups = small(&f, 5) + 1;
  r.row_capacity = small(&f, block >= 128 ? 16 : 48);
  if (r.dtype == SFMOE_DTYPE_FP4_E2M1) r.row_capacity += r.row_capacity % 2;
  r.input_cols = (gated ? times(2, F) : F) + (f.ConsumeIntegralInRange<int>(0, 20) == 0 ? 1 : 0);
  r.row_alignment = alignment(f);
  r.group_amax = f.ConsumeBool();
  const int64_t G = r.num_groups;
  Grouped* in = plain_rows(a, G, r.row_capacity, r.input_cols, r.row_alignment, float_dtype(f));
  // Each group's real rows: mostly within its block, now and then anything (the host checks them).
  const sfmoe_tensor* group_rows = a.tensor(SFMOE_DTYPE_INT64, {G});
  const int64_t* off = in != nullptr ? in->t.group_offsets : nullptr;
  a.fill_int64(group_rows, [&](int64_t g) -> int64_t {
    if (off == nullptr || g >= G || f.ConsumeIntegralInRange<int>(0, 12) == 0) {
      return f.ConsumeIntegral<int64_t>();
    }
    int64_t rows = 0;  // (an entry offsets() broke may be anything)
    if (__builtin_sub_overflow(off[g + 1], off[g], &rows)) rows = 0;
    return rows > 0 ? f.ConsumeIntegralInRange<int64_t>(0, rows) : 0;
  });
  const sfmoe_grouped_tensor* input = a.mutate(in);
  sfmoe_grouped_tensor_plan op;
  op.struct_size = sizeof(op);
  Grouped* og = a.grouped(op, sfmoe_plan_grouped_activation(&r, &op) == SFMOE_SUCCESS);
  if (og != nullptr && in != nullptr && f.ConsumeBool()) {
    og->t.group_offsets = in->t.group_offsets;  // (documented: may be the input's own array)
    og->held[kOffsets] = in->held[kOffsets];
  }
  const sfmoe_grouped_tensor* output = a.mutate(og);
  sfmoe_quantize_config q = sfmoe_quantize_config_init();
  q.power_of_two_scales = f.ConsumeBool();
  q.stochastic_rounding = f.ConsumeIntegralInRange<int>(0, 10) == 0;  // (refused when fused)
  const int64_t groups = output != nullptr && output->num_groups > G ? output->num_groups : G;
  if (f.ConsumeBool()) q.tensor_scales = a.floats(groups);
  if (f.ConsumeIntegralInRange<int>(0, 10) == 0) q.group_amax = a.floats(groups);
  sfmoe_activation_config c = sfmoe_activation_config_init();
  c.kind = f.ConsumeIntegralInRange<int>(0, 20) == 0
               ? static_cast<sfmoe_activation>(f.ConsumeIntegralInRange<int32_t>(-1, 6))
               : r.kind;
  if (f.ConsumeBool()) c.limit = f.ConsumeFloatingPoint<float>();
  if (f.ConsumeBool()) c.alpha = f.ConsumeFloatingPoint<float>();
  c.quantize = f.ConsumeBool() ? &q : nullptr;
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint8_t>();
  sfmoe_grouped_activation(input, group_rows, &c, output, word.w, nullptr);
  a.check();
  // The backward: d_output [capacity, F] and d_input shaped like the input, both unquantized.
  Grouped* dog = plain_rows(a, G, r.row_capacity, F, r.row_alignment, float_dtype(f));
  Grouped* dig = plain_rows(a, G, r.row_capacity, r.input_cols, r.row_alignment, float_dtype(f));
  if (in != nullptr) {
    for (Grouped* d : {dog, dig}) {
      if (d != nullptr && f.ConsumeIntegralInRange<int>(0, 5) != 0) {
        d->t.group_offsets = in->t.group_offsets;
        d->held[kOffsets] = in->held[kOffsets];
      }
    }
  }
  const sfmoe_grouped_tensor* d_output = a.mutate(dog);
  const sfmoe_grouped_tensor* d_input = a.mutate(dig);
  sfmoe_grouped_activation_backward(input, group_rows, d_output,
                                    f.ConsumeIntegralInRange<int>(0, 20) == 0 ? nullptr : &c,
                                    d_input, word.w, nullptr);
  a.check();
}

void fuzz_cast(Arena& a) {
  FuzzedDataProvider& f = *a.fdp;
  std::vector<int64_t> shape;
  const int ndim = f.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < ndim; ++i) shape.push_back(small(&f, 24));
  // The output: mostly the same shape, now and then flattened (same count) or another one.
  std::vector<int64_t> out_shape = shape;
  const int reshape = f.ConsumeIntegralInRange<int>(0, 6);
  if (reshape == 1) {
    int64_t n = 1;
    for (int64_t d : shape) n = __builtin_mul_overflow(n, d, &n) ? -1 : n;
    out_shape = {n};
  } else if (reshape == 2 && !out_shape.empty()) {
    out_shape.back() = small(&f, 24);
  }
  // (FP32 .. FP4 mostly; the integer and scale dtypes and unknown values now and then)
  auto dtype = [&f]() {
    return static_cast<sfmoe_dtype>(f.ConsumeIntegralInRange<int>(0, 8) == 0
                                        ? f.ConsumeIntegralInRange<int32_t>(-1, 9)
                                        : f.ConsumeIntegralInRange<int32_t>(0, 5));
  };
  const sfmoe_tensor* input = a.tensor(dtype(), shape);
  const sfmoe_tensor* output = a.tensor(dtype(), out_shape);
  sfmoe_cast_config c = sfmoe_cast_config_init();
  c.scale = f.ConsumeBool() ? 1.0f : f.ConsumeFloatingPoint<float>();
  if (f.ConsumeIntegralInRange<int>(0, 3) == 0) c.scale_device = a.floats(1);
  if (f.ConsumeIntegralInRange<int>(0, 20) == 0) c.struct_size = f.ConsumeIntegral<uint8_t>();
  sfmoe_cast(input, output, f.ConsumeIntegralInRange<int>(0, 20) == 0 ? nullptr : &c, nullptr);
  a.check();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  Arena arena{&fdp, {}, {}, {}};
  switch (fdp.ConsumeIntegralInRange<int>(0, 8)) {
    case 0:
      fuzz_router(arena);
      break;
    case 1:
      fuzz_ep(arena);
      break;
    case 2:
      fuzz_layer(arena);
      break;
    case 4:
      fuzz_permute(arena);
      break;
    case 5:
      fuzz_quantize(arena);
      break;
    case 6:
      fuzz_gemm(arena);
      break;
    case 7:
      fuzz_activation(arena);
      break;
    case 8:
      fuzz_cast(arena);
      break;
    default:  // (3: the descriptors kept their number)
      fuzz_descriptors(arena);
  }
  sfmoe_clear_last_error();
  return 0;
}
