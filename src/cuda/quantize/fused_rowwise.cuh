// Rowwise quantization of eight consecutive values per thread, for kernels that produce rows and
// quantize them on the fly (permute, the grouped activations): the recipes whose blocks lie within
// a row, MX_1X32 (E8M0 scales, compact or swizzled) and BLOCK_1X128 (FP32 scales, compact),
// per-tensor FP8 with given scales (TENSOR: one caller scale per group, config.tensor_scales), and
// NVFP4 1x16 once the group amax is known (the grouped activations compute it first). A
// block of B elements is B / 8 neighbouring lanes, whose amax is reduced by xor shuffles (the
// propagating max of the numerics headers, which does not depend on the order); the scale and the
// codes come from the grouped quantization's own encoder (recipe_encoder.cuh), so the bytes equal
// sfmoe_grouped_quantize of the same FP32 values.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
#include "src/common/quantize_args.h"
#include "src/cuda/quantize/recipe_encoder.cuh"

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

// A block's scale (MXFP8: kBlock 32, E8M0; FP8 1x128: kBlock 128, FP32 scale_inv) by the
// encoder's rule, and where the fused kernels store it.
template <int kBlock>
struct BlockScales {
  static constexpr sfmoe_scaling kScaling =
      kBlock == 32 ? SFMOE_SCALING_MX_1X32 : SFMOE_SCALING_BLOCK_1X128;
  encoding::BlockScale scale;
  float multiplier;
  static __device__ __forceinline__ BlockScales of(float amax, bool e5m2, bool power_of_two) {
    BlockScales s;
    s.scale =
        encoding::block_scale<kScaling>(amax, encoding::fp8_limits(e5m2), power_of_two, 1.0f, 1.0f);
    s.multiplier = s.scale.multiplier;
    return s;
  }
  __device__ __forceinline__ void store(const FusedQuantization& q, int64_t row, int64_t block_col,
                                        int64_t scale_cols) const {
    const int64_t offset = kBlock == 32 ? byte_scale_offset(q, row, block_col, scale_cols)
                                        : row * scale_cols + block_col;
    encoding::store_scale<kScaling>(q.scales, offset, scale);
  }
};

// Eight codes, packed in element order.
__device__ __forceinline__ uint2 encode_eight(const float (&v)[8], float multiplier, bool e5m2) {
  return encoding::encode_eight_fp8(v, multiplier, e5m2);
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
  const encoding::BlockScale s = encoding::block_scale<SFMOE_SCALING_NV_1X16>(
      amax, encoding::Fp8Limits{0.0f, 0.0f}, false, g.encode, g.decode);
  *scale_code = s.stored_u8;
  float mult[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) mult[i] = s.multiplier;
  uint32_t word;
  encoding::encode_packed<true, 8>(v, mult, false, false, 0, 0, 0, &word);
  return word;
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
