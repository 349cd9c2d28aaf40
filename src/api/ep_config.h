// The expert-parallel group's configuration rules (include/sfmoe/ep.h), stated once for the EP
// calls and for the MoE layer's group.
#pragma once

#include <memory>

#include "sfmoe/ep.h"
#include "src/common/ep_args.h"
#include "src/ops/layout_plan.h"

namespace sfmoe {

// Checks `config` for a group in `memory` on `device`: transport, overflow policy, world and rank,
// sizes, top-k, payload and its scaling, row alignment, both capacities, the device loopback's
// bounds. Words a failure with `context`.
sfmoe_status check_ep_config(const char* context, const sfmoe_ep_config* config,
                             sfmoe_memory memory, int32_t device);

// sfmoe_ep_group_create with the ranks' exchange given (an NCCL group whose ranks are emulated in
// one process: the tests of the per-rank transport on one device); NULL: as the public call.
sfmoe_status ep_group_create_with_exchange(const sfmoe_ep_config* config, sfmoe_memory memory,
                                           int32_t device, std::unique_ptr<EpExchange> exchange,
                                           sfmoe_ep_group** out);

// A group as the MoE layer sees it: its configuration, layout and (NCCL) exchange, or NULL.
const sfmoe_ep_config& ep_group_config(const sfmoe_ep_group* group);
const ops::EpLayout& ep_group_layout(const sfmoe_ep_group* group);
const EpRankExchange* ep_group_exchange(const sfmoe_ep_group* group);
int32_t ep_group_device(const sfmoe_ep_group* group);

}  // namespace sfmoe
