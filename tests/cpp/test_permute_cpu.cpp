// Permute / unpermute CPU reference (docs/permute.md): a hand-worked case with capacity
// dropping, the router's DeepSeek-shaped routing (T = 4097, E = 256, k = 8) permuted at every
// alignment with special values in the rows, unpermute against float64 sums, and unpermute's
// backward. Fresh random inputs each run (seed printed; SFMOE_TEST_SEED replays it).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sfmoe/numerics.h"
#include "sfmoe/permute.h"
#include "src/cpu/backend.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace {

struct Permuted {
  std::vector<uint16_t> rows;
  std::vector<int64_t> offsets, row_map, kept, dropped;
  std::vector<float> amax;  // each expert's amax of its kept rows
};

constexpr uint16_t kPoison = 0xBEEF;

Permuted permute_bf16(const std::vector<uint16_t>& tokens, const std::vector<int32_t>& ids,
                      int64_t tokens_count, int64_t hidden, int64_t k, int64_t experts,
                      int64_t alignment, int64_t capacity, int64_t row_capacity) {
  Permuted p;
  p.rows.assign(row_capacity * hidden, kPoison);
  p.offsets.assign(experts + 1, -7);
  p.row_map.assign(tokens_count * k, -7);
  p.kept.assign(experts, -7);
  p.dropped.assign(experts, -7);
  p.amax.assign(experts, -3.0f);
  PermuteArgs a{tokens.data(), SFMOE_DTYPE_BF16, tokens_count,     hidden,        k,
                experts,       ids.data(),       alignment,        capacity,      row_capacity,
                p.rows.data(), p.offsets.data(), p.row_map.data(), p.kept.data(), p.dropped.data(),
                nullptr,       nullptr,          nullptr,          p.amax.data()};
  cpu::permute(a);
  return p;
}

