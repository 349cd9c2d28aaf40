// Expert parallelism on the CPU backend through the C API (include/sfmoe/ep.h), loopback with
// R = 1, 2, 4, 8 ranks: dispatch, combine and their backward passes against an independent
// all-to-all written from the documented rules (each destination's candidate rows listed in
// (source rank, token, slot) order, the first receive_capacity kept, each local expert's rows
// by source rank and token), bit for bit; the counts exactly; R = 1 against permute; TRAP's
// fault; the refusals. Random inputs each run (seed printed), special values in the payload.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/ep.h"
#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "src/common/permute_args.h"
#include "src/cpu/backend.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace testing {
namespace {

constexpr sfmoe_dtype kBytes = SFMOE_DTYPE_FP8_E4M3;

struct EpCase {
  std::string name;
  int32_t world;
  int64_t experts_per_rank, max_tokens, top_k, hidden, alignment;
  int64_t capacity;  // SFMOE_EP_CAPACITY_WORST_CASE or rows
  enum Routing { kRandom, kAllToOneExpert, kSkewed } routing = kRandom;
  bool empty_ranks = false;  // some ranks have no tokens
  sfmoe_ep_overflow overflow = SFMOE_EP_OVERFLOW_DROP;
  int64_t spill = 0;  // SPILL's second round: rows, or SFMOE_EP_CAPACITY_WORST_CASE
};

// One rank's inputs and outputs, in host memory.
struct Rank {
  int64_t tokens = 0;
  std::vector<float> x;  // [T, H] FP32 payload (exact moves)
  std::vector<int32_t> ids;
  std::vector<float> probs;
  std::vector<float> received;
  std::vector<int64_t> offsets, kept, routed, dropped;
  std::vector<uint8_t> handle;
  std::vector<float> out, d_out, d_rows, d_probs, back;
};

// The documented rules written out independently: per destination, the candidate list; the
// first `capacity` kept in the first round, the next `spill` (SPILL) in the second, whose rows
// start at `spill_base`; each round's groups by local expert, padded.
struct Expected {
  std::vector<std::vector<int64_t>> offsets, kept, routed, dropped;
  // row of each (rank, slot) at its destination, or -1
  std::vector<std::vector<int64_t>> row;
  std::vector<std::vector<int64_t>> dest;
  // each rank's padding rows, and the rows past each round's last group
  std::vector<std::vector<int64_t>> padding, unused;
};

Expected expected_dispatch(int64_t R, int64_t El, int64_t k, int64_t alignment,
                           const std::vector<int64_t>& tokens,
                           const std::vector<std::vector<int32_t>>& ids, int64_t capacity,
                           int64_t rounds, int64_t spill, int64_t spill_base,
                           int64_t receive_rows) {
  const int64_t E = R * El;
  Expected x;
  x.offsets.assign(R, std::vector<int64_t>(rounds * (El + 1), 0));
  x.kept.assign(R, std::vector<int64_t>(rounds * El, 0));
  x.routed.assign(R, std::vector<int64_t>(El, 0));
  x.dropped.assign(R, std::vector<int64_t>(E, 0));
  x.row.assign(R, {});
  x.dest.assign(R, {});
  x.padding.assign(R, {});
  x.unused.assign(R, {});
  for (int64_t r = 0; r < R; ++r) {
    x.row[r].assign(tokens[r] * k, -1);
    x.dest[r].assign(tokens[r] * k, -1);
  }
  struct Candidate {
    int64_t source, token, slot, local;
  };
  for (int64_t d = 0; d < R; ++d) {
    std::vector<Candidate> list;
    for (int64_t s = 0; s < R; ++s) {
      for (int64_t t = 0; t < tokens[s]; ++t) {
        for (int64_t i = 0; i < k; ++i) {
          const int32_t e = ids[s][t * k + i];
          if (e / El == d) list.push_back({s, t, i, e % El});
        }
      }
    }
    // (already in (source, token, slot) order by construction; sorted again to say so)
    std::stable_sort(list.begin(), list.end(), [](const Candidate& a, const Candidate& b) {
      return std::tie(a.source, a.token, a.slot) < std::tie(b.source, b.token, b.slot);
    });
    std::vector<std::vector<Candidate>> kept(rounds);
    for (size_t n = 0; n < list.size(); ++n) {
      ++x.routed[d][list[n].local];
      const int64_t position = static_cast<int64_t>(n);
      if (position < capacity) {
        kept[0].push_back(list[n]);
      } else if (rounds > 1 && position < capacity + spill) {
        kept[1].push_back(list[n]);
      } else {
        ++x.dropped[list[n].source][d * El + list[n].local];
      }
    }
    std::vector<char> used(receive_rows, 0);
    for (int64_t round = 0; round < rounds; ++round) {
      const int64_t base = round == 0 ? 0 : spill_base;
      int64_t row = base;
      for (int64_t e = 0; e < El; ++e) {
        x.offsets[d][round * (El + 1) + e] = row - base;
        for (const Candidate& q : kept[round]) {
          if (q.local != e) continue;
          x.row[q.source][q.token * k + q.slot] = row;
          x.dest[q.source][q.token * k + q.slot] = d;
          used[row] = 1;
          ++row;
          ++x.kept[d][round * El + e];
        }
        while ((row - base) % alignment != 0) {
          x.padding[d].push_back(row);
          used[row] = 1;
          ++row;
        }
      }
      x.offsets[d][round * (El + 1) + El] = row - base;
    }
    for (int64_t row = 0; row < receive_rows; ++row) {
      if (!used[row]) x.unused[d].push_back(row);
    }
  }
  return x;
}

// The documented order of combine's backward d probs (docs/ep.md): element h in lane
// (h / V) mod 256, V = 8 for a hidden size that is a multiple of 8, else 1; each lane's products
// summed in increasing h; then the lanes pairwise, halving.
float lane_dot(const float* a, const float* b, int64_t hidden) {
  const int64_t V = hidden % 8 == 0 ? 8 : 1;
  std::vector<float> lane(256, 0.0f);
  for (int64_t h = 0; h < hidden; ++h) {
    float& sum = lane[(h / V) % 256];
    sum = numerics::add_rn(sum, numerics::mul_rn(a[h], b[h]));
  }
  for (int64_t w = 128; w >= 1; w /= 2) {
    for (int64_t j = 0; j < w; ++j) lane[j] = numerics::add_rn(lane[j], lane[j + w]);
  }
  return lane[0];
}

std::vector<int32_t> routing(const EpCase& c, int64_t tokens, int64_t rank, std::mt19937_64& rng) {
  const int64_t E = c.world * c.experts_per_rank, k = c.top_k;
  std::vector<int32_t> ids(tokens * k);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> experts(E);
    for (int32_t e = 0; e < E; ++e) experts[e] = e;
    if (c.routing == EpCase::kAllToOneExpert) {
      std::swap(experts[0], experts[E - 1]);  // everyone's first choice: expert E - 1
      std::shuffle(experts.begin() + 1, experts.end(), rng);
    } else if (c.routing == EpCase::kSkewed) {
      // Zipf-like: expert e drawn with weight 1 / (e + 1), k distinct ones.
      std::vector<double> weight(E);
      for (int32_t e = 0; e < E; ++e) weight[e] = 1.0 / (e + 1);
      for (int64_t i = 0; i < k; ++i) {
        std::discrete_distribution<int32_t> pick(weight.begin(), weight.end());
        const int32_t e = pick(rng);
        experts[i] = e;
        weight[e] = 0.0;
      }
    } else {
      std::shuffle(experts.begin(), experts.end(), rng);
    }
    (void)rank;
    for (int64_t i = 0; i < k; ++i) ids[t * k + i] = experts[i];
  }
  return ids;
}

