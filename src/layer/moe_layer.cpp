// The MoE layer's plan and its two sequences (src/layer/moe_layer.h, docs/moe_layer.md).
#include "src/layer/moe_layer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "src/common/error.h"
#include "src/common/grouped_gemm_args.h"
#include "src/common/permute_args.h"
#include "src/common/quantize_args.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {
namespace layer {
namespace {

// Every region starts on the planning alignment (the ops' 16-byte rule, TMA's base alignment).
constexpr int64_t kRegionAlignment = SFMOE_PLAN_ALIGNMENT;

int64_t element_bytes(sfmoe_dtype dtype) { return sfmoe_dtype_bits(dtype) / 8; }

// Appends `bytes` to a buffer of `*total` bytes, overflow-checked.
Outcome place(int64_t bytes, int64_t* total, Region* region) {
  int64_t start = 0, end = 0;
  if (bytes < 0 || __builtin_add_overflow(*total, kRegionAlignment - 1, &start) ||
      __builtin_add_overflow(start / kRegionAlignment * kRegionAlignment, bytes, &end)) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the layer's buffers overflow int64");
  }
  region->offset = start / kRegionAlignment * kRegionAlignment;
  region->bytes = bytes;
  *total = end;
  return Outcome{};
}

// rows x cols elements of `bytes_each`, overflow-checked.
Outcome matrix_bytes(int64_t rows, int64_t cols, int64_t bytes_each, int64_t* bytes) {
  int64_t elements = 0;
  if (__builtin_mul_overflow(rows, cols, &elements) ||
      __builtin_mul_overflow(elements, bytes_each, bytes)) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the layer's buffers overflow int64");
  }
  return Outcome{};
}

template <class T>
T* at(uint8_t* base, const Region& r) {
  return reinterpret_cast<T*>(base + r.offset);
}
template <class T>
const T* at(const uint8_t* base, const Region& r) {
  return reinterpret_cast<const T*>(base + r.offset);
}
// A region the backend may not need (the device workspaces on the host): NULL when empty.
template <class T>
T* at_or_null(uint8_t* base, const Region& r) {
  return r.bytes > 0 ? at<T>(base, r) : nullptr;
}

// A step's failure: its reason named by the step.
sfmoe_status step(const char* name, sfmoe_status status) {
  if (status != SFMOE_SUCCESS) name_reported_step(name);
  return status;
}

// The shape of one of the six GEMMs: its form, each group's weight [n, k], and operand b, which
// is a weight ([E, n, k]: uniform groups of n rows) except in wgrad (rows [R, k]).
struct StepShape {
  GroupedGemmForm form;
  int64_t n, k;
  int64_t a_cols;
  bool b_is_weight;
};

StepShape step_shape(const MoeLayerShape& s, int64_t fc1_cols, GemmStep step) {
  const int64_t H = s.hidden, F = s.ffn;
  switch (step) {
    case GemmStep::kFc1Fprop:
      return {GroupedGemmForm::kFprop, fc1_cols, H, H, true};
    case GemmStep::kFc2Fprop:
      return {GroupedGemmForm::kFprop, H, F, F, true};
    case GemmStep::kFc2Dgrad:
      return {GroupedGemmForm::kDgrad, H, F, H, true};
    case GemmStep::kFc2Wgrad:
      return {GroupedGemmForm::kWgrad, H, F, H, false};
    case GemmStep::kFc1Dgrad:
      return {GroupedGemmForm::kDgrad, fc1_cols, H, fc1_cols, true};
    case GemmStep::kFc1Wgrad:
      return {GroupedGemmForm::kWgrad, fc1_cols, H, fc1_cols, false};
  }
  return {GroupedGemmForm::kFprop, 0, 0, 0, true};
}

// The quantize request of a recipe operand: expert rows [R, cols] at the layer's offsets, or a
// weight of uniform groups of `n` rows.
sfmoe_quantize_plan_request operand_request(const OperandFormat& f, const MoeLayerShape& s,
                                            int64_t row_capacity, bool weight, int64_t n,
                                            int64_t cols) {
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  r.dtype = f.dtype;
  r.scaling = f.scaling;
  r.scale_layout = f.layout;
  r.rowwise = !f.columnwise || f.rowwise_scales;  // (its codes dropped from the plan)
  r.columnwise = f.columnwise;
  r.hadamard_columnwise = f.hadamard && f.columnwise;
  r.num_groups = s.local_experts();
  r.cols = cols;
  if (weight) {
    r.input_rows = s.local_experts() * n;
    r.uniform_group_rows = n;
  } else {
    r.input_rows = row_capacity;
    r.input_row_alignment = s.row_alignment;
    r.row_alignment = s.row_alignment;
    r.row_capacity = row_capacity;
  }
  return r;
}

// Unquantized expert rows [row_capacity, cols] grouped by the permute's offsets, as a GEMM
// operand.
GemmOperand rows_operand(const void* data, sfmoe_dtype dtype, const int64_t* offsets,
                         int64_t experts, int64_t row_capacity, int64_t cols) {
  GemmOperand o{};
  GroupedQuantizeArgs& t = o.tensor;
  t.dtype = dtype;
  t.scaling = SFMOE_SCALING_NONE;
  t.scale_layout = SFMOE_SCALE_LAYOUT_COMPACT;
  t.num_groups = experts;
  t.cols = cols;
  t.row_capacity = row_capacity;
  t.row_alignment = 1;
  t.offsets = const_cast<int64_t*>(offsets);
  t.rowwise = const_cast<void*>(data);
  o.columnwise = false;
  return o;
}

// A GEMM operand's group amax under FP8 per-tensor scaling: `known` given to its quantization
// (computed before from the same values: the input is then read once), or `keep` where its
// quantization's amax is copied for a later one; both NULL otherwise, and ignored by the other
// recipes.
struct AmaxUse {
  const float* known = nullptr;
  float* keep = nullptr;
};

// The GEMMs of one call: each operand in the layer's dtype, quantized first under a quantized
// recipe (into its workspace region), then the grouped GEMM.
struct Gemm {
  const MoeLayerShape& shape;
  const MoeLayerPlan& plan;
  const ops::Backend& backend;
  const int64_t* offsets;
  int64_t rows;  // the expert rows' capacity in this call (a round's)
  uint8_t* workspace;
  sfmoe_memory memory;
  sfmoe_fault_report* word;
  void* stream;
  uint64_t rng_offset;
  const uint64_t* rng_offset_device;
  // The call's weight cache (or NULL): the weights' quantized copies live there instead of in the
  // workspace; filled: they are there already, and nothing quantizes them.
  uint8_t* weight_cache;
  bool weight_cache_filled;

  // Where the quantized copy of operand b (or a) of `step` lives: its workspace region, or a
  // weight's place in the weight cache.
  uint8_t* operand_base(GemmStep step, bool b, bool weight) const {
    if (weight && weight_cache != nullptr)
      return weight_cache + plan.weight_copies[static_cast<int>(step)].offset;
    return workspace + (b ? plan.quantized_b : plan.quantized_a).offset;
  }

