// Turning CUDA runtime errors into sfmoe statuses with a message naming the call site.
#pragma once

#include <cuda_runtime.h>

#include "src/common/error.h"

namespace sfmoe {
namespace cuda {

inline sfmoe_status cuda_fail(const char* context, const char* what, cudaError_t error) {
  return fail(SFMOE_ERROR_CUDA, "%s: %s failed: %s (%s)", context, what, cudaGetErrorName(error),
              cudaGetErrorString(error));
}

// After a kernel launch: reports a launch failure (bad configuration, missing kernel image).
inline sfmoe_status check_launch(const char* context, const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return SFMOE_SUCCESS;
  return cuda_fail(context, kernel, error);
}

// Multiprocessors of the current device (cached per device).
int multiprocessor_count();

// Blocks of `kernel` the device holds at once (one wave), from the occupancy calculator: per
// device, not a stream operation (capture-safe); at least one per multiprocessor.
int64_t resident_wave(const void* kernel, int threads_per_block, size_t dynamic_shared);

// Grid size for a grid-stride kernel over `work_items`, bounded by a few waves of the device.
int grid_for(int64_t work_items, int threads_per_block);

}  // namespace cuda
}  // namespace sfmoe

#define SFMOE_CUDA_RETURN_IF_ERROR(context, call)                                       \
  do {                                                                                  \
    const cudaError_t error_ = (call);                                                  \
    if (error_ != cudaSuccess) return ::sfmoe::cuda::cuda_fail(context, #call, error_); \
  } while (0)
