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
  if (request == nullptr || plan == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: request and plan must not be NULL", context);
  }
  if (request->struct_size != sizeof(Request)) {
    return fail(SFMOE_ERROR_STRUCT_SIZE, "%s: request struct_size is %zu, expected %zu (use %s())",
                context, request->struct_size, sizeof(Request), init_name);
  }
  if (plan->struct_size != sizeof(Plan)) {
    return fail(SFMOE_ERROR_STRUCT_SIZE,
                "%s: plan struct_size is %zu, expected %zu (set it to sizeof the plan)", context,
                plan->struct_size, sizeof(Plan));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status worded(const char* context, const Outcome& outcome) {
  return outcome.ok() ? SFMOE_SUCCESS : fail_with(context, outcome);
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
  const char* context = "sfmoe_plan_grouped_quantize";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_sizes(context, request, plan, "sfmoe_quantize_plan_request_init"));
    return sfmoe::worded(context, sfmoe::ops::plan_grouped_quantize(*request, plan));
  });
}

sfmoe_permute_plan_request sfmoe_permute_plan_request_init(void) {
  sfmoe_permute_plan_request r = sfmoe::sized_zero_config<sfmoe_permute_plan_request>();
  r.row_alignment = 1;
  r.dtype = SFMOE_DTYPE_BF16;
  return r;
}

sfmoe_status sfmoe_plan_permute(const sfmoe_permute_plan_request* request,
                                sfmoe_permute_plan* plan) {
  const char* context = "sfmoe_plan_permute";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_sizes(context, request, plan, "sfmoe_permute_plan_request_init"));
    return sfmoe::worded(context, sfmoe::ops::plan_permute(*request, plan));
  });
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
  const char* context = "sfmoe_plan_grouped_activation";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_sizes(context, request, plan, "sfmoe_activation_plan_request_init"));
    return sfmoe::worded(context, sfmoe::ops::plan_grouped_activation(*request, plan));
  });
}

int64_t sfmoe_router_workspace_bytes(int64_t tokens, int64_t num_experts) {
  return sfmoe::ops::router_workspace_bytes(tokens, num_experts);
}

sfmoe_status sfmoe_grouped_tensor_bind(const sfmoe_grouped_tensor_plan* plan, sfmoe_memory memory,
                                       int32_t device, void* base, sfmoe_grouped_tensor* out) {
  const char* context = "sfmoe_grouped_tensor_bind";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    if (plan == nullptr || out == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: plan and out must not be NULL", context);
    }
    if (plan->struct_size != sizeof(sfmoe_grouped_tensor_plan)) {
      return sfmoe::fail(SFMOE_ERROR_STRUCT_SIZE, "%s: plan struct_size is %zu, expected %zu",
                         context, plan->struct_size, sizeof(sfmoe_grouped_tensor_plan));
    }
    return sfmoe::worded(context,
                         sfmoe::ops::bind_grouped_tensor(*plan, memory, device, base, out));
  });
}

}  // extern "C"
