// The router on the device (docs/router.md): a warp per token, each lane owning one chunk of
// router_chunk_size(E) consecutive experts, so that the softmax's denominator is summed in the
// order numerics::router_sum defines and the ids and probabilities equal the CPU reference's
// bit for bit. Selection is a sequence of warp argmax reductions (two redux instructions) over
// numerics::selection_key.
//
// Forward: one kernel (scores, groups, top-k, probabilities, per-block expert counts, per-block
// loss partials into the caller's workspace), then, when a loss is asked for, one single-block
// kernel that sums the partials in block order (deterministic: no float atomics anywhere).
// Backward: one kernel, d logits per token.
#include <cuda_bf16.h>

#include <type_traits>

#include "sfmoe/numerics/elementary.h"
#include "sfmoe/numerics/routing.h"
#include "src/common/fault.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/common/sm90_dependent_launch.h"
#include "src/cuda/heuristics/router_launch.h"

namespace sfmoe {
namespace cuda {
namespace {

using numerics::add_rn;
using numerics::div_rn;
using numerics::mul_rn;

// The kernels' parameters: the call's arguments with the logits' dtype as a flag and the losses'
// constants rounded once on the host.
struct RouterDeviceForward {
  const void* logits;  // [tokens, num_experts], FP32 or BF16
  bool logits_bf16;
  const float* bias;  // or NULL
  int64_t tokens;
  RouterConfig config;
  int32_t* topk_ids;
  float* probs;
  int64_t* tokens_per_expert;
  float* aux_loss;      // or NULL
  float* z_loss;        // or NULL
  float* aux_partials;  // router_workspace_floats(tokens, E) floats when a loss is asked for
  float aux_factor, z_factor;
};

struct RouterDeviceBackward {
  const void* logits;
  bool logits_bf16;
  const int32_t* topk_ids;
  const int64_t* tokens_per_expert;
  int64_t tokens;
  RouterConfig config;
  const float* d_probs;  // or NULL
  float d_aux_loss, d_z_loss, aux_factor;
  float* d_logits;
  sfmoe_fault_report* word;  // or NULL
};

constexpr int kLanes = numerics::kRouterSumChunks;  // lanes per token: a warp
static_assert(kLanes == 32, "a warp per token");
constexpr int kThreads = 256;
constexpr int kTokensPerBlock = kThreads / kLanes;
static_assert(kTokensPerBlock == kRouterTokensPerBlock, "the workspace's block count");
constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ float shfl_xor(float v, int m) {
  return __shfl_xor_sync(kFullMask, v, m, kLanes);
}
__device__ __forceinline__ int shfl_xor(int v, int m) {
  return __shfl_xor_sync(kFullMask, v, m, kLanes);
}
__device__ __forceinline__ uint32_t shfl_xor(uint32_t v, int m) {
  return __shfl_xor_sync(kFullMask, v, m, kLanes);
}

// The token's sum in the router-sum order: this lane's chunk sum, then the butterfly.
__device__ __forceinline__ float token_sum(float chunk_sum) {
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    chunk_sum = add_rn(chunk_sum, shfl_xor(chunk_sum, width));
  }
  return chunk_sum;
}

// Plain (not bit-defined) token sum and max, for gradients and losses.
__device__ __forceinline__ float token_max(float v) {
  for (int width = kLanes / 2; width >= 1; width /= 2) v = fmaxf(v, shfl_xor(v, width));
  return v;
}
__device__ __forceinline__ int token_count(int v) {
  for (int width = kLanes / 2; width >= 1; width /= 2) v += shfl_xor(v, width);
  return v;
}

// The best (key, index) of the token: a higher key, then a lower index. Returns key 0 when no lane
// has a candidate.
struct Pick {
  uint32_t key;
  int index;
};
__device__ __forceinline__ Pick token_argmax(Pick p) {
  const uint32_t key = __reduce_max_sync(kFullMask, p.key);
  const uint32_t index =
      __reduce_min_sync(kFullMask, p.key == key ? static_cast<uint32_t>(p.index) : 0x7FFFFFFFu);
  return Pick{key, static_cast<int>(index)};
}

// The better of two picks (a higher key, then a lower index).
__device__ __forceinline__ bool better(const Pick& a, const Pick& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// softmax over a token's n values held by chunks (present: j < count): docs/router.md's rule
// with its limits for non-finite values, the denominator in the router-sum order.
template <int kV>
__device__ __forceinline__ void token_softmax(const float (&x)[kV], int count, float (&s)[kV]) {
  bool any = false;
  float max = -INFINITY;
  int counted = 0;
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if (j < count && x[j] == x[j]) {
      max = fmaxf(max, x[j]);
      any = true;
      ++counted;
    }
  }
  max = token_max(max);
  any = token_count(any ? 1 : 0) > 0;
  counted = token_count(counted);
  if (any && (max == INFINITY || max == -INFINITY)) {
    int at_max = 0;
#pragma unroll
    for (int j = 0; j < kV; ++j) at_max += (j < count && x[j] == max) ? 1 : 0;
    at_max = token_count(at_max);
    const float share = div_rn(1.0f, static_cast<float>(max == INFINITY ? at_max : counted));
#pragma unroll
    for (int j = 0; j < kV; ++j) s[j] = x[j] != x[j] ? x[j] : (x[j] == max ? share : 0.0f);
    return;
  }
  float chunk = 0.0f;
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    s[j] = x[j] != x[j] ? x[j] : numerics::exp_f32(add_rn(x[j], -max));
    if (j < count && x[j] == x[j]) chunk = add_rn(chunk, s[j]);
  }
  const float sum = token_sum(chunk);
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if (x[j] == x[j]) s[j] = div_rn(s[j], sum);
  }
}