std::vector<const sfmoe_tensor*> pointers(std::vector<sfmoe_tensor>& list) {
  std::vector<const sfmoe_tensor*> out;
  for (sfmoe_tensor& t : list) out.push_back(&t);
  return out;
}

std::vector<EpCase> cases() {
  std::vector<EpCase> out;
  out.push_back({"R 1, worst-case capacity", 1, 8, 37, 2, 24, 8, SFMOE_EP_CAPACITY_WORST_CASE});
  out.push_back({"R 2, capacity below demand", 2, 3, 50, 2, 17, 1, 40});
  EpCase all_one{"R 4, every token's first choice one expert, tight capacity",
                 4,
                 2,
                 33,
                 3,
                 8,
                 16,
                 30,
                 EpCase::kAllToOneExpert};
  all_one.overflow = SFMOE_EP_OVERFLOW_TRAP;
  out.push_back(all_one);
  EpCase empty{"R 8, empty ranks, skewed", 8, 2, 21, 4, 5, 32, 25, EpCase::kSkewed, true};
  out.push_back(empty);
  out.push_back({"R 8, one expert per rank, k 8", 8, 1, 19, 8, 3, 1, SFMOE_EP_CAPACITY_WORST_CASE});
  EpCase spill{"R 4, spill, both rounds bind", 4, 3, 40, 3, 9, 8, 20, EpCase::kSkewed};
  spill.overflow = SFMOE_EP_OVERFLOW_SPILL;
  spill.spill = 11;
  out.push_back(spill);
  EpCase spill_all{"R 2, spill of the worst case, one-row first round",
                   2,
                   4,
                   30,
                   2,
                   16,
                   16,
                   1,
                   EpCase::kAllToOneExpert};
  spill_all.overflow = SFMOE_EP_OVERFLOW_SPILL;
  spill_all.spill = SFMOE_EP_CAPACITY_WORST_CASE;
  out.push_back(spill_all);
  return out;
}

