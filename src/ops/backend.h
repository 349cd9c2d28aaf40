// The backend table: every op's launcher on one backend, all with one signature (the op's argument
// struct and a stream) and one status type, chosen once per call from where the tensors live.
// The CPU reference, the CUDA kernels, and a table for builds without CUDA whose entries refuse
// with SFMOE_ERROR_NO_BACKEND. The API layer dispatches through it after validation, and the MoE
// layer composes ops through it without re-validating.
#pragma once

#include <stddef.h>

#include "sfmoe/sfmoe.h"
#include "src/common/activation_args.h"
#include "src/common/cast_args.h"
#include "src/common/copy_span.h"
#include "src/common/ep_args.h"
#include "src/common/group_offsets.h"
#include "src/common/grouped_gemm_args.h"
#include "src/common/permute_args.h"
#include "src/common/quantize_args.h"
#include "src/common/router_args.h"

namespace sfmoe {
namespace ops {

struct Backend {
  const char* name;  // "cpu", "cuda", "not built"
  // A copy within the backend's memory, ordered on the stream (at once on the host).
  sfmoe_status (*copy)(void* to, const void* from, size_t bytes, void* stream);
  // Several small copies within the backend's memory, ordered on the stream (on the device in one
  // launch for up to 32 of them).
  sfmoe_status (*copy_spans)(const CopySpan* spans, size_t count, void* stream);
  sfmoe_status (*check_group_offsets)(const GroupOffsetsCheckArgs&, void* stream);
  sfmoe_status (*cast)(const CastArgs&, void* stream);
  sfmoe_status (*grouped_amax)(const GroupedAmaxArgs&, void* stream);
  sfmoe_status (*grouped_quantize)(const GroupedQuantizeArgs&, void* stream);
  sfmoe_status (*grouped_dequantize)(const GroupedDequantizeArgs&, void* stream);
  sfmoe_status (*swizzle_scales)(const SwizzleArgs&, void* stream);
  sfmoe_status (*router_forward)(const RouterForwardArgs&, void* stream);
  sfmoe_status (*router_backward)(const RouterBackwardArgs&, void* stream);
  sfmoe_status (*permute)(const PermuteArgs&, void* stream);
  sfmoe_status (*unpermute)(const UnpermuteArgs&, void* stream);
  sfmoe_status (*unpermute_backward)(const UnpermuteBackwardArgs&, void* stream);
  sfmoe_status (*row_sources)(const RowSourcesArgs&, void* stream);
  sfmoe_status (*slot_values)(const SlotValuesArgs&, void* stream);
  sfmoe_status (*activation_forward)(const ActivationArgs&, void* stream);
  sfmoe_status (*activation_backward)(const ActivationBackwardArgs&, void* stream);
  sfmoe_status (*grouped_gemm)(const GroupedGemmArgs&, void* stream);
  // Expert parallelism over the ranks this process holds (the loopback transport).
  sfmoe_status (*ep_route)(const EpRouteArgs&, void* stream);
  sfmoe_status (*ep_scatter)(const EpScatterArgs&, void* stream);
  sfmoe_status (*ep_gather)(const EpGatherArgs&, void* stream);
  sfmoe_status (*ep_slot_values)(const EpSlotValuesArgs&, void* stream);
};

// The backend of tensors in `memory` (validated: HOST or CUDA).
const Backend& backend_for(sfmoe_memory memory);

}  // namespace ops
}  // namespace sfmoe