  // The quantization of operand b (or a) of `step` from `data` (rows [R, cols] or a weight [E, n,
  // cols]) into its region (operand_base), under a quantized recipe.
  GroupedQuantizeArgs quantize_args(GemmStep step, bool b, const void* data, bool weight, int64_t n,
                                    int64_t cols, AmaxUse amax) const {
    const OperandFormat f = operand_format(shape.recipe, step, b);
    const int64_t R = rows, E = shape.local_experts();
    const sfmoe_grouped_tensor_plan& p = plan.operands[static_cast<int>(step)][b ? 1 : 0];
    const sfmoe_grouped_tensor t =
        ops::carve_grouped_tensor(p, memory, 0, operand_base(step, b, weight));
    GroupedQuantizeArgs q{};
    q.input = GroupedInput{data, shape.dtype, weight ? E * n : R, weight ? nullptr : offsets,
                           weight ? n : 0};
    q.num_groups = E;
    q.cols = cols;
    q.dtype = t.dtype;
    q.scaling = t.scaling;
    q.scale_layout = t.scale_layout;
    q.row_capacity = t.row_capacity;
    q.row_alignment = t.row_alignment;
    q.offsets = t.group_offsets;
    q.uniform_rows = t.group_offsets ? 0 : t.uniform_group_rows;
    q.rowwise = t.rowwise_data;
    q.rowwise_scale_inv = t.rowwise_scale_inv;
    q.columnwise = t.columnwise_data;
    q.columnwise_scale_inv = t.columnwise_scale_inv;
    q.amax = t.amax;
    q.columnwise_amax = t.columnwise_amax;
    q.config = sfmoe_quantize_config_init();
    q.config.power_of_two_scales = f.power_of_two_scales ? 1 : 0;
    q.config.hadamard_columnwise = f.hadamard && f.columnwise ? 1 : 0;
    if (f.stochastic_rounding) {
      // A stream of its own for each GEMM's gradient operand.
      q.config.stochastic_rounding = 1;
      q.config.seed = shape.seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(step) + 1);
      q.config.offset = rng_offset;
      q.config.offset_device = rng_offset_device;
    }
    q.config.group_amax = f.scaling == SFMOE_SCALING_TENSOR ? amax.known : nullptr;
    q.word = word;
    return q;
  }

  // Operand a's quantization written by the step before the GEMM instead of a pass of its own
  // (fused_rows): the expert rows' offsets are the layer's (the fused step writes none).
  GroupedQuantizeArgs fused_a(GemmStep step, int64_t cols) const {
    GroupedQuantizeArgs q = quantize_args(step, false, nullptr, false, 0, cols, {});
    q.offsets = const_cast<int64_t*>(offsets);
    return q;
  }

  // Operand b (or a) of `step` from `data` (rows [R, cols] or a weight [E, n, cols]); `written`:
  // its quantized copy is in its region already (fused_a's, written by permute or the
  // activation).
  sfmoe_status operand(GemmStep step, bool b, const void* data, bool weight, int64_t n,
                       int64_t cols, AmaxUse amax, bool written, GemmOperand* out) const {
    const OperandFormat f = operand_format(shape.recipe, step, b);
    const int64_t R = rows, E = shape.local_experts();
    if (!f.quantized) {
      *out =
          rows_operand(data, shape.dtype, weight ? nullptr : offsets, E, weight ? E * n : R, cols);
      if (weight) out->tensor.uniform_rows = n;
      return SFMOE_SUCCESS;
    }
    if (written) {
      *out = GemmOperand{fused_a(step, cols), f.columnwise};
      return SFMOE_SUCCESS;
    }
    const GroupedQuantizeArgs q = quantize_args(step, b, data, weight, n, cols, amax);
    // (a cached weight's copy holds its group amax too, which a forward keeps for its backward)
    if (!(weight && weight_cache != nullptr && weight_cache_filled))
      SFMOE_RETURN_IF_ERROR(backend.grouped_quantize(q, stream));
    if (f.scaling == SFMOE_SCALING_TENSOR && amax.keep != nullptr && amax.known == nullptr) {
      SFMOE_RETURN_IF_ERROR(backend.copy(amax.keep, q.amax, static_cast<size_t>(E) * 4, stream));
    }
    *out = GemmOperand{q, f.columnwise};
    return SFMOE_SUCCESS;
  }

  // `step` with a = rows [R, a_cols] (or, with a_row_index, a's rows gathered from `a`'s
  // a_source_rows rows) and b = the weight (or, in wgrad, rows [R, k]).
  // a_written: a's quantized copy is in its region already (fused_a).
  sfmoe_status run(GemmStep step, const void* a, const void* b, void* out, AmaxUse a_amax = {},
                   AmaxUse b_amax = {}, const int32_t* a_row_index = nullptr,
                   int64_t a_source_rows = 0, bool a_written = false) const {
    const StepShape g = step_shape(shape, plan.fc1_cols, step);
    GroupedGemmArgs args{};
    SFMOE_RETURN_IF_ERROR(operand(step, false, a, false, 0, g.a_cols, a_amax, a_written, &args.a));
    SFMOE_RETURN_IF_ERROR(operand(step, true, b, g.b_is_weight, g.n, g.k, b_amax, false, &args.b));
    const bool wgrad = g.form == GroupedGemmForm::kWgrad;
    args.form = g.form;
    args.num_groups = shape.local_experts();
    args.offsets = offsets;
    args.row_capacity = rows;
    args.n = g.n;
    args.k = g.k;
    args.out = out;
    args.out_dtype = wgrad && shape.accumulate_weight_grads ? SFMOE_DTYPE_FP32 : shape.dtype;
    args.accumulate = wgrad && shape.accumulate_weight_grads;
    // FP8 per-tensor fprop sums over K on the tensor cores alone; dgrad and wgrad promote
    // partial sums into FP32 (TransformerEngine's split: the gradients keep the precise sums).
    args.fast_accumulation =
        shape.recipe == SFMOE_MOE_RECIPE_FP8_TENSOR && g.form == GroupedGemmForm::kFprop;
    args.workspace = at_or_null<uint8_t>(workspace, plan.gemm_workspace);
    args.workspace_bytes = plan.gemm_workspace.bytes;
    args.word = word;
    args.a_row_index = a_row_index;
    args.a_source_rows = a_source_rows;
    return backend.grouped_gemm(args, stream);
  }
};

// The activation over each expert's rows of FC1's output (forward, and again in the backward).
ActivationArgs activation_args(const MoeLayerShape& s, int64_t rows, const int64_t* offsets,
                               const int64_t* kept, const void* fc1_rows, void* act_rows,
                               sfmoe_fault_report* word) {
  ActivationArgs a{};
  a.config = s.activation;
  a.groups = GroupRowsView{offsets, kept, s.local_experts()};
  a.cols = s.ffn;
  a.input = fc1_rows;
  a.input_dtype = s.dtype;
  a.output = act_rows;
  a.output_dtype = s.dtype;
  a.row_capacity = rows;
  a.word = word;
  return a;
}

// Expert rows back to token rows: out[t] = sum_i weight[t, i] rows[row_map[t, i]] (weight 1
// without probabilities: permute's backward).
UnpermuteArgs combine_args(const MoeLayerShape& s, const MoeLayerPlan& plan, int64_t tokens,
                           const void* rows, const int64_t* row_map, const float* probs, void* out,
                           sfmoe_fault_report* word) {
  UnpermuteArgs a{};
  a.rows = rows;
  a.rows_dtype = s.dtype;
  a.num_tokens = tokens;
  a.hidden = s.hidden;
  a.top_k = s.top_k;
  a.row_map = row_map;
  a.probs = probs;
  a.out = out;
  a.out_dtype = s.dtype;
  a.row_capacity = plan.row_capacity;
  a.word = word;
  return a;
}

// A quantized recipe's operand plans (plan->operands), with the row capacity raised where a
// columnwise copy runs its blocks down the rows (a multiple of the block, or of 1024 rows for the
// long compact copies: the quantize planner's default capacity).
Outcome plan_recipe_operands(const MoeLayerShape& s, MoeLayerPlan* plan) {
  for (auto& step : plan->operands) {
    for (sfmoe_grouped_tensor_plan& p : step) p = sfmoe_grouped_tensor_plan{};
  }
  if (s.recipe == SFMOE_MOE_RECIPE_BF16) return Outcome{};
  for (int pass = 0; pass < 2; ++pass) {  // the capacity first, then the plans at it
    for (int i = 0; i < kGemmSteps; ++i) {
      const GemmStep step = static_cast<GemmStep>(i);
      const StepShape g = step_shape(s, plan->fc1_cols, step);
      for (int b = 0; b < 2; ++b) {
        const bool weight = b == 1 && g.b_is_weight;
        const int64_t cols = b == 1 ? g.k : g.a_cols;
        const OperandFormat f = operand_format(s.recipe, step, b == 1);
        sfmoe_quantize_plan_request r =
            operand_request(f, s, plan->row_capacity, weight, g.n, cols);
        if (pass == 0) {
          if (weight) continue;
          r.row_capacity = 0;  // the planner's default: the smallest the quantizer accepts
          sfmoe_grouped_tensor_plan smallest{};
          smallest.struct_size = sizeof(smallest);
          SFMOE_RETURN_IF_REFUSED(ops::plan_grouped_quantize(r, &smallest));
          if (smallest.row_capacity > plan->row_capacity)
            plan->row_capacity = smallest.row_capacity;
          continue;
        }
        plan->operands[i][b].struct_size = sizeof(sfmoe_grouped_tensor_plan);
        SFMOE_RETURN_IF_REFUSED(ops::plan_grouped_quantize(r, &plan->operands[i][b]));
        if (f.rowwise_scales)
          SFMOE_RETURN_IF_REFUSED(ops::drop_rowwise_codes(&plan->operands[i][b]));
      }
    }
  }
  return Outcome{};
}

}  // namespace

sfmoe_ep_config ep_config_of(const MoeLayerShape& s) {
  sfmoe_ep_config c = sfmoe_ep_config_init();
  c.world_size = static_cast<int32_t>(s.ep_world);
  c.experts_per_rank = s.local_experts();
  c.max_tokens_per_rank = s.max_tokens;
  c.top_k = s.top_k;
  c.hidden = s.hidden;
  c.payload = s.dtype;
  c.row_alignment = s.row_alignment;
  c.receive_capacity = s.ep_receive_capacity;
  c.overflow = s.ep_overflow;
  c.spill_capacity = s.ep_spill_capacity;
  c.pair_capacity = s.ep_pair_capacity;
  c.transport = s.ep_transport;
  c.rank = s.ep_rank;
  return c;
}

namespace {

// The EXTERNAL transport's collectives, in the order the sequences below meet them: the routing's
// two all-gathers (per-expert counts, per-expert kept counts per round) and its row index, x rows
// to the experts, expert rows back (forward); d y rows, the rows' probabilities and their d probs
// back (the backward's FC2 part); x rows again and d x rows back (its FC1 part).
void plan_stages(const MoeLayerShape& s, MoeLayerPlan* plan) {
  const int64_t E = s.experts, P = plan->ep.pair_rows, row = s.hidden * element_bytes(s.dtype);
  const auto gather = [](int64_t bytes) { return ops::EpCollective{false, bytes}; };
  const auto to_all = [](int64_t bytes) { return ops::EpCollective{true, bytes}; };
  plan->forward_collectives = {gather(E * 8), gather(E * 16), to_all(P * 8), to_all(P * row),
                               to_all(P * row)};
  std::vector<ops::EpCollective>* backward = plan->backward_collectives;
  backward[SFMOE_MOE_BACKWARD_FC2] = {to_all(P * row), to_all(P * 4), to_all(P * 4)};
  backward[SFMOE_MOE_BACKWARD_FC1] = {to_all(P * row), to_all(P * row)};
  backward[SFMOE_MOE_BACKWARD_ALL] = backward[SFMOE_MOE_BACKWARD_FC2];
  backward[SFMOE_MOE_BACKWARD_ALL].insert(backward[SFMOE_MOE_BACKWARD_ALL].end(),
                                          backward[SFMOE_MOE_BACKWARD_FC1].begin(),
                                          backward[SFMOE_MOE_BACKWARD_FC1].end());
}

// The backward's peak in each order (docs/moe_layer.md, "Backward in parts"), from the plan's
// buffers and the gradients a backward makes (none for weights accumulated into main gradients),
// each a sum of at most a few buffers the plan has already bounded.
Outcome plan_backward_peaks(const MoeLayerShape& s, MoeLayerPlan* plan) {
  const int64_t T = s.max_tokens, H = s.hidden, E = s.experts, El = s.local_experts();
  const int64_t act = element_bytes(s.dtype);
  const int64_t grad = s.accumulate_weight_grads ? 0 : act;
  int64_t g1 = 0, g2 = 0, d_x = 0, d_logits = 0, rows = 0;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(El * plan->fc1_cols, H, grad, &g1));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(El * H, s.ffn, grad, &g2));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, H, act, &d_x));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, E, sizeof(float), &d_logits));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(plan->row_capacity, H, act, &rows));
  const long double S = plan->saved_bytes, W = plan->workspace_bytes,
                    W1 = plan->fc1_backward_workspace_bytes, G1 = g1, G2 = g2,
                    D = static_cast<long double>(d_x) + d_logits;
  const long double two = std::max(S + W + G2, S + G2 + W1 + G1 + D);
  const long double three = std::max(S + W + G1 + D, W + G1 + G2 + D);
  if (two > static_cast<long double>(INT64_MAX))
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the layer's buffers overflow int64");
  plan->backward_peak_two_parts = static_cast<int64_t>(two);
  plan->backward_peak_three_parts = s.expert_parallel() ? 0 : static_cast<int64_t>(three);
  plan->three_part_backward = !s.expert_parallel() && two - three > rows;
  return Outcome{};
}

// Whether the forward's FC1 gathers its x rows from the tokens (GroupedGemmArgs::a_row_index)
// instead of reading rows permute copied out: the BF16 recipe without expert parallelism (the EP
// moves and the quantized recipes write their rows anyway), on the device up to the gathering
// kernel's group bound. SFMOE_LAYER_GATHER_ROWS=1 / 0 turns it on / off; unset, it is on for host
// memory and off on the device, where the gathering kernel's cp.async producers measured slower
// than the TMA loads of a copy plus the copy itself (docs/KERNEL_NOTES.md).
bool gathers_x_rows(const MoeLayerShape& s, sfmoe_memory memory) {
  const bool device = memory == SFMOE_MEMORY_CUDA;
  const char* setting = getenv("SFMOE_LAYER_GATHER_ROWS");
  const bool wanted =
      setting != nullptr && setting[0] != '\0' ? strcmp(setting, "0") != 0 : !device;
  return wanted && !s.expert_parallel() && s.recipe == SFMOE_MOE_RECIPE_BF16 &&
         (!device || s.local_experts() <= kGatheredGemmMaxGroups);
}

}  // namespace