TEST(EpLoopbackCpu, DispatchCombineAndBackwardEqualTheAllToAllBitForBit) {
  std::mt19937_64 rng(session_test_seed() + 501);
  const std::vector<uint32_t> special = special_f32_bits();
  int checked = 0;
  for (const EpCase& c : cases()) {
    SCOPED_TRACE(c.name);
    sfmoe_ep_config config = sfmoe_ep_config_init();
    config.world_size = c.world;
    config.experts_per_rank = c.experts_per_rank;
    config.max_tokens_per_rank = c.max_tokens;
    config.top_k = c.top_k;
    config.hidden = c.hidden;
    config.payload = SFMOE_DTYPE_FP32;
    config.row_alignment = c.alignment;
    config.receive_capacity = c.capacity;
    config.overflow = c.overflow;
    config.spill_capacity = c.spill;
    sfmoe_ep_group* group = nullptr;
    ASSERT_EQ(sfmoe_ep_group_create(&config, SFMOE_MEMORY_HOST, 0, &group), SFMOE_SUCCESS)
        << sfmoe_last_error();
    sfmoe_ep_plan plan = sfmoe_ep_plan_init();
    ASSERT_EQ(sfmoe_ep_group_get_plan(group, &plan), SFMOE_SUCCESS);
    ASSERT_EQ(plan.local_ranks, c.world);
    const int64_t R = c.world, H = c.hidden, k = c.top_k, El = c.experts_per_rank, E = R * El;
    const bool spill = c.overflow == SFMOE_EP_OVERFLOW_SPILL;
    const int64_t worst = R * c.max_tokens * k, rounds = spill ? 2 : 1, G = rounds * El;
    if (c.capacity == SFMOE_EP_CAPACITY_WORST_CASE) {
      EXPECT_EQ(plan.receive_capacity, worst);
    }
    EXPECT_EQ(plan.rounds, rounds);
    const int64_t padding = El * (c.alignment - 1);
    if (spill) {
      EXPECT_EQ(plan.spill_capacity,
                c.spill == SFMOE_EP_CAPACITY_WORST_CASE ? worst - plan.receive_capacity : c.spill);
      EXPECT_EQ(plan.spill_row_base, plan.receive_capacity + padding);
      EXPECT_EQ(plan.spill_rows, plan.spill_capacity + padding);
    } else {
      EXPECT_EQ(plan.spill_capacity, 0);
      EXPECT_EQ(plan.spill_rows, 0);
    }
    EXPECT_EQ(plan.receive_rows, plan.receive_capacity + padding + plan.spill_rows);

    std::vector<Rank> ranks(R);
    for (int64_t r = 0; r < R; ++r) {
      Rank& q = ranks[r];
      q.tokens = c.empty_ranks && r % 3 == 1 ? 0 : static_cast<int64_t>(rng() % (c.max_tokens + 1));
      if (r == 0) q.tokens = c.max_tokens;
      std::normal_distribution<float> normal(0.0f, 1.0f);
      q.x.resize(q.tokens * H);
      for (size_t i = 0; i < q.x.size(); ++i) {
        q.x[i] =
            i % 29 == 3 ? numerics::bits_to_f32(special[(i / 29) % special.size()]) : normal(rng);
      }
      q.ids = routing(c, q.tokens, r, rng);
      q.probs.resize(q.tokens * k);
      for (float& p : q.probs) p = static_cast<float>(rng() % 1000) / 999.0f;
      q.received.assign(plan.receive_rows * H, -77.0f);
      q.offsets.assign(rounds * (El + 1), -1);
      q.kept.assign(G, -1);
      q.routed.assign(El, -1);
      q.dropped.assign(E, -1);
      q.handle.assign(plan.handle_bytes, 0xCD);
    }
    std::vector<sfmoe_tensor> t_x, t_ids, t_received, t_offsets, t_handle, t_kept, t_routed,
        t_dropped;
    for (Rank& q : ranks) {
      t_x.push_back(host_tensor(q.x.data(), SFMOE_DTYPE_FP32, {q.tokens, H}));
      t_ids.push_back(host_tensor(q.ids.data(), SFMOE_DTYPE_INT32, {q.tokens, k}));
      t_received.push_back(
          host_tensor(q.received.data(), SFMOE_DTYPE_FP32, {plan.receive_rows, H}));
      t_offsets.push_back(host_tensor(q.offsets.data(), SFMOE_DTYPE_INT64, {rounds * (El + 1)}));
      t_handle.push_back(host_tensor(q.handle.data(), kBytes, {plan.handle_bytes}));
      t_kept.push_back(host_tensor(q.kept.data(), SFMOE_DTYPE_INT64, {G}));
      t_routed.push_back(host_tensor(q.routed.data(), SFMOE_DTYPE_INT64, {El}));
      t_dropped.push_back(host_tensor(q.dropped.data(), SFMOE_DTYPE_INT64, {E}));
    }
    const auto p_x = pointers(t_x), p_ids = pointers(t_ids), p_received = pointers(t_received),
               p_offsets = pointers(t_offsets), p_handle = pointers(t_handle),
               p_kept = pointers(t_kept), p_routed = pointers(t_routed),
               p_dropped = pointers(t_dropped);
    sfmoe_status_word* word = nullptr;
    ASSERT_EQ(sfmoe_status_word_create(SFMOE_MEMORY_HOST, 0, &word), SFMOE_SUCCESS);
    sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
    d.tokens = p_x.data();
    d.topk_ids = p_ids.data();
    d.received = p_received.data();
    d.group_offsets = p_offsets.data();
    d.handle = p_handle.data();
    d.tokens_per_expert = p_kept.data();
    d.routed_per_expert = p_routed.data();
    d.dropped_per_expert = p_dropped.data();
    d.word = word;
    ASSERT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_SUCCESS) << sfmoe_last_error();

    std::vector<int64_t> tokens;
    std::vector<std::vector<int32_t>> all_ids;
    for (const Rank& q : ranks) {
      tokens.push_back(q.tokens);
      all_ids.push_back(q.ids);
    }
    const Expected want =
        expected_dispatch(R, El, k, c.alignment, tokens, all_ids, plan.receive_capacity, rounds,
                          plan.spill_capacity, plan.spill_row_base, plan.receive_rows);
    int64_t dropped_total = 0, spilled = 0;
    for (int64_t r = 0; r < R; ++r) {
      EXPECT_EQ(ranks[r].offsets, want.offsets[r]) << "rank " << r;
      EXPECT_EQ(ranks[r].kept, want.kept[r]) << "rank " << r;
      EXPECT_EQ(ranks[r].routed, want.routed[r]) << "rank " << r;
      EXPECT_EQ(ranks[r].dropped, want.dropped[r]) << "rank " << r;
      for (int64_t e = 0; e < E; ++e) dropped_total += want.dropped[r][e];
      for (int64_t g = El; g < G; ++g) spilled += want.kept[r][g];
      // Each kept slot's row bit for bit (NaN payloads too), padding zero, the rest untouched.
      for (int64_t row : want.padding[r]) {
        for (int64_t h = 0; h < H; ++h) {
          ASSERT_EQ(numerics::f32_to_bits(ranks[r].received[row * H + h]), 0u) << "padding";
        }
      }
      for (int64_t row : want.unused[r]) {
        for (int64_t h = 0; h < H; ++h) {
          ASSERT_EQ(ranks[r].received[row * H + h], -77.0f) << "rank " << r << " unused row";
        }
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t slot = 0; slot < ranks[r].tokens * k; ++slot) {
        const int64_t d = want.dest[r][slot], row = want.row[r][slot];
        if (d < 0) continue;
        ASSERT_EQ(0, std::memcmp(&ranks[d].received[row * H], &ranks[r].x[(slot / k) * H], H * 4))
            << "rank " << r << " slot " << slot;
      }
    }
    if (spill && c.capacity < worst) {
      EXPECT_GT(spilled, 0) << "the second round is meant to run";
    }
    sfmoe_fault_report report{};
    ASSERT_EQ(sfmoe_status_word_snapshot(word, nullptr), SFMOE_SUCCESS);
    ASSERT_EQ(sfmoe_status_word_read(word, &report), SFMOE_SUCCESS);
    const bool trapped = (report.flags & SFMOE_FAULT_EP_OVERFLOW) != 0;
    EXPECT_EQ(trapped, c.overflow != SFMOE_EP_OVERFLOW_DROP && dropped_total > 0);
    if (c.capacity != SFMOE_EP_CAPACITY_WORST_CASE && c.spill != SFMOE_EP_CAPACITY_WORST_CASE) {
      EXPECT_GT(dropped_total, 0) << "the capacity is meant to bind";
    }
    if (c.spill == SFMOE_EP_CAPACITY_WORST_CASE) {
      EXPECT_EQ(dropped_total, 0);
    }

    // Combine of expert outputs (here: the received rows scaled by their row index + 1, a
    // function of the row alone) with the probabilities, and the backward passes.
    std::vector<std::vector<float>> y(R);
    for (int64_t r = 0; r < R; ++r) {
      y[r] = ranks[r].received;
      for (int64_t row = 0; row < plan.receive_rows; ++row) {
        for (int64_t h = 0; h < H; ++h) y[r][row * H + h] *= static_cast<float>(row % 7 + 1);
      }
      ranks[r].out.assign(ranks[r].tokens * H, NAN);
      ranks[r].back.assign(ranks[r].tokens * H, NAN);
      ranks[r].d_out.resize(ranks[r].tokens * H);
      for (float& v : ranks[r].d_out) v = static_cast<float>(rng() % 64) / 8.0f - 4.0f;
      ranks[r].d_rows.assign(plan.receive_rows * H, -55.0f);
      ranks[r].d_probs.assign(ranks[r].tokens * k, NAN);
    }
    std::vector<sfmoe_tensor> t_y, t_probs, t_out, t_back, t_dout, t_drows, t_dprobs;
    for (int64_t r = 0; r < R; ++r) {
      Rank& q = ranks[r];
      t_y.push_back(host_tensor(y[r].data(), SFMOE_DTYPE_FP32, {plan.receive_rows, H}));
      t_probs.push_back(host_tensor(q.probs.data(), SFMOE_DTYPE_FP32, {q.tokens, k}));
      t_out.push_back(host_tensor(q.out.data(), SFMOE_DTYPE_FP32, {q.tokens, H}));
      t_back.push_back(host_tensor(q.back.data(), SFMOE_DTYPE_FP32, {q.tokens, H}));
      t_dout.push_back(host_tensor(q.d_out.data(), SFMOE_DTYPE_FP32, {q.tokens, H}));
      t_drows.push_back(host_tensor(q.d_rows.data(), SFMOE_DTYPE_FP32, {plan.receive_rows, H}));
      t_dprobs.push_back(host_tensor(q.d_probs.data(), SFMOE_DTYPE_FP32, {q.tokens, k}));
    }
    const auto p_y = pointers(t_y), p_probs = pointers(t_probs), p_out = pointers(t_out),
               p_back = pointers(t_back), p_dout = pointers(t_dout), p_drows = pointers(t_drows),
               p_dprobs = pointers(t_dprobs);
    sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
    cb.rows = p_y.data();
    cb.probs = p_probs.data();
    cb.handle = p_handle.data();
    cb.out = p_out.data();
    ASSERT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
    // Dispatch's backward: the combine of the received rows' gradients with weight 1.
    sfmoe_ep_combine_args db = cb;
    db.rows = p_received.data();
    db.probs = nullptr;
    db.out = p_back.data();
    ASSERT_EQ(sfmoe_ep_combine(group, &db), SFMOE_SUCCESS) << sfmoe_last_error();
    sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
    bb.d_out = p_dout.data();
    bb.rows = p_y.data();
    bb.probs = p_probs.data();
    bb.handle = p_handle.data();
    bb.d_rows = p_drows.data();
    bb.d_probs = p_dprobs.data();
    ASSERT_EQ(sfmoe_ep_combine_backward(group, &bb), SFMOE_SUCCESS) << sfmoe_last_error();

    for (int64_t r = 0; r < R; ++r) {
      const Rank& q = ranks[r];
      for (int64_t t = 0; t < q.tokens; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          float sum = 0.0f, plain = 0.0f;
          for (int64_t i = 0; i < k; ++i) {
            const int64_t slot = t * k + i, dest = want.dest[r][slot], row = want.row[r][slot];
            if (dest < 0) continue;
            sum = numerics::add_rn(sum, numerics::mul_rn(q.probs[slot], y[dest][row * H + h]));
            plain = numerics::add_rn(plain, ranks[dest].received[row * H + h]);
          }
          ASSERT_EQ(numerics::f32_to_bits(q.out[t * H + h]), numerics::f32_to_bits(sum))
              << "combine, rank " << r << " token " << t;
          ASSERT_EQ(numerics::f32_to_bits(q.back[t * H + h]), numerics::f32_to_bits(plain))
              << "dispatch backward, rank " << r << " token " << t;
        }
        for (int64_t i = 0; i < k; ++i) {
          const int64_t slot = t * k + i, dest = want.dest[r][slot], row = want.row[r][slot];
          for (int64_t h = 0; dest >= 0 && h < H; ++h) {
            ASSERT_EQ(numerics::f32_to_bits(ranks[dest].d_rows[row * H + h]),
                      numerics::f32_to_bits(numerics::mul_rn(q.probs[slot], q.d_out[t * H + h])))
                << "combine backward d rows";
          }
          const float dot = dest >= 0 ? lane_dot(&q.d_out[t * H], &y[dest][row * H], H) : 0.0f;
          ASSERT_EQ(numerics::f32_to_bits(q.d_probs[slot]), numerics::f32_to_bits(dot))
              << "d probs, rank " << r << " slot " << slot;
        }
      }
      // d rows: padding zero, the unused rows untouched.
      for (int64_t row : want.padding[r]) {
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(q.d_rows[row * H + h], 0.0f);
      }
      for (int64_t row : want.unused[r]) {
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(q.d_rows[row * H + h], -55.0f);
      }
    }
    sfmoe_status_word_destroy(word);
    sfmoe_ep_group_destroy(group);
    ++checked;
  }
  std::printf("[ ep ] %d loopback cases (R 1-8): dispatch, combine, backward bit-exact\n", checked);
}

