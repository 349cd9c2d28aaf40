// What sfmoe's own warp-specialized persistent GEMM kernels share (sm90_contiguous_grouped_gemm.cu,
// sm90_wgrad_grouped_gemm.cu): 384 threads -- a producer warp group whose first warp issues the
// TMA loads, two consumer warp groups of 128 threads running the MMAs -- around a CUTLASS mainloop
// pipeline, launched as persistent clusters (one CTA an SM).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <cub/block/block_scan.cuh>
#include <cute/tensor.hpp>
#include <mutex>

#include "src/common/error.h"
#include "src/common/grouped_gemm_args.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace warp_specialized {

constexpr int kThreads = 384;
// The producer warp group gives registers back (it only issues TMA), the consumers take them.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
// The groups' prefix of work lives in shared memory, kGroupsPerThread groups a thread.
constexpr int kGroupsPerThread = 2;
constexpr int kMaxGroups = kThreads * kGroupsPerThread;
using GroupScan = cub::BlockScan<int, kThreads>;
static_assert(kMaxGroups == kGatheredGemmMaxGroups, "the bound the layer plans with");

// Each group's units of work and their exclusive prefix, written to unit_start[0, groups] in
// shared memory by all kThreads threads: units_of(g) returns group g's count (and records what the
// caller keeps of the group). The caller synchronizes before unit_start is read.
template <class UnitsOf>
__device__ __forceinline__ void prefix_units(int thread, int groups, GroupScan::TempStorage& scan,
                                             int* unit_start, UnitsOf units_of) {
  int units[kGroupsPerThread], starts[kGroupsPerThread], total = 0;
  for (int j = 0; j < kGroupsPerThread; ++j) {
    const int g = thread * kGroupsPerThread + j;
    units[j] = g < groups ? units_of(g) : 0;
  }
  GroupScan(scan).ExclusiveSum(units, starts, total);
  for (int j = 0; j < kGroupsPerThread; ++j) {
    const int g = thread * kGroupsPerThread + j;
    if (g < groups) unit_start[g] = starts[j];
  }
  if (thread == 0) unit_start[groups] = total;
}

// Whether an operand's address suits TMA (16-byte aligned), as both kernels' guards ask.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The pipeline role of `thread`: the producer warp group's first `producer_threads` threads
// produce (by default its first warp, whose elected lane issues the TMA loads), its other threads
// sit out, both consumer warp groups consume. A stage fills on `producer_arrivals` arrivals (the
// first thread's, which expects the stage's TMA bytes, and any others') and its TMA bytes.
template <class Pipeline>
__device__ __forceinline__ typename Pipeline::Params pipeline_params(
    int thread, uint32_t transaction_bytes, int producer_threads = 32,
    uint32_t producer_arrivals = 1) {
  typename Pipeline::Params params;
  if (thread < 128) {
    params.role = thread < producer_threads ? Pipeline::ThreadCategory::Producer
                                            : Pipeline::ThreadCategory::NonParticipant;
  } else {
    params.role = Pipeline::ThreadCategory::Consumer;
  }
  params.is_leader = thread % 128 == 0;
  params.num_consumers = 256;
  params.num_producers = producer_arrivals;
  params.transaction_bytes = transaction_bytes;
  return params;
}

// After the pipeline's barriers are initialized and the CTA synchronized: the cluster's CTAs see
// each other's barriers before any multicast or remote arrival.
template <int kCluster>
__device__ __forceinline__ void cluster_sync_after_init() {
  if constexpr (kCluster > 1) {
    cute::cluster_arrive_relaxed();
    cute::cluster_wait();
  }
}

// A consumer warp group none of whose rows a tile needs: it waits for and releases the tile's
// k_tiles stages without MMAs (the other warp group's MMAs run alone, and the producers, this
// CTA's and in a cluster the others', go on), and advances `read` past them.
template <class Pipeline, class State>
__device__ __forceinline__ void pass_stages(Pipeline& pipeline, State& read, int k_tiles) {
  State stage = read;
  for (int k = 0; k < k_tiles; ++k) {
    pipeline.consumer_wait(stage, pipeline.consumer_try_wait(stage));
    pipeline.consumer_release(stage);
    ++stage;
  }
  read.advance(k_tiles);
}

// The launch configuration of kCluster-CTA clusters of kThreads with smem_bytes of dynamic shared
// memory (the cluster attribute lives in *attribute).
template <int kCluster>
cudaLaunchConfig_t cluster_config(int smem_bytes, cudaStream_t stream,
                                  cudaLaunchAttribute* attribute) {
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = kCluster;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

// How many kCluster-CTA clusters of kKernel fit on the GPU at once (the SM count for one CTA);
// the shared-memory attribute is set on the first call. 0, with the error reported, when that
// fails.
template <auto kKernel, int kCluster>
int resident_clusters(int smem_bytes, const char* name) {
  static std::once_flag attribute_set;
  static cudaError_t attribute_status = cudaSuccess;
  static int resident = 0;
  std::call_once(attribute_set, [smem_bytes] {
    attribute_status =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (attribute_status == cudaSuccess && kCluster > 1) {
      cudaLaunchAttribute attribute{};
      cudaLaunchConfig_t probe = cluster_config<kCluster>(smem_bytes, nullptr, &attribute);
      probe.gridDim = dim3(static_cast<unsigned>(multiprocessor_count()));
      attribute_status = cudaOccupancyMaxActiveClusters(&resident, kKernel, &probe);
    } else {
      resident = static_cast<int>(multiprocessor_count());
    }
  });
  if (attribute_status != cudaSuccess || resident < 1) {
    report(SFMOE_ERROR_CUDA, "%s's launch setup: %s", name, cudaGetErrorString(attribute_status));
    return 0;
  }
  return resident;
}

// Launches `clusters` kCluster-CTA clusters of kKernel on `stream`.
template <auto kKernel, int kCluster, class Params>
sfmoe_status launch_clusters(const Params& params, int64_t clusters, int smem_bytes,
                             cudaStream_t stream, const char* name) {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config = cluster_config<kCluster>(smem_bytes, stream, &attribute);
  config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
  const cudaError_t launched = cudaLaunchKernelEx(&config, kKernel, params);
  if (launched != cudaSuccess) {
    return report(SFMOE_ERROR_CUDA, "%s: %s", name, cudaGetErrorString(launched));
  }
  return check_launch(name);
}

}  // namespace warp_specialized
}  // namespace cuda
}  // namespace sfmoe
