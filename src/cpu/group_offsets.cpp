#include "src/common/group_offsets.h"

#include "src/cpu/backend.h"

namespace sfmoe {
namespace cpu {

void check_group_offsets(const int64_t* offsets, int64_t num_groups, int64_t row_capacity,
                         int64_t row_alignment, sfmoe_fault_report* word) {
  for (int64_t g = 0; g < num_groups; ++g) {
    check_group(offsets, g, row_capacity, row_alignment, word);
  }
}

}  // namespace cpu
}  // namespace sfmoe