// One rank with the worst-case capacity is permute: the same rows, offsets and row map.
TEST(EpLoopbackCpu, OneRankIsPermute) {
  std::mt19937_64 rng(session_test_seed() + 502);
  const int64_t T = 45, H = 12, El = 7, k = 3, a = 16;
  sfmoe_ep_config config = sfmoe_ep_config_init();
  config.experts_per_rank = El;
  config.max_tokens_per_rank = T;
  config.top_k = k;
  config.hidden = H;
  config.payload = SFMOE_DTYPE_BF16;
  config.row_alignment = a;
  sfmoe_ep_group* group = nullptr;
  ASSERT_EQ(sfmoe_ep_group_create(&config, SFMOE_MEMORY_HOST, 0, &group), SFMOE_SUCCESS);
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(group, &plan), SFMOE_SUCCESS);
  std::vector<uint16_t> x(T * H);
  for (uint16_t& v : x) v = numerics::f32_to_bf16(static_cast<float>(rng() % 512) / 16.0f - 16.0f);
  std::vector<int32_t> ids(T * k);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(El);
    for (int32_t i = 0; i < El; ++i) e[i] = i;
    std::shuffle(e.begin(), e.end(), rng);
    for (int64_t i = 0; i < k; ++i) ids[t * k + i] = e[i];
  }
  std::vector<uint16_t> received(plan.receive_rows * H, 0xBEEF),
      permuted(plan.receive_rows * H, 0xBEEF);
  std::vector<int64_t> offsets(El + 1), p_offsets(El + 1), row_map(T * k), kept(El), dropped(El);
  std::vector<uint8_t> handle(plan.handle_bytes);
  sfmoe_tensor t_x = host_tensor(x.data(), SFMOE_DTYPE_BF16, {T, H});
  sfmoe_tensor t_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {T, k});
  sfmoe_tensor t_rec = host_tensor(received.data(), SFMOE_DTYPE_BF16, {plan.receive_rows, H});
  sfmoe_tensor t_off = host_tensor(offsets.data(), SFMOE_DTYPE_INT64, {El + 1});
  sfmoe_tensor t_handle = host_tensor(handle.data(), kBytes, {plan.handle_bytes});
  const sfmoe_tensor *px = &t_x, *pids = &t_ids, *prec = &t_rec, *poff = &t_off,
                     *phandle = &t_handle;
  sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
  d.tokens = &px;
  d.topk_ids = &pids;
  d.received = &prec;
  d.group_offsets = &poff;
  d.handle = &phandle;
  ASSERT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_SUCCESS) << sfmoe_last_error();
  cpu::permute(PermuteArgs{x.data(), SFMOE_DTYPE_BF16, T, H, k, El, ids.data(), a, 0,
                           plan.receive_rows, permuted.data(), p_offsets.data(), row_map.data(),
                           kept.data(), dropped.data(), nullptr, nullptr, nullptr, nullptr});
  EXPECT_EQ(offsets, p_offsets);
  EXPECT_EQ(received, permuted);
  sfmoe_ep_group_destroy(group);
}

// The buffers of one loopback group's ranks, in host memory, as byte vectors.
struct HostEpRanks {
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  std::vector<std::vector<uint8_t>> received, scales, handle;
  std::vector<std::vector<int64_t>> offsets, kept;
  std::vector<sfmoe_tensor> t_received, t_scales, t_handle, t_offsets, t_kept;
};

