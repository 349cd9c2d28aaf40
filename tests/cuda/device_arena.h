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
  void copy_in(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void copy_out(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void sync() override { EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace testing
}  // namespace sfmoe
