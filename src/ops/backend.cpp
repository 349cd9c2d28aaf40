// The backend tables (src/ops/backend.h).
#include "src/ops/backend.h"

#include <string.h>

#include "src/common/error.h"
#include "src/cpu/backend.h"
#include "src/cpu/float_environment.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

namespace sfmoe {
namespace ops {
namespace {

// The CPU reference runs at once, on the calling thread (in IEEE arithmetic whatever the caller's
// floating-point mode); it has no stream and cannot fail once the API layer has validated its
// arguments.
template <class Args, void (*Run)(const Args&)>
sfmoe_status on_host(const Args& args, void*) {
  const cpu::IeeeFloatEnvironment ieee;
  Run(args);
  return SFMOE_SUCCESS;
}

// The EP operations: every rank of the loopback at once, or (an exchange) this call's one rank,
// which can fail in its exchange.
template <class Args, void (*Loopback)(const Args&), sfmoe_status (*Rank)(const Args&)>
sfmoe_status ep_on_host(const Args& args, void*) {
  const cpu::IeeeFloatEnvironment ieee;
  if (args.exchange != nullptr) return Rank(args);
  Loopback(args);
  return SFMOE_SUCCESS;
}

sfmoe_status host_copy(void* to, const void* from, size_t bytes, void*) {
  if (bytes > 0) memcpy(to, from, bytes);
  return SFMOE_SUCCESS;
}
sfmoe_status host_copy_spans(const CopySpan* spans, size_t count, void*) {
  for (size_t i = 0; i < count; ++i) {
    const CopySpan& c = spans[i];
    if (c.plus == nullptr) {
      host_copy(c.to, c.from, c.bytes, nullptr);
      continue;
    }
    for (size_t w = 0; w < c.bytes / 8; ++w) {
      int64_t a, b;
      memcpy(&a, static_cast<const uint8_t*>(c.from) + 8 * w, 8);
      memcpy(&b, c.plus + w, 8);
      const int64_t sum = a + b;
      memcpy(static_cast<uint8_t*>(c.to) + 8 * w, &sum, 8);
    }
  }
  return SFMOE_SUCCESS;
}
void host_check_group_offsets(const GroupOffsetsCheckArgs& a) {
  cpu::check_group_offsets(a.offsets, a.num_groups, a.row_capacity, a.row_alignment, a.word);
}
void host_cast(const CastArgs& a) {
  const float scale = a.scale_device ? *a.scale_device : a.scale;
  cpu::cast(a.input, a.input_dtype, a.output, a.output_dtype, a.count, scale);
}
void host_grouped_amax(const GroupedAmaxArgs& a) {
  cpu::grouped_amax(a.input, a.num_groups, a.cols, a.amax, a.word);
}
void host_swizzle_scales(const SwizzleArgs& a) {
  if (a.unswizzle) {
    cpu::unswizzle_scales(a.from, a.rows, a.scale_cols, a.to);
  } else {
    cpu::swizzle_scales(a.from, a.rows, a.scale_cols, a.to);
  }
}

const Backend kCpu = {
    "cpu",
    host_copy,
    host_copy_spans,
    on_host<GroupOffsetsCheckArgs, host_check_group_offsets>,
    on_host<CastArgs, host_cast>,
    on_host<GroupedAmaxArgs, host_grouped_amax>,
    on_host<GroupedQuantizeArgs, cpu::grouped_quantize>,
    on_host<GroupedDequantizeArgs, cpu::grouped_dequantize>,
    on_host<SwizzleArgs, host_swizzle_scales>,
    on_host<RouterForwardArgs, cpu::router_forward>,
    on_host<RouterBackwardArgs, cpu::router_backward>,
    on_host<PermuteArgs, cpu::permute>,
    on_host<UnpermuteArgs, cpu::unpermute>,
    on_host<UnpermuteBackwardArgs, cpu::unpermute_backward>,
    on_host<RowSourcesArgs, cpu::row_sources>,
    on_host<SlotValuesArgs, cpu::slot_values>,
    on_host<ActivationArgs, cpu::activation_forward>,
    on_host<ActivationBackwardArgs, cpu::activation_backward>,
    on_host<GroupedGemmArgs, cpu::grouped_gemm>,
    ep_on_host<EpRouteArgs, cpu::ep_route, cpu::ep_route_rank>,
    ep_on_host<EpScatterArgs, cpu::ep_scatter, cpu::ep_scatter_rank>,
    ep_on_host<EpGatherArgs, cpu::ep_gather, cpu::ep_gather_rank>,
    ep_on_host<EpSlotValuesArgs, cpu::ep_slot_values, cpu::ep_slot_values_rank>,
};

#if defined(SFMOE_WITH_CUDA)
sfmoe_status device_check_group_offsets(const GroupOffsetsCheckArgs& a, void* stream) {
  return cuda::check_group_offsets(a.offsets, a.num_groups, a.row_capacity, a.row_alignment, a.word,
                                   stream);
}
sfmoe_status device_cast(const CastArgs& a, void* stream) {
  return cuda::cast(a.input, a.input_dtype, a.output, a.output_dtype, a.count, a.scale,
                    a.scale_device, stream);
}
sfmoe_status device_grouped_amax(const GroupedAmaxArgs& a, void* stream) {
  return cuda::grouped_amax(a.input, a.num_groups, a.cols, a.amax, a.word, stream);
}
sfmoe_status device_swizzle_scales(const SwizzleArgs& a, void* stream) {
  return cuda::swizzle_scales(a.from, a.rows, a.scale_cols, a.to, a.unswizzle, stream);
}

const Backend kCuda = {
    "cuda",
    cuda::copy_device_async,
    cuda::copy_spans_async,
    device_check_group_offsets,
    device_cast,
    device_grouped_amax,
    cuda::grouped_quantize,
    cuda::grouped_dequantize,
    device_swizzle_scales,
    cuda::router_forward,
    cuda::router_backward,
    cuda::permute,
    cuda::unpermute,
    cuda::unpermute_backward,
    cuda::row_sources,
    cuda::slot_values,
    cuda::activation_forward,
    cuda::activation_backward,
    cuda::grouped_gemm,
    cuda::ep_route,
    cuda::ep_scatter,
    cuda::ep_gather,
    cuda::ep_slot_values,
};
#else
// Validation refuses CUDA memory in a build without the CUDA backend; a caller that reaches this
// table anyway is told so rather than crashing.
template <class Args>
sfmoe_status not_built(const Args&, void*) {
  return report(SFMOE_ERROR_NO_BACKEND, "this build of sfmoe has no CUDA backend");
}

sfmoe_status copy_not_built(void*, const void*, size_t, void*) {
  return report(SFMOE_ERROR_NO_BACKEND, "this build of sfmoe has no CUDA backend");
}
sfmoe_status copy_spans_not_built(const CopySpan*, size_t, void*) {
  return report(SFMOE_ERROR_NO_BACKEND, "this build of sfmoe has no CUDA backend");
}

const Backend kNotBuilt = {
    "not built",
    copy_not_built,
    copy_spans_not_built,
    not_built<GroupOffsetsCheckArgs>,
    not_built<CastArgs>,
    not_built<GroupedAmaxArgs>,
    not_built<GroupedQuantizeArgs>,
    not_built<GroupedDequantizeArgs>,
    not_built<SwizzleArgs>,
    not_built<RouterForwardArgs>,
    not_built<RouterBackwardArgs>,
    not_built<PermuteArgs>,
    not_built<UnpermuteArgs>,
    not_built<UnpermuteBackwardArgs>,
    not_built<RowSourcesArgs>,
    not_built<SlotValuesArgs>,
    not_built<ActivationArgs>,
    not_built<ActivationBackwardArgs>,
    not_built<GroupedGemmArgs>,
    not_built<EpRouteArgs>,
    not_built<EpScatterArgs>,
    not_built<EpGatherArgs>,
    not_built<EpSlotValuesArgs>,
};
#endif

}  // namespace

const Backend& backend_for(sfmoe_memory memory) {
  if (memory == SFMOE_MEMORY_HOST) return kCpu;
#if defined(SFMOE_WITH_CUDA)
  return kCuda;
#else
  return kNotBuilt;
#endif
}

}  // namespace ops
}  // namespace sfmoe
