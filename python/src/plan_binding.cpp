// See plan_binding.h.
#include "plan_binding.h"

#include <nanobind/stl/string.h>
#include <stdint.h>
#include <string.h>

#include <initializer_list>
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

// One integer (or enum) field of a request, by name.
struct Field {
  const char* key;
  void* address;
  size_t size;  // 4 (int32_t, enums) or 8 (int64_t)
};

template <class T>
Field field(const char* key, T* address) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "request fields are int32, enums or int64");
  return Field{key, address, sizeof(T)};
}

// Fills `fields` from the dict: a missing key keeps the *_init() default, an unknown key is
// refused (a misspelt option must not pass silently). Enums are stored through their integer, so
// the library sees the caller's value unchanged, invalid ones included.
void read_request(const nb::dict& request, std::initializer_list<Field> fields, const char* what) {
  for (auto item : request) {
    const std::string key = nb::cast<std::string>(item.first);
    const Field* found = nullptr;
    for (const Field& f : fields) found = key == f.key ? &f : found;
    if (found == nullptr) {
      throw nb::value_error((std::string(what) + ": unknown field '" + key + "'").c_str());
    }
    const int64_t value = nb::cast<int64_t>(nb::int_(item.second));
    if (found->size == 8) {
      memcpy(found->address, &value, 8);
      continue;
    }
    const int32_t narrow = static_cast<int32_t>(value);
    if (narrow != value) throw nb::value_error((std::string(key) + ": out of range").c_str());
    memcpy(found->address, &narrow, 4);
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

// The plan of `request` by the C planner `planner`, as a dict (`as_dict`).
template <class Request, class Plan>
nb::dict planned(const Request& request, sfmoe_status (*planner)(const Request*, Plan*),
                 nb::dict (*as_dict)(const Plan&)) {
  Plan plan;
  plan.struct_size = sizeof(plan);
  check(planner(&request, &plan));
  return as_dict(plan);
}

nb::dict permute_plan_dict(const sfmoe_permute_plan& plan) {
  nb::dict d;
  d["permuted"] = grouped_plan_dict(plan.permuted);
  d["row_map"] = buffer_object(plan.row_map);
  d["tokens_per_expert"] = buffer_object(plan.tokens_per_expert);
  d["dropped_per_expert"] = buffer_object(plan.dropped_per_expert);
  d["workspace"] = buffer_object(plan.workspace);
  return d;
}

nb::dict plan_grouped_quantize(const nb::dict& request) {
  sfmoe_quantize_plan_request r = sfmoe_quantize_plan_request_init();
  read_request(
      request,
      {field("dtype", &r.dtype), field("scaling", &r.scaling),
       field("scale_layout", &r.scale_layout), field("rowwise", &r.rowwise),
       field("columnwise", &r.columnwise), field("hadamard_columnwise", &r.hadamard_columnwise),
       field("num_groups", &r.num_groups), field("cols", &r.cols),
       field("input_rows", &r.input_rows), field("input_row_alignment", &r.input_row_alignment),
       field("uniform_group_rows", &r.uniform_group_rows), field("row_alignment", &r.row_alignment),
       field("row_capacity", &r.row_capacity)},
      "plan_grouped_quantize");
  return planned(r, sfmoe_plan_grouped_quantize, grouped_plan_dict);
}

nb::dict plan_permute(const nb::dict& request) {
  sfmoe_permute_plan_request r = sfmoe_permute_plan_request_init();
  read_request(
      request,
      {field("num_tokens", &r.num_tokens), field("topk", &r.topk),
       field("num_experts", &r.num_experts), field("hidden", &r.hidden),
       field("row_alignment", &r.row_alignment), field("expert_capacity", &r.expert_capacity),
       field("dtype", &r.dtype), field("scaling", &r.scaling),
       field("scale_layout", &r.scale_layout), field("group_amax", &r.group_amax)},
      "plan_permute");
  return planned(r, sfmoe_plan_permute, permute_plan_dict);
}

nb::dict plan_grouped_activation(const nb::dict& request) {
  sfmoe_activation_plan_request r = sfmoe_activation_plan_request_init();
  read_request(request,
               {field("kind", &r.kind), field("num_groups", &r.num_groups),
                field("row_capacity", &r.row_capacity), field("input_cols", &r.input_cols),
                field("row_alignment", &r.row_alignment), field("dtype", &r.dtype),
                field("scaling", &r.scaling), field("scale_layout", &r.scale_layout),
                field("group_amax", &r.group_amax)},
               "plan_grouped_activation");
  return planned(r, sfmoe_plan_grouped_activation, grouped_plan_dict);
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
