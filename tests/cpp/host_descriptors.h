// Descriptors of host buffers for the C API tests.
#pragma once

#include <stdint.h>

#include <utility>
#include <vector>

#include "sfmoe/grouped_gemm.h"
#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace testing {

// The grouped GEMM's workspace in INT64 words, the tensors the tests allocate for it (negative
// answers pass through).
inline int64_t gemm_workspace_words(int64_t groups, sfmoe_scaling a_scaling, int64_t a_rows,
                                    int64_t a_cols, sfmoe_scaling b_scaling, int64_t b_rows,
                                    int64_t b_cols) {
  const int64_t bytes = sfmoe_grouped_gemm_workspace_bytes(groups, a_scaling, a_rows, a_cols,
                                                           b_scaling, b_rows, b_cols);
  return bytes < 0 ? bytes : (bytes + 7) / 8;
}

inline sfmoe_tensor tensor_in(sfmoe_memory memory, void* data, sfmoe_dtype dtype,
                              std::vector<int64_t> dims) {
  return sfmoe_tensor_make(data, dtype, static_cast<int32_t>(dims.size()), dims.data(), memory, 0);
}

inline sfmoe_tensor host_tensor(void* data, sfmoe_dtype dtype, std::vector<int64_t> dims) {
  return tensor_in(SFMOE_MEMORY_HOST, data, dtype, std::move(dims));
}

// Rows (unquantized unless the caller sets a scaling) in groups given by `offsets`
// (num_groups + 1 entries), in `memory` (device 0 for CUDA).
inline sfmoe_grouped_tensor rows_in(sfmoe_memory memory, void* data, sfmoe_dtype dtype,
                                    int64_t num_groups, int64_t row_capacity, int64_t cols,
                                    int64_t row_alignment, int64_t* offsets) {
  sfmoe_grouped_tensor g = sfmoe_grouped_tensor_init();
  g.memory = memory;
  g.dtype = dtype;
  g.num_groups = num_groups;
  g.row_capacity = row_capacity;
  g.cols = cols;
  g.row_alignment = row_alignment;
  g.group_offsets = offsets;
  g.rowwise_data = data;
  return g;
}

inline sfmoe_grouped_tensor host_rows(void* data, sfmoe_dtype dtype, int64_t num_groups,
                                      int64_t row_capacity, int64_t cols, int64_t row_alignment,
                                      int64_t* offsets) {
  return rows_in(SFMOE_MEMORY_HOST, data, dtype, num_groups, row_capacity, cols, row_alignment,
                 offsets);
}

}  // namespace testing
}  // namespace sfmoe
