// The CPU reference backend: plain loops over the numerics headers. These define the operations;
// the CUDA backend is checked against them.
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"
#include "src/common/activation_args.h"
#include "src/common/ep_args.h"
#include "src/common/grouped_gemm_args.h"
#include "src/common/permute_args.h"
#include "src/common/quantize_args.h"
#include "src/common/router_args.h"

namespace sfmoe {
namespace cpu {

void check_group_offsets(const int64_t* offsets, int64_t num_groups, int64_t row_capacity,
                         int64_t row_alignment, sfmoe_fault_report* word);
void cast(const void* input, sfmoe_dtype input_dtype, void* output, sfmoe_dtype output_dtype,
          int64_t count, float scale);

// Grouped quantization (docs/quantization.md). Arguments are validated by the API layer.
void grouped_amax(const GroupedInput& input, int64_t num_groups, int64_t cols, float* amax,
                  sfmoe_fault_report* word);
void grouped_quantize(const GroupedQuantizeArgs& args);
void grouped_dequantize(const GroupedDequantizeArgs& args);
void swizzle_scales(const uint8_t* compact, int64_t rows, int64_t scale_cols, uint8_t* swizzled);
void unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t scale_cols, uint8_t* compact);

// Router (docs/router.md).
void router_forward(const RouterForwardArgs& args);
void router_backward(const RouterBackwardArgs& args);

// Permute / unpermute (docs/permute.md); with args.quantized, the fused quantization by its
// definition (permute, then the grouped quantization of the rows). Permute's backward is unpermute
// without probabilities.
void permute(const PermuteArgs& args);
void unpermute(const UnpermuteArgs& args);
void unpermute_backward(const UnpermuteBackwardArgs& args);
void row_sources(const RowSourcesArgs& args);
void slot_values(const SlotValuesArgs& args);

// Expert parallelism over the ranks this process holds (docs/ep.md).
void ep_route(const EpRouteArgs& args);
void ep_scatter(const EpScatterArgs& args);
void ep_gather(const EpGatherArgs& args);
void ep_slot_values(const EpSlotValuesArgs& args);
// The same with one rank a call, the ranks meeting in args.exchange (src/cpu/ep_exchange.cpp):
// the exchange's failures returned.
sfmoe_status ep_route_rank(const EpRouteArgs& args);
sfmoe_status ep_scatter_rank(const EpScatterArgs& args);
sfmoe_status ep_gather_rank(const EpGatherArgs& args);
sfmoe_status ep_slot_values_rank(const EpSlotValuesArgs& args);

// Grouped GEMM (docs/grouped_gemm.md): the reference the device GEMMs are checked against, over
// FP32 operands; grouped_gemm decodes quantized operands from the copy each form reads first.
void grouped_gemm_values(const GroupedGemmValues& args);
void grouped_gemm(const GroupedGemmArgs& args);

// Grouped activations (docs/activations.md); with args.quantized, the fused quantization by its
// definition (the FP32 activations, then the grouped quantization).
void activation_forward(const ActivationArgs& args);
void activation_backward(const ActivationBackwardArgs& args);

}  // namespace cpu
}  // namespace sfmoe
