// Dequantization of grouped tensors and the scale swizzle (any arch). Dequantize serves checks,
// debugging and checkpoints, and the grouped GEMM's MXFP8 / NVFP4 emulation (which decodes both
// operands on every call), so its common shapes take tiled kernels:
//   rowwise:    a warp per row (its group and NVFP4 global scale found once), eight elements per
//               lane and step: one 8- or 4-byte code load, one scale per chunk, 16-byte stores;
//   columnwise: 64 x 64 tiles; four lanes read a column's 64 contiguous codes (16 rows each, one
//               scale block, the inverse Hadamard transform applied there), the tile is turned
//               in shared memory and written as rows of 16-byte stores.
// Other shapes (columns not a multiple of 8, unaligned buffers) take element-wise grid-stride
// kernels. All compute each value as mul_rn(code, factor) with the factor of dequantize_factor(),
// so every form gives the same bits.
#include <stdint.h>

#include <type_traits>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

using namespace numerics;

// An element's value from its copy's codes.
__device__ float decode_code(const GroupedQuantizeArgs& a, const void* copy, int64_t index) {
  return decode_element(a.dtype, load_code(copy, a.dtype == SFMOE_DTYPE_FP4_E2M1 ? 4 : 8, index));
}

__device__ void store_value(void* out, sfmoe_dtype dtype, int64_t index, float v) {
  const uint32_t code = encode_element(dtype, v);
  if (dtype == SFMOE_DTYPE_FP32)
    static_cast<uint32_t*>(out)[index] = code;
  else
    static_cast<uint16_t*>(out)[index] = static_cast<uint16_t>(code);
}

__global__ void dequantize_rowwise_kernel(GroupedDequantizeArgs d) {
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t total = dequantized_rows(a) * a.cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / a.cols, c = e % a.cols, g = quantized_group_of_row(a, r);
    const float v =
        mul_rn(decode_code(a, a.rowwise, e),
               dequantize_factor(a, false, r, c, g, dequantize_global_decode(a, false, g)));
    store_value(d.output, d.output_dtype, e, v);
  }
}

// One thread per (column, 16-row block) so the inverse Hadamard transform sees its block.
__global__ void dequantize_columnwise_kernel(GroupedDequantizeArgs d) {
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t rows = dequantized_rows(a), R = a.row_capacity, C = a.cols;
  const int64_t blocks = (rows + 15) / 16 * C;
  const bool hadamard = a.dtype == SFMOE_DTYPE_FP4_E2M1 && a.config.hadamard_columnwise;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < blocks;
       q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = q % C, r0 = (q / C) * 16;
    float v[16];
    for (int m = 0; m < 16; ++m) {
      const int64_t r = r0 + m;
      const int64_t g = r < rows ? quantized_group_of_row(a, r) : 0;
      v[m] = r < rows
                 ? mul_rn(decode_code(a, a.columnwise, c * R + r),
                          dequantize_factor(a, true, r, c, g, dequantize_global_decode(a, true, g)))
                 : 0.0f;
    }
    if (hadamard) hadamard16_inverse(v);
    for (int m = 0; m < 16 && r0 + m < rows; ++m)
      store_value(d.output, d.output_dtype, (r0 + m) * C + c, v[m]);
  }
}

// Eight decoded values to out[index, index + 8) as the output dtype, by 16-byte stores.
__device__ __forceinline__ void store_eight(void* out, sfmoe_dtype dtype, int64_t index,
                                            const float (&v)[8]) {
  if (dtype == SFMOE_DTYPE_FP32) {
    float4* p = reinterpret_cast<float4*>(static_cast<float*>(out) + index);
    p[0] = make_float4(v[0], v[1], v[2], v[3]);
    p[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = encode_element(dtype, v[2 * i]) | (encode_element(dtype, v[2 * i + 1]) << 16);
  }
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + index) =
      make_uint4(w[0], w[1], w[2], w[3]);
}