sfmoe_status host_dispatch(const sfmoe_ep_group* group, int64_t R, int64_t H, sfmoe_dtype payload,
                           std::vector<sfmoe_tensor>& t_x, std::vector<sfmoe_tensor>& t_ids,
                           std::vector<sfmoe_tensor>* t_token_scales, HostEpRanks* h) {
  EXPECT_EQ(sfmoe_ep_group_get_plan(group, &h->plan), SFMOE_SUCCESS);
  const sfmoe_ep_plan& p = h->plan;
  const int elem = sfmoe_dtype_bits(payload) / 8;
  const int scale_elem = sfmoe_dtype_bits(p.scale_dtype) / 8;
  h->received.assign(R, std::vector<uint8_t>(p.receive_rows * H * elem, 0xA5));
  h->scales.assign(R, std::vector<uint8_t>(p.receive_rows * p.scale_columns * scale_elem, 0xA5));
  h->handle.assign(R, std::vector<uint8_t>(p.handle_bytes, 0xA5));
  h->t_received.clear();
  h->t_scales.clear();
  h->t_handle.clear();
  h->t_offsets.clear();
  h->t_kept.clear();
  for (int64_t r = 0; r < R; ++r) {
    h->t_received.push_back(host_tensor(h->received[r].data(), payload, {p.receive_rows, H}));
    h->t_scales.push_back(
        host_tensor(h->scales[r].data(), p.scale_dtype, {p.receive_rows, p.scale_columns}));
    h->t_handle.push_back(host_tensor(h->handle[r].data(), kBytes, {p.handle_bytes}));
  }
  const int64_t offsets_size = h->offsets.empty() ? 0 : static_cast<int64_t>(h->offsets[0].size());
  const int64_t kept_size = h->kept.empty() ? 0 : static_cast<int64_t>(h->kept[0].size());
  for (int64_t r = 0; r < R; ++r) {
    h->t_offsets.push_back(host_tensor(h->offsets[r].data(), SFMOE_DTYPE_INT64, {offsets_size}));
    h->t_kept.push_back(host_tensor(h->kept[r].data(), SFMOE_DTYPE_INT64, {kept_size}));
  }
  auto px = pointers(t_x), pids = pointers(t_ids), prec = pointers(h->t_received),
       pscales = pointers(h->t_scales), phandle = pointers(h->t_handle),
       poff = pointers(h->t_offsets), pkept = pointers(h->t_kept);
  std::vector<const sfmoe_tensor*> ptoken_scales;
  if (t_token_scales != nullptr) ptoken_scales = pointers(*t_token_scales);
  sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
  d.tokens = px.data();
  d.topk_ids = pids.data();
  d.received = prec.data();
  d.group_offsets = poff.data();
  d.handle = phandle.data();
  d.tokens_per_expert = pkept.data();
  if (t_token_scales != nullptr) {
    d.token_scales = ptoken_scales.data();
    d.received_scales = pscales.data();
  }
  return sfmoe_ep_dispatch(group, &d);
}

sfmoe_ep_group* loopback_group(int32_t R, int64_t El, int64_t T, int64_t k, int64_t H,
                               int64_t alignment, sfmoe_dtype payload, sfmoe_scaling scaling,
                               int64_t capacity, sfmoe_ep_overflow overflow, int64_t spill) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = R;
  c.experts_per_rank = El;
  c.max_tokens_per_rank = T;
  c.top_k = k;
  c.hidden = H;
  c.payload = payload;
  c.payload_scaling = scaling;
  c.row_alignment = alignment;
  c.receive_capacity = capacity;
  c.overflow = overflow;
  c.spill_capacity = spill;
  sfmoe_ep_group* g = nullptr;
  EXPECT_EQ(sfmoe_ep_group_create(&c, SFMOE_MEMORY_HOST, 0, &g), SFMOE_SUCCESS)
      << sfmoe_last_error();
  return g;
}

