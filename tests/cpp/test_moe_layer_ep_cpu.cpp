// The MoE layer with expert parallelism over the loopback transport on the CPU backend: R = 2 and
// 4 ranks against the layer without expert parallelism on the same global batch, every output
// and gradient bit for bit (tests/cpp/moe_layer_ep_harness.h), an empty rank and uneven token
// counts among them.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "sfmoe/moe_layer.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/moe_layer_ep_harness.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace testing {
namespace {

LayerMemory host_memory() {
  LayerMemory m;
  m.memory = SFMOE_MEMORY_HOST;
  m.alloc = [](size_t bytes, uint8_t fill) {
    void* p = std::malloc(bytes > 0 ? bytes : 1);
    std::memset(p, fill, bytes);
    return p;
  };
  m.upload = [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); };
  m.download = [](void* to, const void* from, size_t bytes) { std::memcpy(to, from, bytes); };
  m.release = [](void* p) { std::free(p); };
  m.wait = [] {};
  return m;
}

// The host cases: an empty rank, FP32 with sigmoid, GeLU and main gradients, one expert a rank,
// SPILL.
std::vector<EpLayerCase> host_ep_cases() {
  std::vector<EpLayerCase> cases;
  cases.push_back({"R 4, bf16, SwiGLU, an empty rank", {13, 0, 7, 21}, 24, 16, 8, 2, 8});
  EpLayerCase fp32{"R 2, fp32, sigmoid, GeLU, accumulate",
                   {9, 17},
                   20,
                   12,
                   6,
                   3,
                   1,
                   SFMOE_DTYPE_FP32,
                   true,
                   true,
                   ActivationKind::kGeLU};
  cases.push_back(fp32);
  cases.push_back({"R 4, one expert per rank, k 3", {5, 11, 3, 8}, 16, 8, 4, 3, 16});
  EpLayerCase spill{"R 4, SPILL: a first round of 6 rows", {13, 5, 17, 9}, 24, 16, 8, 2, 8};
  spill.accumulate = true;
  spill.spill_capacity = 6;
  cases.push_back(spill);
  return cases;
}

