// See plan_binding.h.
#include "plan_binding.h"

#include <nanobind/stl/string.h>
#include <stdint.h>
#include <string.h>

#include <string>

#include "binding_errors.h"
#include "sfmoe/activation.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace sfmoe_binding {
namespace {

// Integer fields of a request: the dict's value where it has the key, else the *_init() default.
// Enums are stored through their integer so that the library sees the caller's value unchanged.
template <class Field>
void read_field(const nb::dict& request, const char* key, Field* field) {
  if (!request.contains(key)) return;
  const int64_t value = nb::cast<int64_t>(nb::int_(request[key]));
  if constexpr (sizeof(Field) == sizeof(int32_t)) {
    const int32_t narrow = static_cast<int32_t>(value);
    if (narrow != value) throw nb::value_error((std::string(key) + ": out of range").c_str());
    memcpy(field, &narrow, sizeof(narrow));
  } else {
    *field = static_cast<Field>(value);
  }
}

// Keys the request does not know are refused, so that a misspelt option cannot pass silently.
void refuse_unknown_keys(const nb::dict& request, std::initializer_list<const char*> known,
                         const char* what) {
  for (auto item : request) {
    const std::string key = nb::cast<std::string>(item.first);
    bool found = false;
    for (const char* k : known) found = found || key == k;
    if (!found)
      throw nb::value_error((std::string(what) + ": unknown field '" + key + "'").c_str());
  }
}

// A planned buffer: None when absent, else (dtype, shape, bytes).
nb::object buffer_object(const sfmoe_buffer_plan& b) {
  if (b.ndim == 0) return nb::none();
  nb::list shape;
  for (int32_t d = 0; d < b.ndim; ++d) shape.append(b.shape[d]);
  return nb::make_tuple(static_cast<int>(b.dtype), nb::tuple(shape), b.bytes);
}

nb::dict grouped_plan_dict(const sfmoe_grouped_tensor_plan& p) {
  nb::dict d;
  d["dtype"] = static_cast<int>(p.dtype);
  d["scaling"] = static_cast<int>(p.scaling);
  d["scale_layout"] = static_cast<int>(p.scale_layout);
  d["num_groups"] = p.num_groups;
  d["row_capacity"] = p.row_capacity;
  d["cols"] = p.cols;
  d["row_alignment"] = p.row_alignment;
  d["uniform_group_rows"] = p.uniform_group_rows;
  nb::dict buffers;
  buffers["group_offsets"] = buffer_object(p.group_offsets);
  buffers["rowwise_data"] = buffer_object(p.rowwise_data);
  buffers["rowwise_scale_inv"] = buffer_object(p.rowwise_scale_inv);
  buffers["columnwise_data"] = buffer_object(p.columnwise_data);
  buffers["columnwise_scale_inv"] = buffer_object(p.columnwise_scale_inv);
  buffers["amax"] = buffer_object(p.amax);
  buffers["columnwise_amax"] = buffer_object(p.columnwise_amax);
  d["buffers"] = buffers;
  d["total_bytes"] = p.total_bytes;
  return d;
}

nb::dict plan_grouped_quantize(const nb::dict& request) {
  refuse_unknown_keys(
      request,
      {"dtype", "scaling", "scale_layout", "rowwise", "columnwise", "hadamard_columnwise",
       "num_groups", "cols", "input_rows", "input_row_alignment", "uniform_group_rows",
       "row_alignment", "row_capacity"},
      "plan_grouped_quantize");
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  read_field(request, "dtype", &r.dtype);
  read_field(request, "scaling", &r.scaling);
  read_field(request, "scale_layout", &r.scale_layout);
  read_field(request, "rowwise", &r.rowwise);
  read_field(request, "columnwise", &r.columnwise);
  read_field(request, "hadamard_columnwise", &r.hadamard_columnwise);
  read_field(request, "num_groups", &r.num_groups);
  read_field(request, "cols", &r.cols);
  read_field(request, "input_rows", &r.input_rows);
  read_field(request, "input_row_alignment", &r.input_row_alignment);
  read_field(request, "uniform_group_rows", &r.uniform_group_rows);
  read_field(request, "row_alignment", &r.row_alignment);
  read_field(request, "row_capacity", &r.row_capacity);
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  check(sfmoe_plan_grouped_quantize(&r, &plan));
  return grouped_plan_dict(plan);
}

nb::dict plan_permute(const nb::dict& request) {
  refuse_unknown_keys(request,
                      {"num_tokens", "topk", "num_experts", "hidden", "row_alignment",
                       "expert_capacity", "dtype", "scaling", "scale_layout", "group_amax"},
                      "plan_permute");
  sfmoe_permute_plan_request r = sfmoe_permute_plan_request_init();
  read_field(request, "num_tokens", &r.num_tokens);
  read_field(request, "topk", &r.topk);
  read_field(request, "num_experts", &r.num_experts);
  read_field(request, "hidden", &r.hidden);
  read_field(request, "row_alignment", &r.row_alignment);
  read_field(request, "expert_capacity", &r.expert_capacity);
  read_field(request, "dtype", &r.dtype);
  read_field(request, "scaling", &r.scaling);
  read_field(request, "scale_layout", &r.scale_layout);
  read_field(request, "group_amax", &r.group_amax);
  sfmoe_permute_plan plan;
  plan.struct_size = sizeof(plan);
  check(sfmoe_plan_permute(&r, &plan));
  nb::dict d;
  d["permuted"] = grouped_plan_dict(plan.permuted);
  d["row_map"] = buffer_object(plan.row_map);
  d["tokens_per_expert"] = buffer_object(plan.tokens_per_expert);
  d["dropped_per_expert"] = buffer_object(plan.dropped_per_expert);
  d["workspace"] = buffer_object(plan.workspace);
  return d;
}

nb::dict plan_grouped_activation(const nb::dict& request) {
  refuse_unknown_keys(request,
                      {"kind", "num_groups", "row_capacity", "input_cols", "row_alignment", "dtype",
                       "scaling", "scale_layout", "group_amax"},
                      "plan_grouped_activation");
  sfmoe_activation_plan_request r = sfmoe_activation_plan_request_init();
  read_field(request, "kind", &r.kind);
  read_field(request, "num_groups", &r.num_groups);
  read_field(request, "row_capacity", &r.row_capacity);
  read_field(request, "input_cols", &r.input_cols);
  read_field(request, "row_alignment", &r.row_alignment);
  read_field(request, "dtype", &r.dtype);
  read_field(request, "scaling", &r.scaling);
  read_field(request, "scale_layout", &r.scale_layout);
  read_field(request, "group_amax", &r.group_amax);
  sfmoe_grouped_tensor_plan plan;
  plan.struct_size = sizeof(plan);
  check(sfmoe_plan_grouped_activation(&r, &plan));
  return grouped_plan_dict(plan);
}

}  // namespace