// SPILL with a first round far below demand gives the bits of an unlimited capacity: the combine
// (weighted), dispatch's backward, and combine's backward (d probs, and the token gradient its d
// rows give through dispatch's backward).
TEST(EpLoopbackCpu, SpillGivesTheBitsOfAnUnlimitedCapacity) {
  std::mt19937_64 rng(session_test_seed() + 503);
  const int32_t R = 4;
  const int64_t El = 3, T = 37, k = 4, H = 40, a = 8;
  EpCase shape{"spill", R, El, T, k, H, a, 0, EpCase::kSkewed};
  std::vector<std::vector<uint16_t>> x(R), d_out(R);
  std::vector<std::vector<int32_t>> ids(R);
  std::vector<std::vector<float>> probs(R);
  std::vector<int64_t> tokens(R);
  const std::vector<uint32_t> special = special_f32_bits();
  for (int64_t r = 0; r < R; ++r) {
    tokens[r] = r == 2 ? 0 : T - static_cast<int64_t>(rng() % 5);
    x[r].resize(tokens[r] * H);
    d_out[r].resize(tokens[r] * H);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < x[r].size(); ++i) {
      x[r][i] = numerics::f32_to_bf16(
          i % 23 == 4 ? numerics::bits_to_f32(special[(i / 23) % special.size()]) : normal(rng));
      d_out[r][i] = numerics::f32_to_bf16(normal(rng));
    }
    ids[r] = routing(shape, tokens[r], r, rng);
    probs[r].resize(tokens[r] * k);
    for (float& p : probs[r]) p = static_cast<float>(rng() % 1000) / 999.0f;
  }
  struct Outputs {
    std::vector<std::vector<uint16_t>> out, back, token_grad;
    std::vector<std::vector<float>> d_probs;
    int64_t spilled = 0;
  };
  auto run = [&](sfmoe_ep_group* group, int64_t rounds) {
    Outputs o;
    HostEpRanks h;
    EXPECT_EQ(sfmoe_ep_group_get_plan(group, &h.plan), SFMOE_SUCCESS);
    h.offsets.assign(R, std::vector<int64_t>(rounds * (El + 1), -1));
    h.kept.assign(R, std::vector<int64_t>(rounds * El, -1));
    std::vector<sfmoe_tensor> t_x, t_ids;
    for (int64_t r = 0; r < R; ++r) {
      t_x.push_back(host_tensor(x[r].data(), SFMOE_DTYPE_BF16, {tokens[r], H}));
      t_ids.push_back(host_tensor(ids[r].data(), SFMOE_DTYPE_INT32, {tokens[r], k}));
    }
    EXPECT_EQ(host_dispatch(group, R, H, SFMOE_DTYPE_BF16, t_x, t_ids, nullptr, &h), SFMOE_SUCCESS)
        << sfmoe_last_error();
    const int64_t rows = h.plan.receive_rows;
    // Expert outputs: each received row scaled by its local expert's factor (a function of the
    // row and its expert, not of where it lies).
    std::vector<std::vector<uint16_t>> y(R, std::vector<uint16_t>(rows * H, 0));
    for (int64_t r = 0; r < R; ++r) {
      const uint16_t* rec = reinterpret_cast<const uint16_t*>(h.received[r].data());
      for (int64_t g = 0; g < rounds * El; ++g) {
        const int64_t round = g / El, e = g % El, base = round == 0 ? 0 : h.plan.spill_row_base;
        const int64_t begin = base + h.offsets[r][round * (El + 1) + e];
        if (round == 1) o.spilled += h.kept[r][g];
        for (int64_t row = begin; row < begin + h.kept[r][g]; ++row) {
          for (int64_t j = 0; j < H; ++j) {
            y[r][row * H + j] = numerics::f32_to_bf16(numerics::mul_rn(
                numerics::bf16_to_f32(rec[row * H + j]), static_cast<float>(e + 1) * 0.75f));
          }
        }
      }
    }
    o.out.assign(R, {});
    o.back.assign(R, {});
    o.token_grad.assign(R, {});
    o.d_probs.assign(R, {});
    std::vector<std::vector<uint16_t>> d_rows(R, std::vector<uint16_t>(rows * H, 0));
    std::vector<sfmoe_tensor> t_y, t_rec, t_probs, t_out, t_back, t_dout, t_drows, t_dprobs, t_grad;
    for (int64_t r = 0; r < R; ++r) {
      o.out[r].assign(tokens[r] * H, 0xBEEF);
      o.back[r].assign(tokens[r] * H, 0xBEEF);
      o.token_grad[r].assign(tokens[r] * H, 0xBEEF);
      o.d_probs[r].assign(tokens[r] * k, NAN);
      t_y.push_back(host_tensor(y[r].data(), SFMOE_DTYPE_BF16, {rows, H}));
      t_rec.push_back(host_tensor(h.received[r].data(), SFMOE_DTYPE_BF16, {rows, H}));
      t_probs.push_back(host_tensor(probs[r].data(), SFMOE_DTYPE_FP32, {tokens[r], k}));
      t_out.push_back(host_tensor(o.out[r].data(), SFMOE_DTYPE_BF16, {tokens[r], H}));
      t_back.push_back(host_tensor(o.back[r].data(), SFMOE_DTYPE_BF16, {tokens[r], H}));
      t_grad.push_back(host_tensor(o.token_grad[r].data(), SFMOE_DTYPE_BF16, {tokens[r], H}));
      t_dout.push_back(host_tensor(d_out[r].data(), SFMOE_DTYPE_BF16, {tokens[r], H}));
      t_drows.push_back(host_tensor(d_rows[r].data(), SFMOE_DTYPE_BF16, {rows, H}));
      t_dprobs.push_back(host_tensor(o.d_probs[r].data(), SFMOE_DTYPE_FP32, {tokens[r], k}));
    }
    auto py = pointers(t_y), prec = pointers(t_rec), pprobs = pointers(t_probs),
         pout = pointers(t_out), pback = pointers(t_back), pgrad = pointers(t_grad),
         pdout = pointers(t_dout), pdrows = pointers(t_drows), pdprobs = pointers(t_dprobs),
         phandle = pointers(h.t_handle);
    sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
    cb.rows = py.data();
    cb.probs = pprobs.data();
    cb.handle = phandle.data();
    cb.out = pout.data();
    EXPECT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
    cb.rows = prec.data();
    cb.probs = nullptr;
    cb.out = pback.data();
    EXPECT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
    sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
    bb.d_out = pdout.data();
    bb.rows = py.data();
    bb.probs = pprobs.data();
    bb.handle = phandle.data();
    bb.d_rows = pdrows.data();
    bb.d_probs = pdprobs.data();
    EXPECT_EQ(sfmoe_ep_combine_backward(group, &bb), SFMOE_SUCCESS) << sfmoe_last_error();
    cb.rows = pdrows.data();
    cb.out = pgrad.data();
    EXPECT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
    return o;
  };
  sfmoe_ep_group* unlimited =
      loopback_group(R, El, T, k, H, a, SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE,
                     SFMOE_EP_CAPACITY_WORST_CASE, SFMOE_EP_OVERFLOW_DROP, 0);
  sfmoe_ep_group* spill =
      loopback_group(R, El, T, k, H, a, SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE, T * k / R,
                     SFMOE_EP_OVERFLOW_SPILL, SFMOE_EP_CAPACITY_WORST_CASE);
  ASSERT_NE(unlimited, nullptr);
  ASSERT_NE(spill, nullptr);
  const Outputs want = run(unlimited, 1), got = run(spill, 2);
  EXPECT_GT(got.spilled, 0) << "the second round is meant to run";
  EXPECT_EQ(want.spilled, 0);
  for (int64_t r = 0; r < R; ++r) {
    EXPECT_EQ(got.out[r], want.out[r]) << "combine, rank " << r;
    EXPECT_EQ(got.back[r], want.back[r]) << "dispatch backward, rank " << r;
    EXPECT_EQ(got.token_grad[r], want.token_grad[r]) << "token gradient, rank " << r;
    EXPECT_TRUE(
        want.d_probs[r].empty() ||
        std::memcmp(got.d_probs[r].data(), want.d_probs[r].data(), want.d_probs[r].size() * 4) == 0)
        << "d probs, rank " << r;
  }
  sfmoe_ep_group_destroy(unlimited);
  sfmoe_ep_group_destroy(spill);
}