// The scores the probabilities come from (softmax, sigmoid, or the logits for softmax after
// top-k).
template <int kV>
__device__ __forceinline__ void token_scores(const RouterConfig& c, const float (&x)[kV], int count,
                                             float (&s)[kV]) {
  if (c.sigmoid) {
#pragma unroll
    for (int j = 0; j < kV; ++j) s[j] = numerics::sigmoid_f32(x[j]);
  } else if (c.softmax_after_topk) {
#pragma unroll
    for (int j = 0; j < kV; ++j) s[j] = x[j];
  } else {
    token_softmax(x, count, s);
  }
}

// The load-balancing loss's scores: the softmax over all experts, or the sigmoids divided by
// their router sum.
template <int kV>
__device__ __forceinline__ void aux_scores(const RouterConfig& c, const float (&x)[kV],
                                           const float (&s)[kV], int count, float (&a)[kV]) {
  if (c.sigmoid) {
    float chunk = 0.0f;
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      if (j < count) chunk = add_rn(chunk, s[j]);
    }
    const float sum = token_sum(chunk);
#pragma unroll
    for (int j = 0; j < kV; ++j) a[j] = div_rn(s[j], sum);
  } else if (c.softmax_after_topk) {
    token_softmax(x, count, a);
  } else {
#pragma unroll
    for (int j = 0; j < kV; ++j) a[j] = s[j];
  }
}

// log sum exp of the token's logits (losses only: logf, not bit-defined).
template <int kV>
__device__ __forceinline__ float token_log_sum_exp(const float (&x)[kV], int count) {
  float max = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if (j < count) {
      max = fmaxf(max, x[j]);
      nan = nan || x[j] != x[j];
    }
  }
  max = token_max(max);
  float chunk = 0.0f;
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if (j < count) chunk = add_rn(chunk, numerics::exp_f32(add_rn(x[j], -max)));
  }
  const float sum = token_sum(chunk);
  if (token_count(nan ? 1 : 0) > 0) return NAN;
  return max + logf(sum);
}

template <class In>
__device__ __forceinline__ float load_logit(const In* p);
template <>
__device__ __forceinline__ float load_logit<float>(const float* p) {
  return __ldg(p);
}
template <>
__device__ __forceinline__ float load_logit<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}

// kV consecutive values as FP32 from p: 16-byte vectors where `vectorized` (p 16-byte aligned
// and all kV present), otherwise value by value for j < count (the others NaN).
template <int kV, class In>
__device__ __forceinline__ void load_values(const In* p, bool vectorized, int count,
                                            float (&x)[kV]) {
  constexpr int kPerVector = 16 / static_cast<int>(sizeof(In));
  if constexpr (kV % kPerVector == 0) {
    if (vectorized) {
#pragma unroll
      for (int v = 0; v < kV / kPerVector; ++v) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p) + v);
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int i = 0; i < kPerVector; ++i) {
          if constexpr (std::is_same<In, float>::value) {
            x[v * kPerVector + i] = __uint_as_float(words[i]);
          } else {
            x[v * kPerVector + i] = __uint_as_float((words[i / 2] >> (16 * (i % 2))) << 16);
          }
        }
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kV; ++j) x[j] = j < count ? load_logit(p + j) : NAN;
}

// Whether a lane's full chunk can be read as 16-byte vectors: the chunk starts 16-byte aligned
// for every token (the same for all lanes and tokens of a launch).
template <class In>
__device__ __forceinline__ bool chunks_vectorizable(const void* p, int64_t row_elements,
                                                    int chunk_size) {
  constexpr int kPerVector = 16 / static_cast<int>(sizeof(In));
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && row_elements % kPerVector == 0 &&
         chunk_size % kPerVector == 0;
}

// The best candidate of this lane among keys (a higher key, then the lower j), as a token pick.
template <int kV>
__device__ __forceinline__ Pick lane_best(const uint32_t (&key)[kV], int base) {
  Pick p{0u, 0x7FFFFFFF};
#pragma unroll
  for (int j = 0; j < kV; ++j) {
    if (key[j] > p.key) {
      p.key = key[j];
      p.index = base + j;
    }
  }
  return p;
}

// A lane's candidates, best first (a higher key, then a lower index), so that each pick of the
// top-k looks at one head per lane and only the lane that owned the pick shifts its list. Keys of
// 0 (left out) carry no index.
template <int kV>
struct LaneCandidates {
  uint32_t key[kV];
  int index[kV];

