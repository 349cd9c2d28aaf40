// The planning functions against what the ops write, on either backend: every planned buffer is
// allocated with guard bytes after its planned extent, the op runs on the bound descriptor, and
// the guards must come back untouched (and the op must accept the planned layout). A plan one row
// smaller than the planned bound must be refused by the planner and by the op alike.
#pragma once

#include <gtest/gtest.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/activation.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/sfmoe.h"
#include "tests/cpp/host_descriptors.h"

namespace sfmoe {
namespace testing {

// Where the buffers live: host memory, or a device with copies to and from it.
struct MemorySpace {
  sfmoe_memory memory;
  std::function<void*(size_t)> allocate;  // owned by the space until it is destroyed
  std::function<void(void*, const void*, size_t)> upload;
  std::function<void(void*, const void*, size_t)> download;
  std::function<void()> synchronize;
};

constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuard = 0xA5;

// One planned buffer with guard bytes behind it: [poison of `bytes`][kGuard x kGuardBytes].
struct GuardedBuffer {
  void* data = nullptr;
  int64_t bytes = 0;
};

inline GuardedBuffer guarded(const MemorySpace& space, int64_t bytes, uint8_t poison) {
  // Rounded up to 16 bytes only where the planned extent is not (the op may not write there);
  // the guard starts right after the planned extent.
  GuardedBuffer b;
  b.bytes = bytes;
  const size_t total = static_cast<size_t>(bytes) + kGuardBytes;
  b.data = space.allocate(total);
  std::vector<uint8_t> init(total, kGuard);
  memset(init.data(), poison, static_cast<size_t>(bytes));
  space.upload(b.data, init.data(), total);
  return b;
}

// The guards of `b` as they are now: every byte after the planned extent still kGuard.
inline ::testing::AssertionResult guards_intact(const MemorySpace& space, const GuardedBuffer& b,
                                                const char* name) {
  if (b.data == nullptr) return ::testing::AssertionSuccess();
  std::vector<uint8_t> guard(kGuardBytes);
  space.download(guard.data(), static_cast<uint8_t*>(b.data) + b.bytes, kGuardBytes);
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (guard[i] != kGuard) {
      return ::testing::AssertionFailure()
             << name << ": byte " << i << " after the planned " << b.bytes
             << " bytes was written (now " << static_cast<unsigned>(guard[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Every buffer of a grouped-tensor plan, guarded, and the descriptor over them.
struct PlannedTensor {
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  std::vector<std::pair<std::string, GuardedBuffer>> buffers;

  PlannedTensor(const MemorySpace& space, const sfmoe_grouped_tensor_plan& plan) {
    t.memory = space.memory;
    t.dtype = plan.dtype;
    t.scaling = plan.scaling;
    t.scale_layout = plan.scale_layout;
    t.num_groups = plan.num_groups;
    t.row_capacity = plan.row_capacity;
    t.cols = plan.cols;
    t.row_alignment = plan.row_alignment;
    t.uniform_group_rows = plan.uniform_group_rows;
    auto take = [&](const char* name, const sfmoe_buffer_plan& b) -> void* {
      if (b.ndim == 0) return nullptr;
      buffers.emplace_back(name, guarded(space, b.bytes, 0x7F));
      return buffers.back().second.data;
    };
    t.group_offsets = static_cast<int64_t*>(take("group_offsets", plan.group_offsets));
    t.rowwise_data = take("rowwise_data", plan.rowwise_data);
    t.rowwise_scale_inv = take("rowwise_scale_inv", plan.rowwise_scale_inv);
    t.columnwise_data = take("columnwise_data", plan.columnwise_data);
    t.columnwise_scale_inv = take("columnwise_scale_inv", plan.columnwise_scale_inv);
    t.amax = static_cast<float*>(take("amax", plan.amax));
    t.columnwise_amax = static_cast<float*>(take("columnwise_amax", plan.columnwise_amax));
  }

  ::testing::AssertionResult intact(const MemorySpace& space) const {
    for (const auto& [name, b] : buffers) {
      auto r = guards_intact(space, b, name.c_str());
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }
};

// Random group sizes summing to at most `rows`, with empty groups among them.
inline std::vector<int64_t> random_offsets(std::mt19937& rng, int64_t groups, int64_t rows) {
  std::vector<int64_t> offsets(static_cast<size_t>(groups) + 1, 0);
  std::uniform_int_distribution<int64_t> pick(0, rows);
  std::vector<int64_t> cuts(static_cast<size_t>(groups - 1));
  for (auto& c : cuts) c = pick(rng);
  cuts.push_back(rows);  // the last group ends at the capacity: the bound is reached
  std::sort(cuts.begin(), cuts.end());
  for (int64_t g = 0; g < groups; ++g) offsets[g + 1] = cuts[g];
  if (groups > 2) offsets[2] = offsets[1];  // an empty group
  return offsets;
}

// FP32 rows of random values (zeros, subnormals and large values among them).
inline std::vector<float> random_rows(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t i = 0; i < v.size(); ++i) {
    const int pick = static_cast<int>(rng() % 16);
    v[i] = pick == 0 ? 0.0f : pick == 1 ? 1e-40f : pick == 2 ? -1e4f : normal(rng);
  }
  return v;
}

struct Recipe {
  sfmoe_scaling scaling;
  sfmoe_dtype dtype;
};

inline std::vector<Recipe> quantized_recipes() {
  return {{SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E4M3},
          {SFMOE_SCALING_TENSOR, SFMOE_DTYPE_FP8_E5M2},
          {SFMOE_SCALING_BLOCK_1X128, SFMOE_DTYPE_FP8_E4M3},
          {SFMOE_SCALING_BLOCK_128X128, SFMOE_DTYPE_FP8_E4M3},
          {SFMOE_SCALING_MX_1X32, SFMOE_DTYPE_FP8_E5M2},
          {SFMOE_SCALING_NV_1X16, SFMOE_DTYPE_FP4_E2M1},
          {SFMOE_SCALING_NV_16X16, SFMOE_DTYPE_FP4_E2M1}};
}

inline std::vector<sfmoe_scale_layout> layouts_of(sfmoe_scaling scaling) {
  std::vector<sfmoe_scale_layout> layouts = {SFMOE_SCALE_LAYOUT_COMPACT};
  if (scaling == SFMOE_SCALING_MX_1X32 || scaling == SFMOE_SCALING_NV_1X16) {
    layouts.push_back(SFMOE_SCALE_LAYOUT_SWIZZLED);
  }
  if (scaling == SFMOE_SCALING_BLOCK_1X128) {
    layouts.push_back(SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED);
  }
  return layouts;
}

// sfmoe_grouped_quantize into the planned output of every recipe, copy and scale layout.
inline void check_quantize_plans(const MemorySpace& space, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t groups = 5;
  for (const Recipe& recipe : quantized_recipes()) {
    // cols: a multiple of every block, and an odd number of blocks for the 1D recipes.
    const int64_t cols = recipe.scaling == SFMOE_SCALING_TENSOR ? 72 : 384;
    for (sfmoe_scale_layout layout : layouts_of(recipe.scaling)) {
      for (int copies = 1; copies <= 3; ++copies) {
        for (int hadamard = 0; hadamard <= (recipe.scaling == SFMOE_SCALING_NV_1X16); ++hadamard) {
          const bool rowwise = copies & 1, columnwise = copies & 2;
          const int64_t rows = 131 + static_cast<int64_t>(rng() % 200);
          SCOPED_TRACE(std::string(sfmoe_scaling_name(recipe.scaling)) + " " +
                       sfmoe_dtype_name(recipe.dtype) + " layout " + std::to_string(layout) +
                       " copies " + std::to_string(copies) + " hadamard " +
                       std::to_string(hadamard) + " rows " + std::to_string(rows));
          sfmoe_quantize_plan_request request = sfmoe_quantize_plan_request_init();
          request.dtype = recipe.dtype;
          request.scaling = recipe.scaling;
          request.scale_layout = layout;
          request.rowwise = rowwise;
          request.columnwise = columnwise;
          request.hadamard_columnwise = hadamard;
          request.num_groups = groups;
          request.cols = cols;
          request.input_rows = rows;
          sfmoe_grouped_tensor_plan plan;
          plan.struct_size = sizeof(plan);
          ASSERT_EQ(sfmoe_plan_grouped_quantize(&request, &plan), SFMOE_SUCCESS)
              << sfmoe_last_error();
          ASSERT_GE(plan.row_capacity, rows);
          ASSERT_EQ(plan.rowwise_data.ndim != 0, rowwise);
          ASSERT_EQ(plan.columnwise_data.ndim != 0, columnwise);

          const std::vector<int64_t> offsets = random_offsets(rng, groups, rows);
          const std::vector<float> values = random_rows(rng, rows, cols);
          void* x = space.allocate(values.size() * sizeof(float));
          space.upload(x, values.data(), values.size() * sizeof(float));
          void* x_offsets = space.allocate(offsets.size() * sizeof(int64_t));
          space.upload(x_offsets, offsets.data(), offsets.size() * sizeof(int64_t));
          const sfmoe_grouped_tensor input =
              rows_in(space.memory, x, SFMOE_DTYPE_FP32, groups, rows, cols, 1,
                      static_cast<int64_t*>(x_offsets));

          PlannedTensor out(space, plan);
          sfmoe_quantize_config config = sfmoe_quantize_config_init();
          config.hadamard_columnwise = hadamard;
          ASSERT_EQ(sfmoe_grouped_quantize(&input, &out.t, &config, nullptr, nullptr),
                    SFMOE_SUCCESS)
              << sfmoe_last_error();
          space.synchronize();
          EXPECT_TRUE(out.intact(space));
          // The codes reach the end of the used rows: the plan is not merely generous.
          std::vector<int64_t> written(static_cast<size_t>(groups) + 1);
          space.download(written.data(), out.t.group_offsets, written.size() * sizeof(int64_t));
          EXPECT_LE(written[groups], plan.row_capacity);

          // The smallest capacity the planner allows is the smallest the op accepts.
          request.row_capacity = plan.row_capacity - 1;
          sfmoe_grouped_tensor_plan smaller;
          smaller.struct_size = sizeof(smaller);
          const sfmoe_status planned = sfmoe_plan_grouped_quantize(&request, &smaller);
          sfmoe_grouped_tensor shrunk = out.t;
          shrunk.row_capacity = plan.row_capacity - 1;
          const sfmoe_status accepted =
              sfmoe_grouped_quantize(&input, &shrunk, &config, nullptr, nullptr);
          space.synchronize();
          if (planned == SFMOE_SUCCESS) {
            // A larger default (rounded for the copies' alignment): the op takes the smaller
            // capacity too, writing within its own extents.
            EXPECT_EQ(accepted, SFMOE_SUCCESS) << sfmoe_last_error();
            EXPECT_TRUE(out.intact(space));
          } else {
            EXPECT_NE(accepted, SFMOE_SUCCESS);
          }
        }
      }
    }
  }
}

// sfmoe_permute into its planned outputs: unquantized rows (with and without the expert amax)
// and the fused quantizations.
inline void check_permute_plans(const MemorySpace& space, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t tokens = 77, k = 3, experts = 6, hidden = 256;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool(static_cast<size_t>(experts));
    for (int32_t e = 0; e < experts; ++e) pool[e] = e;
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int64_t i = 0; i < k; ++i) ids[t * k + i] = pool[i] == 5 ? 0 : pool[i];  // skew
    if (ids[t * k] == ids[t * k + 1] || ids[t * k] == ids[t * k + 2] ||
        ids[t * k + 1] == ids[t * k + 2]) {
      for (int64_t i = 0; i < k; ++i) ids[t * k + i] = static_cast<int32_t>(i + 1);
    }
  }
  const std::vector<float> values = random_rows(rng, tokens, hidden);
  std::vector<uint16_t> bf16(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    memcpy(&bits, &values[i], 4);
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  void* x = space.allocate(bf16.size() * 2);
  space.upload(x, bf16.data(), bf16.size() * 2);
  void* x_ids = space.allocate(ids.size() * 4);
  space.upload(x_ids, ids.data(), ids.size() * 4);
  const sfmoe_tensor t_tokens = tensor_in(space.memory, x, SFMOE_DTYPE_BF16, {tokens, hidden});
  const sfmoe_tensor t_ids = tensor_in(space.memory, x_ids, SFMOE_DTYPE_INT32, {tokens, k});
  struct Case {
    sfmoe_dtype dtype;
    sfmoe_scaling scaling;
    sfmoe_scale_layout layout;
    int64_t alignment, capacity;
    bool amax;
  };
  const Case cases[] = {
      {SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT, 1, 0, false},
      {SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT, 16, 0, true},
      {SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT, 128, 20, false},
      {SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALING_MX_1X32, SFMOE_SCALE_LAYOUT_SWIZZLED, 32, 0, false},
      {SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALING_BLOCK_1X128, SFMOE_SCALE_LAYOUT_COMPACT, 8, 9, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("permuted ") + sfmoe_scaling_name(c.scaling) + " alignment " +
                 std::to_string(c.alignment) + " capacity " + std::to_string(c.capacity));
    sfmoe_permute_plan_request request = sfmoe_permute_plan_request_init();
    request.num_tokens = tokens;
    request.topk = k;
    request.num_experts = experts;
    request.hidden = hidden;
    request.row_alignment = c.alignment;
    request.expert_capacity = c.capacity;
    request.dtype = c.dtype;
    request.scaling = c.scaling;
    request.scale_layout = c.layout;
    request.group_amax = c.amax;
    sfmoe_permute_plan plan;
    plan.struct_size = sizeof(plan);
    ASSERT_EQ(sfmoe_plan_permute(&request, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
    EXPECT_EQ(plan.workspace.bytes, sfmoe_permute_workspace_bytes(tokens, experts));
    PlannedTensor permuted(space, plan.permuted);
    const GuardedBuffer map = guarded(space, plan.row_map.bytes, 0x11);
    const GuardedBuffer kept = guarded(space, plan.tokens_per_expert.bytes, 0x22);
    const GuardedBuffer dropped = guarded(space, plan.dropped_per_expert.bytes, 0x33);
    const GuardedBuffer ws = guarded(space, plan.workspace.bytes, 0x44);
    const sfmoe_tensor t_map = tensor_in(space.memory, map.data, SFMOE_DTYPE_INT64, {tokens, k});
    const sfmoe_tensor t_kept = tensor_in(space.memory, kept.data, SFMOE_DTYPE_INT64, {experts});
    const sfmoe_tensor t_dropped =
        tensor_in(space.memory, dropped.data, SFMOE_DTYPE_INT64, {experts});
    const sfmoe_tensor t_ws =
        tensor_in(space.memory, ws.data, SFMOE_DTYPE_INT32, {plan.workspace.shape[0]});
    sfmoe_permute_config config = sfmoe_permute_config_init();
    config.expert_capacity = c.capacity;
    ASSERT_EQ(sfmoe_permute(&t_tokens, &t_ids, &config, &permuted.t, &t_map, &t_kept, &t_dropped,
                            &t_ws, nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    space.synchronize();
    EXPECT_TRUE(permuted.intact(space));
    EXPECT_TRUE(guards_intact(space, map, "row_map"));
    EXPECT_TRUE(guards_intact(space, kept, "tokens_per_expert"));
    EXPECT_TRUE(guards_intact(space, dropped, "dropped_per_expert"));
    EXPECT_TRUE(guards_intact(space, ws, "workspace"));
    if (c.capacity == 0) {  // every slot kept: the last block ends within the planned capacity
      std::vector<int64_t> offsets(static_cast<size_t>(experts) + 1);
      space.download(offsets.data(), permuted.t.group_offsets, offsets.size() * 8);
      EXPECT_LE(offsets[experts], plan.permuted.row_capacity);
      EXPECT_GE(offsets[experts], tokens * k);
    }
  }
}

// sfmoe_grouped_activation into its planned output: unquantized and the fused quantizations.
inline void check_activation_plans(const MemorySpace& space, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t groups = 4, f = 96 * 2;  // F = 192: a multiple of 32, 16 and 8, not of 128
  const int64_t alignment = 16;
  std::vector<int64_t> group_rows = {5, 0, 33, 17};
  std::vector<int64_t> offsets(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) {
    offsets[g + 1] = offsets[g] + (group_rows[g] + alignment - 1) / alignment * alignment;
  }
  const int64_t capacity = offsets[groups] + alignment;
  struct Case {
    sfmoe_activation kind;
    sfmoe_dtype dtype;
    sfmoe_scaling scaling;
    sfmoe_scale_layout layout;
    bool amax;
  };
  const Case cases[] = {
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_DTYPE_BF16, SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT,
       true},
      {SFMOE_ACTIVATION_GELU, SFMOE_DTYPE_FP32, SFMOE_SCALING_NONE, SFMOE_SCALE_LAYOUT_COMPACT,
       false},
      {SFMOE_ACTIVATION_SWIGLU, SFMOE_DTYPE_FP8_E4M3, SFMOE_SCALING_MX_1X32,
       SFMOE_SCALE_LAYOUT_SWIZZLED, false},
      {SFMOE_ACTIVATION_GEGLU, SFMOE_DTYPE_FP4_E2M1, SFMOE_SCALING_NV_1X16,
       SFMOE_SCALE_LAYOUT_COMPACT, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("activation output ") + sfmoe_scaling_name(c.scaling) + " " +
                 sfmoe_dtype_name(c.dtype));
    const bool gated = c.kind == SFMOE_ACTIVATION_SWIGLU || c.kind == SFMOE_ACTIVATION_GEGLU;
    const int64_t in_cols = gated ? 2 * f : f;
    const std::vector<float> values = random_rows(rng, capacity, in_cols);
    void* x = space.allocate(values.size() * 4);
    space.upload(x, values.data(), values.size() * 4);
    void* x_offsets = space.allocate(offsets.size() * 8);
    space.upload(x_offsets, offsets.data(), offsets.size() * 8);
    void* x_rows = space.allocate(group_rows.size() * 8);
    space.upload(x_rows, group_rows.data(), group_rows.size() * 8);
    const sfmoe_grouped_tensor input =
        rows_in(space.memory, x, SFMOE_DTYPE_FP32, groups, capacity, in_cols, alignment,
                static_cast<int64_t*>(x_offsets));
    sfmoe_activation_plan_request request = sfmoe_activation_plan_request_init();
    request.kind = c.kind;
    request.num_groups = groups;
    request.row_capacity = capacity;
    request.input_cols = in_cols;
    request.row_alignment = alignment;
    request.dtype = c.dtype;
    request.scaling = c.scaling;
    request.scale_layout = c.layout;
    request.group_amax = c.amax;
    sfmoe_grouped_tensor_plan plan;
    plan.struct_size = sizeof(plan);
    ASSERT_EQ(sfmoe_plan_grouped_activation(&request, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
    EXPECT_EQ(plan.cols, f);
    PlannedTensor out(space, plan);
    const sfmoe_tensor t_rows = tensor_in(space.memory, x_rows, SFMOE_DTYPE_INT64, {groups});
    sfmoe_activation_config config = sfmoe_activation_config_init();
    config.kind = c.kind;
    ASSERT_EQ(sfmoe_grouped_activation(&input, &t_rows, &config, &out.t, nullptr, nullptr),
              SFMOE_SUCCESS)
        << sfmoe_last_error();
    space.synchronize();
    EXPECT_TRUE(out.intact(space));
  }
}

}  // namespace testing
}  // namespace sfmoe