// FP8 payloads: the codes and the scales beside them arrive as they were sent, byte for byte,
// for each scaling (per-tensor: one FP32 per row; 1x128: FP32 per 128 columns; MXFP8: E8M0 per
// 32), at a hidden size that is a multiple of neither, with SPILL binding; padding rows' codes and
// scales zero, other rows untouched; scales missing, or given to rows without them, refused.
TEST(EpLoopbackCpu, Fp8PayloadsTravelWithTheirScales) {
  std::mt19937_64 rng(session_test_seed() + 504);
  const int32_t R = 4;
  const int64_t El = 3, T = 29, k = 3, H = 200, a = 16;
  EpCase shape{"fp8", R, El, T, k, H, a, 0, EpCase::kSkewed};
  int checked = 0;
  for (sfmoe_dtype payload : {SFMOE_DTYPE_FP8_E4M3, SFMOE_DTYPE_FP8_E5M2}) {
    for (sfmoe_scaling scaling :
         {SFMOE_SCALING_TENSOR, SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALING_MX_1X32}) {
      SCOPED_TRACE(std::string(sfmoe_dtype_name(payload)) + " scaling " +
                   std::to_string(static_cast<int>(scaling)));
      sfmoe_ep_group* group =
          loopback_group(R, El, T, k, H, a, payload, scaling, 20, SFMOE_EP_OVERFLOW_SPILL, 9);
      ASSERT_NE(group, nullptr);
      sfmoe_ep_plan plan = sfmoe_ep_plan_init();
      ASSERT_EQ(sfmoe_ep_group_get_plan(group, &plan), SFMOE_SUCCESS);
      const int64_t S = scaling == SFMOE_SCALING_TENSOR    ? 1
                        : scaling == SFMOE_SCALING_MX_1X32 ? (H + 31) / 32
                                                           : (H + 127) / 128;
      ASSERT_EQ(plan.scale_columns, S);
      ASSERT_EQ(plan.scale_dtype,
                scaling == SFMOE_SCALING_MX_1X32 ? SFMOE_DTYPE_E8M0 : SFMOE_DTYPE_FP32);
      const int64_t sb = S * (scaling == SFMOE_SCALING_MX_1X32 ? 1 : 4);
      std::vector<int64_t> tokens(R);
      std::vector<std::vector<uint8_t>> x(R), scales(R);
      std::vector<std::vector<int32_t>> ids(R);
      std::vector<sfmoe_tensor> t_x, t_ids, t_scales;
      for (int64_t r = 0; r < R; ++r) {
        tokens[r] = r == 3 ? 0 : T - static_cast<int64_t>(rng() % 4);
        x[r].resize(tokens[r] * H);
        for (uint8_t& b : x[r]) b = static_cast<uint8_t>(rng());  // every code, NaNs among them
        scales[r].resize(tokens[r] * sb);
        for (uint8_t& b : scales[r]) b = static_cast<uint8_t>(rng());
        ids[r] = routing(shape, tokens[r], r, rng);
        t_x.push_back(host_tensor(x[r].data(), payload, {tokens[r], H}));
        t_ids.push_back(host_tensor(ids[r].data(), SFMOE_DTYPE_INT32, {tokens[r], k}));
        t_scales.push_back(host_tensor(scales[r].data(), plan.scale_dtype, {tokens[r], S}));
      }
      HostEpRanks h;
      h.offsets.assign(R, std::vector<int64_t>(2 * (El + 1), -1));
      h.kept.assign(R, std::vector<int64_t>(2 * El, -1));
      // Refused: the scales missing.
      EXPECT_EQ(host_dispatch(group, R, H, payload, t_x, t_ids, nullptr, &h),
                SFMOE_ERROR_NULL_POINTER);
      EXPECT_NE(std::string(sfmoe_last_error()).find("token_scales"), std::string::npos)
          << sfmoe_last_error();
      for (const auto& rec : h.received) {
        for (uint8_t v : rec) ASSERT_EQ(v, 0xA5) << "a refused call wrote";
      }
      ASSERT_EQ(host_dispatch(group, R, H, payload, t_x, t_ids, &t_scales, &h), SFMOE_SUCCESS)
          << sfmoe_last_error();
      const Expected want =
          expected_dispatch(R, El, k, a, tokens, ids, plan.receive_capacity, 2, plan.spill_capacity,
                            plan.spill_row_base, plan.receive_rows);
      int64_t spilled = 0;
      for (int64_t r = 0; r < R; ++r) {
        EXPECT_EQ(h.offsets[r], want.offsets[r]);
        EXPECT_EQ(h.kept[r], want.kept[r]);
        for (int64_t g = El; g < 2 * El; ++g) spilled += want.kept[r][g];
        for (int64_t slot = 0; slot < tokens[r] * k; ++slot) {
          const int64_t d = want.dest[r][slot], row = want.row[r][slot], t = slot / k;
          if (d < 0) continue;
          ASSERT_EQ(0, std::memcmp(&h.received[d][row * H], &x[r][t * H], H)) << "codes";
          ASSERT_EQ(0, std::memcmp(&h.scales[d][row * sb], &scales[r][t * sb], sb)) << "scales";
        }
        for (int64_t row : want.padding[r]) {
          for (int64_t j = 0; j < H; ++j) ASSERT_EQ(h.received[r][row * H + j], 0);
          for (int64_t j = 0; j < sb; ++j) ASSERT_EQ(h.scales[r][row * sb + j], 0);
        }
        for (int64_t row : want.unused[r]) {
          for (int64_t j = 0; j < H; ++j) ASSERT_EQ(h.received[r][row * H + j], 0xA5);
          for (int64_t j = 0; j < sb; ++j) ASSERT_EQ(h.scales[r][row * sb + j], 0xA5);
        }
      }
      EXPECT_GT(spilled, 0);
      sfmoe_ep_group_destroy(group);
      ++checked;
    }
  }
  // Scales given to a group whose rows have none.
  sfmoe_ep_group* plain = loopback_group(R, El, T, k, 8, 1, SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE,
                                         SFMOE_EP_CAPACITY_WORST_CASE, SFMOE_EP_OVERFLOW_DROP, 0);
  std::vector<uint16_t> xs(T * 8, 0);
  std::vector<int32_t> ids(T * k);
  for (int64_t i = 0; i < T * k; ++i) ids[i] = static_cast<int32_t>(i % k);
  std::vector<float> sc(T, 1.0f);
  std::vector<sfmoe_tensor> t_x, t_ids, t_sc;
  for (int64_t r = 0; r < R; ++r) {
    t_x.push_back(host_tensor(xs.data(), SFMOE_DTYPE_BF16, {T, 8}));
    t_ids.push_back(host_tensor(ids.data(), SFMOE_DTYPE_INT32, {T, k}));
    t_sc.push_back(host_tensor(sc.data(), SFMOE_DTYPE_FP32, {T, 1}));
  }
  HostEpRanks h;
  h.offsets.assign(R, std::vector<int64_t>(El + 1, -1));
  h.kept.assign(R, std::vector<int64_t>(El, -1));
  EXPECT_EQ(host_dispatch(plain, R, 8, SFMOE_DTYPE_BF16, t_x, t_ids, &t_sc, &h),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("without scales"), std::string::npos);
  sfmoe_ep_group_destroy(plain);
  std::printf("[ ep ] %d FP8 payload cases: codes and scales byte-exact, spill binding\n", checked);
}