  __device__ __forceinline__ LaneCandidates(const uint32_t (&keys)[kV], int base) {
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      key[j] = keys[j];
      index[j] = keys[j] != 0u ? base + j : 0x7FFFFFFF;
    }
    // Bitonic sort, descending; every index is compile-time, so all of it stays in registers.
#pragma unroll
    for (int size = 2; size <= kV; size *= 2) {
#pragma unroll
      for (int stride = size / 2; stride > 0; stride /= 2) {
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          const int j = i ^ stride;
          if (j <= i) continue;
          const bool descending = (i & size) == 0;
          const bool j_first = key[j] > key[i] || (key[j] == key[i] && index[j] < index[i]);
          if (j_first == descending) {
            const uint32_t k = key[i];
            key[i] = key[j];
            key[j] = k;
            const int x = index[i];
            index[i] = index[j];
            index[j] = x;
          }
        }
      }
    }
  }

  // Drops the head (the lane's pick was taken).
  __device__ __forceinline__ void pop_if(bool taken) {
#pragma unroll
    for (int j = 0; j + 1 < kV; ++j) {
      key[j] = taken ? key[j + 1] : key[j];
      index[j] = taken ? index[j + 1] : index[j];
    }
    key[kV - 1] = taken ? 0u : key[kV - 1];
    index[kV - 1] = taken ? 0x7FFFFFFF : index[kV - 1];
  }
};

// Per-block storage: expert counts and the picked experts' values for the probabilities.
struct RouterShared {
  int counts[kMaxDeviceExperts];
  float picked[kTokensPerBlock][kMaxDeviceTopK];
  // The token's per-expert values where the probabilities do not follow from the selection key
  // (an expert bias, or softmax after top-k).
  float values[kTokensPerBlock][kMaxDeviceExperts];
  float loss_columns[kMaxDeviceExperts];
  float loss_z[kThreads / 32];
};

// The launch's shape, worked out on the host (integer divisions cost a warp, which routes a token
// or two, more than a hundred instructions).
struct RouterShape {
  int chunk_size;       // experts per lane: router_chunk_size(E)
  int per_group;        // experts per group (E when ungrouped)
  int lanes_per_group;  // per_group / chunk_size
  int lanes_per_group_log2;
  bool aligned_groups;  // groups of a power of two of whole lanes, group score of the best 1-2
  int k_chunk;          // router_chunk_size(k): the softmax after top-k's chunks
  int64_t rounds;       // tokens per warp: ceil(tokens / (grid x tokens per block))
  bool logit_order;     // sigmoid scores alone: the top k by top_k_by_logit_order
};

RouterShape router_shape(const RouterConfig& c, int64_t tokens, int64_t grid) {
  RouterShape r{};
  const int64_t experts = c.num_experts;
  r.chunk_size = static_cast<int>(numerics::router_chunk_size(experts));
  r.per_group = static_cast<int>(c.num_groups > 1 ? experts / c.num_groups : experts);
  r.lanes_per_group = r.per_group / r.chunk_size;
  // Groups made of whole lanes (a power of two of them; DeepSeek-V3: 4 lanes of 8 experts) with a
  // group score of the best one or two take the fast path.
  r.aligned_groups = experts % kLanes == 0 && r.per_group % r.chunk_size == 0 &&
                     r.lanes_per_group > 0 && (r.lanes_per_group & (r.lanes_per_group - 1)) == 0 &&
                     c.group_score_topk <= 2;
  while (r.aligned_groups && (1 << r.lanes_per_group_log2) < r.lanes_per_group)
    ++r.lanes_per_group_log2;
  r.k_chunk = static_cast<int>(numerics::router_chunk_size(c.top_k));
  const int64_t stride = grid * kTokensPerBlock;
  r.rounds = (tokens + stride - 1) / stride;
  return r;
}

// Sigmoid scores with no bias, groups or losses: the top k from the logits' order. sigmoid_f32 is
// not exactly monotone (rounding makes it dip by one ulp at some 900 floats), but it is within one
// ulp of it: for every x' <= x, sigmoid(x') <= next_up(sigmoid(x)), and +0 and -0 score the same
// (both checked over every float on the host by tests/cpp/test_numerics.cpp; the device's sigmoid
// gives the host's bits, device numerics suite). So take the first k + 1 experts
// by logit (selection_key of the logit: NaN last, as NaN scores rank) and their sigmoids (one per
// lane). If the first k scores strictly decrease and the k-th is above next_up of pick k's, no
// other expert can reach the k-th (every later logit scores at most next_up of pick k's), and the
// first k are the top k in selection order: lane i < k gets pick i (its score's key and index).
// Otherwise (equal or near-equal scores, NaNs) it returns false and the caller takes the general
// path. One sigmoid per lane instead of one per expert.
template <int kV>
__device__ __forceinline__ bool top_k_by_logit_order(const float (&x)[kV], int count, int base,
                                                     int k, int sub, uint32_t* my_key,
                                                     int* my_index) {
  uint32_t key[kV];
#pragma unroll
  for (int j = 0; j < kV; ++j) key[j] = j < count ? numerics::selection_key(x[j]) : 0u;
  LaneCandidates<kV> list(key, base);
  uint32_t picked = 0u;
  int picked_index = 0;
  for (int i = 0; i <= k; ++i) {
    const Pick best = token_argmax(Pick{list.key[0], list.index[0]});
    list.pop_if(list.index[0] == best.index);
    if (i == sub) picked = best.key, picked_index = best.index;
  }
  // -1: no pick (fewer than k + 1 candidates), unequal to every score.
  const float score =
      picked != 0u ? numerics::sigmoid_f32(numerics::selection_key_score(picked)) : -1.0f;
  const float next = __shfl_down_sync(0xFFFFFFFFu, score, 1);
  // (next >= 0 here is a score: sigmoids are never -0 and at most 1.)
  const float above_next =
      next > 0.0f || next == 0.0f ? numerics::f32_next_up_nonnegative(next) : next;
  const bool unsafe = (sub + 1 < k && !(score > next)) || (sub + 1 == k && !(score > above_next));
  if (__any_sync(0xFFFFFFFFu, unsafe)) return false;
  *my_key = sub < k ? numerics::selection_key(score) : 0u;
  *my_index = picked_index;
  return true;
}