TEST(PermuteCpu, HandWorkedCaseWithCapacity) {
  // 4 tokens, k = 2, 3 experts, hidden 2; token t's row is {t + 1, -(t + 1)} in BF16.
  std::vector<uint16_t> tokens;
  for (int t = 0; t < 4; ++t) {
    tokens.push_back(numerics::f32_to_bf16(t + 1.0f));
    tokens.push_back(numerics::f32_to_bf16(-(t + 1.0f)));
  }
  const std::vector<int32_t> ids = {2, 0, 0, 1, 0, 2, 1, 0};
  Permuted p = permute_bf16(tokens, ids, 4, 2, 2, 3, 4, 0, 16);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(p.kept, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(p.dropped, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(p.row_map, (std::vector<int64_t>{8, 0, 1, 4, 2, 9, 5, 3}));
  EXPECT_EQ(p.amax, (std::vector<float>{4, 4, 3})) << "the largest |value| of each expert's rows";
  const float want_first[12] = {1, 2, 3, 4, 2, 4, 0, 0, 1, 3, 0, 0};
  for (int r = 0; r < 12; ++r)
    EXPECT_EQ(numerics::bf16_to_f32(p.rows[2 * r]), want_first[r]) << "row " << r;
  for (int r = 12; r < 16; ++r)
    EXPECT_EQ(p.rows[2 * r], kPoison) << "row " << r << " is beyond the groups";

  // Capacity 3: expert 0 keeps tokens 0, 1, 2 (the lowest token indices); token 3's slot drops.
  p = permute_bf16(tokens, ids, 4, 2, 2, 3, 4, 3, 16);
  EXPECT_EQ(p.kept, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(p.dropped, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(p.row_map, (std::vector<int64_t>{8, 0, 1, 4, 2, 9, 5, -1}));
  EXPECT_EQ(p.amax, (std::vector<float>{3, 4, 3})) << "the dropped token does not count";
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 4, 8, 12}));
  EXPECT_EQ(p.rows[2 * 3], 0) << "the padding row that replaced the dropped token is zero";
}

TEST(PermuteCpu, RouterShapedRoutingAtEveryAlignment) {
  const int64_t tokens_count = 4097, experts = 256, k = 8, hidden = 24;
  std::mt19937_64 rng(testing::session_test_seed() + 10);
  // Routing from the router reference (sigmoid, 8 groups, experts 16m + 5 idle).
  RouterConfig c;
  c.num_experts = experts;
  c.top_k = k;
  c.sigmoid = true;
  c.num_groups = 8;
  c.group_topk = 4;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(tokens_count * experts), bias(experts), probs(tokens_count * k);
  for (float& v : logits) v = normal(rng);
  for (int64_t e = 0; e < experts; ++e) bias[e] = e % 16 == 5 ? -100.0f : 0.0f;
  std::vector<int32_t> ids(tokens_count * k);
  std::vector<int64_t> router_counts(experts);
  RouterForwardArgs route{
      logits.data(), SFMOE_DTYPE_FP32,     bias.data(), tokens_count, c,      ids.data(),
      probs.data(),  router_counts.data(), nullptr,     nullptr,      nullptr};
  cpu::router_forward(route);

  // Rows: random BF16 patterns, with specials (NaN payloads, -0, Inf, subnormals) in the mix.
  std::vector<uint16_t> tokens(tokens_count * hidden);
  const uint16_t specials[] = {0x7FC1, 0xFFFF, 0x8000, 0x0000, 0x7F80, 0xFF80, 0x0001, 0x807F};
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = (i % 97 == 0) ? specials[(i / 97) % 8] : static_cast<uint16_t>(rng());
  }
  for (int64_t alignment : {1, 8, 16, 32, 64, 128}) {
    for (int64_t capacity : {int64_t{0}, int64_t{150}}) {
      const int64_t row_capacity = tokens_count * k + experts * (alignment - 1) + 64;
      const Permuted p = permute_bf16(tokens, ids, tokens_count, hidden, k, experts, alignment,
                                      capacity, row_capacity);
      int64_t kept_total = 0, dropped_total = 0;
      for (int64_t e = 0; e < experts; ++e) {
        EXPECT_EQ(p.offsets[e] % alignment, 0);
        EXPECT_EQ(p.offsets[e + 1] - p.offsets[e],
                  (p.kept[e] + alignment - 1) / alignment * alignment);
        EXPECT_EQ(p.kept[e] + p.dropped[e], router_counts[e]);
        if (capacity > 0) {
          EXPECT_LE(p.kept[e], capacity);
        }
        kept_total += p.kept[e];
        dropped_total += p.dropped[e];
      }
      EXPECT_EQ(kept_total + dropped_total, tokens_count * k);
      if (capacity > 0) {
        EXPECT_GT(dropped_total, 0) << "capacity " << capacity << " should drop some rows";
      }
      // Every kept slot's row holds its token's row bit for bit; rows fill each block in token
      // order. Rows fill each block in token order, and an expert drops only its latest tokens.
      std::vector<bool> named(row_capacity, false);
      std::vector<int64_t> filled(experts, 0);
      for (int64_t t = 0; t < tokens_count; ++t) {
        for (int64_t i = 0; i < k; ++i) {
          const int64_t row = p.row_map[t * k + i];
          const int32_t e = ids[t * k + i];
          if (row < 0) {
            EXPECT_EQ(filled[e], p.kept[e])
                << "token " << t << " dropped while expert " << e << " had room";
            continue;
          }
          ASSERT_EQ(row, p.offsets[e] + filled[e]) << "token " << t << ", expert " << e;
          ++filled[e];
          named[row] = true;
          ASSERT_EQ(std::memcmp(&p.rows[row * hidden], &tokens[t * hidden], hidden * 2), 0)
              << "row " << row;
        }
      }
      for (int64_t row = 0; row < row_capacity; ++row) {
        if (named[row]) continue;
        const uint16_t want =
            row < p.offsets[experts] ? 0 : kPoison;  // padding zeros; beyond untouched
        for (int64_t h = 0; h < hidden; ++h)
          ASSERT_EQ(p.rows[row * hidden + h], want) << "row " << row;
      }
      // Each expert's amax: the largest BF16 magnitude bits among its kept rows (NaN payloads
      // above Inf, as the amax rule orders them), 0 for an expert without rows.
      std::vector<uint32_t> want_bits(experts, 0);
      for (int64_t slot = 0; slot < tokens_count * k; ++slot) {
        if (p.row_map[slot] < 0) continue;
        for (int64_t h = 0; h < hidden; ++h) {
          const uint32_t magnitude = tokens[(slot / k) * hidden + h] & 0x7FFFu;
          want_bits[ids[slot]] = std::max(want_bits[ids[slot]], magnitude << 16);
        }
      }
      int idle = 0, nan = 0;
      for (int64_t e = 0; e < experts; ++e) {
        ASSERT_EQ(numerics::f32_to_bits(p.amax[e]), want_bits[e]) << "expert " << e;
        idle += p.kept[e] == 0;
        nan += std::isnan(p.amax[e]);
      }
      EXPECT_GT(idle, 0) << "idle experts (amax 0) are in the mix";
      EXPECT_GT(nan, 0) << "NaN rows are in the mix";
    }
  }
}

