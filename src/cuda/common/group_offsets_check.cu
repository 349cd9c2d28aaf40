// Device-side check of a grouped tensor's offsets: one thread per group, faults to the word.
#include "src/common/group_offsets.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

__global__ void check_group_offsets_kernel(const int64_t* offsets, int64_t num_groups,
                                           int64_t row_capacity, int64_t row_alignment,
                                           sfmoe_fault_report* word) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < num_groups;
       g += stride) {
    check_group(offsets, g, row_capacity, row_alignment, word);
  }
}

}  // namespace

sfmoe_status check_group_offsets(const int64_t* offsets, int64_t num_groups, int64_t row_capacity,
                                 int64_t row_alignment, sfmoe_fault_report* word, void* stream) {
  constexpr int kThreads = 256;
  check_group_offsets_kernel<<<grid_for(num_groups, kThreads), kThreads, 0,
                               static_cast<cudaStream_t>(stream)>>>(
      offsets, num_groups, row_capacity, row_alignment, word);
  return check_launch("check_group_offsets_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
