// The planning functions (sfmoe.h, "layout planning") against the CPU backend: the ops accept the
// planned layouts and write nothing past them (tests/cpp/layout_plan_cases.h), plus the planners'
// refusals and their agreement with the element-count rules they replace.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <random>
#include <vector>

#include "sfmoe/activation.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "tests/cpp/layout_plan_cases.h"

namespace sfmoe {
namespace testing {
namespace {

// Host memory, freed with the space.
struct HostSpace {
  std::vector<std::unique_ptr<void, void (*)(void*)>> blocks;
  MemorySpace space;
  HostSpace() {
    space.memory = SFMOE_MEMORY_HOST;
    space.allocate = [this](size_t bytes) {
      void* p = aligned_alloc(SFMOE_PLAN_ALIGNMENT, (bytes + 255) / 256 * 256 + 256);
      blocks.emplace_back(p, &free);
      return p;
    };
    space.upload = [](void* to, const void* from, size_t n) { memcpy(to, from, n); };
    space.download = [](void* to, const void* from, size_t n) { memcpy(to, from, n); };
    space.synchronize = [] {};
  }
};

uint32_t fresh_seed() {
  const uint32_t seed = std::random_device{}();
  std::printf("[ plan ] seed %u\n", seed);
  return seed;
}

TEST(LayoutPlan, QuantizeOutputsHoldWhatTheOpWrites) {
  HostSpace host;
  check_quantize_plans(host.space, fresh_seed());
}

TEST(LayoutPlan, PermuteOutputsHoldWhatTheOpWrites) {
  HostSpace host;
  check_permute_plans(host.space, fresh_seed());
}

TEST(LayoutPlan, ActivationOutputsHoldWhatTheOpWrites) {
  HostSpace host;
  check_activation_plans(host.space, fresh_seed());
}

sfmoe_grouped_tensor_plan empty_plan() {
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  return plan;
}

// The default capacity: rows + G (a - 1), in whole blocks, aligned with a columnwise copy, even
// for FP4, and whole 1024-row units for large compact columnwise MXFP8 / 1x128 outputs.
TEST(LayoutPlan, QuantizeDefaultCapacity) {
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  r.scaling = SFMOE_SCALING_MX_1X32;
  r.num_groups = 3;
  r.cols = 64;
  r.input_rows = 100;
  sfmoe_grouped_tensor_plan plan = empty_plan();
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_alignment, 1);
  EXPECT_EQ(plan.row_capacity, 100);
  EXPECT_EQ(plan.rowwise_data.bytes, 100 * 64);
  EXPECT_EQ(plan.rowwise_scale_inv.bytes, 100 * 2);
  EXPECT_EQ(plan.columnwise_data.ndim, 0);
  EXPECT_EQ(plan.amax.ndim, 0);
  EXPECT_EQ(plan.group_offsets.shape[0], 4);
  r.row_alignment = 16;
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity, 100 + 3 * 15);
  r.row_alignment = 0;
  r.columnwise = 1;  // alignment 32, whole blocks
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_alignment, 32);
  EXPECT_EQ(plan.row_capacity, (100 + 3 * 31 + 31) / 32 * 32);
  EXPECT_EQ(plan.columnwise_scale_inv.shape[0], 64);
  EXPECT_EQ(plan.columnwise_scale_inv.shape[1], plan.row_capacity / 32);
  r.input_rows = 20000;  // staged whole-sector scales
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity % 1024, 0);
  EXPECT_GE(plan.row_capacity, 20000 + 3 * 31);
  r.scale_layout = SFMOE_SCALE_LAYOUT_SWIZZLED;  // not staged
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity, (20000 + 3 * 31 + 31) / 32 * 32);
  // Already aligned input groups need no padding.
  r.scale_layout = SFMOE_SCALE_LAYOUT_COMPACT;
  r.columnwise = 0;
  r.input_rows = 256;
  r.row_alignment = 32;
  r.input_row_alignment = 64;
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity, 256);
  // NVFP4: an even capacity and the group amax; with the Hadamard columnwise copy its own amax.
  sfmoe_quantize_plan_request n = sfmoe_quantize_plan_request_init();
  n.dtype = SFMOE_DTYPE_FP4_E2M1;
  n.scaling = SFMOE_SCALING_NV_1X16;
  n.num_groups = 2;
  n.cols = 32;
  n.input_rows = 9;
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&n, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.row_capacity, 10);
  EXPECT_EQ(plan.rowwise_data.bytes, 10 * 16);
  EXPECT_EQ(plan.amax.shape[0], 2);
  n.columnwise = 1;
  n.hadamard_columnwise = 1;
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&n, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.columnwise_amax.shape[0], 2);
  int64_t total = 0;
  for (const sfmoe_buffer_plan* b :
       {&plan.group_offsets, &plan.rowwise_data, &plan.rowwise_scale_inv, &plan.columnwise_data,
        &plan.columnwise_scale_inv, &plan.amax, &plan.columnwise_amax}) {
    if (b->ndim) total += (b->bytes + SFMOE_PLAN_ALIGNMENT - 1) / SFMOE_PLAN_ALIGNMENT * 256;
  }
  EXPECT_EQ(plan.total_bytes, total);
}