// The tiled kernels are compiled per code format (kCode: a.dtype, E4M3, E5M2 or E2M1) so that each
// code's decode is straight-line code rather than a switch per element.
template <class Launch>
void launch_for_code_format(sfmoe_dtype dtype, Launch&& launch) {
  switch (dtype) {
    case SFMOE_DTYPE_FP8_E5M2:
      launch(std::integral_constant<sfmoe_dtype, SFMOE_DTYPE_FP8_E5M2>{});
      return;
    case SFMOE_DTYPE_FP4_E2M1:
      launch(std::integral_constant<sfmoe_dtype, SFMOE_DTYPE_FP4_E2M1>{});
      return;
    default:
      launch(std::integral_constant<sfmoe_dtype, SFMOE_DTYPE_FP8_E4M3>{});
  }
}

constexpr int kRowsThreads = 256;
template <sfmoe_dtype kCode>
__global__ void __launch_bounds__(kRowsThreads) dequantize_rows_kernel(GroupedDequantizeArgs d) {
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t rows = dequantized_rows(a), C = a.cols, chunks = C / 8;
  constexpr bool fp4 = kCode == SFMOE_DTYPE_FP4_E2M1;
  constexpr int kWarps = kRowsThreads / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t g = quantized_group_of_row(a, r);
    const float global_decode = dequantize_global_decode(a, false, g);
    for (int64_t c = lane; c < chunks; c += 32) {
      // Eight codes: 8 bytes (FP8) or 4 (E2M1, element 2i in the low nibble).
      uint32_t lo, hi;
      if (fp4) {
        lo = static_cast<const uint32_t*>(a.rowwise)[(r * C) / 8 + c];
        hi = 0u;
      } else {
        const uint2 raw = static_cast<const uint2*>(a.rowwise)[(r * C) / 8 + c];
        lo = raw.x;
        hi = raw.y;
      }
      // One factor per chunk: every recipe's blocks hold whole chunks of eight.
      const float factor = dequantize_factor(a, false, r, c * 8, g, global_decode);
      float v[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t code =
            fp4 ? (lo >> (4 * i)) & 0xFu : ((i < 4 ? lo : hi) >> (8 * (i % 4))) & 0xFFu;
        v[i] = mul_rn(decode_element(kCode, code), factor);
      }
      store_eight(d.output, d.output_dtype, r * C + c * 8, v);
    }
  }
}

constexpr int kTile = 64;  // rows and columns of a columnwise tile
constexpr int kTileThreads = 256;
static_assert(kTileThreads == kTile * 4, "four lanes (16 rows each) per column of the tile");

template <sfmoe_dtype kCode>
__global__ void __launch_bounds__(kTileThreads)
    dequantize_columns_kernel(GroupedDequantizeArgs d, bool vector_loads) {
  const GroupedQuantizeArgs& a = d.quantized;
  __shared__ float tile[kTile][kTile + 1];
  const int64_t rows = dequantized_rows(a), R = a.row_capacity, C = a.cols;
  constexpr bool fp4 = kCode == SFMOE_DTYPE_FP4_E2M1;
  const bool hadamard = fp4 && a.config.hadamard_columnwise;
  const bool per_row_group = a.scaling == SFMOE_SCALING_TENSOR;  // blocks follow no 16-row rule
  const int segment = threadIdx.x % 4, j = threadIdx.x / 4;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, c = c0 + j;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    const int64_t first = r0 + segment * 16;
    float v[16];
    if (c < C && first < rows) {
      uint32_t words[4] = {0u, 0u, 0u, 0u};  // 16 codes of column c, rows first..first + 15
      const int64_t index = c * R + first;   // (element index in the columnwise copy)
      if (vector_loads) {
        if (fp4) {
          const uint2 raw = static_cast<const uint2*>(a.columnwise)[index / 16];
          words[0] = raw.x, words[1] = raw.y;
        } else {
          const uint4 raw = static_cast<const uint4*>(a.columnwise)[index / 16];
          words[0] = raw.x, words[1] = raw.y, words[2] = raw.z, words[3] = raw.w;
        }
      }
      const int64_t g0 = quantized_group_of_row(a, first);
      const float factor0 =
          dequantize_factor(a, true, first, c, g0, dequantize_global_decode(a, true, g0));
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const int64_t r = first + m;
        uint32_t code;
        if (vector_loads) {
          code = fp4 ? (words[m / 8] >> (4 * (m % 8))) & 0xFu
                     : (words[m / 4] >> (8 * (m % 4))) & 0xFFu;
        } else {
          code = r < rows ? load_code(a.columnwise, fp4 ? 4 : 8, index + m) : 0u;
        }
        float factor = factor0;
        if (per_row_group && r < rows) {
          const int64_t g = quantized_group_of_row(a, r);
          factor = dequantize_factor(a, true, r, c, g, 1.0f);
        }
        v[m] = r < rows ? mul_rn(decode_element(kCode, code), factor) : 0.0f;
      }
      if (hadamard) hadamard16_inverse(v);
    } else {
#pragma unroll
      for (int m = 0; m < 16; ++m) v[m] = 0.0f;
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) tile[segment * 16 + m][j] = v[m];
    __syncthreads();
    // The tile's rows: eight lanes per row, eight values each.
    for (int row = threadIdx.x / 8; row < kTile; row += kTileThreads / 8) {
      const int64_t r = r0 + row, col = c0 + (threadIdx.x % 8) * 8;
      if (r < rows && col < C) {
        float out[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) out[i] = tile[row][(threadIdx.x % 8) * 8 + i];
        store_eight(d.output, d.output_dtype, r * C + col, out);
      }
    }
    __syncthreads();
  }
}

