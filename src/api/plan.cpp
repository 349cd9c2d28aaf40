// The layout-planning entry points (sfmoe.h, "layout planning"): check the request's struct sizes,
// run the planner of src/ops/layout_plan.h, word its refusal.
#include "sfmoe/activation.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {
namespace {

// A request made by its *_init() and a plan whose struct_size the caller set.
template <class Request, class Plan>
sfmoe_status check_sizes(const char* context, const Request* request, const Plan* plan,
                         const char* init_name) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "request", request, init_name));
  return check_struct(context, "plan", plan, "sizeof the plan as struct_size");
}

sfmoe_status worded(const char* context, const Outcome& outcome) {
  return outcome.ok() ? SFMOE_SUCCESS : fail_with(context, outcome);
}

// A planning entry point: the sizes checked, then the planner's outcome worded as `context`'s.
template <class Request, class Plan>
sfmoe_status plan_call(const char* context, const char* init_name, const Request* request,
                       Plan* plan, Outcome (*planner)(const Request&, Plan*)) {
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(check_sizes(context, request, plan, init_name));
    return worded(context, planner(*request, plan));
  });
}

}  // namespace
}  // namespace sfmoe

extern "C" {

sfmoe_quantize_plan_request sfmoe_quantize_plan_request_init(void) {
  sfmoe_quantize_plan_request r = sfmoe::sized_zero_config<sfmoe_quantize_plan_request>();
  r.dtype = SFMOE_DTYPE_FP8_E4M3;
  r.scaling = SFMOE_SCALING_TENSOR;
  r.rowwise = 1;
  return r;
}

sfmoe_status sfmoe_plan_grouped_quantize(const sfmoe_quantize_plan_request* request,
                                         sfmoe_grouped_tensor_plan* plan) {
  return sfmoe::plan_call("sfmoe_plan_grouped_quantize", "sfmoe_quantize_plan_request_init",
                          request, plan, sfmoe::ops::plan_grouped_quantize);
}

sfmoe_permute_plan_request sfmoe_permute_plan_request_init(void) {
  sfmoe_permute_plan_request r = sfmoe::sized_zero_config<sfmoe_permute_plan_request>();
  r.row_alignment = 1;
  r.dtype = SFMOE_DTYPE_BF16;
  return r;
}

sfmoe_status sfmoe_plan_permute(const sfmoe_permute_plan_request* request,
                                sfmoe_permute_plan* plan) {
  return sfmoe::plan_call("sfmoe_plan_permute", "sfmoe_permute_plan_request_init", request, plan,
                          sfmoe::ops::plan_permute);
}

int64_t sfmoe_permute_workspace_bytes(int64_t num_tokens, int64_t num_experts) {
  return sfmoe::ops::permute_workspace_bytes(num_tokens, num_experts);
}

sfmoe_activation_plan_request sfmoe_activation_plan_request_init(void) {
  sfmoe_activation_plan_request r = sfmoe::sized_zero_config<sfmoe_activation_plan_request>();
  r.kind = SFMOE_ACTIVATION_SWIGLU;
  r.row_alignment = 1;
  r.dtype = SFMOE_DTYPE_BF16;
  return r;
}

sfmoe_status sfmoe_plan_grouped_activation(const sfmoe_activation_plan_request* request,
                                           sfmoe_grouped_tensor_plan* plan) {
  return sfmoe::plan_call("sfmoe_plan_grouped_activation", "sfmoe_activation_plan_request_init",
                          request, plan, sfmoe::ops::plan_grouped_activation);
}

int64_t sfmoe_router_workspace_bytes(int64_t tokens, int64_t num_experts) {
  return sfmoe::ops::router_workspace_bytes(tokens, num_experts);
}

sfmoe_status sfmoe_grouped_tensor_bind(const sfmoe_grouped_tensor_plan* plan, sfmoe_memory memory,
                                       int32_t device, void* base, sfmoe_grouped_tensor* out) {
  const char* context = "sfmoe_grouped_tensor_bind";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (out == nullptr) return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: out is NULL", context);
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "plan", plan, "sizeof the plan as struct_size"));
    return sfmoe::worded(context,
                         sfmoe::ops::bind_grouped_tensor(*plan, memory, device, base, out));
  });
}

}  // extern "C"