TEST(EpLoopbackCpu, BadConfigurationsAndCallsAreRefusedWithoutWriting) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = 4;
  c.experts_per_rank = 2;
  c.max_tokens_per_rank = 16;
  c.top_k = 2;
  c.hidden = 8;
  sfmoe_ep_group* group = nullptr;
  auto refused = [&](sfmoe_ep_config bad, sfmoe_status status, const char* words) {
    group = nullptr;
    EXPECT_EQ(sfmoe_ep_group_create(&bad, SFMOE_MEMORY_HOST, 0, &group), status);
    EXPECT_NE(std::string(sfmoe_last_error()).find(words), std::string::npos) << sfmoe_last_error();
    EXPECT_EQ(group, nullptr);
  };
  sfmoe_ep_config bad = c;
  bad.receive_capacity = 0;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "receive_capacity");
  bad = c;
  bad.rank = 4;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "outside the world");
  bad = c;
  bad.rank = 1;  // a loopback group is every rank
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "loopback");
  bad = c;
  bad.top_k = 9;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "top_k");
  bad = c;
  bad.payload = SFMOE_DTYPE_INT32;
  refused(bad, SFMOE_ERROR_DTYPE_MISMATCH, "payload");
  bad = c;
  bad.payload = SFMOE_DTYPE_FP8_E4M3;  // codes without their scales
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "payload_scaling");
  bad = c;
  bad.overflow = SFMOE_EP_OVERFLOW_SPILL;  // without a second round's capacity
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "spill_capacity");
  bad = c;
  bad.spill_capacity = 8;  // a second round without SPILL
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "spill_capacity");
  bad = c;
  bad.pair_capacity = -7;
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "pair_capacity");
  bad = c;
  bad.transport = SFMOE_EP_TRANSPORT_EXTERNAL;  // a layer's stages only
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "EXTERNAL");
  bad = c;
  bad.payload = SFMOE_DTYPE_FP8_E4M3;
  bad.payload_scaling = SFMOE_SCALING_BLOCK_128X128;  // not a rows' scaling
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "payload_scaling");
  bad = c;
  bad.payload_scaling = SFMOE_SCALING_TENSOR;  // scales for BF16 rows
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "payload_scaling");
  bad = c;
  bad.transport = SFMOE_EP_TRANSPORT_NCCL;  // (device memory only)
  refused(bad, SFMOE_ERROR_UNSUPPORTED, "SFMOE_MEMORY_CUDA");
  bad = c;
  uint8_t id[SFMOE_EP_NCCL_UNIQUE_ID_BYTES] = {};
  bad.nccl_unique_id = id;  // an NCCL id for the loopback
  refused(bad, SFMOE_ERROR_INVALID_ARGUMENT, "nccl_unique_id");

  ASSERT_EQ(sfmoe_ep_group_create(&c, SFMOE_MEMORY_HOST, 0, &group), SFMOE_SUCCESS);
  sfmoe_ep_plan plan = sfmoe_ep_plan_init();
  ASSERT_EQ(sfmoe_ep_group_get_plan(group, &plan), SFMOE_SUCCESS);
  const int64_t T = 5, H = 8, k = 2;
  std::vector<uint16_t> x(T * H, 0x3F80), wide(T * (H + 1), 0x3F80);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 1, 1};  // the last token names 1 twice
  std::vector<std::vector<uint16_t>> received(4,
                                              std::vector<uint16_t>(plan.receive_rows * H, 0xBEEF));
  std::vector<std::vector<int64_t>> offsets(4, std::vector<int64_t>(3, -1));
  std::vector<std::vector<uint8_t>> handle(4, std::vector<uint8_t>(plan.handle_bytes, 0xCD));
  std::vector<sfmoe_tensor> t_x(4), t_ids(4), t_rec(4), t_off(4), t_handle(4);
  for (int r = 0; r < 4; ++r) {
    t_x[r] = host_tensor(x.data(), SFMOE_DTYPE_BF16, {T, H});
    t_ids[r] = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {T, k});
    t_rec[r] = host_tensor(received[r].data(), SFMOE_DTYPE_BF16, {plan.receive_rows, H});
    t_off[r] = host_tensor(offsets[r].data(), SFMOE_DTYPE_INT64, {3});
    t_handle[r] = host_tensor(handle[r].data(), kBytes, {plan.handle_bytes});
  }
  auto px = pointers(t_x), pids = pointers(t_ids), prec = pointers(t_rec), poff = pointers(t_off),
       phandle = pointers(t_handle);
  sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
  d.tokens = px.data();
  d.topk_ids = pids.data();
  d.received = prec.data();
  d.group_offsets = poff.data();
  d.handle = phandle.data();
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("twice"), std::string::npos);
  ids[9] = 8;  // outside the 8 experts
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("experts are [0, 8)"), std::string::npos);
  ids[9] = 0;
  t_x[2] = host_tensor(wide.data(), SFMOE_DTYPE_BF16, {T, H + 1});  // a mismatched hidden size
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(std::string(sfmoe_last_error()).find("tokens[2]"), std::string::npos);
  t_x[2] = host_tensor(x.data(), SFMOE_DTYPE_FP16, {T, H});  // not the payload dtype
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_SHAPE_MISMATCH);
  t_x[2] = host_tensor(x.data(), SFMOE_DTYPE_BF16, {T, H});
  d.handle = nullptr;
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_NULL_POINTER);
  t_handle[3] = t_handle[1];  // two ranks' routing in one buffer
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_NULL_POINTER);
  d.handle = phandle.data();
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sfmoe_last_error()).find("overlap"), std::string::npos);
  t_handle[3] = host_tensor(handle[3].data(), kBytes, {plan.handle_bytes});
  // Nothing was written by the refused calls.
  for (int r = 0; r < 4; ++r) {
    for (uint16_t v : received[r]) ASSERT_EQ(v, 0xBEEF);
    for (int64_t v : offsets[r]) ASSERT_EQ(v, -1);
    for (uint8_t v : handle[r]) ASSERT_EQ(v, 0xCD);
  }
  EXPECT_EQ(sfmoe_ep_dispatch(group, &d), SFMOE_SUCCESS) << sfmoe_last_error();

  // A handle no dispatch wrote (here: bytes of 0x7F, rows far outside every buffer): combine
  // writes zeros for its tokens and reads nothing outside the buffers.
  for (auto& h : handle) std::fill(h.begin(), h.end(), 0x7F);
  std::vector<std::vector<uint16_t>> out(4, std::vector<uint16_t>(T * H, 0xBEEF));
  std::vector<sfmoe_tensor> t_out(4);
  for (int r = 0; r < 4; ++r) t_out[r] = host_tensor(out[r].data(), SFMOE_DTYPE_BF16, {T, H});
  auto pout = pointers(t_out);
  sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
  cb.rows = prec.data();
  cb.handle = phandle.data();
  cb.out = pout.data();
  EXPECT_EQ(sfmoe_ep_combine(group, &cb), SFMOE_SUCCESS) << sfmoe_last_error();
  for (int r = 0; r < 4; ++r) {
    for (uint16_t v : out[r]) ASSERT_EQ(v, 0) << "rank " << r;
  }
  // Combine's backward over such handles (bytes of 0x7F: offsets far past the buffers; of 0xFF:
  // negative ones) zeroes padding only inside each rank's d rows and gives d probs 0 (no slot is
  // sent); the sanitizer build checks that nothing outside the buffers is touched.
  std::vector<std::vector<uint16_t>> d_rows(4, std::vector<uint16_t>(plan.receive_rows * H));
  std::vector<std::vector<float>> probs(4, std::vector<float>(T * k, 0.5f)),
      d_probs(4, std::vector<float>(T * k, NAN));
  std::vector<sfmoe_tensor> t_drows(4), t_probs(4), t_dprobs(4);
  for (int r = 0; r < 4; ++r) {
    t_drows[r] = host_tensor(d_rows[r].data(), SFMOE_DTYPE_BF16, {plan.receive_rows, H});
    t_probs[r] = host_tensor(probs[r].data(), SFMOE_DTYPE_FP32, {T, k});
    t_dprobs[r] = host_tensor(d_probs[r].data(), SFMOE_DTYPE_FP32, {T, k});
  }
  auto pdrows = pointers(t_drows), pprobs = pointers(t_probs), pdprobs = pointers(t_dprobs);
  for (uint8_t garbage : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    for (auto& h : handle) std::fill(h.begin(), h.end(), garbage);
    sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
    bb.d_out = pout.data();
    bb.rows = prec.data();
    bb.probs = pprobs.data();
    bb.handle = phandle.data();
    bb.d_rows = pdrows.data();
    bb.d_probs = pdprobs.data();
    EXPECT_EQ(sfmoe_ep_combine_backward(group, &bb), SFMOE_SUCCESS) << sfmoe_last_error();
    for (int r = 0; r < 4; ++r) {
      for (float v : d_probs[r]) ASSERT_EQ(v, 0.0f) << "rank " << r;
    }
  }
  sfmoe_ep_group_destroy(group);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe
