// The MoE layer's plan and its two sequences (src/layer/moe_layer.h, docs/moe_layer.md).
#include "src/layer/moe_layer.h"

#include <string.h>

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

// Expert weights [E, n, k] as a GEMM operand (E uniform groups of n rows).
GemmOperand weights_operand(const void* data, sfmoe_dtype dtype, int64_t experts, int64_t n,
                            int64_t k) {
  GemmOperand o = rows_operand(data, dtype, nullptr, experts, experts * n, k);
  o.tensor.uniform_rows = n;
  return o;
}

struct Gemm {
  const MoeLayerShape& shape;
  const MoeLayerPlan& plan;
  const int64_t* offsets;
  uint8_t* workspace;
  sfmoe_fault_report* word;

  GroupedGemmArgs args(GroupedGemmForm form, int64_t n, int64_t k, GemmOperand a, GemmOperand b,
                       void* out, sfmoe_dtype out_dtype, bool accumulate) const {
    GroupedGemmArgs g{};
    g.form = form;
    g.num_groups = shape.experts;
    g.offsets = offsets;
    g.row_capacity = plan.row_capacity;
    g.n = n;
    g.k = k;
    g.a = a;
    g.b = b;
    g.out = out;
    g.out_dtype = out_dtype;
    g.accumulate = accumulate;
    g.fast_accumulation = false;
    g.workspace = at_or_null<uint8_t>(workspace, plan.gemm_workspace);
    g.workspace_bytes = plan.gemm_workspace.bytes;
    g.word = word;
    return g;
  }
  // Y [R, n] = X [R, k] W^T, W [E, n, k].
  GroupedGemmArgs fprop(const void* x, const void* w, int64_t n, int64_t k, void* y) const {
    return args(GroupedGemmForm::kFprop, n, k,
                rows_operand(x, shape.dtype, offsets, shape.experts, plan.row_capacity, k),
                weights_operand(w, shape.dtype, shape.experts, n, k), y, shape.dtype, false);
  }
  // dX [R, k] = dY [R, n] W, W [E, n, k].
  GroupedGemmArgs dgrad(const void* dy, const void* w, int64_t n, int64_t k, void* dx) const {
    return args(GroupedGemmForm::kDgrad, n, k,
                rows_operand(dy, shape.dtype, offsets, shape.experts, plan.row_capacity, n),
                weights_operand(w, shape.dtype, shape.experts, n, k), dx, shape.dtype, false);
  }
  // dW [E, n, k] (+)= dY_e^T X_e over each expert's rows.
  GroupedGemmArgs wgrad(const void* dy, const void* x, int64_t n, int64_t k, void* dw) const {
    return args(GroupedGemmForm::kWgrad, n, k,
                rows_operand(dy, shape.dtype, offsets, shape.experts, plan.row_capacity, n),
                rows_operand(x, shape.dtype, offsets, shape.experts, plan.row_capacity, k), dw,
                shape.accumulate_weight_grads ? SFMOE_DTYPE_FP32 : shape.dtype,
                shape.accumulate_weight_grads);
  }
};

// The activation over each expert's rows of FC1's output (forward, and again in the backward).
ActivationArgs activation_args(const MoeLayerShape& s, const MoeLayerPlan& plan,
                               const int64_t* offsets, const int64_t* kept, const void* fc1_rows,
                               void* act_rows, sfmoe_fault_report* word) {
  ActivationArgs a{};
  a.config = s.activation;
  a.groups = GroupRowsView{offsets, kept, s.experts};
  a.cols = s.ffn;
  a.input = fc1_rows;
  a.input_dtype = s.dtype;
  a.output = act_rows;
  a.output_dtype = s.dtype;
  a.row_capacity = plan.row_capacity;
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

}  // namespace

Outcome plan_moe_layer(const MoeLayerShape& s, sfmoe_memory memory, MoeLayerPlan* plan) {
  *plan = MoeLayerPlan{};
  const bool device = memory == SFMOE_MEMORY_CUDA;
  SFMOE_RETURN_IF_REFUSED(ops::permute_row_capacity_bound(
      s.max_tokens, s.top_k, s.experts, s.row_alignment, s.expert_capacity, &plan->row_capacity));
  const int64_t R = plan->row_capacity, T = s.max_tokens, E = s.experts, k = s.top_k;
  plan->fc1_cols = activation_is_gated(s.activation.kind) ? 2 * s.ffn : s.ffn;
  const int64_t act = element_bytes(s.dtype);
  int64_t bytes = 0;
  int64_t* total = &plan->saved_bytes;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(int32_t), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->topk_ids));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(float), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->probs));
  SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->router_counts));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(int64_t), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->row_map));
  SFMOE_RETURN_IF_REFUSED(place((E + 1) * 8, total, &plan->offsets));
  SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->kept));
  SFMOE_RETURN_IF_REFUSED(place(E * 8, total, &plan->dropped));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.hidden, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->x_rows));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, plan->fc1_cols, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->fc1_rows));
  // FC2's rows: unpermute's backward takes d probs as their dot products with d y.
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.hidden, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->fc2_rows));

  total = &plan->workspace_bytes;
  SFMOE_RETURN_IF_REFUSED(
      place(device ? ops::permute_workspace_bytes(T, E) : 0, total, &plan->permute_workspace));
  const bool losses = s.router.aux_loss_coeff > 0.0f || s.router.z_loss_coeff > 0.0f;
  SFMOE_RETURN_IF_REFUSED(place(device && losses ? ops::router_workspace_bytes(T, E) : 0, total,
                                &plan->router_workspace));
  const int64_t gemm =
      device ? ops::grouped_gemm_workspace_bytes(E, SFMOE_SCALING_NONE, R, s.hidden,
                                                 SFMOE_SCALING_NONE, E * plan->fc1_cols, s.hidden)
             : 0;
  if (gemm < 0) return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the GEMM workspace overflows int64");
  SFMOE_RETURN_IF_REFUSED(place(gemm, total, &plan->gemm_workspace));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.ffn, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->act_rows));
  plan->forward_workspace_bytes = plan->workspace_bytes;
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(T, k, sizeof(float), &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_probs));
  // d FC2 rows [R, H], later reused for d x rows (FC1's dgrad, [R, H] too).
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.hidden, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_fc2_rows));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, s.ffn, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_act_rows));
  SFMOE_RETURN_IF_REFUSED(matrix_bytes(R, plan->fc1_cols, act, &bytes));
  SFMOE_RETURN_IF_REFUSED(place(bytes, total, &plan->d_fc1_rows));
  return Outcome{};
}

sfmoe_status moe_layer_forward(const MoeLayerShape& s, const MoeLayerPlan& plan,
                               const MoeForwardCall& c) {
  const ops::Backend& backend = ops::backend_for(c.memory);
  const int64_t T = c.tokens, E = s.experts, H = s.hidden, R = plan.row_capacity;
  int32_t* topk_ids = at<int32_t>(c.saved, plan.topk_ids);
  float* probs = at<float>(c.saved, plan.probs);
  int64_t* router_counts = at<int64_t>(c.saved, plan.router_counts);
  int64_t* row_map = at<int64_t>(c.saved, plan.row_map);
  int64_t* offsets = at<int64_t>(c.saved, plan.offsets);
  int64_t* kept = at<int64_t>(c.saved, plan.kept);
  int64_t* dropped = at<int64_t>(c.saved, plan.dropped);
  void* x_rows = at<uint8_t>(c.saved, plan.x_rows);
  void* fc1_rows = at<uint8_t>(c.saved, plan.fc1_rows);
  void* fc2_rows = at<uint8_t>(c.saved, plan.fc2_rows);
  void* act_rows = at<uint8_t>(c.workspace, plan.act_rows);

  RouterForwardArgs router{};
  router.logits = c.logits;
  router.logits_dtype = c.logits_dtype;
  router.expert_bias = c.expert_bias;
  router.tokens = T;
  router.config = s.router;
  router.topk_ids = topk_ids;
  router.probs = probs;
  router.tokens_per_expert = router_counts;
  router.aux_loss = c.aux_loss;
  router.z_loss = c.z_loss;
  router.aux_partials = at_or_null<float>(c.workspace, plan.router_workspace);
  SFMOE_RETURN_IF_ERROR(step("router", backend.router_forward(router, c.stream)));

  PermuteArgs permute{};
  permute.tokens = c.x;
  permute.dtype = s.dtype;
  permute.num_tokens = T;
  permute.hidden = H;
  permute.top_k = s.top_k;
  permute.num_experts = E;
  permute.topk_ids = topk_ids;
  permute.alignment = s.row_alignment;
  permute.expert_capacity = s.expert_capacity;
  permute.row_capacity = R;
  permute.permuted = x_rows;
  permute.expert_offsets = offsets;
  permute.row_map = row_map;
  permute.tokens_per_expert = kept;
  permute.dropped_per_expert = dropped;
  permute.word = c.word;
  permute.workspace = at_or_null<int32_t>(c.workspace, plan.permute_workspace);
  SFMOE_RETURN_IF_ERROR(step("permute", backend.permute(permute, c.stream)));

  const Gemm gemm{s, plan, offsets, c.workspace, c.word};
  SFMOE_RETURN_IF_ERROR(step(
      "fc1", backend.grouped_gemm(gemm.fprop(x_rows, c.w1, plan.fc1_cols, H, fc1_rows), c.stream)));

  SFMOE_RETURN_IF_ERROR(
      step("activation",
           backend.activation_forward(
               activation_args(s, plan, offsets, kept, fc1_rows, act_rows, c.word), c.stream)));

  SFMOE_RETURN_IF_ERROR(
      step("fc2", backend.grouped_gemm(gemm.fprop(act_rows, c.w2, H, s.ffn, fc2_rows), c.stream)));

  return step(
      "unpermute",
      backend.unpermute(combine_args(s, plan, T, fc2_rows, row_map, probs, c.y, c.word), c.stream));
}

