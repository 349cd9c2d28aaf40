// The MoE layer with expert parallelism over the loopback transport (src/layer/moe_layer.h)
// against the layer without it, on the same global batch: each rank holds a slice of the tokens
// and its local experts' weights; the outputs and every gradient, put back together, must equal
// the single layer's bit for bit (every routed row is kept: a worst-case receive capacity). Shared
// by the CPU suite and the GPU suite, which give it their memory.
#pragma once

#include <gtest/gtest.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/numerics.h"
#include "src/layer/moe_layer.h"

namespace sfmoe {
namespace testing {

struct EpLayerCase {
  std::string name;
  std::vector<int64_t> tokens;  // each rank's T (the world is their count)
  int64_t hidden, ffn, experts, top_k, alignment;
  sfmoe_dtype dtype = SFMOE_DTYPE_BF16;
  bool sigmoid = false;
  bool accumulate = false;  // FP32 main-grad weight gradients, added to
  ActivationKind activation = ActivationKind::kSwiGLU;
  // SPILL: each rank's first round of `capacity` rows, the rest in the second (needs accumulate);
  // the weight gradients then add the rounds' sums in turn: equal within FP32 rounding only.
  int64_t spill_capacity = 0;  // 0: no SPILL
  sfmoe_moe_recipe recipe = SFMOE_MOE_RECIPE_BF16;
  // DROP beyond a receive capacity of this many rows (0: the worst case, nothing dropped): the
  // EP layer then differs from the single layer, and is compared with itself over transports.
  int64_t drop_capacity = 0;
  // > 0: each rank sends another at most this many rows (the rest dropped; host loopback and the
  // per-rank transports only)
  int64_t pair_capacity = 0;
};

// Where the buffers live: allocation (filled with one byte), copies both ways, release, and a
// wait for the stream.
struct LayerMemory {
  sfmoe_memory memory;
  std::function<void*(size_t bytes, uint8_t fill)> alloc;
  std::function<void(void* to, const void* from, size_t bytes)> upload;
  std::function<void(void* to, const void* from, size_t bytes)> download;
  std::function<void(void*)> release;
  std::function<void()> wait;
  void* stream = nullptr;
};

struct EpLayerRun {
  const EpLayerCase& c;
  LayerMemory& m;
  int64_t world, total, fc1_cols, elem;
  layer::MoeLayerShape single_shape, ep_shape, external_shape;
  layer::MoeLayerPlan single_plan, ep_plan, external_plan;
  std::vector<void*> owned;
  // global buffers (the EP ranks read and write slices of them)
  uint8_t *x, *logits, *w1, *w2, *d_y, *y[2], *d_x[2], *d_logits[2], *d_w1[2], *d_w2[2];
  std::vector<uint8_t*> saved, workspace;  // [0]: the single layer's; then one per rank
  std::vector<int64_t> start;              // each rank's first token