// Four blocks per multiprocessor (64 registers) up to 256 experts: the occupancy hides the
// latency of the per-token chain of reductions. The loss sums are compiled in only when asked for.
template <int kV, class In, bool kLosses>
__global__ void __launch_bounds__(kThreads, kV <= 8 ? 4 : 2)
    router_forward_kernel(RouterDeviceForward a, RouterShape shape) {
  const RouterConfig& c = a.config;
  __shared__ RouterShared shared;
  const int experts = static_cast<int>(c.num_experts), k = static_cast<int>(c.top_k);
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    shared.counts[e] = 0;
    shared.loss_columns[e] = 0.0f;
  }
  __syncthreads();
  const int sub = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
  const int chunk_size = shape.chunk_size;
  const int base = sub * chunk_size;
  const int count = max(0, min(chunk_size, experts - base));
  constexpr bool losses = kLosses;
  const int per_group = shape.per_group, lanes_per_group = shape.lanes_per_group;
  const bool aligned_groups = shape.aligned_groups;
  float column_sum[kV];
#pragma unroll
  for (int j = 0; j < kV; ++j) column_sum[j] = 0.0f;
  float z_sum = 0.0f;
  const In* logits = static_cast<const In*>(a.logits);
  const bool logits_vectors = chunks_vectorizable<In>(a.logits, experts, chunk_size) && count == kV;
  const bool bias_vectors = chunks_vectorizable<float>(a.bias, 0, chunk_size) && count == kV;

  const bool logit_order = !kLosses && shape.logit_order;
  // Every lane runs the same trip count (full-mask shuffles); lanes past the last token are idle.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTokensPerBlock;
  for (int64_t round = 0; round < shape.rounds; ++round) {
    const int64_t t = round * stride + static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + slot;
    const bool active = t < a.tokens;
    float x[kV], s[kV];
    load_values<kV, In>(logits + (active ? t : 0) * experts + base, logits_vectors && active,
                        active ? count : 0, x);
    constexpr int kHeld = kMaxDeviceTopK / kLanes;
    uint32_t held_key[kHeld];
    int held_index[kHeld];
#pragma unroll
    for (int h = 0; h < kHeld; ++h) held_key[h] = 0u, held_index[h] = 0;
    const bool by_logits =
        logit_order && top_k_by_logit_order(x, count, base, k, sub, &held_key[0], &held_index[0]);
    if (!by_logits) {
      token_scores(c, x, count, s);
      uint32_t key[kV];
      if (a.bias != nullptr) {
        float bias[kV];  // (read per token: L1 hits, and no registers held across tokens)
        load_values<kV, float>(a.bias + base, bias_vectors, count, bias);
#pragma unroll
        for (int j = 0; j < kV; ++j)
          key[j] = j < count ? numerics::selection_key(add_rn(s[j], bias[j])) : 0u;
      } else {
#pragma unroll
        for (int j = 0; j < kV; ++j) key[j] = j < count ? numerics::selection_key(s[j]) : 0u;
      }

      if (c.num_groups > 1 && aligned_groups) {
        // Each lane's chunk lies in one group of lanes_per_group lanes: the group's best two come
        // from each lane's best two, merged over the group's lanes by xor shuffles.
        Pick first{0u, 0x7FFFFFFF}, second{0u, 0x7FFFFFFF};
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const Pick p{key[j], base + j};
          if (better(p, first)) {
            second = first;
            first = p;
          } else if (better(p, second)) {
            second = p;
          }
        }
        for (int width = 1; width < lanes_per_group; width *= 2) {
          const Pick o1{shfl_xor(first.key, width), shfl_xor(first.index, width)};
          const Pick o2{shfl_xor(second.key, width), shfl_xor(second.index, width)};
          if (better(first, o1)) {
            second = better(second, o1) ? second : o1;
          } else {
            second = better(first, o2) ? first : o2;
            first = o1;
          }
        }
        float sum = add_rn(0.0f, numerics::selection_key_score(first.key));
        if (c.group_score_topk == 2) sum = add_rn(sum, numerics::selection_key_score(second.key));
        const int group = sub >> shape.lanes_per_group_log2;  // (a power of two of lanes)
        const uint32_t group_key =
            (sub & (lanes_per_group - 1)) == 0 ? numerics::selection_key(sum) : 0u;
        uint64_t kept = 0;
        for (int pick = 0; pick < c.group_topk; ++pick) {
          const Pick best = token_argmax(Pick{(kept >> group) & 1u ? 0u : group_key, group});
          kept |= uint64_t{1} << best.index;
        }
        if (!((kept >> group) & 1u)) {
#pragma unroll
          for (int j = 0; j < kV; ++j) key[j] = 0u;
        }
      } else if (c.num_groups > 1) {
        // Group scores: the sum of each group's best group_score_topk selection scores, best first.
        const int groups = static_cast<int>(c.num_groups);
        float group_score_held[kMaxDeviceGroups / kLanes];  // group g on lane g % 32, slot g / 32
#pragma unroll
        for (int i = 0; i < kMaxDeviceGroups / kLanes; ++i) group_score_held[i] = 0.0f;
        for (int g = 0; g < groups; ++g) {
          // This lane's part of group g: j in [g * per_group - base, (g + 1) * per_group - base).
          const int lo = g * per_group - base, hi = lo + per_group;
          uint32_t group_key[kV];
#pragma unroll
          for (int j = 0; j < kV; ++j) group_key[j] = j >= lo && j < hi ? key[j] : 0u;
          float sum = 0.0f;
          for (int pick = 0; pick < c.group_score_topk; ++pick) {
            const Pick best = token_argmax(lane_best(group_key, base));
            sum = add_rn(sum, numerics::selection_key_score(best.key));
#pragma unroll
            for (int j = 0; j < kV; ++j) {
              if (j < count && base + j == best.index) group_key[j] = 0u;
            }
          }
#pragma unroll
          for (int i = 0; i < kMaxDeviceGroups / kLanes; ++i) {
            if (g == sub + kLanes * i) group_score_held[i] = sum;
          }
        }
        uint64_t kept = 0;
        uint32_t held_key[kMaxDeviceGroups / kLanes];
#pragma unroll
        for (int i = 0; i < kMaxDeviceGroups / kLanes; ++i) {
          held_key[i] =
              sub + kLanes * i < groups ? numerics::selection_key(group_score_held[i]) : 0u;
        }
        for (int pick = 0; pick < c.group_topk; ++pick) {
          Pick p{0u, 0x7FFFFFFF};
#pragma unroll
          for (int i = 0; i < kMaxDeviceGroups / kLanes; ++i) {
            if (held_key[i] > p.key) {
              p.key = held_key[i];
              p.index = sub + kLanes * i;
            }
          }
          const Pick best = token_argmax(p);
          kept |= uint64_t{1} << best.index;
#pragma unroll
          for (int i = 0; i < kMaxDeviceGroups / kLanes; ++i) {
            if (sub + kLanes * i == best.index) held_key[i] = 0u;
          }
        }
        // The experts of dropped groups are out (this lane spans groups first..last).
        const int first = base / per_group, last = (base + max(count, 1) - 1) / per_group;
        for (int g = first; g <= last; ++g) {
          if ((kept >> g) & 1u) continue;
          const int lo = g * per_group - base, hi = lo + per_group;
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            if (j >= lo && j < hi) key[j] = 0u;
          }
        }
      }

      // Top-k, best first: each pick is the best of the lanes' heads. Pick i is kept by lane
      // i % 32 (slot i / 32), which then writes its id, counts it and records its value.
      {
        LaneCandidates<kV> list(key, base);
        for (int i = 0; i < k; ++i) {
          const Pick best = token_argmax(Pick{list.key[0], list.index[0]});
          list.pop_if(list.index[0] == best.index);
#pragma unroll
          for (int h = 0; h < kHeld; ++h) {
            if (i == sub + kLanes * h) held_key[h] = best.key, held_index[h] = best.index;
          }
        }
      }
    }  // !by_logits
    // The probabilities' values: the selection score itself (the key's inverse) unless a bias was
    // added for the selection or the values are the logits (softmax after top-k).
    const bool key_is_value = a.bias == nullptr && !c.softmax_after_topk;
    if (!key_is_value) {
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        if (j < count) shared.values[slot][base + j] = c.softmax_after_topk ? x[j] : s[j];
      }
      __syncwarp();
    }
