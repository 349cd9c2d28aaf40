// The CPU reference backend: plain loops over the numerics headers. These define the operations;
// the CUDA backend is checked against them.
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace cpu {

void check_group_offsets(const int64_t* offsets, int64_t num_groups, int64_t row_capacity,
                         int64_t row_alignment, sfmoe_fault_report* word);
void cast(const void* input, sfmoe_dtype input_dtype, void* output, sfmoe_dtype output_dtype,
          int64_t count, float scale);

}  // namespace cpu
}  // namespace sfmoe
