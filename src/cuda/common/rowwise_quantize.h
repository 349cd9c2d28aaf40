// Rowwise quantization of eight consecutive values per thread, for kernels that produce rows and
// quantize them on the fly (permute, the grouped activations): the recipes whose blocks lie within
// a row, MX_1X32 (E8M0 scales, compact or swizzled) and BLOCK_1X128 (FP32 scales, compact),
// per-tensor FP8 with given scales (TENSOR: one caller scale per group, config.tensor_scales), and
// NVFP4 1x16 once the group amax is known (the grouped activations compute it first). A
// block of B elements is B / 8 neighbouring lanes, whose amax is reduced by xor shuffles (the
// propagating max of the numerics headers, which does not depend on the order); the scale and the
// codes are the grouped quantization's (docs/quantization.md), so the bytes equal
// sfmoe_grouped_quantize of the same FP32 values.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
#include "src/common/quantize_args.h"

namespace sfmoe {
namespace cuda {

struct FusedQuantization {
  uint8_t* codes;  // [row_capacity, hidden]
  void* scales;    // compact [row_capacity, hidden / B] or swizzled; TENSOR: [num_groups] scale_inv
  bool e5m2, swizzled, power_of_two;
  const float* tensor_scales;  // TENSOR: [num_groups] given scales
  float* amax;                 // TENSOR: [num_groups] group amax (bit-pattern max, order-free)
  int64_t num_groups;
};

// TENSOR: the block value standing for "one scale per group" in the kernels' templates.
constexpr int kTensorQuantBlock = 1;
// NVFP4 1x16 (E2M1 codes, E4M3 block scales under the group's global scale from q.amax).
constexpr int kNvfp4QuantBlock = 16;

// TENSOR: scale_inv[g] = scale_inverse(given scale[g]) for every group (empty ones included).
template <int kUnused = 0>
__global__ void tensor_scale_inverse_kernel(FusedQuantization q) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < q.num_groups)
    static_cast<float*>(q.scales)[g] = numerics::scale_inverse(q.tensor_scales[g]);
}

// Where the byte scale (E8M0 or E4M3) of block (row, block_col) goes, compact or swizzled.
__device__ __forceinline__ int64_t byte_scale_offset(const FusedQuantization& q, int64_t row,
                                                     int64_t block_col, int64_t scale_cols) {
  return scale_offset(q.swizzled ? SFMOE_SCALE_LAYOUT_SWIZZLED : SFMOE_SCALE_LAYOUT_COMPACT, row,
                      block_col, scale_cols);
}

template <int kBlock>
struct BlockScales {
  float multiplier, scale_inv;
  uint8_t code;
  static __device__ __forceinline__ BlockScales of(float amax, bool e5m2, bool power_of_two) {
    const float fp8_max = e5m2 ? numerics::kE5M2Max : numerics::kE4M3Max;
    BlockScales s;
    if constexpr (kBlock == 32) {
      s.code = numerics::mx_scale_from_amax(amax, fp8_max);
      s.multiplier = numerics::mx_multiplier(s.code);
      s.scale_inv = 0.0f;
    } else {
      s.multiplier = numerics::fp8_scale_from_amax(amax, fp8_max, power_of_two);
      s.scale_inv = numerics::scale_inverse(s.multiplier);
      s.code = 0;
    }
    return s;
  }
  __device__ __forceinline__ void store(const FusedQuantization& q, int64_t row, int64_t block_col,
                                        int64_t scale_cols) const {
    if constexpr (kBlock == 32) {
      static_cast<uint8_t*>(q.scales)[byte_scale_offset(q, row, block_col, scale_cols)] = code;
    } else {
      static_cast<float*>(q.scales)[row * scale_cols + block_col] = scale_inv;
    }
  }
};

// Eight codes, packed in element order.
__device__ __forceinline__ uint2 encode_eight(const float (&v)[8], float multiplier, bool e5m2) {
  uint32_t words[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float x = numerics::mul_rn(v[i], multiplier);
    const uint32_t code = e5m2 ? numerics::f32_to_e5m2(x) : numerics::f32_to_e4m3(x);
    words[i / 4] |= code << (8 * (i % 4));
  }
  return make_uint2(words[0], words[1]);
}