#pragma unroll
    for (int h = 0; h < kHeld; ++h) {
      const int i = sub + kLanes * h;
      // (A key of 0 cannot win: the configuration keeps at least k experts selectable.)
      if (i < k && held_key[h] != 0u) {
        shared.picked[slot][i] = key_is_value ? numerics::selection_key_score(held_key[h])
                                              : shared.values[slot][held_index[h]];
        if (active) {
          atomicAdd(&shared.counts[held_index[h]], 1);
          a.topk_ids[t * k + i] = held_index[h];
        }
      }
    }
    __syncwarp();

    // Probabilities, in selection order.
    if (c.softmax_after_topk) {
      constexpr int kPerLane = kMaxDeviceTopK / kLanes;
      const int k_chunk = shape.k_chunk;
      const int k_base = sub * k_chunk, k_count = max(0, min(k_chunk, k - k_base));
      float px[kPerLane], pp[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        px[j] = j < k_count ? shared.picked[slot][k_base + j] : NAN;
      token_softmax(px, k_count, pp);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (active && j < k_count) {
          a.probs[t * k + k_base + j] = mul_rn(pp[j], c.scaling_factor);
        }
      }
    } else {
      float sum = 0.0f;
      if (c.normalize) {
        for (int i = 0; i < k; ++i) sum = add_rn(sum, shared.picked[slot][i]);
      }
      for (int i = sub; i < k; i += kLanes) {
        float p = shared.picked[slot][i];
        if (c.normalize && sum > 0.0f) p = div_rn(p, sum);
        if (active) a.probs[t * k + i] = mul_rn(p, c.scaling_factor);
      }
    }
    __syncwarp();

    // Idle lanes take part in the helpers' shuffles too; only active tokens are summed.
    if (kLosses && a.aux_loss != nullptr) {
      float aux[kV];
      aux_scores(c, x, s, count, aux);
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        if (active && j < count) column_sum[j] = add_rn(column_sum[j], aux[j]);
      }
    }
    if (kLosses && a.z_loss != nullptr) {
      const float lse = token_log_sum_exp(x, count);
      if (active) z_sum = add_rn(z_sum, mul_rn(lse, lse));
    }
  }

  __syncthreads();
  // The dependent of router_clear_counts_kernel (router_forward): the counts are zero once it
  // has completed.
  wait_for_previous_kernel();
  for (int e = threadIdx.x; e < experts; e += kThreads) {
    if (shared.counts[e] != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(a.tokens_per_expert + e),
                static_cast<unsigned long long>(shared.counts[e]));
    }
  }
  if (!losses) return;
  // Loss partials of this block, in a fixed order: the warps one after the other (the lanes of a
  // warp own distinct experts; each holds the warp's z sum).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared.loss_z[warp] = z_sum;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (warp == w) {
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        if (j < count) {
          shared.loss_columns[base + j] = add_rn(shared.loss_columns[base + j], column_sum[j]);
        }
      }
    }
    __syncthreads();
  }
  float* partial = a.aux_partials + static_cast<int64_t>(blockIdx.x) * (experts + 1);
  for (int e = threadIdx.x; e < experts; e += kThreads) partial[e] = shared.loss_columns[e];
  if (threadIdx.x == 0) {
    float z = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) z = add_rn(z, shared.loss_z[w]);
    partial[experts] = z;
  }
}

// The losses from the blocks' partials in a fixed order: warp w sums the blocks b = w (mod 32)
// of 32 columns at a time, warp 0 adds the 32 warps' sums in order and weighs each column by its
// count; the columns' terms are then added by a butterfly over the lanes.
constexpr int kLossThreads = 1024;
__global__ void __launch_bounds__(kLossThreads)
    router_loss_kernel(const float* partials, int blocks, int experts,
                       const int64_t* tokens_per_expert, float aux_factor, float z_factor,
                       float* aux_loss, float* z_loss) {
  __shared__ float part[32][33];
  __shared__ float z_part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = experts + 1;
  float term = 0.0f;
  for (int first = 0; first < experts; first += 32) {
    const int column = first + lane;
    float sum = 0.0f;
    if (column < experts) {
      for (int b = warp; b < blocks; b += 32) sum = add_rn(sum, partials[b * row + column]);
    }
    part[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && column < experts) {
      float total = 0.0f;
      for (int w = 0; w < 32; ++w) total = add_rn(total, part[w][lane]);
      term = add_rn(term, mul_rn(static_cast<float>(tokens_per_expert[column]), total));
    }
    __syncthreads();
  }
  float z = 0.0f;
  if (lane == 0) {
    for (int b = warp; b < blocks; b += 32) z = add_rn(z, partials[b * row + experts]);
    z_part[warp] = z;
  }
  __syncthreads();
  if (warp != 0) return;
  for (int width = 16; width >= 1; width /= 2) {
    term = add_rn(term, __shfl_xor_sync(kFullMask, term, width));
  }
  if (lane == 0) {
    if (aux_loss != nullptr) *aux_loss = mul_rn(term, aux_factor);
    if (z_loss != nullptr) {
      float total = 0.0f;
      for (int w = 0; w < 32; ++w) total = add_rn(total, z_part[w]);
      *z_loss = mul_rn(total, z_factor);
    }
  }
}

// ---- backward -------------------------------------------------------------------------------

template <int kV, class In>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(RouterDeviceBackward a, RouterShape shape) {
  const RouterConfig& c = a.config;
  __shared__ int picked_id[kTokensPerBlock][kMaxDeviceTopK];
  __shared__ float picked_u[kTokensPerBlock][kMaxDeviceTopK];
  const int experts = static_cast<int>(c.num_experts), k = static_cast<int>(c.top_k);
  const int sub = threadIdx.x % kLanes, slot = threadIdx.x / kLanes;
  const int chunk_size = shape.chunk_size;
  const int base = sub * chunk_size;
  const int count = max(0, min(chunk_size, experts - base));
  const In* logits = static_cast<const In*>(a.logits);
  const bool logits_vectors = chunks_vectorizable<In>(a.logits, experts, chunk_size) && count == kV;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTokensPerBlock;
  for (int64_t round = 0; round < shape.rounds; ++round) {
    const int64_t t = round * stride + static_cast<int64_t>(blockIdx.x) * kTokensPerBlock + slot;
    const bool active = t < a.tokens;
    float x[kV], s[kV], dx[kV];
    load_values<kV, In>(logits + (active ? t : 0) * experts + base, logits_vectors && active,
                        active ? count : 0, x);
#pragma unroll
    for (int j = 0; j < kV; ++j) dx[j] = 0.0f;

    if (a.d_probs != nullptr) {
      // The selected experts: ids checked (an id outside [0, E) takes no part, and is reported).
      for (int i = sub; i < k; i += kLanes) {
        int id = active ? a.topk_ids[t * k + i] : -1;
        if (active && (id < 0 || id >= experts)) {
          if (a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, t, id);
          id = -1;
        }
        picked_id[slot][i] = id;
      }
      __syncwarp();
      if (!c.sigmoid && c.softmax_after_topk) {
        // u = softmax over the selected logits with the forward's rules for non-finite logits
        // (a sum in plain order: gradients are compared with a tolerance); lane i computes u_i.
        // d x_id = u_i (dp_i scale - sum_j dp_j scale u_j).
        for (int i = sub; i < k; i += kLanes) {
          const int id = picked_id[slot][i];
          picked_u[slot][i] = id >= 0 ? load_logit(logits + t * experts + id) : NAN;
        }
        __syncwarp();
        bool any = false;
        float max = -INFINITY;
        int counted = 0;
        for (int i = 0; i < k; ++i) {
          const float v = picked_u[slot][i];
          if (v == v) {
            max = fmaxf(max, v);
            any = true;
            ++counted;
          }
        }
        const bool limit = any && (max == INFINITY || max == -INFINITY);
        int at_max = 0;
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) {
          const float v = picked_u[slot][i];
          at_max += v == max ? 1 : 0;
          if (v == v) sum += __expf(v - max);
        }
        float u_mine[kMaxDeviceTopK / kLanes];
#pragma unroll
        for (int r = 0; r < kMaxDeviceTopK / kLanes; ++r) {
          const int i = sub + r * kLanes;
          const float v = i < k ? picked_u[slot][i] : 0.0f;
          u_mine[r] = v != v
                          ? v
                          : (limit ? (v == max ? 1.0f / (max == INFINITY ? at_max : counted) : 0.0f)
                                   : __expf(v - max) / sum);
        }
        __syncwarp();
#pragma unroll
        for (int r = 0; r < kMaxDeviceTopK / kLanes; ++r) {
          const int i = sub + r * kLanes;
          if (i < k) picked_u[slot][i] = u_mine[r];
        }
        __syncwarp();
        float dot = 0.0f;
        for (int i = 0; i < k; ++i) {
          if (picked_id[slot][i] < 0) continue;
          dot += (active ? a.d_probs[t * k + i] : 0.0f) * c.scaling_factor * picked_u[slot][i];
        }
        for (int i = 0; i < k; ++i) {
          const int id = picked_id[slot][i];
          if (id < base || id >= base + count) continue;
          const float u = picked_u[slot][i];
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            if (j < count && base + j == id) {
              dx[j] += u * ((active ? a.d_probs[t * k + i] : 0.0f) * c.scaling_factor - dot);
            }
          }
        }
      } else {
        token_scores(c, x, count, s);
        __syncwarp();
        // u_i = s[id_i], gathered through shared memory by the owner lanes.
        for (int i = 0; i < k; ++i) {
          const int id = picked_id[slot][i];
          __syncwarp();
          float mine = 0.0f;
          bool owner = false;
#pragma unroll
          for (int j = 0; j < kV; ++j) {
            if (j < count && base + j == id) {
              mine = s[j];
              owner = true;
            }
          }
          if (owner) picked_u[slot][i] = mine;
          if (id < 0 && sub == 0) picked_u[slot][i] = 0.0f;
          __syncwarp();
        }
        float sum = 0.0f, weighted = 0.0f;
        for (int i = 0; i < k; ++i) {
          const float u = picked_u[slot][i];
          sum += u;
          weighted += (active ? a.d_probs[t * k + i] : 0.0f) * u;
        }
        const bool normalized = c.normalize && sum > 0.0f;
        float dot = 0.0f;  // softmax: sum_i du_i u_i
        for (int i = 0; i < k; ++i) {
          const int id = picked_id[slot][i];
          const float u = picked_u[slot][i];
          const float dp = active ? a.d_probs[t * k + i] : 0.0f;
          const float du = c.scaling_factor * (normalized ? dp / sum - weighted / (sum * sum) : dp);
          dot += du * u;
          if (id >= base && id < base + count) {
#pragma unroll
            for (int j = 0; j < kV; ++j) {
              if (j < count && base + j == id) dx[j] += c.sigmoid ? du * u * (1.0f - u) : s[j] * du;
            }
          }
        }
        if (!c.sigmoid) {
#pragma unroll
          for (int j = 0; j < kV; ++j) dx[j] -= s[j] * dot;
        }
      }
      __syncwarp();
    }

    if (c.aux_loss_coeff != 0.0f && a.d_aux_loss != 0.0f) {
      // d aux / d a[t, e] = factor count_e; then through the softmax or the normalized sigmoids.
      if (a.d_probs == nullptr || c.softmax_after_topk) token_scores(c, x, count, s);
      float aux[kV], g[kV];
      aux_scores(c, x, s, count, aux);
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        g[j] = j < count
                   ? a.d_aux_loss * a.aux_factor * static_cast<float>(a.tokens_per_expert[base + j])
                   : 0.0f;
        if (j < count) dot += g[j] * aux[j];
      }
      for (int width = kLanes / 2; width >= 1; width /= 2) dot += shfl_xor(dot, width);
      if (!c.sigmoid) {
#pragma unroll
        for (int j = 0; j < kV; ++j) dx[j] += aux[j] * (g[j] - dot);
      } else {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kV; ++j) sum += j < count ? s[j] : 0.0f;
        for (int width = kLanes / 2; width >= 1; width /= 2) sum += shfl_xor(sum, width);