  EpLayerRun(const EpLayerCase& lc, LayerMemory& mem, std::mt19937_64& rng) : c(lc), m(mem) {
    world = static_cast<int64_t>(c.tokens.size());
    total = 0;
    int64_t most = 0;
    for (int64_t t : c.tokens) {
      start.push_back(total);
      total += t;
      most = t > most ? t : most;
    }
    fc1_cols = activation_is_gated(c.activation) ? 2 * c.ffn : c.ffn;
    elem = sfmoe_dtype_bits(c.dtype) / 8;
    layer::MoeLayerShape s;
    s.hidden = c.hidden;
    s.ffn = c.ffn;
    s.experts = c.experts;
    s.top_k = c.top_k;
    s.row_alignment = c.alignment;
    s.router.num_experts = c.experts;
    s.router.top_k = c.top_k;
    s.router.sigmoid = c.sigmoid;
    s.router.normalize = c.sigmoid;
    s.activation.kind = c.activation;
    s.dtype = c.dtype;
    s.accumulate_weight_grads = c.accumulate;
    s.recipe = c.recipe;
    s.seed = 0x5EEDull;
    single_shape = s;
    single_shape.max_tokens = total;
    ep_shape = s;
    ep_shape.max_tokens = most;
    ep_shape.ep_world = world;
    if (c.spill_capacity > 0) {
      ep_shape.ep_receive_capacity = c.spill_capacity;
      ep_shape.ep_overflow = SFMOE_EP_OVERFLOW_SPILL;
      ep_shape.ep_spill_capacity = SFMOE_EP_CAPACITY_WORST_CASE;
    }
    if (c.drop_capacity > 0) ep_shape.ep_receive_capacity = c.drop_capacity;
    if (c.pair_capacity > 0) ep_shape.ep_pair_capacity = c.pair_capacity;
    external_shape = ep_shape;
    external_shape.ep_transport = SFMOE_EP_TRANSPORT_EXTERNAL;
    EXPECT_TRUE(layer::plan_moe_layer(single_shape, m.memory, &single_plan).ok());
    const Outcome planned = layer::plan_moe_layer(ep_shape, m.memory, &ep_plan);
    EXPECT_TRUE(planned.ok()) << planned.reason;
    const Outcome external = layer::plan_moe_layer(external_shape, m.memory, &external_plan);
    EXPECT_TRUE(external.ok()) << external.reason;

    const int64_t E = c.experts, H = c.hidden, F = c.ffn;
    x = upload_values(total * H, 1.0, rng);
    d_y = upload_values(total * H, 1.0, rng);
    w1 = upload_values(E * fc1_cols * H, 1.0 / std::sqrt(static_cast<double>(H)), rng);
    w2 = upload_values(E * H * F, 1.0 / std::sqrt(static_cast<double>(F)), rng);
    logits = upload_floats(total * E, rng);
    const int64_t wbytes = c.accumulate ? 4 : elem;
    std::vector<uint8_t> start_w1, start_w2;  // accumulate: the same main gradients before
    if (c.accumulate) {
      start_w1 = random_floats(E * fc1_cols * H, rng);
      start_w2 = random_floats(E * H * F, rng);
    }
    for (int i = 0; i < 2; ++i) {
      y[i] = alloc(total * H * elem, 0xEE);
      d_x[i] = alloc(total * H * elem, 0xEE);
      d_logits[i] = alloc(total * E * 4, 0xEE);
      d_w1[i] = alloc(E * fc1_cols * H * wbytes, 0xEE);
      d_w2[i] = alloc(E * H * F * wbytes, 0xEE);
      if (c.accumulate) {
        m.upload(d_w1[i], start_w1.data(), start_w1.size());
        m.upload(d_w2[i], start_w2.data(), start_w2.size());
      }
    }
    saved.push_back(alloc(single_plan.saved_bytes, 0xA5));
    workspace.push_back(alloc(single_plan.workspace_bytes, 0x5A));
    // (each rank's buffers serve both transports: EXTERNAL's handle holds more of the routing)
    const int64_t saved_bytes = std::max(ep_plan.saved_bytes, external_plan.saved_bytes);
    const int64_t workspace_bytes =
        std::max(ep_plan.workspace_bytes, external_plan.workspace_bytes);
    for (int64_t r = 0; r < world; ++r) {
      saved.push_back(alloc(saved_bytes, 0xA5));
      workspace.push_back(alloc(workspace_bytes, 0x5A));
    }
  }
  ~EpLayerRun() {
    for (void* p : owned) m.release(p);
  }

  uint8_t* alloc(int64_t bytes, uint8_t fill) {
    void* p = m.alloc(static_cast<size_t>(bytes), fill);
    owned.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  std::vector<uint8_t> random_floats(int64_t n, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float v = d(rng);
      memcpy(&b[i * 4], &v, 4);
    }
    return b;
  }
  uint8_t* upload_floats(int64_t n, std::mt19937_64& rng) {
    const std::vector<uint8_t> b = random_floats(n, rng);
    uint8_t* p = alloc(n * 4, 0);
    m.upload(p, b.data(), b.size());
    return p;
  }
  // Values of the layer's dtype, normal with deviation sd.
  uint8_t* upload_values(int64_t n, double sd, std::mt19937_64& rng) {
    std::normal_distribution<float> d(0.0f, static_cast<float>(sd));
    std::vector<uint8_t> b(static_cast<size_t>(n * elem));
    for (int64_t i = 0; i < n; ++i) {
      const float v = d(rng);
      if (elem == 2) {
        const uint16_t code = numerics::f32_to_bf16(v);
        memcpy(&b[i * 2], &code, 2);
      } else {
        memcpy(&b[i * 4], &v, 4);
      }
    }
    uint8_t* p = alloc(n * elem, 0);
    m.upload(p, b.data(), b.size());
    return p;
  }
  void new_logits(std::mt19937_64& rng) {
    const std::vector<uint8_t> b = random_floats(total * c.experts, rng);
    m.upload(logits, b.data(), b.size());
  }

