// The tensor-core scale layout expressed as a CuTe layout, for kernels that address scales
// through CuTe (the grouped GEMMs) rather than through numerics/scale_swizzle.h.
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {
namespace cuda {

// Writes the swizzled offset of every (row, col) of a [rows, scale_cols] scale matrix into
// offsets[row * scale_cols + col], computed on the device through the CuTe layout.
sfmoe_status swizzled_scale_offsets_cute(int64_t rows, int64_t scale_cols, int64_t* offsets,
                                         void* stream);

}  // namespace cuda
}  // namespace sfmoe
