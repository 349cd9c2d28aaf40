// Dequantization of grouped tensors and the scale swizzle (any arch). These serve checks,
// debugging and checkpoints; they are simple grid-stride kernels, not tuned.
#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

using namespace numerics;

// The FP32 decode factor of element (r, c) of the rowwise matrix, read from the chosen copy's
// scales (docs/quantization.md, Dequantize).
__device__ float decode_factor(const GroupedQuantizeArgs& a, bool columnwise, int64_t r, int64_t c,
                               int64_t g) {
  const int64_t R = a.row_capacity, C = a.cols;
  const void* scales = columnwise ? a.columnwise_scale_inv : a.rowwise_scale_inv;
  const int64_t major = columnwise ? c : r, minor = columnwise ? r : c;
  const int64_t minor_size = columnwise ? R : C;
  switch (a.scaling) {
    case SFMOE_SCALING_TENSOR: return static_cast<const float*>(scales)[g];
    case SFMOE_SCALING_BLOCK_1X128:
      return static_cast<const float*>(scales)[block_1x128_scale_offset(
          a.scale_layout, columnwise, major, minor / 128, minor_size / 128, columnwise ? C : R)];
    case SFMOE_SCALING_BLOCK_128X128:
      return static_cast<const float*>(scales)[(major / 128) * (minor_size / 128) + minor / 128];
    case SFMOE_SCALING_MX_1X32:
      return e8m0_to_f32(static_cast<const uint8_t*>(scales)[scale_offset(a.scale_layout, major, minor / 32, minor_size / 32)]);
    default: {
      const bool hadamard = columnwise && a.config.hadamard_columnwise;
      const float global = nvfp4_global_encode_scale(hadamard ? a.columnwise_amax[g] : a.amax[g]);
      const int64_t offset = a.scaling == SFMOE_SCALING_NV_16X16
                                 ? (major / 16) * (minor_size / 16) + minor / 16
                                 : scale_offset(a.scale_layout, major, minor / 16, minor_size / 16);
      return mul_rn(e4m3_to_f32(static_cast<const uint8_t*>(scales)[offset]), div_rn(1.0f, global));
    }
  }
}

__device__ float decode_code(const GroupedQuantizeArgs& a, const void* copy, int64_t index) {
  if (a.dtype == SFMOE_DTYPE_FP4_E2M1) return e2m1_to_f32(load_code(copy, 4, index));
  const uint8_t code = static_cast<const uint8_t*>(copy)[index];
  return a.dtype == SFMOE_DTYPE_FP8_E5M2 ? e5m2_to_f32(code) : e4m3_to_f32(code);
}

__device__ void store_value(void* out, sfmoe_dtype dtype, int64_t index, float v) {
  const uint32_t code = encode_element(dtype, v);
  if (dtype == SFMOE_DTYPE_FP32) static_cast<uint32_t*>(out)[index] = code;
  else static_cast<uint16_t*>(out)[index] = static_cast<uint16_t>(code);
}

__global__ void dequantize_rowwise_kernel(GroupedDequantizeArgs d) {
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t total = quantized_group_offset(a, a.num_groups) * a.cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / a.cols, c = e % a.cols;
    const float v = mul_rn(decode_code(a, a.rowwise, e), decode_factor(a, false, r, c, quantized_group_of_row(a, r)));
    store_value(d.output, d.output_dtype, e, v);
  }
}

// One thread per (column, 16-row block) so the inverse Hadamard transform sees its block.
__global__ void dequantize_columnwise_kernel(GroupedDequantizeArgs d) {
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t rows = quantized_group_offset(a, a.num_groups), R = a.row_capacity, C = a.cols;
  const int64_t blocks = (rows + 15) / 16 * C;
  const bool hadamard = a.dtype == SFMOE_DTYPE_FP4_E2M1 && a.config.hadamard_columnwise;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < blocks; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = q % C, r0 = (q / C) * 16;
    float v[16];
    for (int m = 0; m < 16; ++m) {
      const int64_t r = r0 + m;
      v[m] = r < rows ? mul_rn(decode_code(a, a.columnwise, c * R + r), decode_factor(a, true, r, c, quantized_group_of_row(a, r)))
                      : 0.0f;
    }
    if (hadamard) hadamard16_inverse(v);
    for (int m = 0; m < 16 && r0 + m < rows; ++m) store_value(d.output, d.output_dtype, (r0 + m) * C + c, v[m]);
  }
}

__global__ void swizzle_kernel(const uint8_t* from, int64_t rows, int64_t scale_cols, uint8_t* to,
                               bool unswizzle) {
  const int64_t n = unswizzle ? rows * scale_cols : swizzled_scale_padded_size(rows, scale_cols);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    if (unswizzle) {
      to[o] = from[swizzled_scale_offset(o / scale_cols, o % scale_cols, scale_cols)];
    } else {
      int64_t r, c;
      swizzled_scale_position(o, scale_cols, &r, &c);
      to[o] = (r < rows && c < scale_cols) ? from[r * scale_cols + c] : 0;
    }
  }
}

}  // namespace

sfmoe_status grouped_dequantize(const GroupedDequantizeArgs& d, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  constexpr int kThreads = 256;
  const int64_t bound = d.quantized.row_capacity * d.quantized.cols;
  if (d.from_columnwise) {
    dequantize_columnwise_kernel<<<grid_for(bound / 16 + 1, kThreads), kThreads, 0, stream>>>(d);
  } else {
    dequantize_rowwise_kernel<<<grid_for(bound, kThreads), kThreads, 0, stream>>>(d);
  }
  return check_launch("sfmoe_grouped_dequantize", "dequantize_kernel");
}

sfmoe_status swizzle_scales(const uint8_t* from, int64_t rows, int64_t scale_cols, uint8_t* to,
                            bool unswizzle, void* stream_handle) {
  constexpr int kThreads = 256;
  swizzle_kernel<<<grid_for(swizzled_scale_padded_size(rows, scale_cols), kThreads), kThreads, 0,
                   static_cast<cudaStream_t>(stream_handle)>>>(from, rows, scale_cols, to, unswizzle);
  return check_launch(unswizzle ? "sfmoe_unswizzle_scales" : "sfmoe_swizzle_scales", "swizzle_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