  // Rows in each rank's second round (SPILL), read from the handles after a step.
  int64_t spilled() {
    m.wait();
    int64_t n = 0;
    const int64_t El = c.experts / world;
    for (int64_t r = 0; r < world && ep_plan.ep.shape.rounds > 1; ++r) {
      const EpRankRouting q =
          ops::ep_routing_at(ep_plan.ep, saved[1 + r] + ep_plan.ep_handle.offset);
      std::vector<int64_t> kept(static_cast<size_t>(2 * El));
      m.download(kept.data(), q.kept, kept.size() * 8);
      for (int64_t g = El; g < 2 * El; ++g) n += kept[g];
    }
    return n;
  }

  // Rows the ranks dropped (every rank's handle of the last step over `plan`).
  int64_t dropped(const layer::MoeLayerPlan& plan) {
    m.wait();
    int64_t n = 0;
    for (int64_t r = 0; r < world; ++r) {
      const EpRankRouting q = ops::ep_routing_at(plan.ep, saved[1 + r] + plan.ep_handle.offset);
      std::vector<int64_t> v(static_cast<size_t>(c.experts));
      m.download(v.data(), q.dropped, v.size() * 8);
      for (int64_t d : v) n += d;
    }
    return n;
  }

  // The calls of one forward and backward of the single layer (out = 0) or of the EP ranks
  // (out = 1: one per rank).
  void calls(int out, std::vector<layer::MoeForwardCall>* forward,
             std::vector<layer::MoeBackwardCall>* backward) {
    const int64_t E = c.experts, H = c.hidden, F = c.ffn, El = E / world;
    const int64_t wbytes = c.accumulate ? 4 : elem;
    const bool ep = out == 1;
    const int64_t ranks = ep ? world : 1;
    std::vector<layer::MoeForwardCall>& fwd = *forward;
    std::vector<layer::MoeBackwardCall>& bwd = *backward;
    fwd.assign(static_cast<size_t>(ranks), layer::MoeForwardCall{});
    bwd.assign(static_cast<size_t>(ranks), layer::MoeBackwardCall{});
    for (int64_t r = 0; r < ranks; ++r) {
      const int64_t t0 = ep ? start[r] : 0, T = ep ? c.tokens[r] : total;
      const int64_t e0 = ep ? r * El : 0;
      layer::MoeForwardCall& f = fwd[r];
      f = layer::MoeForwardCall{};
      f.tokens = T;
      f.x = x + t0 * H * elem;
      f.logits = logits + t0 * E * 4;
      f.logits_dtype = SFMOE_DTYPE_FP32;
      f.w1 = w1 + e0 * fc1_cols * H * elem;
      f.w2 = w2 + e0 * H * F * elem;
      f.y = y[out] + t0 * H * elem;
      f.saved = saved[ep ? 1 + r : 0];
      f.workspace = workspace[ep ? 1 + r : 0];
      f.memory = m.memory;
      f.stream = m.stream;
      layer::MoeBackwardCall& b = bwd[r];
      b = layer::MoeBackwardCall{};
      b.part = SFMOE_MOE_BACKWARD_ALL;
      b.tokens = T;
      b.x = f.x;
      b.d_y = d_y + t0 * H * elem;
      b.logits = f.logits;
      b.logits_dtype = SFMOE_DTYPE_FP32;
      b.w1 = f.w1;
      b.w2 = f.w2;
      b.d_x = d_x[out] + t0 * H * elem;
      b.d_logits = reinterpret_cast<float*>(d_logits[out] + t0 * E * 4);
      b.d_w1 = d_w1[out] + e0 * fc1_cols * H * wbytes;
      b.d_w2 = d_w2[out] + e0 * H * F * wbytes;
      b.saved = f.saved;
      b.workspace = f.workspace;
      b.memory = m.memory;
      b.stream = m.stream;
    }
  }