// Requests the op would refuse are refused, with the plan left as it was.
TEST(LayoutPlan, QuantizeRefusals) {
  sfmoe_quantize_plan_request good = sfmoe_quantize_plan_request_init();
  good.scaling = SFMOE_SCALING_BLOCK_1X128;
  good.num_groups = 2;
  good.cols = 256;
  good.input_rows = 50;
  struct Case {
    const char* what;
    void (*change)(sfmoe_quantize_plan_request*);
    sfmoe_status status;
  };
  const Case cases[] = {
      {"no scaling", [](sfmoe_quantize_plan_request* r) { r->scaling = SFMOE_SCALING_NONE; },
       SFMOE_ERROR_INVALID_ARGUMENT},
      {"unknown scaling", [](sfmoe_quantize_plan_request* r) { memset(&r->scaling, 0x7f, 4); },
       SFMOE_ERROR_INVALID_ARGUMENT},
      {"fp4 codes for fp8 scales",
       [](sfmoe_quantize_plan_request* r) { r->dtype = SFMOE_DTYPE_FP4_E2M1; },
       SFMOE_ERROR_DTYPE_MISMATCH},
      {"cols off the block", [](sfmoe_quantize_plan_request* r) { r->cols = 200; },
       SFMOE_ERROR_SHAPE_MISMATCH},
      {"no copy", [](sfmoe_quantize_plan_request* r) { r->rowwise = 0; },
       SFMOE_ERROR_INVALID_ARGUMENT},
      {"swizzled 1x128",
       [](sfmoe_quantize_plan_request* r) { r->scale_layout = SFMOE_SCALE_LAYOUT_SWIZZLED; },
       SFMOE_ERROR_UNSUPPORTED},
      {"alignment 3", [](sfmoe_quantize_plan_request* r) { r->row_alignment = 3; },
       SFMOE_ERROR_SHAPE_MISMATCH},
      {"columnwise alignment 64",
       [](sfmoe_quantize_plan_request* r) {
         r->columnwise = 1;
         r->row_alignment = 64;
       },
       SFMOE_ERROR_SHAPE_MISMATCH},
      {"capacity too small", [](sfmoe_quantize_plan_request* r) { r->row_capacity = 49; },
       SFMOE_ERROR_SHAPE_MISMATCH},
      {"hadamard on 1x128", [](sfmoe_quantize_plan_request* r) { r->hadamard_columnwise = 1; },
       SFMOE_ERROR_UNSUPPORTED},
      {"sizes past int64", [](sfmoe_quantize_plan_request* r) { r->input_rows = INT64_MAX / 2; },
       SFMOE_ERROR_INVALID_ARGUMENT},
      {"uniform rows off the total",
       [](sfmoe_quantize_plan_request* r) { r->uniform_group_rows = 20; },
       SFMOE_ERROR_SHAPE_MISMATCH},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    sfmoe_quantize_plan_request r = good;
    c.change(&r);
    sfmoe_grouped_tensor_plan plan = empty_plan();
    plan.row_capacity = -7;
    EXPECT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), c.status);
    EXPECT_EQ(plan.row_capacity, -7) << "a refused plan is left untouched";
    EXPECT_NE(std::string(sfmoe_last_error()).find("sfmoe_plan_grouped_quantize: "),
              std::string::npos)
        << sfmoe_last_error();
  }
  sfmoe_quantize_plan_request stale = good;
  stale.struct_size -= 8;
  sfmoe_grouped_tensor_plan plan = empty_plan();
  EXPECT_EQ(sfmoe_plan_grouped_quantize(&stale, &plan), SFMOE_ERROR_STRUCT_SIZE);
  plan.struct_size = 8;
  EXPECT_EQ(sfmoe_plan_grouped_quantize(&good, &plan), SFMOE_ERROR_STRUCT_SIZE);
  EXPECT_EQ(sfmoe_plan_grouped_quantize(nullptr, &plan), SFMOE_ERROR_NULL_POINTER);
}

