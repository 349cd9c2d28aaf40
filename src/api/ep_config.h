// The expert-parallel group's configuration rules (include/sfmoe/ep.h), stated once for the EP
// calls and for the MoE layer's group.
#pragma once

#include "sfmoe/ep.h"

namespace sfmoe {

// Checks `config` for a group in `memory` on `device`: transport, overflow policy, world and rank,
// sizes, top-k, payload and its scaling, row alignment, both capacities, the device loopback's
// bounds. Words a failure with `context`.
sfmoe_status check_ep_config(const char* context, const sfmoe_ep_config* config,
                             sfmoe_memory memory, int32_t device);

}  // namespace sfmoe