#pragma unroll
        for (int j = 0; j < kV; ++j) dx[j] += s[j] * (1.0f - s[j]) * (g[j] - dot) / sum;
      }
    }

    if (c.z_loss_coeff != 0.0f && a.d_z_loss != 0.0f) {
      const float lse = token_log_sum_exp(x, count);
      float sm[kV];
      token_softmax(x, count, sm);
      const float factor = a.d_z_loss * 2.0f * c.z_loss_coeff / static_cast<float>(a.tokens) * lse;
#pragma unroll
      for (int j = 0; j < kV; ++j) dx[j] += factor * sm[j];
    }

    if (active) {
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        if (j < count) a.d_logits[t * experts + base + j] = dx[j];
      }
    }
    __syncwarp();
  }
}

// Zeroes the expert counts the forward adds to. Its dependent, the forward kernel
// (launch_dependent), starts at once and computes while this runs; it waits for it only before
// its first count is added, so the clearing costs no gap between two kernels.
__global__ void router_clear_counts_kernel(int64_t* counts, int64_t experts) {
  let_dependents_start();
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = 0;
}

static_assert(kMaxDeviceExperts <= 16 * kLanes, "chunks of at most 16 experts");
template <class Launch>
sfmoe_status by_chunk(int chunk, Launch launch) {
  if (chunk <= 1) return launch(std::integral_constant<int, 1>());
  if (chunk <= 2) return launch(std::integral_constant<int, 2>());
  if (chunk <= 4) return launch(std::integral_constant<int, 4>());
  if (chunk <= 8) return launch(std::integral_constant<int, 8>());
  return launch(std::integral_constant<int, 16>());  // kMaxDeviceExperts / 32
}

}  // namespace

sfmoe_status router_forward(const RouterForwardArgs& args, void* stream_pointer) {
  const RouterDeviceForward a{args.logits,
                              args.logits_dtype == SFMOE_DTYPE_BF16,
                              args.expert_bias,
                              args.tokens,
                              args.config,
                              args.topk_ids,
                              args.probs,
                              args.tokens_per_expert,
                              args.aux_loss,
                              args.z_loss,
                              args.aux_partials,
                              router_aux_factor(args.config, args.tokens),
                              router_z_factor(args.config, args.tokens)};
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const RouterConfig& c = a.config;
  router_clear_counts_kernel<<<1, 256, 0, stream>>>(a.tokens_per_expert, c.num_experts);
  SFMOE_RETURN_IF_ERROR(check_launch("router_clear_counts_kernel"));
  const int64_t blocks = router_blocks(a.tokens);
  RouterShape shape = router_shape(c, a.tokens, blocks);
  // The top k from the logits' order where the scores keep it (heuristics/router_launch.h).
  shape.logit_order =
      router_takes_logit_order(c, a.bias != nullptr, a.aux_loss != nullptr || a.z_loss != nullptr);
  if (a.tokens > 0) {
    SFMOE_RETURN_IF_ERROR(by_chunk(shape.chunk_size, [&](auto v) -> sfmoe_status {
      constexpr int kV = decltype(v)::value;
      const bool losses = a.aux_loss != nullptr || a.z_loss != nullptr;
      const unsigned grid = static_cast<unsigned>(blocks);
      const auto kernel = a.logits_bf16 ? (losses ? router_forward_kernel<kV, __nv_bfloat16, true>
                                                  : router_forward_kernel<kV, __nv_bfloat16, false>)
                                        : (losses ? router_forward_kernel<kV, float, true>
                                                  : router_forward_kernel<kV, float, false>);
      const cudaError_t launched =
          launch_dependent(kernel, dim3(grid), dim3(kThreads), 0, stream, a, shape);
      SFMOE_CUDA_RETURN_IF_ERROR(launched);
      return check_launch("router_forward_kernel");
    }));
  }
  if (a.aux_loss != nullptr || a.z_loss != nullptr) {
    if (a.tokens == 0) {
      if (a.aux_loss) SFMOE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.aux_loss, 0, 4, stream));
      if (a.z_loss) SFMOE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.z_loss, 0, 4, stream));
      return SFMOE_SUCCESS;
    }
    router_loss_kernel<<<1, kLossThreads, 0, stream>>>(
        a.aux_partials, static_cast<int>(blocks), static_cast<int>(c.num_experts),
        a.tokens_per_expert, a.aux_factor, a.z_factor, a.aux_loss, a.z_loss);
    return check_launch("router_loss_kernel");
  }
  return SFMOE_SUCCESS;
}

sfmoe_status router_backward(const RouterBackwardArgs& args, void* stream_pointer) {
  const RouterDeviceBackward a{args.logits,   args.logits_dtype == SFMOE_DTYPE_BF16,
                               args.topk_ids, args.tokens_per_expert,
                               args.tokens,   args.config,
                               args.d_probs,  args.d_aux_loss,
                               args.d_z_loss, router_aux_factor(args.config, args.tokens),
                               args.d_logits, args.word};
  if (a.tokens == 0) return SFMOE_SUCCESS;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const int64_t wanted = (a.tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  const RouterShape shape = router_shape(a.config, a.tokens, blocks);
  return by_chunk(shape.chunk_size, [&](auto v) -> sfmoe_status {
    constexpr int kV = decltype(v)::value;
    if (a.logits_bf16) {
      router_backward_kernel<kV, __nv_bfloat16><<<blocks, kThreads, 0, stream>>>(a, shape);
    } else {
      router_backward_kernel<kV, float><<<blocks, kThreads, 0, stream>>>(a, shape);
    }
    return check_launch("router_backward_kernel");
  });
}

}  // namespace cuda
}  // namespace sfmoe