__global__ void swizzle_kernel(const uint8_t* from, int64_t rows, int64_t scale_cols, uint8_t* to,
                               bool unswizzle) {
  const int64_t n = unswizzle ? rows * scale_cols : swizzled_scale_padded_size(rows, scale_cols);
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n;
       o += int64_t(gridDim.x) * blockDim.x) {
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
  const GroupedQuantizeArgs& a = d.quantized;
  const int64_t bound = a.row_capacity * a.cols;
  if (bound == 0) return SFMOE_SUCCESS;
  // The tiled kernels: columns a multiple of 8 (whole chunks and 16-byte stores) and an aligned
  // output.
  const int out_bytes = d.output_dtype == SFMOE_DTYPE_FP32 ? 4 : 2;
  const bool tiled = a.cols % 8 == 0 && reinterpret_cast<uintptr_t>(d.output) % 16 == 0 &&
                     (a.cols * out_bytes) % 16 == 0;
  if (d.from_columnwise) {
    if (tiled && a.row_capacity % 16 == 0) {
      // 16 codes of a column as one load: the segment's start 8- (E2M1) or 16-byte aligned.
      const bool fp4 = a.dtype == SFMOE_DTYPE_FP4_E2M1;
      const bool vector_loads = reinterpret_cast<uintptr_t>(a.columnwise) % (fp4 ? 8 : 16) == 0;
      const int64_t row_tiles = (a.row_capacity + kTile - 1) / kTile;
      const dim3 grid(static_cast<unsigned>((a.cols + kTile - 1) / kTile),
                      static_cast<unsigned>(row_tiles < 65535 ? row_tiles : 65535));
      launch_for_code_format(a.dtype, [&](auto code) {
        dequantize_columns_kernel<decltype(code)::value>
            <<<grid, kTileThreads, 0, stream>>>(d, vector_loads);
      });
    } else {
      dequantize_columnwise_kernel<<<grid_for(bound / 16 + 1, kThreads), kThreads, 0, stream>>>(d);
    }
  } else {
    const bool fp4 = a.dtype == SFMOE_DTYPE_FP4_E2M1;
    if (tiled && reinterpret_cast<uintptr_t>(a.rowwise) % (fp4 ? 4 : 8) == 0) {
      const int64_t blocks = (a.row_capacity + 7) / 8;
      launch_for_code_format(a.dtype, [&](auto code) {
        dequantize_rows_kernel<decltype(code)::value>
            <<<grid_for(blocks * kRowsThreads, kRowsThreads), kRowsThreads, 0, stream>>>(d);
      });
    } else {
      dequantize_rowwise_kernel<<<grid_for(bound, kThreads), kThreads, 0, stream>>>(d);
    }
  }
  return check_launch("dequantize_kernel");
}

sfmoe_status swizzle_scales(const uint8_t* from, int64_t rows, int64_t scale_cols, uint8_t* to,
                            bool unswizzle, void* stream_handle) {
  constexpr int kThreads = 256;
  swizzle_kernel<<<grid_for(swizzled_scale_padded_size(rows, scale_cols), kThreads), kThreads, 0,
                   static_cast<cudaStream_t>(stream_handle)>>>(from, rows, scale_cols, to,
                                                               unswizzle);
  return check_launch("swizzle_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
