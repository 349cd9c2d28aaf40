// Asynchronous global-to-shared copies (sm_80+ cp.async): a kernel starts the loads of the steps
// ahead without holding their bytes in registers, and waits for a step's group before reading it.
#pragma once

namespace sfmoe {
namespace cuda {

// 16 bytes; src-size 0 reads nothing and zero-fills the 16 bytes (padding rows, columns past the
// end).
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global),
               "r"(fill ? 16 : 0)
               : "memory");
}

// 4 bytes (through L1), zero-filled when !fill.
__device__ __forceinline__ void cp_async_4(void* shared, const void* global, bool fill) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(global),
               "r"(fill ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace cuda
}  // namespace sfmoe
