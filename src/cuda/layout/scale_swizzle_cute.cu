#include <cute/layout.hpp>

#include "src/cuda/common/cuda_check.h"
#include "src/cuda/layout/scale_swizzle_cute.h"

namespace sfmoe {
namespace cuda {

// Rows decompose as (32, 4, tile rows) and columns as (4, tile columns): a row's position inside
// its 32-row slice is the major index (stride 16), the 32-row slice within the 128-row tile next
// (stride 4), the column within its group of four last (stride 1); whole tiles are 512 entries
// apart, in row-major tile order.
template <class TileRows, class TileCols>
__host__ __device__ auto make_swizzled_scale_layout(TileRows tile_rows, TileCols tile_cols) {
  using namespace cute;
  return make_layout(
      make_shape(make_shape(Int<32>{}, Int<4>{}, tile_rows), make_shape(Int<4>{}, tile_cols)),
      make_stride(make_stride(Int<16>{}, Int<4>{}, Int<512>{} * tile_cols),
                  make_stride(Int<1>{}, Int<512>{})));
}

namespace {

__global__ void swizzled_offsets_kernel(int64_t rows, int64_t scale_cols, int64_t* offsets) {
  const int64_t tile_rows = (rows + 127) / 128;
  const int64_t tile_cols = (scale_cols + 3) / 4;
  const auto layout = make_swizzled_scale_layout(tile_rows, tile_cols);
  const int64_t total = rows * scale_cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += stride) {
    offsets[i] = layout(i / scale_cols, i % scale_cols);
  }
}

}  // namespace

sfmoe_status swizzled_scale_offsets_cute(int64_t rows, int64_t scale_cols, int64_t* offsets,
                                         void* stream) {
  constexpr int kThreads = 256;
  swizzled_offsets_kernel<<<grid_for(rows * scale_cols, kThreads), kThreads, 0,
                            static_cast<cudaStream_t>(stream)>>>(rows, scale_cols, offsets);
  return check_launch("swizzled_offsets_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
