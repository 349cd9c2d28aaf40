// Descriptors of host buffers for the C API tests.
#pragma once

#include <stdint.h>

#include <vector>

#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace testing {

inline sfmoe_tensor host_tensor(void* data, sfmoe_dtype dtype, std::vector<int64_t> dims) {
  return sfmoe_tensor_make(data, dtype, static_cast<int32_t>(dims.size()), dims.data(),
                           SFMOE_MEMORY_HOST, 0);
}

// Unquantized rows in groups given by `offsets` (num_groups + 1 entries).
inline sfmoe_grouped_tensor host_rows(void* data, sfmoe_dtype dtype, int64_t num_groups,
                                      int64_t row_capacity, int64_t cols, int64_t row_alignment,
                                      int64_t* offsets) {
  sfmoe_grouped_tensor g = sfmoe_grouped_tensor_init();
  g.memory = SFMOE_MEMORY_HOST;
  g.dtype = dtype;
  g.num_groups = num_groups;
  g.row_capacity = row_capacity;
  g.cols = cols;
  g.row_alignment = row_alignment;
  g.group_offsets = offsets;
  g.rowwise_data = data;
  return g;
}

}  // namespace testing
}  // namespace sfmoe