sfmoe_status moe_layer_backward(const MoeLayerShape& s, const MoeLayerPlan& plan,
                                const MoeBackwardCall& c) {
  const ops::Backend& backend = ops::backend_for(c.memory);
  const int64_t T = c.tokens, E = s.experts, H = s.hidden, R = plan.row_capacity;
  const int32_t* topk_ids = at<int32_t>(c.saved, plan.topk_ids);
  const float* probs = at<float>(c.saved, plan.probs);
  const int64_t* router_counts = at<int64_t>(c.saved, plan.router_counts);
  const int64_t* row_map = at<int64_t>(c.saved, plan.row_map);
  const int64_t* offsets = at<int64_t>(c.saved, plan.offsets);
  const int64_t* kept = at<int64_t>(c.saved, plan.kept);
  const void* x_rows = at<uint8_t>(c.saved, plan.x_rows);
  const void* fc1_rows = at<uint8_t>(c.saved, plan.fc1_rows);
  const void* fc2_rows = at<uint8_t>(c.saved, plan.fc2_rows);
  void* act_rows = at<uint8_t>(c.workspace, plan.act_rows);
  float* d_probs = at<float>(c.workspace, plan.d_probs);
  void* d_fc2_rows = at<uint8_t>(c.workspace, plan.d_fc2_rows);
  void* d_x_rows = d_fc2_rows;  // FC1's dgrad writes here once FC2's wgrad has read d_fc2_rows
  void* d_act_rows = at<uint8_t>(c.workspace, plan.d_act_rows);
  void* d_fc1_rows = at<uint8_t>(c.workspace, plan.d_fc1_rows);

  UnpermuteBackwardArgs combine{};
  combine.d_out = c.d_y;
  combine.d_out_dtype = s.dtype;
  combine.rows = fc2_rows;
  combine.rows_dtype = s.dtype;
  combine.num_tokens = T;
  combine.hidden = H;
  combine.top_k = s.top_k;
  combine.row_capacity = R;
  combine.row_map = row_map;
  combine.probs = probs;
  combine.d_rows = d_fc2_rows;
  combine.d_rows_dtype = s.dtype;
  combine.d_probs = d_probs;
  combine.offsets = offsets;
  combine.group_rows = kept;
  combine.num_groups = E;
  combine.word = c.word;
  SFMOE_RETURN_IF_ERROR(step("unpermute backward", backend.unpermute_backward(combine, c.stream)));

  const Gemm gemm{s, plan, offsets, c.workspace, c.word};
  SFMOE_RETURN_IF_ERROR(
      step("fc2 dgrad",
           backend.grouped_gemm(gemm.dgrad(d_fc2_rows, c.w2, H, s.ffn, d_act_rows), c.stream)));

  // The activation again from FC1's saved rows (its output is not kept between the calls).
  SFMOE_RETURN_IF_ERROR(
      step("activation recompute",
           backend.activation_forward(
               activation_args(s, plan, offsets, kept, fc1_rows, act_rows, c.word), c.stream)));
  SFMOE_RETURN_IF_ERROR(
      step("fc2 wgrad",
           backend.grouped_gemm(gemm.wgrad(d_fc2_rows, act_rows, H, s.ffn, c.d_w2), c.stream)));

  ActivationBackwardArgs d_activation{};
  d_activation.config = s.activation;
  d_activation.groups = GroupRowsView{offsets, kept, E};
  d_activation.cols = s.ffn;
  d_activation.input = fc1_rows;
  d_activation.input_dtype = s.dtype;
  d_activation.d_output = d_act_rows;
  d_activation.d_output_dtype = s.dtype;
  d_activation.d_input = d_fc1_rows;
  d_activation.d_input_dtype = s.dtype;
  d_activation.row_capacity = R;
  d_activation.word = c.word;
  SFMOE_RETURN_IF_ERROR(
      step("activation backward", backend.activation_backward(d_activation, c.stream)));

  SFMOE_RETURN_IF_ERROR(step(
      "fc1 dgrad",
      backend.grouped_gemm(gemm.dgrad(d_fc1_rows, c.w1, plan.fc1_cols, H, d_x_rows), c.stream)));
  SFMOE_RETURN_IF_ERROR(step(
      "fc1 wgrad",
      backend.grouped_gemm(gemm.wgrad(d_fc1_rows, x_rows, plan.fc1_cols, H, c.d_w1), c.stream)));

  // Permute's backward: each token's k rows summed (weight 1).
  SFMOE_RETURN_IF_ERROR(
      step("permute backward",
           backend.unpermute(combine_args(s, plan, T, d_x_rows, row_map, nullptr, c.d_x, c.word),
                             c.stream)));

  RouterBackwardArgs router{};
  router.logits = c.logits;
  router.logits_dtype = c.logits_dtype;
  router.topk_ids = topk_ids;
  router.tokens_per_expert = router_counts;
  router.tokens = T;
  router.config = s.router;
  router.d_probs = d_probs;
  router.d_aux_loss = c.d_aux_loss;
  router.d_z_loss = c.d_z_loss;
  router.d_logits = c.d_logits;
  router.word = c.word;
  return step("router backward", backend.router_backward(router, c.stream));
}

}  // namespace layer
}  // namespace sfmoe
