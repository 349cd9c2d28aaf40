// Layout planning: every buffer an op writes or needs, from host-known bounds alone. The one
// statement of these rules: the C API's planning functions wrap them, the ops' validation and the
// MoE layer's workspace planner call them, and the Python package asks the C API.
#pragma once

#include <stdint.h>

#include "sfmoe/activation.h"
#include "sfmoe/ep.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/sfmoe.h"
#include "src/common/ep_args.h"
#include "src/common/outcome.h"

namespace sfmoe {
namespace ops {

// The shape of one copy's scale array ([copy_rows, copy_cols] is [R, C] for the rowwise copy and
// [C, R] for the columnwise one): docs/quantization.md, "scale storage".
Outcome plan_scale_shape(sfmoe_scaling scaling, sfmoe_scale_layout layout, int64_t num_groups,
                         int64_t copy_rows, int64_t copy_cols, int32_t* ndim, int64_t shape[2]);

// The smallest row capacity a quantized output accepts for `request` (its row_capacity ignored).
Outcome quantized_capacity_bound(const sfmoe_quantize_plan_request& request, int64_t* bound);

// Rows permute's output must hold: every kept slot (min(T k, E expert_capacity) with a capacity)
// plus each expert's alignment padding.
Outcome permute_row_capacity_bound(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                   int64_t row_alignment, int64_t expert_capacity, int64_t* bound);

Outcome plan_grouped_quantize(const sfmoe_quantize_plan_request& request,
                              sfmoe_grouped_tensor_plan* plan);
// `plan` (2D blocks, both copies) less its rowwise codes: the columnwise codes with both copies'
// scales, which the quantizers write without the rowwise codes (src/common/quantize_args.h).
Outcome drop_rowwise_codes(sfmoe_grouped_tensor_plan* plan);
Outcome plan_permute(const sfmoe_permute_plan_request& request, sfmoe_permute_plan* plan);
Outcome plan_grouped_activation(const sfmoe_activation_plan_request& request,
                                sfmoe_grouped_tensor_plan* plan);

// Expert parallelism (docs/ep.md): a group's shape, each rank's handle (its routing, each part on
// the planning alignment) and the scales beside each dispatched row, from a configuration the
// caller has checked (src/api/ep.cpp); sizes overflow-checked.
struct EpHandleLayout {
  int64_t send_rank = 0, send_row = 0, offsets = 0, kept = 0, routed = 0, dropped = 0;
  int64_t route_scratch = 0;  // the device routing's per-chunk counts (ep_args.h)
  // A per-rank transport's (NCCL, EXTERNAL) parts of EpRankRouting; -1 with the loopback.
  int64_t expert_counts = -1, all_counts = -1, expert_kept = -1, all_kept = -1, bases = -1,
          expert_rows = -1, expert_position = -1, received_from = -1, received_row = -1, rank = -1;
  int64_t bytes = 0;
};
struct EpLayout {
  EpShape shape{};
  EpHandleLayout handle;
  int64_t scale_columns = 0;  // beside each dispatched row (FP8 payloads), else 0
  sfmoe_dtype scale_dtype = SFMOE_DTYPE_FP32;
  // A per-rank transport (NCCL, EXTERNAL): this process's one rank, and the staging's blocks.
  bool per_rank = false;
  int64_t pair_rows = 0;          // rows of a pair of ranks' block
  int64_t staging_row_bytes = 0;  // the widest row a block holds
  int64_t scale_bytes = 0;        // bytes of scales beside a dispatched row
};
Outcome plan_ep(const sfmoe_ep_config& config, sfmoe_memory memory, EpLayout* layout);
// A rank's routing inside its handle buffer.
EpRankRouting ep_routing_at(const EpLayout& layout, void* handle);

// Bytes of the device workspaces (no workspace on the host).
int64_t permute_workspace_bytes(int64_t num_tokens, int64_t num_experts);
int64_t router_workspace_bytes(int64_t tokens, int64_t num_experts);
// The grouped GEMM's device workspace: the kernels' per-group arguments, plus (MXFP8 / NVFP4, which
// the device emulates) both operands decoded to BF16; 0 without a usable device; -1 for bad bounds.
int64_t grouped_gemm_kernel_workspace_bytes(int64_t num_groups);
int64_t grouped_gemm_workspace_bytes(int64_t num_groups, sfmoe_scaling a_scaling, int64_t a_rows,
                                     int64_t a_cols, sfmoe_scaling b_scaling, int64_t b_rows,
                                     int64_t b_cols);

// Buffers of `plan` carved out of one SFMOE_PLAN_ALIGNMENT-aligned allocation of
// plan.total_bytes.
Outcome bind_grouped_tensor(const sfmoe_grouped_tensor_plan& plan, sfmoe_memory memory,
                            int32_t device, void* base, sfmoe_grouped_tensor* out);
// The same carving without the checks, for internal callers whose `base` is an offset of
// SFMOE_PLAN_ALIGNMENT into a buffer aligned as its memory requires (the MoE layer's workspace).
sfmoe_grouped_tensor carve_grouped_tensor(const sfmoe_grouped_tensor_plan& plan,
                                          sfmoe_memory memory, int32_t device, void* base);

}  // namespace ops
}  // namespace sfmoe
