// The Hopper bulk-copy (TMA, non-tensor) instructions as small device functions: a global ->
// shared copy that completes on an mbarrier, and shared -> global copies tracked per thread by
// bulk groups. Addresses and sizes must be multiples of 16 bytes (the callers check). One
// instruction moves a whole row, where a vector copy needs one load or store per 16 bytes and
// thread; the kernels that fan a row out to several destinations use it so that the stores are
// issued by the copy engine, not by the warps.
#pragma once

#include <stdint.h>

namespace sfmoe {
namespace cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Initializes the mbarrier for one arriving thread and makes it visible to the copy engine.
__device__ __forceinline__ void mbarrier_init_single(uint64_t* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(barrier)));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The calling thread arrives, announcing `bytes` of transfer, and starts the copy
// global[source, source + bytes) -> shared[destination, ...); the phase completes when they land.
__device__ __forceinline__ void bulk_load_to_shared(void* destination, const void* source,
                                                    uint32_t bytes, uint64_t* barrier) {
  const uint32_t bar = shared_address(barrier);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(shared_address(destination)),
      "l"(source), "r"(bytes), "r"(bar)
      : "memory");
}

// Waits until the barrier's phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t phase) {
  const uint32_t bar = shared_address(barrier);
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  }
}

// shared[source, source + bytes) -> global[destination, ...), in the calling thread's open group.
__device__ __forceinline__ void bulk_store_from_shared(void* destination, const void* source,
                                                       uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(destination),
               "r"(shared_address(source)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// The calling thread's committed stores have read their shared source (it may be overwritten).
__device__ __forceinline__ void bulk_wait_source_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// The calling thread's committed stores are complete.
__device__ __forceinline__ void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Orders this thread's ordinary shared-memory writes before later bulk copies that read them.
__device__ __forceinline__ void fence_shared_for_bulk_copies() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace cuda
}  // namespace sfmoe