Outcome plan_moe_layer(const MoeLayerShape& s, sfmoe_memory memory, MoeLayerPlan* plan) {
  *plan = MoeLayerPlan{};
  const bool device = memory == SFMOE_MEMORY_CUDA;
  const bool ep = s.expert_parallel();
  if (ep && s.ep_overflow == SFMOE_EP_OVERFLOW_SPILL &&
      (!s.accumulate_weight_grads || s.recipe != SFMOE_MOE_RECIPE_BF16)) {
    return refuse(SFMOE_ERROR_UNSUPPORTED,
                  "SPILL runs the experts over two rounds of rows and adds the second round's "
                  "weight gradients to the first's: it needs accumulate_weight_grads and the BF16 "
                  "recipe");
  }
  if (ep) {
    SFMOE_RETURN_IF_REFUSED(ops::plan_ep(ep_config_of(s), memory, &plan->ep));
    plan->row_capacity = plan->ep.shape.receive_rows;
  } else {
    SFMOE_RETURN_IF_REFUSED(ops::permute_row_capacity_bound(
        s.max_tokens, s.top_k, s.experts, s.row_alignment, s.expert_capacity, &plan->row_capacity));
  }
  plan->fc1_cols = activation_is_gated(s.activation.kind) ? 2 * s.ffn : s.ffn;
  SFMOE_RETURN_IF_REFUSED(plan_recipe_operands(s, plan));
  for (int i = 0; i < kGemmSteps; ++i) {
    const bool weight = step_shape(s, plan->fc1_cols, static_cast<GemmStep>(i)).b_is_weight;
    SFMOE_RETURN_IF_REFUSED(place(weight ? plan->operands[i][1].total_bytes : 0,
                                  &plan->weight_cache_bytes, &plan->weight_copies[i]));
  }
  const int64_t R = plan->row_capacity, T = s.max_tokens, E = s.experts, k = s.top_k;
  const int64_t El = s.local_experts(), act = element_bytes(s.dtype);
  int64_t bytes = 0;
  int64_t* total = &plan->saved_bytes;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(int32_t), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->topk_ids));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(float), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->probs));
  SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->router_counts));
  if (ep) {  // the routing: the rank's EP handle
    SFMOE_RETURN_IF_REFUSED(place(plan->ep.handle.bytes, total, &plan->ep_handle));
  } else {
    SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(int64_t), &bytes));
    SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->row_map));
    SFMOE_RETURN_IF_REFUSED(place((E + 1) * 8, total, &plan->offsets));
    SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->kept));
    SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->dropped));
  }
  // FC1's output: the activation is recomputed from it, and its gradient written over it.
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, plan->fc1_cols, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->fc1_rows));
  // d probs: written by the backward's FC2 part, read by its FC1 part (the router's backward).
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(float), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_probs));
  // (TENSOR scaling only: its scales follow from the group amax alone, the same for a tensor's
  // rowwise and columnwise copies)
  const int64_t amax_bytes = s.recipe == SFMOE_MOE_RECIPE_FP8_TENSOR ? El * 4 : 0;
  SFMOE_RETURN_IF_REFUSED(place(amax_bytes, total, &plan->x_amax));
  SFMOE_RETURN_IF_REFUSED(place(amax_bytes, total, &plan->w1_amax));
  SFMOE_RETURN_IF_REFUSED(place(amax_bytes, total, &plan->w2_amax));

  total = &plan->workspace_bytes;
  SFMOE_RETURN_IF_REFUSED(place(device && !ep ? ops::permute_workspace_bytes(T, E) : 0, total,
                                &plan->permute_workspace));
  const bool losses = s.router.aux_loss_coeff > 0.0f || s.router.z_loss_coeff > 0.0f;
  SFMOE_RETURN_IF_REFUSED(place(device && losses ? ops::router_workspace_bytes(T, E) : 0, total,
                                &plan->router_workspace));
  // The GEMM workspace: the largest of the six calls' (the emulated recipes decode both
  // operands into it, each at its quantized copy's row capacity: the quantizer may round a
  // columnwise copy's capacity up, past E n rows for a weight).
  int64_t gemm = 0;
  for (int i = 0; device && i < kGemmSteps; ++i) {
    const GemmStep step = static_cast<GemmStep>(i);
    const StepShape g = step_shape(s, plan->fc1_cols, step);
    const OperandFormat fa = operand_format(s.recipe, step, false);
    const OperandFormat fb = operand_format(s.recipe, step, true);
    auto capacity = [&](int b, int64_t rows) {
      const int64_t planned = plan->operands[i][b].row_capacity;
      return planned > rows ? planned : rows;
    };
    const int64_t bytes_i =
        ops::grouped_gemm_workspace_bytes(El, fa.scaling, capacity(0, R), g.a_cols, fb.scaling,
                                          capacity(1, g.b_is_weight ? El * g.n : R), g.k);
    if (bytes_i < 0)
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the GEMM workspace overflows int64");
    gemm = bytes_i > gemm ? bytes_i : gemm;
  }
  SFMOE_RETURN_IF_REFUSED(place(gemm, total, &plan->gemm_workspace));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.hidden, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->hidden_rows));
  int64_t quantized[2] = {0, 0};
  for (int i = 0; i < kGemmSteps; ++i) {
    for (int b = 0; b < 2; ++b) {
      const int64_t need = plan->operands[i][b].total_bytes;
      quantized[b] = need > quantized[b] ? need : quantized[b];
    }
  }
  SFMOE_RETURN_IF_REFUSED(place(quantized[0], total, &plan->quantized_a));
  SFMOE_RETURN_IF_REFUSED(place(quantized[1], total, &plan->quantized_b));
  SFMOE_RETURN_IF_REFUSED(place(amax_bytes, total, &plan->d_fc1_amax));
  plan->fc1_backward_workspace_bytes = plan->workspace_bytes;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.ffn, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->ffn_rows));
  plan->gather_x_rows = gathers_x_rows(s, memory);
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(plan->gather_x_rows ? R : 0, 1, sizeof(int32_t), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->row_sources));
  // The forward's prefix of the workspace. Where the activation writes FC2's quantized input
  // itself, the forward never touches ffn_rows (the backward's: FC2's dgrad and the weighted
  // activations), so the prefix ends before it.
  const bool act_written_quantized =
      written_quantized_by_producer(operand_format(s.recipe, GemmStep::kFc2Fprop, false));
  plan->forward_workspace_bytes = act_written_quantized && plan->row_sources.bytes == 0
                                      ? plan->ffn_rows.offset
                                      : plan->workspace_bytes;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, 1, sizeof(float), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->row_probs));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_row_probs));
  // (the routing is saved first: fc1_rows' offset is its size)
  SFMOE_RETURN_IF_REFUSED(place(ep ? 0 : plan->fc1_rows.offset, total, &plan->routing_copy));
  SFMOE_RETURN_IF_REFUSED(place(amax_bytes, total, &plan->d_y_amax));
  if (s.ep_transport == SFMOE_EP_TRANSPORT_EXTERNAL) plan_stages(s, plan);
  return plan_backward_peaks(s, plan);
}

namespace {

// Where a call's expert rows are grouped: permute's offsets and counts, or the rank's EP handle's,
// in one round or (SPILL) two: each round a grouped tensor of its own rows, starting at
// first_row of the layer's row buffers.
struct Round {
  int64_t first_row, rows;
  const int64_t* offsets;
  const int64_t* kept;
};
struct Rounds {
  int count;
  Round round[2];
};

// The GEMMs of a call on one round of its rows (a forward has no rounding offsets).
Gemm round_gemm(const MoeLayerShape& s, const MoeLayerPlan& plan, const ops::Backend& backend,
                const Round& round, const MoeForwardCall& c, sfmoe_fault_report* word,
                void* stream) {
  return Gemm{s,    plan,   backend, round.offsets, round.rows,     c.workspace,          c.memory,
              word, stream, 0,       nullptr,       c.weight_cache, c.weight_cache_filled};
}
Gemm round_gemm(const MoeLayerShape& s, const MoeLayerPlan& plan, const ops::Backend& backend,
                const Round& round, const MoeBackwardCall& c, sfmoe_fault_report* word,
                void* stream) {
  return Gemm{s,
              plan,
              backend,
              round.offsets,
              round.rows,
              c.workspace,
              c.memory,
              word,
              stream,
              c.rng_offset,
              c.rng_offset_device,
              c.weight_cache,
              c.weight_cache_filled};
}
Rounds rounds_of(const MoeLayerShape& s, const MoeLayerPlan& plan, uint8_t* saved) {
  if (!s.expert_parallel()) {
    return Rounds{1,
                  {Round{0, plan.row_capacity, at<int64_t>(saved, plan.offsets),
                         at<int64_t>(saved, plan.kept)},
                   Round{}}};
  }
  const EpRankRouting routing = ops::ep_routing_at(plan.ep, saved + plan.ep_handle.offset);
  const EpShape& e = plan.ep.shape;
  if (e.rounds == 1) {
    return Rounds{1, {Round{0, plan.row_capacity, routing.offsets, routing.kept}, Round{}}};
  }
  const int64_t El = e.experts_per_rank;
  return Rounds{2,
                {Round{0, e.spill_row_base, routing.offsets, routing.kept},
                 Round{e.spill_row_base, e.receive_rows - e.spill_row_base,
                       routing.offsets + El + 1, routing.kept + El}}};
}

template <class T>
T* row_at(uint8_t* base, const Region& region, int64_t row, int64_t row_bytes) {
  return reinterpret_cast<T*>(base + region.offset + row * row_bytes);
}

sfmoe_status router_step(const MoeLayerShape& s, const MoeLayerPlan& plan, const MoeForwardCall& c,
                         const ops::Backend& backend) {
  RouterForwardArgs router{};
  router.logits = c.logits;
  router.logits_dtype = c.logits_dtype;
  router.expert_bias = c.expert_bias;
  router.tokens = c.tokens;
  router.config = s.router;
  router.topk_ids = at<int32_t>(c.saved, plan.topk_ids);
  router.probs = at<float>(c.saved, plan.probs);
  router.tokens_per_expert = at<int64_t>(c.saved, plan.router_counts);
  router.aux_loss = c.aux_loss;
  router.z_loss = c.z_loss;
  router.aux_partials = at_or_null<float>(c.workspace, plan.router_workspace);
  return step("router", backend.router_forward(router, c.stream));
}

// The experts' part of the forward on one round of a call's expert rows (x rows in hidden_rows,
// their quantized copy in FC1's operand region when x_rows_quantized, or gathered from the tokens
// through row_sources): FC1 -> activation -> FC2 (its rows over the x rows, which FC1 has read).
// x_amax_folded: the x rows' amax is in the saved state already (permute folded it). The
// activation writes FC2's quantized operand itself where the recipe lets it.
sfmoe_status ffn_forward(const MoeLayerShape& s, const MoeLayerPlan& plan, const MoeForwardCall& c,
                         const ops::Backend& backend, const Round& round, sfmoe_fault_report* word,
                         void* stream, bool x_amax_folded = false,
                         const int32_t* row_sources = nullptr, bool x_rows_quantized = false) {
  const int64_t elem = element_bytes(s.dtype), first = round.first_row;
  void* fc1_rows = row_at<uint8_t>(c.saved, plan.fc1_rows, first, plan.fc1_cols * elem);
  void* x_rows = row_at<uint8_t>(c.workspace, plan.hidden_rows, first, s.hidden * elem);
  void* act_rows = row_at<uint8_t>(c.workspace, plan.ffn_rows, first, s.ffn * elem);
  const Gemm gemm = round_gemm(s, plan, backend, round, c, word, stream);
  float* x_amax = at_or_null<float>(c.saved, plan.x_amax);
  const AmaxUse x_amax_use = x_amax_folded ? AmaxUse{x_amax, nullptr} : AmaxUse{nullptr, x_amax};
  SFMOE_RETURN_IF_ERROR(
      step("fc1", gemm.run(GemmStep::kFc1Fprop, row_sources ? c.x : x_rows, c.w1, fc1_rows,
                           x_amax_use, {nullptr, at_or_null<float>(c.saved, plan.w1_amax)},
                           row_sources, c.tokens, x_rows_quantized)));
  ActivationArgs activation =
      activation_args(s, round.rows, round.offsets, round.kept, fc1_rows, act_rows, word);
  const bool act_quantized =
      written_quantized_by_producer(operand_format(s.recipe, GemmStep::kFc2Fprop, false));
  GroupedQuantizeArgs act_codes{};
  if (act_quantized) {
    act_codes = gemm.fused_a(GemmStep::kFc2Fprop, s.ffn);
    activation.quantized = &act_codes;
  }
  SFMOE_RETURN_IF_ERROR(step("activation", backend.activation_forward(activation, stream)));
  return step("fc2", gemm.run(GemmStep::kFc2Fprop, act_rows, c.w2, x_rows, {},
                              {nullptr, at_or_null<float>(c.saved, plan.w2_amax)}, nullptr, 0,
                              act_quantized));
}

// Every round of a call's rows.
template <class Call, class Part>
sfmoe_status each_round(const MoeLayerShape& s, const MoeLayerPlan& plan, const Call& c,
                        Part part) {
  const Rounds rounds = rounds_of(s, plan, c.saved);
  for (int i = 0; i < rounds.count; ++i) SFMOE_RETURN_IF_ERROR(part(rounds.round[i]));
  return SFMOE_SUCCESS;
}

}  // namespace

sfmoe_status moe_layer_fill_weight_cache(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                         const void* w1, const void* w2, uint8_t* weight_cache,
                                         sfmoe_memory memory, sfmoe_fault_report* word,
                                         void* stream) {
  if (plan.weight_cache_bytes == 0) return SFMOE_SUCCESS;  // (BF16: no weight is quantized)
  const ops::Backend& backend = ops::backend_for(memory);
  // (weights only: no rows, offsets or workspace)
  const Gemm gemm{s,    plan,   backend, nullptr, plan.row_capacity, nullptr, memory,
                  word, stream, 0,       nullptr, weight_cache,      false};
  for (const GemmStep which :
       {GemmStep::kFc1Fprop, GemmStep::kFc2Fprop, GemmStep::kFc2Dgrad, GemmStep::kFc1Dgrad}) {
    const StepShape g = step_shape(s, plan.fc1_cols, which);
    const bool fc1 = which == GemmStep::kFc1Fprop || which == GemmStep::kFc1Dgrad;
    GemmOperand unused{};
    SFMOE_RETURN_IF_ERROR(step("weight cache", gemm.operand(which, true, fc1 ? w1 : w2, true, g.n,
                                                            g.k, {}, false, &unused)));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status moe_layer_forward(const MoeLayerShape& s, const MoeLayerPlan& plan,
                               const MoeForwardCall& c) {
  if (s.expert_parallel()) return moe_layer_forward_ranks(s, plan, &c);
  const ops::Backend& backend = ops::backend_for(c.memory);
  const int64_t T = c.tokens, E = s.experts, H = s.hidden, R = plan.row_capacity;
  SFMOE_RETURN_IF_ERROR(router_step(s, plan, c, backend));
  const int64_t* row_map = at<int64_t>(c.saved, plan.row_map);
  PermuteArgs permute{};
  permute.tokens = c.x;
  permute.dtype = s.dtype;
  permute.num_tokens = T;
  permute.hidden = H;
  permute.top_k = s.top_k;
  permute.num_experts = E;
  permute.topk_ids = at<int32_t>(c.saved, plan.topk_ids);
  permute.alignment = s.row_alignment;
  permute.expert_capacity = s.expert_capacity;
  permute.row_capacity = R;
  // (gathering FC1's rows: the routing only)
  permute.permuted = plan.gather_x_rows ? nullptr : at<uint8_t>(c.workspace, plan.hidden_rows);
  permute.expert_offsets = at<int64_t>(c.saved, plan.offsets);
  permute.row_map = at<int64_t>(c.saved, plan.row_map);
  permute.tokens_per_expert = at<int64_t>(c.saved, plan.kept);
  permute.dropped_per_expert = at<int64_t>(c.saved, plan.dropped);
  permute.word = c.word;
  permute.workspace = at_or_null<int32_t>(c.workspace, plan.permute_workspace);
  permute.group_amax = at_or_null<float>(c.saved, plan.x_amax);  // (FC1's quantization's)
  // Where the recipe lets it, permute writes FC1's quantized x rows itself (each token row
  // quantized once, for its k rows), and the unquantized rows are never written.
  const Round round = rounds_of(s, plan, c.saved).round[0];
  const bool x_rows_quantized = !plan.gather_x_rows && written_quantized_by_producer(operand_format(
                                                           s.recipe, GemmStep::kFc1Fprop, false));
  GroupedQuantizeArgs x_codes{};
  if (x_rows_quantized) {
    const Gemm gemm = round_gemm(s, plan, backend, round, c, c.word, c.stream);
    x_codes = gemm.fused_a(GemmStep::kFc1Fprop, H);
    permute.permuted = nullptr;
    permute.quantized = &x_codes;
  }
  SFMOE_RETURN_IF_ERROR(step("permute", backend.permute(permute, c.stream)));
  int32_t* row_sources = nullptr;
  if (plan.gather_x_rows) {
    row_sources = at<int32_t>(c.workspace, plan.row_sources);
    const RowSourcesArgs sources{row_map, T, s.top_k, R, row_sources, c.word};
    SFMOE_RETURN_IF_ERROR(step("permute", backend.row_sources(sources, c.stream)));
  }
  SFMOE_RETURN_IF_ERROR(ffn_forward(s, plan, c, backend, round, c.word, c.stream,
                                    permute.group_amax != nullptr, row_sources, x_rows_quantized));
  const void* fc2_rows = at<uint8_t>(c.workspace, plan.hidden_rows);
  return step("unpermute",
              backend.unpermute(combine_args(s, plan, T, fc2_rows, row_map,
                                             at<float>(c.saved, plan.probs), c.y, c.word),
                                c.stream));
}

namespace {

// Whether the work between two of the EP moves' collectives is this call's: always, but for the
// EXTERNAL transport's stages (one a call).
bool runs_here(const MoeLayerPlan& plan) {
  return plan.ep_exchange == nullptr || plan.ep_exchange->exchange->runs();
}

// The ranks' calls as the EP moves take them (the loopback: every rank in this process).
struct EpRanksOf {
  std::vector<int64_t> tokens;
  std::vector<EpRankRouting> routing;
  std::vector<const int32_t*> ids;
  std::vector<const float*> probs;
};
template <class Call>
EpRanksOf ep_ranks_of(const MoeLayerShape& s, const MoeLayerPlan& plan, const Call* calls) {
  EpRanksOf e;
  for (int64_t r = 0; r < s.local_ranks(); ++r) {
    e.tokens.push_back(calls[r].tokens);
    e.routing.push_back(ops::ep_routing_at(plan.ep, calls[r].saved + plan.ep_handle.offset));
    e.ids.push_back(at<int32_t>(calls[r].saved, plan.topk_ids));
    e.probs.push_back(at<float>(calls[r].saved, plan.probs));
  }
  return e;
}

// Each rank's token rows (from `tokens_of(r)`) to its experts' ranks, as they are (unweighted;
// padding rows zero), into each rank's hidden_rows.
template <class Call, class Tokens>
sfmoe_status ep_move_to_rows(const char* name, const MoeLayerShape& s, const MoeLayerPlan& plan,
                             const Call* calls, const EpRanksOf& e, Tokens tokens_of,
                             const ops::Backend& backend) {
  std::vector<const void*> from;
  std::vector<void*> to;
  for (int64_t r = 0; r < s.local_ranks(); ++r) {
    from.push_back(tokens_of(calls[r]));
    to.push_back(at<uint8_t>(calls[r].workspace, plan.hidden_rows));
  }
  EpScatterArgs scatter{
      plan.ep.shape, s.hidden,        e.tokens.data(),  from.data(), s.dtype, nullptr, nullptr,
      s.dtype,       nullptr,         e.routing.data(), to.data(),   s.dtype, 0,       nullptr,
      nullptr,       plan.ep_exchange};
  return step(name, backend.ep_scatter(scatter, calls[0].stream));
}

// Each rank's hidden_rows back to its tokens: the sum over each token's slots, weighted by the
// probabilities (combine) or not (dispatch's backward), into `out_of(r)`.
template <class Call, class Out>
sfmoe_status ep_move_to_tokens(const char* name, const MoeLayerShape& s, const MoeLayerPlan& plan,
                               const Call* calls, const EpRanksOf& e, bool weighted, Out out_of,
                               const ops::Backend& backend) {
  std::vector<const void*> rows;
  std::vector<void*> out;
  for (int64_t r = 0; r < s.local_ranks(); ++r) {
    rows.push_back(at<uint8_t>(calls[r].workspace, plan.hidden_rows));
    out.push_back(out_of(calls[r]));
  }
  EpGatherArgs gather{plan.ep.shape,    s.hidden,   e.tokens.data(),
                      rows.data(),      s.dtype,    weighted ? e.probs.data() : nullptr,
                      e.routing.data(), out.data(), s.dtype,
                      plan.ep_exchange};
  return step(name, backend.ep_gather(gather, calls[0].stream));
}

}  // namespace

sfmoe_status moe_layer_forward_ranks(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                     const MoeForwardCall* calls) {
  if (!s.expert_parallel()) return moe_layer_forward(s, plan, calls[0]);
  const MoeForwardCall& first = calls[0];
  const ops::Backend& backend = ops::backend_for(first.memory);
  for (int64_t r = 0; r < s.local_ranks() && runs_here(plan); ++r) {
    SFMOE_RETURN_IF_ERROR(router_step(s, plan, calls[r], backend));
  }
  const EpRanksOf e = ep_ranks_of(s, plan, calls);
  EpRouteArgs route{plan.ep.shape,
                    e.tokens.data(),
                    e.ids.data(),
                    e.routing.data(),
                    s.ep_overflow != SFMOE_EP_OVERFLOW_DROP,  // (TRAP, and SPILL past both rounds)
                    first.word,
                    plan.ep_exchange};
  SFMOE_RETURN_IF_ERROR(step("dispatch", backend.ep_route(route, first.stream)));
  SFMOE_RETURN_IF_ERROR(ep_move_to_rows(
      "dispatch", s, plan, calls, e, [](const MoeForwardCall& c) { return c.x; }, backend));
  for (int64_t r = 0; r < s.local_ranks() && runs_here(plan); ++r) {
    SFMOE_RETURN_IF_ERROR(each_round(s, plan, calls[r], [&](const Round& round) {
      return ffn_forward(s, plan, calls[r], backend, round, first.word, first.stream);
    }));
  }
  return ep_move_to_tokens(
      "combine", s, plan, calls, e, true, [](const MoeForwardCall& c) { return c.y; }, backend);
}

namespace {

// Token rows [T, H] into expert rows under the forward's row map (weight 1, padding rows zero):
// unpermute's backward without probabilities.
UnpermuteBackwardArgs gather_args(const MoeLayerShape& s, const MoeLayerPlan& plan, int64_t tokens,
                                  const void* token_rows, const int64_t* row_map,
                                  const int64_t* offsets, const int64_t* kept, void* rows,
                                  sfmoe_fault_report* word) {
  UnpermuteBackwardArgs a{};
  a.d_out = token_rows;
  a.d_out_dtype = s.dtype;
  a.rows = nullptr;
  a.rows_dtype = s.dtype;
  a.num_tokens = tokens;
  a.hidden = s.hidden;
  a.top_k = s.top_k;
  a.row_capacity = plan.row_capacity;
  a.row_map = row_map;
  a.probs = nullptr;
  a.d_rows = rows;
  a.d_rows_dtype = s.dtype;
  a.d_probs = nullptr;
  a.offsets = offsets;
  a.group_rows = kept;
  a.num_groups = s.experts;
  a.word = word;
  return a;
}

SlotValuesArgs slot_values_args(const MoeLayerPlan& plan, int64_t slots, const int64_t* row_map,
                                bool to_rows, const float* in, float* out,
                                sfmoe_fault_report* word) {
  SlotValuesArgs a{};
  a.row_map = row_map;
  a.slots = slots;
  a.row_capacity = plan.row_capacity;
  a.to_rows = to_rows;
  a.in = in;
  a.out = out;
  a.word = word;
  return a;
}

// The experts' part of the backward's FC2 part before its wgrad, on one round of a call's expert
// rows (d y rows in hidden_rows, each row's probability in row_probs): FC2 dgrad -> the weighted
// activation backward (d FC1 over FC1's saved rows, each row's d prob into d_row_probs, the
// weighted activations into ffn_rows).
sfmoe_status ffn_backward_fc2_dgrad(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                    const MoeBackwardCall& c, const ops::Backend& backend,
                                    const Round& round, sfmoe_fault_report* word, void* stream) {
  const int64_t elem = element_bytes(s.dtype), first = round.first_row;
  void* fc1_rows = row_at<uint8_t>(c.saved, plan.fc1_rows, first, plan.fc1_cols * elem);
  void* d_fc1_rows = fc1_rows;  // the activation's backward writes in place
  void* hidden_rows = row_at<uint8_t>(c.workspace, plan.hidden_rows, first, s.hidden * elem);
  void* ffn_rows = row_at<uint8_t>(c.workspace, plan.ffn_rows, first, s.ffn * elem);
  const Gemm gemm = round_gemm(s, plan, backend, round, c, word, stream);
  SFMOE_RETURN_IF_ERROR(
      step("fc2 dgrad", gemm.run(GemmStep::kFc2Dgrad, hidden_rows, c.w2, ffn_rows,
                                 {nullptr, at_or_null<float>(c.workspace, plan.d_y_amax)},
                                 {at_or_null<float>(c.saved, plan.w2_amax), nullptr})));

  // With y_r = p_r act(h_r) W2: d act = p_r g_r and d p_r = <g_r, act(h_r)> for g = d y_r W2
  // (FC2's dgrad); the weighted activations p_r act(h_r) replace g as FC2's wgrad operand.
  ActivationBackwardArgs d_activation{};
  d_activation.config = s.activation;
  d_activation.groups = GroupRowsView{round.offsets, round.kept, s.local_experts()};
  d_activation.cols = s.ffn;
  d_activation.input = fc1_rows;
  d_activation.input_dtype = s.dtype;
  d_activation.d_output = ffn_rows;
  d_activation.d_output_dtype = s.dtype;
  d_activation.d_input = d_fc1_rows;
  d_activation.d_input_dtype = s.dtype;
  d_activation.row_capacity = round.rows;
  d_activation.word = word;
  d_activation.row_weights = row_at<float>(c.workspace, plan.row_probs, first, 4);
  d_activation.d_row_weights = row_at<float>(c.workspace, plan.d_row_probs, first, 4);
  d_activation.weighted_output = ffn_rows;
  return step("activation backward", backend.activation_backward(d_activation, stream));
}

// FC2's wgrad on one round: d y rows (hidden_rows) against the weighted activations (ffn_rows).
sfmoe_status ffn_backward_fc2_wgrad(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                    const MoeBackwardCall& c, const ops::Backend& backend,
                                    const Round& round, sfmoe_fault_report* word, void* stream) {
  const int64_t elem = element_bytes(s.dtype), first = round.first_row;
  void* hidden_rows = row_at<uint8_t>(c.workspace, plan.hidden_rows, first, s.hidden * elem);
  void* ffn_rows = row_at<uint8_t>(c.workspace, plan.ffn_rows, first, s.ffn * elem);
  const Gemm gemm = round_gemm(s, plan, backend, round, c, word, stream);
  return step("fc2 wgrad", gemm.run(GemmStep::kFc2Wgrad, hidden_rows, ffn_rows, c.d_w2,
                                    {at_or_null<float>(c.workspace, plan.d_y_amax), nullptr}));
}

// The experts' part of the backward's FC2 part on one round: the above in turn.
sfmoe_status ffn_backward_fc2(const MoeLayerShape& s, const MoeLayerPlan& plan,
                              const MoeBackwardCall& c, const ops::Backend& backend,
                              const Round& round, sfmoe_fault_report* word, void* stream) {
  SFMOE_RETURN_IF_ERROR(ffn_backward_fc2_dgrad(s, plan, c, backend, round, word, stream));
  return ffn_backward_fc2_wgrad(s, plan, c, backend, round, word, stream);
}

// The experts' part of the backward's FC1 part on one round (x rows in hidden_rows): FC1 wgrad,
// then FC1 dgrad over the x rows (d x rows).
sfmoe_status ffn_backward_fc1(const MoeLayerShape& s, const MoeLayerPlan& plan,
                              const MoeBackwardCall& c, const ops::Backend& backend,
                              const Round& round, sfmoe_fault_report* word, void* stream) {
  const int64_t elem = element_bytes(s.dtype), first = round.first_row;
  const void* d_fc1_rows = row_at<uint8_t>(c.saved, plan.fc1_rows, first, plan.fc1_cols * elem);
  void* hidden_rows = row_at<uint8_t>(c.workspace, plan.hidden_rows, first, s.hidden * elem);
  float* d_fc1_amax = at_or_null<float>(c.workspace, plan.d_fc1_amax);
  const float* x_amax = at_or_null<float>(c.saved, plan.x_amax);
  const Gemm gemm = round_gemm(s, plan, backend, round, c, word, stream);
  SFMOE_RETURN_IF_ERROR(
      step("fc1 wgrad", gemm.run(GemmStep::kFc1Wgrad, d_fc1_rows, hidden_rows, c.d_w1,
                                 {nullptr, d_fc1_amax}, {x_amax, nullptr})));
  return step("fc1 dgrad",
              gemm.run(GemmStep::kFc1Dgrad, d_fc1_rows, c.w1, hidden_rows, {d_fc1_amax, nullptr},
                       {at_or_null<float>(c.saved, plan.w1_amax), nullptr}));
}

sfmoe_status router_backward_step(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                  const MoeBackwardCall& c, const ops::Backend& backend) {
  RouterBackwardArgs router{};
  router.logits = c.logits;
  router.logits_dtype = c.logits_dtype;
  router.topk_ids = at<int32_t>(c.saved, plan.topk_ids);
  router.tokens_per_expert = at<int64_t>(c.saved, plan.router_counts);
  router.tokens = c.tokens;
  router.config = s.router;
  router.d_probs = at<float>(c.saved, plan.d_probs);
  router.d_aux_loss = c.d_aux_loss;
  router.d_z_loss = c.d_z_loss;
  router.d_logits = c.d_logits;
  router.word = c.word;
  return step("router backward", backend.router_backward(router, c.stream));
}

// The backward's FC2 part (or, with `wgrad` false, FC2_DGRAD's): d y rows -> the experts' part ->
// d probs into the saved state.
sfmoe_status backward_fc2(const MoeLayerShape& s, const MoeLayerPlan& plan,
                          const MoeBackwardCall& c, const ops::Backend& backend, bool wgrad) {
  const int64_t T = c.tokens;
  const float* probs = at<float>(c.saved, plan.probs);
  const int64_t* row_map = at<int64_t>(c.saved, plan.row_map);
  const Round rows = rounds_of(s, plan, c.saved).round[0];
  float* d_probs = at<float>(c.saved, plan.d_probs);
  void* hidden_rows = at<uint8_t>(c.workspace, plan.hidden_rows);
  float* row_probs = at<float>(c.workspace, plan.row_probs);
  float* d_row_probs = at<float>(c.workspace, plan.d_row_probs);
  const int64_t slots = T * s.top_k;

  // d y into expert rows, unweighted: the probabilities scale the activations instead (below),
  // so that d probs come from FC2's dgrad and the activations, not from FC2's saved output.
  SFMOE_RETURN_IF_ERROR(step(
      "d y gather", backend.unpermute_backward(gather_args(s, plan, T, c.d_y, row_map, rows.offsets,
                                                           rows.kept, hidden_rows, c.word),
                                               c.stream)));
  SFMOE_RETURN_IF_ERROR(
      step("row probabilities",
           backend.slot_values(
               slot_values_args(plan, slots, row_map, true, probs, row_probs, c.word), c.stream)));
  if (wgrad) {
    SFMOE_RETURN_IF_ERROR(ffn_backward_fc2(s, plan, c, backend, rows, c.word, c.stream));
  } else {
    SFMOE_RETURN_IF_ERROR(ffn_backward_fc2_dgrad(s, plan, c, backend, rows, c.word, c.stream));
    // The routing for FC2_WGRAD, which runs when `saved` may be gone.
    SFMOE_RETURN_IF_ERROR(
        step("routing copy", backend.copy(at<uint8_t>(c.workspace, plan.routing_copy), c.saved,
                                          plan.routing_copy.bytes, c.stream)));
  }
  return step("d probs", backend.slot_values(slot_values_args(plan, slots, row_map, false,
                                                              d_row_probs, d_probs, c.word),
                                             c.stream));
}

// The FC2_WGRAD part: d y gathered again (FC1 part has used the rows), then FC2's wgrad against
// the weighted activations FC2_DGRAD left, the routing from its copy.
sfmoe_status backward_fc2_wgrad(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                const MoeBackwardCall& c, const ops::Backend& backend) {
  uint8_t* routing = at<uint8_t>(c.workspace, plan.routing_copy);  // laid out as `saved`
  const int64_t* row_map = at<int64_t>(routing, plan.row_map);
  const Round rows = rounds_of(s, plan, routing).round[0];
  void* hidden_rows = at<uint8_t>(c.workspace, plan.hidden_rows);
  SFMOE_RETURN_IF_ERROR(
      step("d y gather",
           backend.unpermute_backward(gather_args(s, plan, c.tokens, c.d_y, row_map, rows.offsets,
                                                  rows.kept, hidden_rows, c.word),
                                      c.stream)));
  return ffn_backward_fc2_wgrad(s, plan, c, backend, rows, c.word, c.stream);
}

// The backward's FC1 part: x rows again -> the experts' part -> permute backward -> router
// backward (from the d probs the FC2 part left in the saved state).
sfmoe_status backward_fc1(const MoeLayerShape& s, const MoeLayerPlan& plan,
                          const MoeBackwardCall& c, const ops::Backend& backend) {
  const int64_t T = c.tokens;
  const int64_t* row_map = at<int64_t>(c.saved, plan.row_map);
  const Round rows = rounds_of(s, plan, c.saved).round[0];
  void* hidden_rows = at<uint8_t>(c.workspace, plan.hidden_rows);

  // x into expert rows again (cheaper to gather than to keep between the calls), then FC1's
  // wgrad reads them before its dgrad overwrites them with d x rows.
  SFMOE_RETURN_IF_ERROR(step(
      "x gather", backend.unpermute_backward(gather_args(s, plan, T, c.x, row_map, rows.offsets,
                                                         rows.kept, hidden_rows, c.word),
                                             c.stream)));
  SFMOE_RETURN_IF_ERROR(ffn_backward_fc1(s, plan, c, backend, rows, c.word, c.stream));
  // Permute's backward: each token's k rows summed (weight 1).
  SFMOE_RETURN_IF_ERROR(
      step("permute backward",
           backend.unpermute(combine_args(s, plan, T, hidden_rows, row_map, nullptr, c.d_x, c.word),
                             c.stream)));
  return router_backward_step(s, plan, c, backend);
}

// One value per slot between each rank's slots and its experts' rows (workspace regions).
sfmoe_status ep_slot_values(const char* name, const MoeLayerShape& s, const MoeLayerPlan& plan,
                            const MoeBackwardCall* calls, const EpRanksOf& e, bool to_rows,
                            const ops::Backend& backend) {
  std::vector<const float*> in;
  std::vector<float*> out;
  for (int64_t r = 0; r < s.local_ranks(); ++r) {
    uint8_t* saved = calls[r].saved;
    uint8_t* workspace = calls[r].workspace;
    in.push_back(to_rows ? at<float>(saved, plan.probs) : at<float>(workspace, plan.d_row_probs));
    out.push_back(to_rows ? at<float>(workspace, plan.row_probs) : at<float>(saved, plan.d_probs));
  }
  EpSlotValuesArgs a{plan.ep.shape, e.tokens.data(), e.routing.data(), to_rows,
                     in.data(),     out.data(),      plan.ep_exchange};
  return step(name, backend.ep_slot_values(a, calls[0].stream));
}

}  // namespace

sfmoe_status moe_layer_backward(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                const MoeBackwardCall& c) {
  if (s.expert_parallel()) return moe_layer_backward_ranks(s, plan, &c);
  const ops::Backend& backend = ops::backend_for(c.memory);
  switch (c.part) {
    case SFMOE_MOE_BACKWARD_ALL:
      SFMOE_RETURN_IF_ERROR(backward_fc2(s, plan, c, backend, true));
      return backward_fc1(s, plan, c, backend);
    case SFMOE_MOE_BACKWARD_FC2:
      return backward_fc2(s, plan, c, backend, true);
    case SFMOE_MOE_BACKWARD_FC1:
      return backward_fc1(s, plan, c, backend);
    case SFMOE_MOE_BACKWARD_FC2_DGRAD:
      return backward_fc2(s, plan, c, backend, false);
    case SFMOE_MOE_BACKWARD_FC2_WGRAD:
      return backward_fc2_wgrad(s, plan, c, backend);
  }
  return SFMOE_ERROR_INVALID_ARGUMENT;  // (the API checks the part)
}

sfmoe_status moe_layer_backward_ranks(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                      const MoeBackwardCall* calls) {
  if (!s.expert_parallel()) return moe_layer_backward(s, plan, calls[0]);
  const MoeBackwardCall& first = calls[0];
  const ops::Backend& backend = ops::backend_for(first.memory);
  const EpRanksOf e = ep_ranks_of(s, plan, calls);
  if (first.part != SFMOE_MOE_BACKWARD_FC1) {
    // d y to the experts' rows as dispatch moved x, each row's probability beside it.
    SFMOE_RETURN_IF_ERROR(ep_move_to_rows(
        "d y dispatch", s, plan, calls, e, [](const MoeBackwardCall& c) { return c.d_y; },
        backend));
    SFMOE_RETURN_IF_ERROR(ep_slot_values("row probabilities", s, plan, calls, e, true, backend));
    for (int64_t r = 0; r < s.local_ranks() && runs_here(plan); ++r) {
      SFMOE_RETURN_IF_ERROR(each_round(s, plan, calls[r], [&](const Round& round) {
        return ffn_backward_fc2(s, plan, calls[r], backend, round, first.word, first.stream);
      }));
    }
    SFMOE_RETURN_IF_ERROR(ep_slot_values("d probs", s, plan, calls, e, false, backend));
  }
  if (first.part != SFMOE_MOE_BACKWARD_FC2) {
    SFMOE_RETURN_IF_ERROR(ep_move_to_rows(
        "x dispatch", s, plan, calls, e, [](const MoeBackwardCall& c) { return c.x; }, backend));
    for (int64_t r = 0; r < s.local_ranks() && runs_here(plan); ++r) {
      SFMOE_RETURN_IF_ERROR(each_round(s, plan, calls[r], [&](const Round& round) {
        return ffn_backward_fc1(s, plan, calls[r], backend, round, first.word, first.stream);
      }));
    }
    // Dispatch's backward: each token's slots' d x rows summed (weight 1).
    SFMOE_RETURN_IF_ERROR(ep_move_to_tokens(
        "dispatch backward", s, plan, calls, e, false,
        [](const MoeBackwardCall& c) { return c.d_x; }, backend));
    for (int64_t r = 0; r < s.local_ranks() && runs_here(plan); ++r) {
      SFMOE_RETURN_IF_ERROR(router_backward_step(s, plan, calls[r], backend));
    }
  }
  return SFMOE_SUCCESS;
}

namespace {

// A stage of `collectives`: the plan's exchange replaced by the stage's (its blocks the caller's
// buffers), the sequence run, every collective met.
template <class Run>
sfmoe_status run_stage(const MoeLayerShape& s, const MoeLayerPlan& plan, sfmoe_memory memory,
                       const std::vector<ops::EpCollective>& collectives, const MoeStage& stage,
                       Run run) {
  ops::EpStagedExchange staged(ops::backend_for(memory), collectives, s.ep_world, stage.index,
                               stage.sent, stage.received);
  EpRankExchange view{};
  view.exchange = &staged;
  view.rank = 0;
  view.rank_device = stage.rank;
  view.pair_rows = plan.ep.pair_rows;
  view.staging_row_bytes = plan.ep.staging_row_bytes;
  view.send_rows = stage.sent;
  view.recv_rows = const_cast<void*>(stage.received);
  view.send_values = static_cast<float*>(stage.sent);
  view.recv_values = static_cast<float*>(const_cast<void*>(stage.received));
  view.send_index = static_cast<int64_t*>(stage.sent);
  MoeLayerPlan staged_plan = plan;
  staged_plan.ep_exchange = &view;
  SFMOE_RETURN_IF_ERROR(run(staged_plan));
  return staged.finish();
}

}  // namespace

sfmoe_status moe_layer_forward_stage(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                     const MoeForwardCall& call, const MoeStage& stage) {
  return run_stage(s, plan, call.memory, plan.forward_collectives, stage,
                   [&](const MoeLayerPlan& p) { return moe_layer_forward_ranks(s, p, &call); });
}

sfmoe_status moe_layer_backward_stage(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                      const MoeBackwardCall& call, const MoeStage& stage) {
  return run_stage(s, plan, call.memory, plan.backward_collectives[call.part], stage,
                   [&](const MoeLayerPlan& p) { return moe_layer_backward_ranks(s, p, &call); });
}

}  // namespace layer
}  // namespace sfmoe
