// Programmatic dependent launch (Hopper): a kernel launched with launch_dependent() may start
// while the kernel before it on the stream is still running, once every block of that kernel has
// called let_dependents_start() (or exited). Before it reads anything the previous kernel writes,
// it calls wait_for_previous_kernel(), which returns when that kernel has completed and its writes
// are visible. A chain of short kernels (permute's count, scan, place and copy; the router's
// count clearing and forward) so loses the launch gap between kernels, and a kernel can load its
// own inputs (those written before the chain) while the previous one finishes. The dependency is
// recorded by stream capture, so the chain stays graph-capturable; in an ordinary launch both
// device calls are no-ops. (Launched as ordinary kernels, permute's chain ran about 1.3% slower:
// docs/KERNEL_NOTES.md, permute v4 and v6.)
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace sfmoe {
namespace cuda {

__device__ __forceinline__ void let_dependents_start() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__device__ __forceinline__ void wait_for_previous_kernel() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) as the programmatic dependent of the
// work before it on the stream.
template <class... KernelArgs, class... Args>
cudaError_t launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block,
                             size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace cuda
}  // namespace sfmoe
