// The grouped quantization's input, as its kernels read it: a group's rows, and chunks of eight
// elements loaded as stored, their amax taken on the raw bits and decoded only to be encoded.
#pragma once

#include <stdint.h>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/common/group_offsets.h"
#include "src/common/quantize_args.h"
#include "src/cuda/common/raw_amax.h"

namespace sfmoe {
namespace cuda {
namespace quantizer {

using namespace numerics;

constexpr int kThreads = 256;  // the small kernels (the offsets scan aside)
constexpr int kChunk = 8;      // elements per chunk

struct InputSpan {
  int64_t begin, rows;
};

SFMOE_HD InputSpan input_span(const GroupedInput& in, int64_t g) {
  if (in.offsets == nullptr) {
    int64_t begin = g * in.uniform_rows, end = begin + in.uniform_rows;
    begin = begin > in.row_capacity ? in.row_capacity : begin;
    end = end > in.row_capacity ? in.row_capacity : end;
    return InputSpan{begin, end - begin};
  }
  const GroupRows r = clamp_group_rows(in.offsets, g, in.row_capacity);
  return InputSpan{r.begin, r.end - r.begin};
}

// ---- raw input chunks ------------------------------------------------------------------------
// 8 elements as
// stored (8 FP32 words, or 8 16-bit codes in 4 words): loads stay in flight as compact vectors, the
// amax is taken on the raw bits, and values are decoded only to be encoded.
template <sfmoe_dtype In>
struct RawChunk {
  static constexpr int kWords = In == SFMOE_DTYPE_FP32 ? 8 : 4;
  uint32_t w[kWords];
};

// A whole chunk from 16-byte aligned memory.
template <sfmoe_dtype In>
__device__ __forceinline__ void load_raw_vectors(const uint8_t* from, RawChunk<In>& r) {
  const uint4* p = reinterpret_cast<const uint4*>(from);
#pragma unroll
  for (int v = 0; v < RawChunk<In>::kWords / 4; ++v) {
    const uint4 x = __ldg(p + v);
    r.w[4 * v] = x.x;
    r.w[4 * v + 1] = x.y;
    r.w[4 * v + 2] = x.z;
    r.w[4 * v + 3] = x.w;
  }
}

template <sfmoe_dtype In>
__device__ __forceinline__ void load_raw(const void* data, int64_t row, int64_t col, int64_t cols,
                                         RawChunk<In>& r) {
  constexpr int kBits = In == SFMOE_DTYPE_FP32 ? 32 : 16;
  const int64_t index = row * cols + col;
  if (col + 8 <= cols && cols % 8 == 0) {
    load_raw_vectors<In>(static_cast<const uint8_t*>(data) + index * (kBits / 8), r);
    return;
  }
#pragma unroll
  for (int k = 0; k < RawChunk<In>::kWords; ++k) r.w[k] = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t code = col + k < cols ? load_code(data, kBits, index + k) : 0u;
    if (kBits == 32)
      r.w[k] = code;
    else
      r.w[k / 2] |= code << (16 * (k & 1));
  }
}

template <sfmoe_dtype In>
__device__ __forceinline__ void zero_raw(RawChunk<In>& r) {
#pragma unroll
  for (int k = 0; k < RawChunk<In>::kWords; ++k) r.w[k] = 0;
}

// Element k of a raw 16-bit-pair word stream or FP32 word stream, decoded.
template <sfmoe_dtype In>
__device__ __forceinline__ float decode_half_word(uint32_t word, int half) {
  const uint32_t code = half ? word >> 16 : word & 0xFFFFu;
  if constexpr (In == SFMOE_DTYPE_BF16) {
    return __uint_as_float(half ? word & 0xFFFF0000u : word << 16);
  } else {
    return decode_element(In, code);
  }
}

template <sfmoe_dtype In>
__device__ __forceinline__ void decode_raw(const RawChunk<In>& r, float v[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    if constexpr (In == SFMOE_DTYPE_FP32) {
      v[k] = __uint_as_float(r.w[k]);
    } else {
      v[k] = decode_half_word<In>(r.w[k / 2], k & 1);
    }
  }
}

// amax_bits of the chunk's propagating amax (docs/quantization.md), from the raw codes.
template <sfmoe_dtype In>
__device__ __forceinline__ uint32_t raw_amax_bits(const RawChunk<In>& r) {
  if constexpr (In == SFMOE_DTYPE_FP32) {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) m = max(m, r.w[k] & kF32AbsMask);
    return m;
  } else {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) m = abs_max_u16x2(m, r.w[k]);
    return half_magnitude_amax_bits(In, max(m >> 16, m & 0xFFFFu));
  }
}

__device__ __forceinline__ uint32_t shfl_max(uint32_t v, int lane_mask) {
  return max(v, __shfl_xor_sync(0xFFFFFFFFu, v, lane_mask));
}

}  // namespace quantizer
}  // namespace cuda
}  // namespace sfmoe
