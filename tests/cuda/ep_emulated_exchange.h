// Ranks of a per-rank expert-parallel transport emulated in one process on one GPU (the tests of
// src/cuda/ep/ep_exchange.cu and of the MoE layer over it): each rank a thread with its own
// stream, the collectives device copies between the ranks' buffers.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdint.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/common/ep_args.h"

namespace sfmoe {
namespace testing {

// R ranks as threads: a collective is a host barrier and device copies between the ranks'
// buffers, each rank's copies on its own stream after every source's `ready` event, and no rank
// goes on (to overwrite its send buffer) before every rank's copies are `done`.
class EmulatedWorld {
 public:
  explicit EmulatedWorld(int ranks) : ranks_(ranks), sends_(ranks), ready_(ranks), done_(ranks) {
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(cudaEventCreateWithFlags(&ready_[r], cudaEventDisableTiming), cudaSuccess);
      EXPECT_EQ(cudaEventCreateWithFlags(&done_[r], cudaEventDisableTiming), cudaSuccess);
    }
  }
  ~EmulatedWorld() {
    for (int r = 0; r < ranks_; ++r) {
      cudaEventDestroy(ready_[r]);
      cudaEventDestroy(done_[r]);
    }
  }

  // recv[q block] = rank q's send (all-gather) or its block for this rank (all-to-all).
  sfmoe_status collect(int rank, const void* send, void* recv, int64_t block, bool to_all,
                       void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    sends_[rank] = send;
    if (cudaEventRecord(ready_[rank], s) != cudaSuccess) return SFMOE_ERROR_CUDA;
    barrier();
    for (int q = 0; q < ranks_; ++q) {
      const uint8_t* from = static_cast<const uint8_t*>(sends_[q]) + (to_all ? rank * block : 0);
      if (cudaStreamWaitEvent(s, ready_[q], 0) != cudaSuccess ||
          cudaMemcpyAsync(static_cast<uint8_t*>(recv) + q * block, from, static_cast<size_t>(block),
                          cudaMemcpyDeviceToDevice, s) != cudaSuccess) {
        return SFMOE_ERROR_CUDA;
      }
    }
    if (cudaEventRecord(done_[rank], s) != cudaSuccess) return SFMOE_ERROR_CUDA;
    barrier();
    for (int q = 0; q < ranks_; ++q) {
      if (cudaStreamWaitEvent(s, done_[q], 0) != cudaSuccess) return SFMOE_ERROR_CUDA;
    }
    barrier();  // (no rank records its events again before every rank waits on these)
    return SFMOE_SUCCESS;
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++waiting_ == ranks_) {
      waiting_ = 0;
      ++generation_;
      wake_.notify_all();
      return;
    }
    wake_.wait(lock, [&] { return generation_ != generation; });
  }

  int ranks_;
  std::vector<const void*> sends_;
  std::vector<cudaEvent_t> ready_, done_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int waiting_ = 0;
  int64_t generation_ = 0;
};

class EmulatedExchange final : public EpExchange {
 public:
  EmulatedExchange(EmulatedWorld* world, int rank) : world_(world), rank_(rank) {}
  sfmoe_status all_gather(const void* send, void* recv, int64_t bytes, void* stream) override {
    return world_->collect(rank_, send, recv, bytes, false, stream);
  }
  sfmoe_status all_to_all(const void* send, void* recv, int64_t pair_bytes, void* stream) override {
    return world_->collect(rank_, send, recv, pair_bytes, true, stream);
  }

 private:
  EmulatedWorld* world_;
  int rank_;
};

// body(rank, stream) for every rank, each on a thread of its own with a stream of its own, waited
// for; each rank's failure (status and message) as a test failure. Returns whether all succeeded.
inline bool run_rank_threads(int ranks,
                             const std::function<sfmoe_status(int, cudaStream_t)>& body) {
  std::vector<sfmoe_status> status(ranks, SFMOE_SUCCESS);
  std::vector<std::string> errors(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        status[r] = SFMOE_ERROR_CUDA;
        return;
      }
      status[r] = body(r, stream);
      if (status[r] != SFMOE_SUCCESS) errors[r] = sfmoe_last_error();
      if (cudaStreamSynchronize(stream) != cudaSuccess) status[r] = SFMOE_ERROR_CUDA;
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
  bool all = true;
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(status[r], SFMOE_SUCCESS) << "rank " << r << ": " << errors[r];
    all = all && status[r] == SFMOE_SUCCESS;
  }
  return all;
}

}  // namespace testing
}  // namespace sfmoe