TEST(MoeLayerEp, LoopbackRanksEqualTheSingleLayerBitForBit) {
  std::mt19937_64 rng(session_test_seed() + 701);
  const std::vector<EpLayerCase> cases = host_ep_cases();
  LayerMemory m = host_memory();
  for (const EpLayerCase& c : cases) {
    SCOPED_TRACE(c.name);
    EpLayerRun run(c, m, rng);
    ASSERT_EQ(run.step(0), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(run.step(1), SFMOE_SUCCESS) << sfmoe_last_error();
    run.expect_equal("host");
    if (c.spill_capacity > 0) {
      EXPECT_GT(run.spilled(), 0) << "the second round is meant to run";
    }
  }
  std::printf("[ layer ep ] %zu loopback cases: outputs and gradients equal the single layer\n",
              cases.size());
}

// The EXTERNAL transport (one rank a call, in stages, the collectives the caller's: what JAX's
// shard_map runs) equals the loopback, which equals the single layer: reduced capacities (DROP),
// SPILL, an empty rank, one rank, FP32 and bf16.
TEST(MoeLayerEp, ExternalStagesEqualTheLoopbackBitForBit) {
  std::mt19937_64 rng(session_test_seed() + 704);
  std::vector<EpLayerCase> cases = host_ep_cases();
  EpLayerCase drop{"R 4, DROP beyond 5 rows, odd H", {13, 9, 17, 4}, 19, 12, 8, 3, 8};
  drop.dtype = SFMOE_DTYPE_FP32;
  drop.drop_capacity = 5;
  cases.push_back(drop);
  EpLayerCase pair{"R 4, a pair capacity of 3 rows", {13, 9, 17, 6}, 16, 8, 8, 3, 8};
  pair.dtype = SFMOE_DTYPE_FP32;
  pair.pair_capacity = 3;
  cases.push_back(pair);
  cases.push_back({"R 1", {11}, 16, 8, 4, 2, 8});
  LayerMemory m = host_memory();
  const int n = expect_external_stages_equal_the_loopback(cases, m, rng);
  std::printf("[ layer ep ] %d EXTERNAL-stage cases on the host: equal to the loopback\n", n);
}

// Determinism: the layer (every recipe) and the expert-parallel layer, run twice on the same
// inputs, give the same bits in every output and gradient.
TEST(MoeLayerEp, TwoRunsGiveTheSameBits) {
  std::mt19937_64 rng(session_test_seed() + 703);
  LayerMemory m = host_memory();
  const int checked = expect_two_runs_give_the_same_bits(
      EpLayerCase{"R 4", {40, 0, 31, 57}, 128, 128, 8, 2, 128}, m, rng);
  std::printf(
      "[ determinism ] %d host runs (5 recipes, with and without EP): the same bits twice\n",
      checked);
}

// Through the C API: an expert-parallel layer's calls over every rank equal the single layer's
// calls on the whole batch (output and d x bit for bit), and its misuses are refused with nothing
// written.
TEST(MoeLayerEp, CApiRanksEqualTheSingleLayerAndRefuseMisuse) {
  std::mt19937_64 rng(session_test_seed() + 702);
  const int32_t R = 2;
  const int64_t H = 16, F = 8, E = 4, k = 2;
  const int64_t T[R] = {6, 9}, total = T[0] + T[1];
  auto config_for = [&](int32_t world, int64_t max_tokens) {
    sfmoe_moe_layer_config c = sfmoe_moe_layer_config_init();
    c.hidden = H;
    c.ffn_hidden = F;
    c.num_experts = E;
    c.max_tokens = max_tokens;
    c.router.top_k = k;
    c.row_alignment = 8;
    c.dtype = SFMOE_DTYPE_FP32;
    c.ep_world_size = world;
    return c;
  };
  sfmoe_moe_layer *single = nullptr, *ep = nullptr;
  sfmoe_moe_layer_config sc = config_for(1, total), ec = config_for(R, 9);
  ASSERT_EQ(sfmoe_moe_layer_create(&sc, SFMOE_MEMORY_HOST, 0, &single), SFMOE_SUCCESS);
  ASSERT_EQ(sfmoe_moe_layer_create(&ec, SFMOE_MEMORY_HOST, 0, &ep), SFMOE_SUCCESS)
      << sfmoe_last_error();
  sfmoe_moe_layer_plan sp = sfmoe_moe_layer_plan_init(), ept = sfmoe_moe_layer_plan_init();
  ASSERT_EQ(sfmoe_moe_layer_get_plan(single, &sp), SFMOE_SUCCESS);
  ASSERT_EQ(sfmoe_moe_layer_get_plan(ep, &ept), SFMOE_SUCCESS);
  EXPECT_EQ(ept.local_ranks, R);
  EXPECT_EQ(ept.local_experts, E / R);
  EXPECT_EQ(sp.local_ranks, 1);
  const int64_t fc1 = sp.fc1_cols, El = E / R;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto values = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = normal(rng);
    return v;
  };
  std::vector<float> x = values(total * H), logits = values(total * E), w1 = values(E * fc1 * H),
                     w2 = values(E * H * F), d_y = values(total * H);
  std::vector<float> y(total * H, NAN), d_x(total * H, NAN), y_ep(total * H, NAN),
      d_x_ep(total * H, NAN), d_logits(total * E), d_logits_ep(total * E), d_w1(E * fc1 * H),
      d_w1_ep(E * fc1 * H), d_w2(E * H * F), d_w2_ep(E * H * F);
  constexpr sfmoe_dtype kB = SFMOE_DTYPE_FP8_E4M3;
  std::vector<uint8_t> saved(sp.saved_bytes), ws(sp.workspace_bytes);
  std::vector<std::vector<uint8_t>> saved_r(R, std::vector<uint8_t>(ept.saved_bytes)),
      ws_r(R, std::vector<uint8_t>(ept.workspace_bytes));
  // The single layer on the whole batch.
  {
    sfmoe_tensor tx = host_tensor(x.data(), SFMOE_DTYPE_FP32, {total, H});
    sfmoe_tensor tl = host_tensor(logits.data(), SFMOE_DTYPE_FP32, {total, E});
    sfmoe_tensor tw1 = host_tensor(w1.data(), SFMOE_DTYPE_FP32, {E, fc1, H});
    sfmoe_tensor tw2 = host_tensor(w2.data(), SFMOE_DTYPE_FP32, {E, H, F});
    sfmoe_tensor ty = host_tensor(y.data(), SFMOE_DTYPE_FP32, {total, H});
    sfmoe_tensor ts = host_tensor(saved.data(), kB, {sp.saved_bytes});
    sfmoe_tensor tws = host_tensor(ws.data(), kB, {sp.workspace_bytes});
    sfmoe_moe_forward_args f = sfmoe_moe_forward_args_init();
    f.x = &tx;
    f.logits = &tl;
    f.w1 = &tw1;
    f.w2 = &tw2;
    f.y = &ty;
    f.saved = &ts;
    f.workspace = &tws;
    ASSERT_EQ(sfmoe_moe_layer_forward(single, &f), SFMOE_SUCCESS) << sfmoe_last_error();
    sfmoe_tensor tdy = host_tensor(d_y.data(), SFMOE_DTYPE_FP32, {total, H});
    sfmoe_tensor tdx = host_tensor(d_x.data(), SFMOE_DTYPE_FP32, {total, H});
    sfmoe_tensor tdl = host_tensor(d_logits.data(), SFMOE_DTYPE_FP32, {total, E});
    sfmoe_tensor tdw1 = host_tensor(d_w1.data(), SFMOE_DTYPE_FP32, {E, fc1, H});
    sfmoe_tensor tdw2 = host_tensor(d_w2.data(), SFMOE_DTYPE_FP32, {E, H, F});
    sfmoe_moe_backward_args b = sfmoe_moe_backward_args_init();
    b.x = &tx;
    b.d_y = &tdy;
    b.logits = &tl;
    b.w1 = &tw1;
    b.w2 = &tw2;
    b.saved = &ts;
    b.workspace = &tws;
    b.d_x = &tdx;
    b.d_logits = &tdl;
    b.d_w1 = &tdw1;
    b.d_w2 = &tdw2;
    ASSERT_EQ(sfmoe_moe_layer_backward(single, &b), SFMOE_SUCCESS) << sfmoe_last_error();
  }
  // The EP layer, each rank its slice of the batch and its local experts.
  std::vector<sfmoe_tensor> tx(R), tl(R), tw1(R), tw2(R), ty(R), ts(R), tws(R), tdy(R), tdx(R),
      tdl(R), tdw1(R), tdw2(R), tkept(R);
  std::vector<std::vector<int64_t>> kept(R, std::vector<int64_t>(El, -1));
  std::vector<sfmoe_moe_forward_args> f(R, sfmoe_moe_forward_args_init());
  std::vector<sfmoe_moe_backward_args> b(R, sfmoe_moe_backward_args_init());
  std::vector<const sfmoe_moe_forward_args*> pf(R);
  std::vector<const sfmoe_moe_backward_args*> pb(R);
  for (int64_t r = 0, t0 = 0; r < R; t0 += T[r], ++r) {
    tx[r] = host_tensor(&x[t0 * H], SFMOE_DTYPE_FP32, {T[r], H});
    tl[r] = host_tensor(&logits[t0 * E], SFMOE_DTYPE_FP32, {T[r], E});
    tw1[r] = host_tensor(&w1[r * El * fc1 * H], SFMOE_DTYPE_FP32, {El, fc1, H});
    tw2[r] = host_tensor(&w2[r * El * H * F], SFMOE_DTYPE_FP32, {El, H, F});
    ty[r] = host_tensor(&y_ep[t0 * H], SFMOE_DTYPE_FP32, {T[r], H});
    ts[r] = host_tensor(saved_r[r].data(), kB, {ept.saved_bytes});
    tws[r] = host_tensor(ws_r[r].data(), kB, {ept.workspace_bytes});
    tdy[r] = host_tensor(&d_y[t0 * H], SFMOE_DTYPE_FP32, {T[r], H});
    tdx[r] = host_tensor(&d_x_ep[t0 * H], SFMOE_DTYPE_FP32, {T[r], H});
    tdl[r] = host_tensor(&d_logits_ep[t0 * E], SFMOE_DTYPE_FP32, {T[r], E});
    tdw1[r] = host_tensor(&d_w1_ep[r * El * fc1 * H], SFMOE_DTYPE_FP32, {El, fc1, H});
    tdw2[r] = host_tensor(&d_w2_ep[r * El * H * F], SFMOE_DTYPE_FP32, {El, H, F});
    tkept[r] = host_tensor(kept[r].data(), SFMOE_DTYPE_INT64, {El});
    f[r].x = &tx[r];
    f[r].logits = &tl[r];
    f[r].w1 = &tw1[r];
    f[r].w2 = &tw2[r];
    f[r].y = &ty[r];
    f[r].saved = &ts[r];
    f[r].workspace = &tws[r];
    f[r].tokens_per_expert = &tkept[r];
    b[r].x = &tx[r];
    b[r].d_y = &tdy[r];
    b[r].logits = &tl[r];
    b[r].w1 = &tw1[r];
    b[r].w2 = &tw2[r];
    b[r].saved = &ts[r];
    b[r].workspace = &tws[r];
    b[r].d_x = &tdx[r];
    b[r].d_logits = &tdl[r];
    b[r].d_w1 = &tdw1[r];
    b[r].d_w2 = &tdw2[r];
    pf[r] = &f[r];
    pb[r] = &b[r];
  }
  // Refused, nothing written: the single-rank call, a shared workspace, global-expert weights.
  EXPECT_EQ(sfmoe_moe_layer_forward(ep, &f[0]), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("_ranks"), std::string::npos);
  f[1].workspace = &tws[0];
  EXPECT_EQ(sfmoe_moe_layer_forward_ranks(ep, pf.data()), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("share"), std::string::npos);
  f[1].workspace = &tws[1];
  sfmoe_tensor wide = host_tensor(w1.data(), SFMOE_DTYPE_FP32, {E, fc1, H});
  f[1].w1 = &wide;
  EXPECT_EQ(sfmoe_moe_layer_forward_ranks(ep, pf.data()), SFMOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(std::string(sfmoe_last_error()).find("rank 1"), std::string::npos)
      << sfmoe_last_error();
  f[1].w1 = &tw1[1];
  for (float v : y_ep) ASSERT_TRUE(std::isnan(v)) << "a refused call wrote";

  ASSERT_EQ(sfmoe_moe_layer_forward_ranks(ep, pf.data()), SFMOE_SUCCESS) << sfmoe_last_error();
  // The three-part backward is refused on an expert-parallel layer, before anything runs.
  for (auto& rank : b) rank.part = SFMOE_MOE_BACKWARD_FC2_DGRAD;
  EXPECT_EQ(sfmoe_moe_layer_backward_ranks(ep, pb.data()), SFMOE_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(sfmoe_last_error()).find("three-part"), std::string::npos);
  for (auto& rank : b) rank.part = SFMOE_MOE_BACKWARD_ALL;
  ASSERT_EQ(sfmoe_moe_layer_backward_ranks(ep, pb.data()), SFMOE_SUCCESS) << sfmoe_last_error();
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  EXPECT_TRUE(same(y, y_ep)) << "y";
  EXPECT_TRUE(same(d_x, d_x_ep)) << "d x";
  EXPECT_TRUE(same(d_logits, d_logits_ep)) << "d logits";
  EXPECT_TRUE(same(d_w1, d_w1_ep)) << "d w1";
  EXPECT_TRUE(same(d_w2, d_w2_ep)) << "d w2";
  int64_t kept_total = 0;
  for (const auto& v : kept) {
    for (int64_t n : v) kept_total += n;
  }
  EXPECT_EQ(kept_total, total * k) << "every slot kept at the worst-case capacity";

  // The EXTERNAL transport through the C API: the same ranks' forward in stages, the collectives
  // made here, gives the loopback's y and counts; its misuses are refused.
  {
    sfmoe_moe_layer_config xc = config_for(R, 9);
    xc.ep_transport = SFMOE_EP_TRANSPORT_EXTERNAL;
    sfmoe_moe_layer* ext = nullptr;
    ASSERT_EQ(sfmoe_moe_layer_create(&xc, SFMOE_MEMORY_HOST, 0, &ext), SFMOE_SUCCESS)
        << sfmoe_last_error();
    sfmoe_moe_layer_plan xp = sfmoe_moe_layer_plan_init();
    ASSERT_EQ(sfmoe_moe_layer_get_plan(ext, &xp), SFMOE_SUCCESS);
    EXPECT_EQ(xp.local_ranks, 1);
    sfmoe_moe_stages fs = sfmoe_moe_stages_init(), bs = sfmoe_moe_stages_init();
    ASSERT_EQ(sfmoe_moe_layer_get_forward_stages(ext, &fs), SFMOE_SUCCESS) << sfmoe_last_error();
    ASSERT_EQ(sfmoe_moe_layer_get_backward_stages(ext, SFMOE_MOE_BACKWARD_FC1, &bs), SFMOE_SUCCESS);
    EXPECT_EQ(fs.collectives, 5);
    EXPECT_EQ(bs.collectives, 2);
    EXPECT_EQ(sfmoe_moe_layer_get_backward_stages(ext, SFMOE_MOE_BACKWARD_FC2_DGRAD, &bs),
              SFMOE_ERROR_UNSUPPORTED)
        << "the three-part backward is for layers without expert parallelism";
    EXPECT_NE(std::string(sfmoe_last_error()).find("three-part"), std::string::npos);
    EXPECT_EQ(fs.collective[0].kind, SFMOE_EP_COLLECTIVE_ALL_GATHER);
    EXPECT_EQ(fs.collective[0].bytes, E * 8);
    EXPECT_EQ(fs.collective[4].kind, SFMOE_EP_COLLECTIVE_ALL_TO_ALL);
    EXPECT_EQ(sfmoe_moe_layer_get_forward_stages(ep, &fs), SFMOE_ERROR_INVALID_ARGUMENT)
        << "a loopback layer has no stages";
    EXPECT_EQ(sfmoe_moe_layer_forward(ext, &f[0]), SFMOE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(sfmoe_last_error()).find("stages"), std::string::npos);
    sfmoe_ep_config group = sfmoe_ep_config_init();
    group.transport = SFMOE_EP_TRANSPORT_EXTERNAL;
    sfmoe_ep_group* g = nullptr;
    EXPECT_EQ(sfmoe_ep_group_create(&group, SFMOE_MEMORY_HOST, 0, &g),
              SFMOE_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(g, nullptr);

    std::vector<float> y_ext(total * H, NAN);
    std::vector<std::vector<int64_t>> kept_ext(R, std::vector<int64_t>(El, -1));
    std::vector<sfmoe_tensor> ty_ext(R), tkept_ext(R), trank(R);
    std::vector<std::array<int32_t, 4>> rank_value(R);  // (16-byte aligned tensors)
    std::vector<sfmoe_moe_forward_args> fx(f.begin(), f.end());
    std::vector<std::vector<uint8_t>> saved_x(R, std::vector<uint8_t>(xp.saved_bytes)),
        ws_x(R, std::vector<uint8_t>(xp.forward_workspace_bytes));
    std::vector<sfmoe_tensor> tsaved_x(R), tws_x(R);
    for (int64_t r = 0, t0 = 0; r < R; t0 += T[r], ++r) {
      tsaved_x[r] = host_tensor(saved_x[r].data(), kB, {xp.saved_bytes});
      tws_x[r] = host_tensor(ws_x[r].data(), kB, {xp.forward_workspace_bytes});
      fx[r].saved = &tsaved_x[r];
      fx[r].workspace = &tws_x[r];
      ty_ext[r] = host_tensor(&y_ext[t0 * H], SFMOE_DTYPE_FP32, {T[r], H});
      tkept_ext[r] = host_tensor(kept_ext[r].data(), SFMOE_DTYPE_INT64, {El});
      rank_value[r][0] = static_cast<int32_t>(r);
      trank[r] = host_tensor(rank_value[r].data(), SFMOE_DTYPE_INT32, {1});
      fx[r].y = &ty_ext[r];
      fx[r].tokens_per_expert = &tkept_ext[r];
      fx[r].dropped_per_expert = nullptr;
    }
    std::vector<std::vector<uint8_t>> sent(R), received(R);
    std::vector<sfmoe_tensor> tsent(R), treceived(R);
    for (int32_t i = 0; i <= fs.collectives; ++i) {
      for (int64_t r = 0; r < R; ++r) {
        sfmoe_moe_stage st = sfmoe_moe_stage_init();
        st.index = i;
        st.rank = &trank[r];
        if (i > 0) st.received = &treceived[r];
        if (i < fs.collectives) {
          const sfmoe_ep_collective& c = fs.collective[i];
          sent[r].assign(c.kind == SFMOE_EP_COLLECTIVE_ALL_TO_ALL ? R * c.bytes : c.bytes, 0xCD);
          tsent[r] = host_tensor(sent[r].data(), kB, {static_cast<int64_t>(sent[r].size())});
          st.sent = &tsent[r];
        }
        if (i == 1 && r == 0) {  // refused: a stage without its sent buffer, a bad index
          st.sent = nullptr;
          EXPECT_EQ(sfmoe_moe_layer_forward_stage(ext, &fx[r], &st), SFMOE_ERROR_NULL_POINTER)
              << sfmoe_last_error();
          st.sent = &tsent[r];
          st.index = 9;
          EXPECT_EQ(sfmoe_moe_layer_forward_stage(ext, &fx[r], &st), SFMOE_ERROR_INVALID_ARGUMENT);
          st.index = i;
        }
        ASSERT_EQ(sfmoe_moe_layer_forward_stage(ext, &fx[r], &st), SFMOE_SUCCESS)
            << "stage " << i << " rank " << r << ": " << sfmoe_last_error();
      }
      if (i == fs.collectives) break;
      const sfmoe_ep_collective& c = fs.collective[i];
      for (int64_t r = 0; r < R; ++r) {
        received[r].assign(R * c.bytes, 0);
        for (int64_t q = 0; q < R; ++q) {
          const int64_t from = c.kind == SFMOE_EP_COLLECTIVE_ALL_TO_ALL ? r * c.bytes : 0;
          std::memcpy(&received[r][q * c.bytes], &sent[q][from], c.bytes);
        }
        treceived[r] = host_tensor(received[r].data(), kB, {R * c.bytes});
      }
    }
    EXPECT_TRUE(same(y_ext, y_ep)) << "y over EXTERNAL stages";
    EXPECT_TRUE(kept_ext == kept) << "tokens per expert over EXTERNAL stages";
    sfmoe_moe_layer_destroy(ext);
  }

  // SPILL through the C API: a first round of 4 rows and a second of 3 keep 7 of the 15 or so
  // rows each rank is sent; the rest are dropped and counted (had the second round's capacity not
  // reached the layer, the worst case would keep them all).
  {
    sfmoe_moe_layer_config spill_config = config_for(R, 9);
    spill_config.accumulate_weight_grads = 1;
    spill_config.ep_receive_capacity = 4;
    spill_config.ep_overflow = SFMOE_EP_OVERFLOW_SPILL;
    spill_config.ep_spill_capacity = 3;
    sfmoe_moe_layer* spill = nullptr;
    ASSERT_EQ(sfmoe_moe_layer_create(&spill_config, SFMOE_MEMORY_HOST, 0, &spill), SFMOE_SUCCESS)
        << sfmoe_last_error();
    sfmoe_moe_layer_plan pl = sfmoe_moe_layer_plan_init();
    ASSERT_EQ(sfmoe_moe_layer_get_plan(spill, &pl), SFMOE_SUCCESS);
    std::vector<std::vector<uint8_t>> saved_s(R, std::vector<uint8_t>(pl.saved_bytes)),
        ws_s(R, std::vector<uint8_t>(pl.workspace_bytes));
    std::vector<std::vector<int64_t>> dropped(R, std::vector<int64_t>(E, -1));
    std::vector<sfmoe_tensor> tss(R), twss(R), tdropped(R);
    for (int64_t r = 0; r < R; ++r) {
      tss[r] = host_tensor(saved_s[r].data(), kB, {pl.saved_bytes});
      twss[r] = host_tensor(ws_s[r].data(), kB, {pl.workspace_bytes});
      tdropped[r] = host_tensor(dropped[r].data(), SFMOE_DTYPE_INT64, {E});
      f[r].saved = &tss[r];
      f[r].workspace = &twss[r];
      f[r].dropped_per_expert = &tdropped[r];
    }
    sfmoe_status_word* word = nullptr;
    ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &word), SFMOE_SUCCESS);
    f[0].word = word;
    ASSERT_EQ(sfmoe_moe_layer_forward_ranks(spill, pf.data()), SFMOE_SUCCESS) << sfmoe_last_error();
    int64_t lost = 0;
    for (const auto& v : dropped) {
      for (int64_t n : v) lost += n;
    }
    EXPECT_EQ(lost, total * k - R * 7) << "each rank keeps 4 + 3 rows (every rank is sent more)";
    int64_t kept_both = 0;  // (tokens_per_expert, still bound to kept)
    for (const auto& v : kept) {
      for (int64_t n : v) kept_both += n;
    }
    EXPECT_EQ(kept_both, R * 7) << "tokens_per_expert counts the rows of both rounds";
    sfmoe_fault_report report{};
    ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
    ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
    EXPECT_NE(report.flags & SFMOE_FAULT_EP_OVERFLOW, 0u) << "SPILL raises what it loses";
    f[0].word = nullptr;
    sfmoe_status_word_destroy(word);
    sfmoe_moe_layer_destroy(spill);
  }

  // Bad configurations.
  auto refused = [&](sfmoe_moe_layer_config c, sfmoe_status status, const char* words) {
    sfmoe_moe_layer* l = nullptr;
    EXPECT_EQ(sfmoe_moe_layer_create(&c, SFMOE_MEMORY_HOST, 0, &l), status);
    EXPECT_NE(std::string(sfmoe_last_error()).find(words), std::string::npos) << sfmoe_last_error();
    EXPECT_EQ(l, nullptr);
  };
  sfmoe_moe_layer_config bad = config_for(3, 9);  // 4 experts over 3 ranks
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "divide");
  bad = config_for(R, 9);
  bad.expert_capacity = 4;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "expert_capacity");
  bad = config_for(R, 9);
  bad.ep_receive_capacity = 0;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "expert-parallel group");
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "receive_capacity must be >= 1");
  bad = config_for(R, 9);
  bad.ep_overflow = SFMOE_EP_OVERFLOW_SPILL;  // without a second round
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "spill_capacity must be >= 1");
  bad.ep_spill_capacity = 8;  // without FP32 main gradients
  refused(bad, SFMOE_ERROR_UNSUPPORTED, "accumulate_weight_grads");
  sfmoe_moe_layer_destroy(single);
  sfmoe_moe_layer_destroy(ep);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe
