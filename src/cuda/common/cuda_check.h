// Turning CUDA runtime errors into sfmoe statuses with a reason naming the failed call (the API
// layer prefixes the public function's name: src/common/error.h).
#pragma once

#include <cuda_runtime.h>

#include "src/common/error.h"

namespace sfmoe {
namespace cuda {

inline sfmoe_status cuda_fail(const char* what, cudaError_t error) {
  return report(SFMOE_ERROR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorName(error),
                cudaGetErrorString(error));
}

// After a kernel launch: reports a launch failure (bad configuration, missing kernel image).
inline sfmoe_status check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error == cudaSuccess) return SFMOE_SUCCESS;
  return cuda_fail(kernel, error);
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

#define SFMOE_CUDA_RETURN_IF_ERROR(call)                                       \
  do {                                                                         \
    const cudaError_t error_ = (call);                                         \
    if (error_ != cudaSuccess) return ::sfmoe::cuda::cuda_fail(#call, error_); \
  } while (0)
