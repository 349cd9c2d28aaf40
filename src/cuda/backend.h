// The CUDA backend as seen from the API layer: plain types only, so the API layer compiles
// without CUDA headers. Only built when the library has the CUDA backend (SFMOE_WITH_CUDA).
#pragma once

#include <stdint.h>

#include "sfmoe/cast.h"
#include "sfmoe/sfmoe.h"
#include "src/common/activation_args.h"
#include "src/common/copy_span.h"
#include "src/common/ep_args.h"
#include "src/common/grouped_gemm_args.h"
#include "src/common/permute_args.h"
#include "src/common/quantize_args.h"
#include "src/common/router_args.h"

namespace sfmoe {
namespace cuda {

enum class PointerKind { kUnknown, kHostMemory, kDeviceMemory };

// What the CUDA runtime says a pointer is (kUnknown when no device or driver is usable).
PointerKind classify_pointer(const void* pointer, int32_t* device);
// Number of usable CUDA devices; 0 when there is no driver or device.
int device_count();
sfmoe_status fill_device_info(sfmoe_device_info* info);
int compiled_cuda_version();

// Status word storage.
sfmoe_status status_word_allocate(int32_t device, sfmoe_fault_report** device_word,
                                  sfmoe_fault_report** host_mirror);
void status_word_free(int32_t device, sfmoe_fault_report* device_word,
                      sfmoe_fault_report* host_mirror);
sfmoe_status status_word_reset(sfmoe_fault_report* device_word, void* stream);
sfmoe_status status_word_snapshot(const sfmoe_fault_report* device_word,
                                  sfmoe_fault_report* host_mirror, void* stream);

// An asynchronous device-to-device copy on the stream.
sfmoe_status copy_device_async(void* to, const void* from, size_t bytes, void* stream);
// Several small device-to-device copies on the stream, one kernel for up to 32 of them.
sfmoe_status copy_spans_async(const CopySpan* spans, size_t count, void* stream);

// Operations (launchers). Inputs are validated by the API layer.
sfmoe_status check_group_offsets(const int64_t* offsets, int64_t num_groups, int64_t row_capacity,
                                 int64_t row_alignment, sfmoe_fault_report* word, void* stream);
sfmoe_status cast(const void* input, sfmoe_dtype input_dtype, void* output,
                  sfmoe_dtype output_dtype, int64_t count, float scale, const float* scale_device,
                  void* stream);

// Grouped quantization (docs/quantization.md).
sfmoe_status grouped_amax(const GroupedInput& input, int64_t num_groups, int64_t cols, float* amax,
                          sfmoe_fault_report* word, void* stream);
sfmoe_status grouped_quantize(const GroupedQuantizeArgs& args, void* stream);
sfmoe_status grouped_dequantize(const GroupedDequantizeArgs& args, void* stream);
sfmoe_status swizzle_scales(const uint8_t* from, int64_t rows, int64_t scale_cols, uint8_t* to,
                            bool unswizzle, void* stream);

// Permute / unpermute (docs/permute.md).
sfmoe_status permute(const PermuteArgs& args, void* stream);
sfmoe_status unpermute(const UnpermuteArgs& args, void* stream);
sfmoe_status unpermute_backward(const UnpermuteBackwardArgs& args, void* stream);
sfmoe_status row_sources(const RowSourcesArgs& args, void* stream);
sfmoe_status slot_values(const SlotValuesArgs& args, void* stream);

// Expert parallelism's loopback transport (docs/ep.md).
sfmoe_status ep_route(const EpRouteArgs& args, void* stream);
sfmoe_status ep_scatter(const EpScatterArgs& args, void* stream);
sfmoe_status ep_gather(const EpGatherArgs& args, void* stream);
sfmoe_status ep_slot_values(const EpSlotValuesArgs& args, void* stream);

// Grouped activations (docs/activations.md).
sfmoe_status activation_forward(const ActivationArgs& args, void* stream);
sfmoe_status activation_backward(const ActivationBackwardArgs& args, void* stream);

// Grouped GEMM on Hopper (docs/grouped_gemm.md). Available only in builds with CUTLASS.
bool grouped_gemm_available();
int64_t grouped_gemm_workspace_bytes(int64_t num_groups);
// The CUTLASS kernels on operands as they lie (BF16, FP8 per-tensor, FP8 blockwise).
sfmoe_status launch_grouped_gemm(const GroupedGemmDeviceArgs& args, void* stream);
// One call of the op: MXFP8 / NVFP4 operands decoded into BF16 in the workspace first (emulated),
// the rest handed to launch_grouped_gemm. In every CUDA build (without CUTLASS it refuses).
sfmoe_status grouped_gemm(const GroupedGemmArgs& args, void* stream);

// Router (docs/router.md).
sfmoe_status router_forward(const RouterForwardArgs& args, void* stream);
sfmoe_status router_backward(const RouterBackwardArgs& args, void* stream);

}  // namespace cuda
}  // namespace sfmoe