// k distinct random experts per token.
std::vector<int32_t> random_routing(int64_t tokens_count, int64_t experts, int64_t k,
                                    std::mt19937_64& rng) {
  std::vector<int32_t> ids(tokens_count * k), all(experts);
  for (int64_t t = 0; t < tokens_count; ++t) {
    for (int32_t e = 0; e < experts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t i = 0; i < k; ++i) ids[t * k + i] = all[i];
  }
  return ids;
}

TEST(PermuteCpu, UnpermuteAndItsBackward) {
  const int64_t tokens_count = 333, experts = 16, k = 4, hidden = 40;
  std::mt19937_64 rng(testing::session_test_seed() + 11);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::vector<int32_t> ids = random_routing(tokens_count, experts, k, rng);
  std::vector<uint16_t> tokens(tokens_count * hidden);
  for (uint16_t& v : tokens) v = numerics::f32_to_bf16(uniform(rng));
  const int64_t row_capacity = tokens_count * k + experts * 31;
  const Permuted p =
      permute_bf16(tokens, ids, tokens_count, hidden, k, experts, 32, 100, row_capacity);

  // Permute's backward (no probabilities) in FP32: each token gets its row times the number of
  // its kept slots, exactly.
  std::vector<float> gathered(tokens_count * hidden, NAN);
  cpu::unpermute(UnpermuteArgs{p.rows.data(), SFMOE_DTYPE_BF16, tokens_count, hidden, k,
                               p.row_map.data(), nullptr, gathered.data(), SFMOE_DTYPE_FP32,
                               row_capacity, nullptr});
  for (int64_t t = 0; t < tokens_count; ++t) {
    int kept = 0;
    for (int64_t i = 0; i < k; ++i) kept += p.row_map[t * k + i] >= 0;
    for (int64_t h = 0; h < hidden; ++h) {
      ASSERT_EQ(gathered[t * hidden + h], kept * numerics::bf16_to_f32(tokens[t * hidden + h]));
    }
  }

  // Unpermute with probabilities, BF16 out: within BF16 rounding of the float64 sum.
  std::vector<float> probs(tokens_count * k);
  for (float& v : probs) v = std::fabs(uniform(rng)) / 4.0f;
  std::vector<uint16_t> combined(tokens_count * hidden);
  cpu::unpermute(UnpermuteArgs{p.rows.data(), SFMOE_DTYPE_BF16, tokens_count, hidden, k,
                               p.row_map.data(), probs.data(), combined.data(), SFMOE_DTYPE_BF16,
                               row_capacity, nullptr});
  for (int64_t t = 0; t < tokens_count; ++t) {
    for (int64_t h = 0; h < hidden; ++h) {
      double want = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t row = p.row_map[t * k + i];
        if (row >= 0)
          want += double(probs[t * k + i]) * numerics::bf16_to_f32(p.rows[row * hidden + h]);
      }
      const double got = numerics::bf16_to_f32(combined[t * hidden + h]);
      ASSERT_NEAR(got, want, 1e-5 + std::fabs(want) / 128.0) << "token " << t << " column " << h;
    }
  }

  // Backward: d_rows = probs * d_out exactly (one FP32 product), padding rows zero; d_probs is
  // the row . d_out dot product.
  std::vector<float> d_out(tokens_count * hidden), d_rows(row_capacity * hidden, NAN),
      d_probs(tokens_count * k, NAN);
  for (float& v : d_out) v = uniform(rng);
  cpu::unpermute_backward(UnpermuteBackwardArgs{
      d_out.data(), SFMOE_DTYPE_FP32, p.rows.data(), SFMOE_DTYPE_BF16, tokens_count, hidden, k,
      row_capacity, p.row_map.data(), probs.data(), d_rows.data(), SFMOE_DTYPE_FP32, d_probs.data(),
      p.offsets.data(), p.kept.data(), experts, nullptr});
  std::vector<bool> named(row_capacity, false);
  for (int64_t t = 0; t < tokens_count; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const int64_t row = p.row_map[t * k + i];
      if (row < 0) {
        EXPECT_EQ(d_probs[t * k + i], 0.0f);
        continue;
      }
      named[row] = true;
      double dot = 0.0;
      for (int64_t h = 0; h < hidden; ++h) {
        ASSERT_EQ(d_rows[row * hidden + h],
                  numerics::mul_rn(probs[t * k + i], d_out[t * hidden + h]));
        dot += double(d_out[t * hidden + h]) * numerics::bf16_to_f32(p.rows[row * hidden + h]);
      }
      EXPECT_NEAR(d_probs[t * k + i], dot, 1e-4 * (1.0 + std::fabs(dot)));
    }
  }
  // Rows no slot names: the groups' padding is zero, rows beyond the groups are left alone.
  for (int64_t row = 0; row < row_capacity; ++row) {
    if (named[row]) continue;
    for (int64_t h = 0; h < hidden; ++h) {
      if (row < p.offsets[experts]) {
        ASSERT_EQ(d_rows[row * hidden + h], 0.0f) << "row " << row;
      } else {
        ASSERT_TRUE(std::isnan(d_rows[row * hidden + h])) << "row " << row;
      }
    }
  }

  // The internal gather form (no probabilities, no rows, no d probs): the tokens gathered under
  // permute's row map are permute's rows, bit for bit, padding zeros included.
  std::vector<uint16_t> again(row_capacity * hidden, kPoison);
  cpu::unpermute_backward(UnpermuteBackwardArgs{
      tokens.data(), SFMOE_DTYPE_BF16, nullptr, SFMOE_DTYPE_BF16, tokens_count, hidden, k,
      row_capacity, p.row_map.data(), nullptr, again.data(), SFMOE_DTYPE_BF16, nullptr,
      p.offsets.data(), p.kept.data(), experts, nullptr});
  EXPECT_EQ(again, p.rows);

  // Each row's source token (the layer's gathered FC1 rows): the tokens gathered through it are
  // permute's rows, bit for bit (-1 for padding and for rows past the groups: zero rows).
  std::vector<int32_t> sources(row_capacity, 12345);
  cpu::row_sources(RowSourcesArgs{p.row_map.data(), tokens_count, k, row_capacity, sources.data()});
  for (int64_t row = 0; row < row_capacity; ++row) {
    for (int64_t h = 0; h < hidden; ++h) {
      const uint16_t want = row < p.offsets[experts] ? p.rows[row * hidden + h] : 0;
      const uint16_t got = sources[row] < 0 ? 0 : tokens[sources[row] * hidden + h];
      ASSERT_EQ(got, want) << "row " << row << " (source " << sources[row] << ")";
    }
  }
  // And permute without rows (the layer's routing-only call) writes the same routing.
  std::vector<int64_t> offsets_only(experts + 1, -1), kept_only(experts, -1),
      dropped_only(experts, -1), map_only(tokens_count * k, -9);
  cpu::permute(PermuteArgs{tokens.data(), SFMOE_DTYPE_BF16, tokens_count, hidden, k, experts,
                           ids.data(), 32, 100, row_capacity, nullptr, offsets_only.data(),
                           map_only.data(), kept_only.data(), dropped_only.data(), nullptr, nullptr,
                           nullptr, nullptr});
  EXPECT_EQ(offsets_only, p.offsets);
  EXPECT_EQ(kept_only, p.kept);
  EXPECT_EQ(map_only, p.row_map);

  // Slot values to rows and back: each kept slot's value at its row, dropped slots 0, rows no
  // slot names untouched.
  std::vector<float> slot_in(tokens_count * k), row_values(row_capacity, -5.0f),
      slot_out(tokens_count * k, NAN);
  for (float& v : slot_in) v = uniform(rng);
  cpu::slot_values(SlotValuesArgs{p.row_map.data(), tokens_count * k, row_capacity, true,
                                  slot_in.data(), row_values.data()});
  cpu::slot_values(SlotValuesArgs{p.row_map.data(), tokens_count * k, row_capacity, false,
                                  row_values.data(), slot_out.data()});
  for (int64_t s = 0; s < tokens_count * k; ++s) {
    const int64_t row = p.row_map[s];
    ASSERT_EQ(slot_out[s], row >= 0 ? slot_in[s] : 0.0f) << "slot " << s;
  }
  for (int64_t row = 0; row < row_capacity; ++row) {
    bool written = false;
    for (int64_t s = 0; s < tokens_count * k; ++s) written = written || p.row_map[s] == row;
    if (!written) {
      ASSERT_EQ(row_values[row], -5.0f) << "row " << row;
    }
  }
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