TEST(LayoutPlan, PermuteWorstCaseAndRefusals) {
  sfmoe_permute_plan_request r = sfmoe_permute_plan_request_init();
  r.num_tokens = 1000;
  r.topk = 8;
  r.num_experts = 64;
  r.hidden = 96;
  r.row_alignment = 16;
  sfmoe_permute_plan plan;
  plan.struct_size = sizeof(plan);
  ASSERT_EQ(sfmoe_plan_permute(&r, &plan), SFMOE_SUCCESS) << sfmoe_last_error();
  EXPECT_EQ(plan.permuted.row_capacity, 8000 + 64 * 15);
  EXPECT_EQ(plan.permuted.rowwise_data.bytes, (8000 + 64 * 15) * 96 * 2);
  EXPECT_EQ(plan.permuted.amax.ndim, 0);
  EXPECT_EQ(plan.row_map.shape[0], 1000);
  EXPECT_EQ(plan.row_map.shape[1], 8);
  EXPECT_EQ(plan.workspace.bytes, sfmoe_permute_workspace_bytes(1000, 64));
  EXPECT_EQ(sfmoe_permute_workspace_bytes(1000, 64), (1000 + 63) / 64 * 64 * 4);
  r.expert_capacity = 30;  // 64 x 30 < 8000 kept rows at most
  ASSERT_EQ(sfmoe_plan_permute(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.permuted.row_capacity, 64 * 30 + 64 * 15);
  r.expert_capacity = 1000;  // more than the slots: the slots bound it
  ASSERT_EQ(sfmoe_plan_permute(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.permuted.row_capacity, 8000 + 64 * 15);
  r.group_amax = 1;
  ASSERT_EQ(sfmoe_plan_permute(&r, &plan), SFMOE_SUCCESS);
  EXPECT_EQ(plan.permuted.amax.shape[0], 64);
  sfmoe_permute_plan_request bad = r;
  bad.row_alignment = 4;
  EXPECT_EQ(sfmoe_plan_permute(&bad, &plan), SFMOE_ERROR_INVALID_ARGUMENT);
  bad = r;
  bad.dtype = SFMOE_DTYPE_FP8_E4M3;  // codes without a scaling
  EXPECT_EQ(sfmoe_plan_permute(&bad, &plan), SFMOE_ERROR_DTYPE_MISMATCH);
  bad.scaling = SFMOE_SCALING_BLOCK_1X128;  // 96 columns: not whole 128-blocks
  EXPECT_EQ(sfmoe_plan_permute(&bad, &plan), SFMOE_ERROR_SHAPE_MISMATCH);
  bad.scaling = SFMOE_SCALING_NV_1X16;  // permute's fused quantization has no NVFP4
  bad.dtype = SFMOE_DTYPE_FP4_E2M1;
  EXPECT_EQ(sfmoe_plan_permute(&bad, &plan), SFMOE_ERROR_UNSUPPORTED);
  EXPECT_EQ(sfmoe_permute_workspace_bytes(-1, 4), -1);
  EXPECT_EQ(sfmoe_permute_workspace_bytes(4, 0), -1);
  // Sizes whose bytes pass int64 are refused, not wrapped (UBSan runs these in CI): a row count
  // whose element count fits int64 / 8 but not int64 / 32 (FP32 rows), and workspaces of
  // chunks x experts x 4 bytes past int64.
  bad = r;
  bad.num_tokens = int64_t{1} << 40;
  bad.hidden = int64_t{1} << 19;
  bad.topk = 1;
  bad.expert_capacity = 0;
  bad.dtype = SFMOE_DTYPE_FP32;
  EXPECT_EQ(sfmoe_plan_permute(&bad, &plan), SFMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(sfmoe_permute_workspace_bytes(INT64_MAX - 1, 4), -1);
  EXPECT_EQ(sfmoe_permute_workspace_bytes(int64_t{1} << 40, int64_t{1} << 30), -1);
}

TEST(LayoutPlan, WorkspaceBytes) {
  EXPECT_EQ(sfmoe_router_workspace_bytes(8192, 128), 1024 * 129 * 4);
  EXPECT_EQ(sfmoe_router_workspace_bytes(3, 8), 9 * 4);
  EXPECT_EQ(sfmoe_router_workspace_bytes(-1, 8), -1);
  EXPECT_EQ(sfmoe_router_workspace_bytes(INT64_MAX - 1, 8), -1);        // (tokens + 7 overflows)
  EXPECT_EQ(sfmoe_router_workspace_bytes(8192, int64_t{1} << 53), -1);  // (x 1024 blocks x 4)
  EXPECT_EQ(
      sfmoe_grouped_gemm_workspace_bytes(-1, SFMOE_SCALING_NONE, 1, 1, SFMOE_SCALING_NONE, 1, 1),
      -1);
}

// One allocation of total_bytes holds the tensor; the op accepts the bound descriptor.
TEST(LayoutPlan, BindCarvesOneAllocation) {
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  r.scaling = SFMOE_SCALING_BLOCK_1X128;
  r.columnwise = 1;
  r.num_groups = 3;
  r.cols = 128;
  r.input_rows = 200;
  sfmoe_grouped_tensor_plan plan = empty_plan();
  ASSERT_EQ(sfmoe_plan_grouped_quantize(&r, &plan), SFMOE_SUCCESS);
  void* base = aligned_alloc(SFMOE_PLAN_ALIGNMENT, static_cast<size_t>(plan.total_bytes));
  sfmoe_grouped_tensor t;
  ASSERT_EQ(sfmoe_grouped_tensor_bind(&plan, SFMOE_MEMORY_HOST, 0, base, &t), SFMOE_SUCCESS);
  EXPECT_EQ(static_cast<void*>(t.group_offsets), base);
  EXPECT_EQ(t.row_capacity, plan.row_capacity);
  EXPECT_EQ(t.amax, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.columnwise_scale_inv) % SFMOE_PLAN_ALIGNMENT, 0u);
  EXPECT_LE(static_cast<uint8_t*>(t.columnwise_scale_inv) + plan.columnwise_scale_inv.bytes,
            static_cast<uint8_t*>(base) + plan.total_bytes);
  EXPECT_EQ(sfmoe_grouped_tensor_validate(&t, "bound"), SFMOE_SUCCESS) << sfmoe_last_error();
  std::vector<float> x(200 * 128, 1.5f);
  std::vector<int64_t> offsets = {0, 70, 70, 200};
  sfmoe_grouped_tensor input = sfmoe_grouped_tensor_init();
  input.dtype = SFMOE_DTYPE_FP32;
  input.num_groups = 3;
  input.row_capacity = 200;
  input.cols = 128;
  input.group_offsets = offsets.data();
  input.rowwise_data = x.data();
  const sfmoe_quantize_config config = sfmoe_quantize_config_init();
  EXPECT_EQ(sfmoe_grouped_quantize(&input, &t, &config, nullptr, nullptr), SFMOE_SUCCESS)
      << sfmoe_last_error();
  EXPECT_EQ(
      sfmoe_grouped_tensor_bind(&plan, SFMOE_MEMORY_HOST, 0, static_cast<uint8_t*>(base) + 16, &t),
      SFMOE_ERROR_MISALIGNED);
  free(base);
}

}  // namespace
}  // namespace testing
}  // namespace sfmoe
