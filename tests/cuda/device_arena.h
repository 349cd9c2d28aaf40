// The guarded arena (tests/cpp/guarded_arena.h) over CUDA device memory, on a stream of its own.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "tests/cpp/guarded_arena.h"

namespace sfmoe {
namespace testing {

class DeviceArena : public Arena {
 public:
  DeviceArena() { cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~DeviceArena() override {
    cudaStreamSynchronize(stream_);
    release_all();
    cudaStreamDestroy(stream_);
  }
  sfmoe_memory memory() const override { return SFMOE_MEMORY_CUDA; }
  void* stream() const override { return stream_; }

 protected:
  void* raw_alloc(size_t bytes) override {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) ADD_FAILURE() << "cudaMalloc of " << bytes;
    return p;
  }
  void raw_free(void* p) override { cudaFree(p); }
  // The copies on the arena's stream, waited for: the stream does not synchronize with the legacy
  // default stream, so a plain cudaMemcpy could overlap the ops' kernels (a pageable copy in may
  // still be in flight when cudaMemcpy returns).
  void copy_in(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  void copy_out(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  void sync() override { EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace testing
}  // namespace sfmoe