  // One forward and backward of the single layer (out = 0) or of the EP ranks (out = 1).
  sfmoe_status step(int out) {
    const bool ep = out == 1;
    std::vector<layer::MoeForwardCall> fwd;
    std::vector<layer::MoeBackwardCall> bwd;
    calls(out, &fwd, &bwd);
    const layer::MoeLayerShape& s = ep ? ep_shape : single_shape;
    const layer::MoeLayerPlan& p = ep ? ep_plan : single_plan;
    const sfmoe_status forward = layer::moe_layer_forward_ranks(s, p, fwd.data());
    if (forward != SFMOE_SUCCESS) return forward;
    return layer::moe_layer_backward_ranks(s, p, bwd.data());
  }

  // One forward and backward of the EP ranks over the EXTERNAL transport (into out = 1): every
  // stage of each sequence on each rank in turn, the collectives between two stages made here
  // (through the host), as a framework's would be.
  sfmoe_status step_external() {
    std::vector<layer::MoeForwardCall> fwd;
    std::vector<layer::MoeBackwardCall> bwd;
    calls(1, &fwd, &bwd);
    std::vector<const int32_t*> rank;
    for (int64_t r = 0; r < world; ++r) {
      const int32_t value = static_cast<int32_t>(r);
      uint8_t* p = alloc(4, 0);
      m.upload(p, &value, 4);
      rank.push_back(reinterpret_cast<const int32_t*>(p));
    }
    sfmoe_status status = run_stages(
        external_plan.forward_collectives, rank, [&](int64_t r, const layer::MoeStage& st) {
          return layer::moe_layer_forward_stage(external_shape, external_plan, fwd[r], st);
        });
    if (status != SFMOE_SUCCESS) return status;
    return run_stages(external_plan.backward_collectives[SFMOE_MOE_BACKWARD_ALL], rank,
                      [&](int64_t r, const layer::MoeStage& st) {
                        return layer::moe_layer_backward_stage(external_shape, external_plan,
                                                               bwd[r], st);
                      });
  }
  template <class Stage>
  sfmoe_status run_stages(const std::vector<ops::EpCollective>& collectives,
                          const std::vector<const int32_t*>& rank, Stage stage) {
    const int64_t n = static_cast<int64_t>(collectives.size());
    std::vector<uint8_t*> sent(static_cast<size_t>(world)), received(static_cast<size_t>(world));
    for (int64_t i = 0; i <= n; ++i) {
      for (int64_t r = 0; r < world; ++r) {
        sent[r] = i < n ? alloc(collectives[i].sent_bytes(world), 0xCD) : nullptr;
        const layer::MoeStage st{i, rank[r], i > 0 ? received[r] : nullptr, sent[r]};
        const sfmoe_status status = stage(r, st);
        if (status != SFMOE_SUCCESS) return status;
      }
      if (i == n) break;
      m.wait();
      const ops::EpCollective& c = collectives[i];
      std::vector<std::vector<uint8_t>> from;
      for (int64_t q = 0; q < world; ++q) from.push_back(bytes(sent[q], c.sent_bytes(world)));
      for (int64_t r = 0; r < world; ++r) {
        std::vector<uint8_t> to(static_cast<size_t>(c.received_bytes(world)));
        for (int64_t q = 0; q < world; ++q) {
          const uint8_t* block = from[q].data() + (c.all_to_all ? r * c.bytes : 0);
          memcpy(to.data() + q * c.bytes, block, static_cast<size_t>(c.bytes));
        }
        received[r] = alloc(c.received_bytes(world), 0);
        m.upload(received[r], to.data(), to.size());
      }
    }
    return SFMOE_SUCCESS;
  }

  std::vector<uint8_t> bytes(const uint8_t* p, int64_t n) {
    std::vector<uint8_t> b(static_cast<size_t>(n));
    m.download(b.data(), p, b.size());
    return b;
  }
  // Every output of the single layer (out = 0) or of the EP ranks (out = 1), as bytes.
  std::vector<std::vector<uint8_t>> outputs(int out) {
    m.wait();
    const int64_t E = c.experts, H = c.hidden, F = c.ffn;
    const int64_t wbytes = c.accumulate ? 4 : elem;
    return {bytes(y[out], total * H * elem), bytes(d_x[out], total * H * elem),
            bytes(d_logits[out], total * E * 4), bytes(d_w1[out], E * fc1_cols * H * wbytes),
            bytes(d_w2[out], E * H * F * wbytes)};
  }