void register_planning(nb::module_& m) {
  m.def("plan_grouped_quantize", &plan_grouped_quantize, "request"_a,
        "sfmoe_plan_grouped_quantize: a dict of sfmoe_quantize_plan_request fields (missing ones\n"
        "take sfmoe_quantize_plan_request_init()'s values) -> the plan as a dict; each buffer is\n"
        "None (absent) or (dtype, shape in elements, bytes).");
  m.def("plan_permute", &plan_permute, "request"_a,
        "sfmoe_plan_permute: a dict of sfmoe_permute_plan_request fields -> the plan as a dict.");
  m.def("plan_grouped_activation", &plan_grouped_activation, "request"_a,
        "sfmoe_plan_grouped_activation: a dict of sfmoe_activation_plan_request fields -> the\n"
        "plan as a dict.");
  m.def("permute_workspace_bytes", &sfmoe_permute_workspace_bytes, "num_tokens"_a, "num_experts"_a,
        "sfmoe_permute_workspace_bytes.");
  m.def("router_workspace_bytes", &sfmoe_router_workspace_bytes, "tokens"_a, "num_experts"_a,
        "sfmoe_router_workspace_bytes.");
  m.def(
      "grouped_gemm_workspace_bytes",
      [](int64_t groups, int32_t a_scaling, int64_t a_rows, int64_t a_cols, int32_t b_scaling,
         int64_t b_rows, int64_t b_cols) {
        sfmoe_scaling a, b;
        memcpy(&a, &a_scaling, sizeof(a));
        memcpy(&b, &b_scaling, sizeof(b));
        return sfmoe_grouped_gemm_workspace_bytes(groups, a, a_rows, a_cols, b, b_rows, b_cols);
      },
      "num_groups"_a, "a_scaling"_a, "a_rows"_a, "a_cols"_a, "b_scaling"_a, "b_rows"_a, "b_cols"_a,
      "sfmoe_grouped_gemm_workspace_bytes (MXFP8 / NVFP4 operands need more).");
}

}  // namespace sfmoe_binding