// The swizzled layout's padding columns of a written row (scale_cols not a multiple of 4) are 0.
__device__ __forceinline__ void zero_swizzle_padding(const FusedQuantization& q, int64_t row,
                                                     int64_t scale_cols) {
  const int64_t padded = numerics::round_up(scale_cols, numerics::kSwizzleTileCols);
  for (int64_t c = scale_cols; c < padded; ++c) {
    static_cast<uint8_t*>(q.scales)[numerics::swizzled_scale_offset(row, c, scale_cols)] = 0;
  }
}

// The codes of this thread's eight values and their block's scales. Every lane of the warp calls
// it (the block amax is a shuffle); lanes without data pass zeros.
template <int kBlock>
__device__ __forceinline__ uint2 quantize_eight(const float (&v)[8], const FusedQuantization& q,
                                                BlockScales<kBlock>* scales) {
  constexpr int kLanesPerBlock = kBlock / 8;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = numerics::amax_accumulate(amax, v[i]);
#pragma unroll
  for (int width = 1; width < kLanesPerBlock; width *= 2) {
    amax = numerics::amax_accumulate(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, width));
  }
  *scales = BlockScales<kBlock>::of(amax, q.e5m2, q.power_of_two);
  return encode_eight(v, scales->multiplier, q.e5m2);
}

// NVFP4 1x16: the group's global encode scale S_enc and its inverse, from the group amax.
struct Nvfp4GroupScale {
  float encode, decode;
  static __device__ __forceinline__ Nvfp4GroupScale of(float group_amax) {
    const float encode = numerics::nvfp4_global_encode_scale(group_amax);
    return Nvfp4GroupScale{encode, numerics::nvfp4_global_decode_scale(encode)};
  }
};

// NVFP4 1x16: this thread's eight values (half of a 16-element block: the neighbouring lane
// holds the other half) as eight E2M1 codes in one word, element 0 in the low nibble, and the
// block's E4M3 scale code. Every lane of the warp calls it (the block amax is a shuffle).
__device__ __forceinline__ uint32_t quantize_eight_nvfp4(const float (&v)[8], Nvfp4GroupScale g,
                                                         uint8_t* scale_code) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = numerics::amax_accumulate(amax, v[i]);
  amax = numerics::amax_accumulate(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  *scale_code = numerics::nvfp4_block_scale(amax, g.encode);
  const float multiplier = numerics::nvfp4_block_multiplier_from_decode(*scale_code, g.decode);
  float scaled[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) scaled[i] = numerics::mul_rn(v[i], multiplier);  // canonical NaNs
  return numerics::pack_e2m1x8_canonical_nan(scaled);
}

// The fused form of a rowwise quantization from its backend arguments.
inline FusedQuantization fused_quantization_of(const GroupedQuantizeArgs& q) {
  return FusedQuantization{static_cast<uint8_t*>(q.rowwise),
                           q.rowwise_scale_inv,
                           q.dtype == SFMOE_DTYPE_FP8_E5M2,
                           q.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED,
                           q.config.power_of_two_scales != 0,
                           q.config.tensor_scales,
                           q.amax,
                           q.num_groups};
}

// TENSOR, before the fused kernel on the same stream: the group amax cleared (the kernel adds to
// it by atomic max) and every group's scale_inv written.
inline cudaError_t prepare_tensor_quantization(const FusedQuantization& q, cudaStream_t stream) {
  const cudaError_t cleared =
      cudaMemsetAsync(q.amax, 0, sizeof(float) * static_cast<size_t>(q.num_groups), stream);
  if (cleared != cudaSuccess || q.num_groups == 0) return cleared;
  tensor_scale_inverse_kernel<<<static_cast<unsigned>((q.num_groups + 255) / 256), 256, 0,
                                stream>>>(q);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace sfmoe