  // The EP ranks' outputs against the single layer's, byte for byte.
  void expect_equal(const std::string& what) {
    m.wait();
    const int64_t E = c.experts, H = c.hidden, F = c.ffn;
    const int64_t wbytes = c.accumulate ? 4 : elem;
    struct Pair {
      const char* name;
      uint8_t* const* p;
      int64_t bytes;
    };
    const Pair pairs[] = {{"y", y, total * H * elem},
                          {"d x", d_x, total * H * elem},
                          {"d logits", d_logits, total * E * 4},
                          {"d w1", d_w1, E * fc1_cols * H * wbytes},
                          {"d w2", d_w2, E * H * F * wbytes}};
    for (const Pair& q : pairs) {
      const std::vector<uint8_t> want = bytes(q.p[0], q.bytes), got = bytes(q.p[1], q.bytes);
      const bool weights = q.name[0] == 'd' && q.name[2] == 'w';
      if (c.spill_capacity > 0 && weights) {  // FP32 main gradients, the rounds added in turn
        double err = 0.0, scale = 0.0;
        for (size_t i = 0; i + 4 <= want.size(); i += 4) {
          float a, b;
          memcpy(&a, &want[i], 4);
          memcpy(&b, &got[i], 4);
          err = std::fmax(err, std::fabs(static_cast<double>(a) - b));
          scale = std::fmax(scale, std::fabs(static_cast<double>(a)));
        }
        EXPECT_LE(err, 1e-5 * scale) << what << ": " << q.name << " (SPILL)";
        continue;
      }
      int64_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
      EXPECT_EQ(differ, 0) << what << ": " << q.name << ", " << differ << " of " << q.bytes
                           << " bytes differ";
    }
  }
};

// The EXTERNAL transport's stages (collectives made by the test between them) against the
// loopback on the same ranks, and against the single layer when nothing is dropped: every output
// and gradient bit for bit. Returns the cases run.
inline int expect_external_stages_equal_the_loopback(const std::vector<EpLayerCase>& cases,
                                                     LayerMemory& m, std::mt19937_64& rng) {
  for (const EpLayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    EXPECT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    if (!c.accumulate) {  // (the main gradients would add the two runs)
      EXPECT_EQ(run.step(1), SFMOE_SUCCESS) << sfmoe_last_error();
      const auto loopback = run.outputs(1);
      EXPECT_EQ(run.step_external(), SFMOE_SUCCESS) << sfmoe_last_error();
      EXPECT_TRUE(loopback == run.outputs(1)) << "EXTERNAL stages differ from the loopback";
    } else {
      EXPECT_EQ(run.step_external(), SFMOE_SUCCESS) << sfmoe_last_error();
    }
    if (c.drop_capacity == 0 && c.pair_capacity == 0) run.expect_equal("EXTERNAL");
    if (c.drop_capacity > 0 || c.pair_capacity > 0) {
      EXPECT_GT(run.dropped(run.external_plan), 0) << "the capacity is meant to bind";
    }
  }
  return static_cast<int>(cases.size());
}

// Determinism: the layer under each recipe, and the expert-parallel layer, run twice on the same
// inputs (of `shape`, a case whose sizes suit every recipe), give the same bits. Returns the
// runs compared.
inline int expect_two_runs_give_the_same_bits(EpLayerCase shape, LayerMemory& m,
                                              std::mt19937_64& rng) {
  const sfmoe_moe_recipe recipes[] = {SFMOE_MOE_RECIPE_BF16, SFMOE_MOE_RECIPE_FP8_TENSOR,
                                      SFMOE_MOE_RECIPE_FP8_BLOCKWISE, SFMOE_MOE_RECIPE_MXFP8,
                                      SFMOE_MOE_RECIPE_NVFP4};
  int checked = 0;
  for (sfmoe_moe_recipe recipe : recipes) {
    EpLayerCase c = shape;
    c.recipe = recipe;
    c.name = shape.name + ", recipe " + std::to_string(static_cast<int>(recipe));
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    for (int out = 0; out < 2; ++out) {
      EXPECT_EQ(run.step(out), SFMOE_SUCCESS) << sfmoe_last_error();
      const auto first = run.outputs(out);
      EXPECT_EQ(run.step(out), SFMOE_SUCCESS) << sfmoe_last_error();
      EXPECT_TRUE(first == run.outputs(out)) << (out ? "EP layer" : "layer") << ": bits differ";
      ++checked;
    }
  }
  return checked;
}

}  // namespace testing
}  // namespace sfmoe