using testing::host_rows;
using testing::host_tensor;

TEST(PermuteApi, RoundTripThroughTheCApiAndItsRefusals) {
  const int64_t tokens_count = 50, hidden = 16, k = 3, experts = 8, alignment = 16;
  std::mt19937_64 rng(testing::session_test_seed() + 12);
  std::vector<int32_t> ids = random_routing(tokens_count, experts, k, rng);
  std::vector<uint16_t> x(tokens_count * hidden);
  for (uint16_t& v : x) v = numerics::f32_to_bf16(std::ldexp(static_cast<float>(rng() % 64), -3));
  const int64_t capacity_rows = tokens_count * k + experts * (alignment - 1);
  std::vector<uint16_t> rows(capacity_rows * hidden, 0xBEEF);
  std::vector<int64_t> offsets(experts + 1, -1), row_map(tokens_count * k, -7), kept(experts),
      dropped(experts);
  sfmoe_tensor t_x = host_tensor(x.data(), SFMOE_DTYPE_BF16, {tokens_count, hidden});
  sfmoe_tensor t_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {tokens_count, k});
  sfmoe_tensor t_map = host_tensor(row_map.data(), SFMOE_DTYPE_INT64, {tokens_count, k});
  sfmoe_tensor t_kept = host_tensor(kept.data(), SFMOE_DTYPE_INT64, {experts});
  sfmoe_tensor t_dropped = host_tensor(dropped.data(), SFMOE_DTYPE_INT64, {experts});
  sfmoe_grouped_tensor g_rows = host_rows(rows.data(), SFMOE_DTYPE_BF16, experts, capacity_rows,
                                          hidden, alignment, offsets.data());
  std::vector<float> amax(experts + 1, NAN);  // one spare entry for the misaligned pointer below
  g_rows.amax = amax.data();                  // each expert's amax of its rows
  sfmoe_permute_config config = sfmoe_permute_config_init();
  ASSERT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g_rows, &t_map, &t_kept, &t_dropped, nullptr,
                          nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  const Permuted want =
      permute_bf16(x, ids, tokens_count, hidden, k, experts, alignment, 0, capacity_rows);
  EXPECT_EQ(rows, want.rows);
  EXPECT_EQ(offsets, want.offsets);
  EXPECT_EQ(row_map, want.row_map);
  EXPECT_EQ(kept, want.kept);
  EXPECT_EQ(std::vector<float>(amax.begin(), amax.begin() + experts), want.amax);
  EXPECT_TRUE(std::isnan(amax[experts])) << "nothing written past the experts";

  // Permute's backward through unpermute without probabilities: k copies of each row, exactly
  // (the values are small multiples of 1/8).
  std::vector<float> back(tokens_count * hidden);
  sfmoe_tensor t_back = host_tensor(back.data(), SFMOE_DTYPE_FP32, {tokens_count, hidden});
  ASSERT_EQ(sfmoe_unpermute(&g_rows, &t_map, nullptr, &t_back, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  for (int64_t i = 0; i < tokens_count * hidden; ++i)
    ASSERT_EQ(back[i], k * numerics::bf16_to_f32(x[i]));

  // Unpermute's backward through the API.
  std::vector<float> probs(tokens_count * k, 0.25f), d_out(tokens_count * hidden, 1.0f),
      d_probs(tokens_count * k);
  std::vector<float> d_rows(capacity_rows * hidden, NAN);
  std::vector<int64_t> d_offsets(offsets);
  sfmoe_tensor t_probs = host_tensor(probs.data(), SFMOE_DTYPE_FP32, {tokens_count, k});
  sfmoe_tensor t_dout = host_tensor(d_out.data(), SFMOE_DTYPE_FP32, {tokens_count, hidden});
  sfmoe_tensor t_dprobs = host_tensor(d_probs.data(), SFMOE_DTYPE_FP32, {tokens_count, k});
  sfmoe_grouped_tensor g_drows = host_rows(d_rows.data(), SFMOE_DTYPE_FP32, experts, capacity_rows,
                                           hidden, alignment, d_offsets.data());
  ASSERT_EQ(sfmoe_unpermute_backward(&t_dout, &g_rows, &t_map, &t_probs, &t_kept, &g_drows,
                                     &t_dprobs, nullptr, nullptr),
            SFMOE_SUCCESS)
      << sfmoe_last_error();
  for (int64_t t = 0; t < tokens_count; ++t) {
    float row_sum = 0.0f;
    for (int64_t h = 0; h < hidden; ++h)
      row_sum = numerics::add_rn(row_sum, numerics::bf16_to_f32(x[t * hidden + h]));
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(d_probs[t * k + i], row_sum);
  }

  // Refusals write nothing.
  const std::vector<int64_t> map_before = row_map;
  sfmoe_grouped_tensor small = g_rows;
  small.row_capacity = capacity_rows - 1;
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &small, &t_map, &t_kept, nullptr, nullptr, nullptr,
                          nullptr),
            SFMOE_ERROR_SHAPE_MISMATCH);
  sfmoe_grouped_tensor odd = g_rows;
  odd.row_alignment = 4;
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &odd, &t_map, &t_kept, nullptr, nullptr, nullptr,
                          nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  sfmoe_grouped_tensor misaligned_amax = g_rows;
  misaligned_amax.amax = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(amax.data()) + 2);
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &misaligned_amax, &t_map, &t_kept, nullptr,
                          nullptr, nullptr, nullptr),
            SFMOE_ERROR_MISALIGNED);
  sfmoe_grouped_tensor fp32_rows = g_rows;
  fp32_rows.dtype = SFMOE_DTYPE_FP32;
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &fp32_rows, &t_map, &t_kept, nullptr, nullptr,
                          nullptr, nullptr),
            SFMOE_ERROR_DTYPE_MISMATCH);
  ids[4] = ids[3];  // token 1 names one expert twice
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g_rows, &t_map, &t_kept, nullptr, nullptr,
                          nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  ids[4] = static_cast<int32_t>(experts);
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g_rows, &t_map, &t_kept, nullptr, nullptr,
                          nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(row_map, map_before);
  config.expert_capacity = INT64_MAX / 2;  // experts x capacity overflows: must not pass as small
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &small, &t_map, &t_kept, nullptr, nullptr, nullptr,
                          nullptr),
            SFMOE_ERROR_SHAPE_MISMATCH);
  config.expert_capacity = -1;
  EXPECT_EQ(sfmoe_permute(&t_x, &t_ids, &config, &g_rows, &t_map, &t_kept, nullptr, nullptr,
                          nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  const int64_t saved = row_map[7];
  row_map[7] = row_map[8] >= 0 ? row_map[8] : 0;  // one row named by two slots
  row_map[8] = row_map[7];
  EXPECT_EQ(sfmoe_unpermute_backward(&t_dout, &g_rows, &t_map, &t_probs, &t_kept, &g_drows,
                                     &t_dprobs, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  row_map[7] = saved;
  row_map[7] = capacity_rows;  // not a row
  std::fill(back.begin(), back.end(), 5.0f);
  EXPECT_EQ(sfmoe_unpermute(&g_rows, &t_map, nullptr, &t_back, nullptr, nullptr),
            SFMOE_ERROR_INVALID_ARGUMENT);
  for (float v : back) ASSERT_EQ(v, 5.0f);
}

}  // namespace
}  // namespace sfmoe

namespace sfmoe {
namespace {

using testing::host_tensor;

// The fused quantization takes the rowwise recipes whose blocks lie within a row; the rest is
// refused before anything is written.
TEST(PermuteApi, FusedQuantizationRefusals) {
  const int64_t tokens_count = 8, hidden = 64, k = 2, experts = 4, alignment = 32;
  std::vector<uint16_t> x(tokens_count * hidden, 0x3F80);
  std::vector<int32_t> ids(tokens_count * k);
  for (int64_t i = 0; i < tokens_count * k; ++i) ids[i] = static_cast<int32_t>(i % experts);
  const int64_t capacity_rows = tokens_count * k + experts * (alignment - 1);
  std::vector<uint8_t> codes(capacity_rows * hidden, 0xA5), scales(capacity_rows * hidden, 0xA5),
      columnwise(capacity_rows * hidden);
  std::vector<int64_t> offsets(experts + 1, -1), row_map(tokens_count * k, -7), kept(experts);
  sfmoe_tensor t_x = host_tensor(x.data(), SFMOE_DTYPE_BF16, {tokens_count, hidden});
  sfmoe_tensor t_ids = host_tensor(ids.data(), SFMOE_DTYPE_INT32, {tokens_count, k});
  sfmoe_tensor t_map = host_tensor(row_map.data(), SFMOE_DTYPE_INT64, {tokens_count, k});
  sfmoe_tensor t_kept = host_tensor(kept.data(), SFMOE_DTYPE_INT64, {experts});
  sfmoe_grouped_tensor q = testing::host_rows(codes.data(), SFMOE_DTYPE_FP8_E4M3, experts,
                                              capacity_rows, hidden, alignment, offsets.data());
  q.scaling = SFMOE_SCALING_MX_1X32;
  q.rowwise_scale_inv = scales.data();
  sfmoe_permute_config config = sfmoe_permute_config_init();
  ASSERT_EQ(
      sfmoe_permute(&t_x, &t_ids, &config, &q, &t_map, &t_kept, nullptr, nullptr, nullptr, nullptr),
      SFMOE_SUCCESS)
      << sfmoe_last_error();
  const std::vector<int64_t> map_before = row_map;
  std::fill(row_map.begin(), row_map.end(), -7);
  auto refused = [&](const sfmoe_grouped_tensor& bad, const sfmoe_permute_config& c,
                     sfmoe_status want, const char* what) {
    EXPECT_EQ(
        sfmoe_permute(&t_x, &t_ids, &c, &bad, &t_map, &t_kept, nullptr, nullptr, nullptr, nullptr),
        want)
        << what << ": " << sfmoe_last_error();
    for (int64_t v : row_map) EXPECT_EQ(v, -7) << what;
  };
  sfmoe_grouped_tensor bad = q;
  bad.scaling = SFMOE_SCALING_TENSOR;
  refused(bad, config, SFMOE_ERROR_UNSUPPORTED, "per-tensor scaling");
  bad = q;
  bad.columnwise_data = columnwise.data();
  bad.columnwise_scale_inv = scales.data();
  refused(bad, config, SFMOE_ERROR_UNSUPPORTED, "a columnwise copy");
  bad = q;
  bad.dtype = SFMOE_DTYPE_FP4_E2M1;
  refused(bad, config, SFMOE_ERROR_DTYPE_MISMATCH, "fp4 codes");
  bad = q;
  bad.scaling = SFMOE_SCALING_BLOCK_1X128;  // 64 columns: not a whole 128-element block
  refused(bad, config, SFMOE_ERROR_SHAPE_MISMATCH, "columns not a multiple of the block");
  sfmoe_quantize_config options = sfmoe_quantize_config_init();
  options.power_of_two_scales = 1;  // not an MX option
  sfmoe_permute_config with_options = config;
  with_options.quantize = &options;
  refused(q, with_options, SFMOE_ERROR_UNSUPPORTED, "power-of-two scales for mxfp8");
  options = sfmoe_quantize_config_init();
  options.stochastic_rounding = 1;
  refused(q, with_options, SFMOE_ERROR_UNSUPPORTED, "stochastic rounding");
  EXPECT_NE(map_before[0], -7);
}

}  // namespace
}  // namespace sfmoe
