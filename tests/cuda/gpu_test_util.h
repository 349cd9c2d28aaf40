// Shared helpers of the GPU suites: device detection that skips cleanly, checked CUDA calls,
// and device buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace testing {

// A usable GPU: a device, a driver, and machine code of this build that runs on it.
inline bool gpu_available() {
  static const bool available = [] {
    sfmoe_device_info info;
    info.struct_size = sizeof(info);
    if (sfmoe_get_device_info(&info) != SFMOE_SUCCESS) return false;
    if (info.device_count == 0 || !info.kernels_supported) {
      std::printf("[ gpu ] no usable CUDA device (%d device(s), kernels %s): GPU tests skip\n",
                  info.device_count, info.kernels_supported ? "supported" : "unsupported");
      return false;
    }
    std::printf("[ gpu ] %s, sm_%d%d\n", info.name, info.compute_major, info.compute_minor);
    return true;
  }();
  return available;
}

#define SFMOE_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                           \
    if (!::sfmoe::testing::gpu_available()) {                                    \
      GTEST_SKIP() << "no usable CUDA device on this machine: GPU test skipped"; \
    }                                                                            \
  } while (0)

#define CUDA_OK(call) \
  ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, (n ? n : 1) * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  // Complete when it returns: a copy from pageable memory may return while its DMA is still in
  // flight on the legacy stream, which a non-blocking stream (a test's graph launch) does not wait
  // for.
  cudaError_t upload(const std::vector<T>& host) {
    const cudaError_t copied =
        cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return copied != cudaSuccess ? copied : cudaStreamSynchronize(cudaStreamLegacy);
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    if (cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      host.clear();
    return host;
  }
};

}  // namespace testing
}  // namespace sfmoe
