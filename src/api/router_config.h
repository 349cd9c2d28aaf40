// The router's configuration checked once, for the router's calls and the MoE layer's.
#pragma once

#include <stdint.h>

#include "sfmoe/router.h"
#include "src/common/router_args.h"

namespace sfmoe {

// A valid sfmoe_router_config for `experts` experts, translated for the backends.
sfmoe_status check_router_config(const char* context, const sfmoe_router_config* c, int64_t experts,
                                 RouterConfig* out);
// Logits: a valid [tokens, experts] FP32 or BF16 tensor.
sfmoe_status check_router_logits(const char* context, const sfmoe_tensor* logits);
// The CUDA router's bounds (a token's scores and picks live in a warp's registers and shared
// memory).
sfmoe_status check_router_device_bounds(const char* context, const RouterConfig& c);

}  // namespace sfmoe
