// The encoding of every recipe, for the grouped quantization's kernels and for the kernels that
// quantize the rows they produce (permute, the grouped activations: fused_rowwise.cuh): a block's
// scale from its amax and how it is stored, and values times their multipliers encoded and packed
// as stored (hardware pair conversions for FP8, the branch-free packing for E2M1). One definition,
// so that every producer writes the bytes of the CPU backend (docs/quantization.md).
#pragma once

#include <stdint.h>

#include "sfmoe/numerics.h"

// nvcc reports static constexpr members of class templates that a given instantiation's
// discarded `if constexpr` branches skip as "declared but never referenced" (177).
#pragma nv_diag_suppress 177

namespace sfmoe {
namespace cuda {
namespace encoding {

using namespace numerics;

template <sfmoe_scaling S>
struct Recipe {
  static constexpr int kBlock =
      S == SFMOE_SCALING_TENSOR                                              ? 0
      : (S == SFMOE_SCALING_BLOCK_1X128 || S == SFMOE_SCALING_BLOCK_128X128) ? 128
      : S == SFMOE_SCALING_MX_1X32                                           ? 32
                                                                             : 16;
  static constexpr bool kTensor = S == SFMOE_SCALING_TENSOR;
  static constexpr bool kNv = S == SFMOE_SCALING_NV_1X16 || S == SFMOE_SCALING_NV_16X16;
  static constexpr bool k2D = S == SFMOE_SCALING_BLOCK_128X128 || S == SFMOE_SCALING_NV_16X16;
  static constexpr bool kFp8Block =
      S == SFMOE_SCALING_BLOCK_1X128 || S == SFMOE_SCALING_BLOCK_128X128;
  static constexpr bool kGroupAmax = kTensor || kNv;
};

// A non-negative position over a block size: computed unsigned, so that it is one shift (a signed
// 64-bit division by a power of two takes five instructions, and kernels do one per scale).
template <int B>
__device__ __forceinline__ int64_t blocks_before(int64_t position) {
  return static_cast<int64_t>(static_cast<uint64_t>(position) / B);
}

// ---- scale rules per recipe ------------------------------------------------------------------
struct BlockScale {
  float multiplier;   // applied to the values before encoding
  float stored_f32;   // FP32 scale_inv (FP8 tensor / blockwise)
  uint8_t stored_u8;  // E8M0 or E4M3 code (MXFP8 / NVFP4)
};

// The block scale from its amax; `global` is the group's NVFP4 encode scale S_enc and
// `global_decode` 1 / S_enc (both unused by the FP8 recipes).
// FP8 limits of the output dtype, with the reciprocal the MXFP8 rule needs computed once.
struct Fp8Limits {
  float max, inverse_max;
};

__device__ __forceinline__ Fp8Limits fp8_limits(bool e5m2) {
  const float max = e5m2 ? kE5M2Max : kE4M3Max;
  return Fp8Limits{max, div_rn(1.0f, max)};
}

template <sfmoe_scaling S>
__device__ __forceinline__ BlockScale block_scale(float block_amax, Fp8Limits fp8, bool pow2,
                                                  float global, float global_decode) {
  BlockScale s{1.0f, 1.0f, 0};
  if constexpr (Recipe<S>::kFp8Block) {
    s.multiplier = fp8_scale_from_amax(block_amax, fp8.max, pow2);
    s.stored_f32 = scale_inverse(s.multiplier);
  } else if constexpr ((S == SFMOE_SCALING_MX_1X32)) {
    s.stored_u8 = mx_scale_from_amax_and_inverse_max(block_amax, fp8.inverse_max);
    s.multiplier = mx_multiplier(s.stored_u8);
  } else if constexpr (Recipe<S>::kNv) {
    s.stored_u8 = nvfp4_block_scale(block_amax, global);
    s.multiplier = nvfp4_block_multiplier_from_decode(s.stored_u8, global_decode);
  }
  return s;
}

template <sfmoe_scaling S>
__device__ __forceinline__ void store_scale(void* scales, int64_t offset, const BlockScale& s) {
  if constexpr (Recipe<S>::kFp8Block || Recipe<S>::kTensor) {
    static_cast<float*>(scales)[offset] = s.stored_f32;
  } else {
    static_cast<uint8_t*>(scales)[offset] = s.stored_u8;
  }
}

// ---- encoding --------------------------------------------------------------------------------
// N values (N
// a multiple of 8) times their multipliers, encoded and packed as stored: FP8 one byte per value (N
// / 4 words), FP4 a nibble per value (N / 8 words). `mult` holds one multiplier per value (they
// differ only for TENSOR columnwise pieces whose rows span groups). Stochastic rounding draws the
// random bits of element index first_index + e (docs/quantization.md); first_index is a multiple of
// 4, so one Philox evaluation serves four values. The format and the rounding mode are template
// parameters: encode_packed branches once per call, not per value.
template <bool kFp4, int N, bool kE5M2, bool kStochastic>
__device__ __forceinline__ void encode_packed_as(const float v[N], const float mult[N],
                                                 uint64_t seed, uint64_t stream,
                                                 int64_t first_index,
                                                 uint32_t out[kFp4 ? N / 8 : N / 4]) {
  if constexpr (kFp4 && !kStochastic) {
#pragma unroll
    for (int w = 0; w < N / 8; ++w) {
      float x[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = mul_rn(v[8 * w + k], mult[8 * w + k]);  // canonical NaNs
      out[w] = pack_e2m1x8_canonical_nan(x);
    }
  } else if constexpr (kFp4) {  // stochastic rounding
#pragma unroll
    for (int w = 0; w < N / 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const Philox4x32 random = philox_random_quad(
            seed, stream, static_cast<uint64_t>(first_index + 8 * w + 4 * half) >> 2);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int e = 8 * w + 4 * half + k;
          const uint32_t code = f32_to_e2m1_stochastic(mul_rn(v[e], mult[e]), random.v[k]);
          word |= code << (4 * (4 * half + k));
        }
      }
      out[w] = word;
    }
  } else {
#pragma unroll
    for (int w = 0; w < N / 4; ++w) {
      const float x0 = mul_rn(v[4 * w], mult[4 * w]), x1 = mul_rn(v[4 * w + 1], mult[4 * w + 1]);
      const float x2 = mul_rn(v[4 * w + 2], mult[4 * w + 2]),
                  x3 = mul_rn(v[4 * w + 3], mult[4 * w + 3]);
      const uint32_t lo = kE5M2 ? f32x2_to_e5m2x2(x0, x1) : f32x2_to_e4m3x2(x0, x1);
      const uint32_t hi = kE5M2 ? f32x2_to_e5m2x2(x2, x3) : f32x2_to_e4m3x2(x2, x3);
      out[w] = lo | (hi << 16);
    }
  }
}

template <bool kFp4, int N>
__device__ __forceinline__ void encode_packed(const float v[N], const float mult[N], bool e5m2,
                                              bool stochastic, uint64_t seed, uint64_t stream,
                                              int64_t first_index,
                                              uint32_t out[kFp4 ? N / 8 : N / 4]) {
  if constexpr (kFp4) {
    if (stochastic) {
      encode_packed_as<true, N, false, true>(v, mult, seed, stream, first_index, out);
    } else {
      encode_packed_as<true, N, false, false>(v, mult, seed, stream, first_index, out);
    }
  } else {
    if (e5m2) {
      encode_packed_as<false, N, true, false>(v, mult, seed, stream, first_index, out);
    } else {
      encode_packed_as<false, N, false, false>(v, mult, seed, stream, first_index, out);
    }
  }
}

// Stores N packed codes at `base` (the byte of their first element): one vector store when
// `vector_ok` and all N are valid, else element by element (FP4: whole bytes; valid counts are
// even there).
template <bool kFp4, int N>
__device__ __forceinline__ void store_packed_at(uint8_t* base, const uint32_t* words, int valid,
                                                bool vector_ok) {
  constexpr int kWords = kFp4 ? N / 8 : N / 4;
  if (vector_ok && valid == N) {
    if constexpr (kWords == 4) {
      *reinterpret_cast<uint4*>(base) = make_uint4(words[0], words[1], words[2], words[3]);
    } else if constexpr (kWords == 2) {
      *reinterpret_cast<uint2*>(base) = make_uint2(words[0], words[1]);
    } else {
      *reinterpret_cast<uint32_t*>(base) = words[0];
    }
    return;
  }
  constexpr int kBytes = kWords * 4;
  const int valid_bytes = kFp4 ? (valid + 1) / 2 : valid;
#pragma unroll
  for (int b = 0; b < kBytes; ++b) {
    if (b < valid_bytes) base[b] = static_cast<uint8_t>(words[b / 4] >> (8 * (b % 4)));
  }
}

// The same at element `index` of a copy.
template <bool kFp4, int N>
__device__ __forceinline__ void store_packed(void* copy, int64_t index, const uint32_t* words,
                                             int valid, bool vector_ok) {
  store_packed_at<kFp4, N>(static_cast<uint8_t*>(copy) + (kFp4 ? index / 2 : index), words, valid,
                           vector_ok);
}

// Swizzled MX/NV scales: the padding entries beside a written block hold 0. Rowwise, the last
// block of a row writes the row's padding columns; columnwise, the block of the last column
// writes the padding rows under its row block.
__device__ __forceinline__ void zero_swizzle_padding_columns(uint8_t* scales, int64_t row,
                                                             int64_t scale_cols) {
  for (int64_t k = scale_cols; k < round_up(scale_cols, kSwizzleTileCols); ++k) {
    scales[swizzled_scale_offset(row, k, scale_cols)] = 0;
  }
}
__device__ __forceinline__ void zero_swizzle_padding_rows(uint8_t* scales, int64_t first_row,
                                                          int64_t col, int64_t scale_cols) {
  for (int64_t m = first_row; m < round_up(first_row, kSwizzleTileRows); ++m) {
    scales[swizzled_scale_offset(m, col, scale_cols)] = 0;
  }
}

// Eight FP8 codes of values under one multiplier, packed in element order (the fused
// quantizations' form of encode_packed).
__device__ __forceinline__ uint2 encode_eight_fp8(const float (&v)[8], float multiplier,
                                                  bool e5m2) {
  float mult[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) mult[i] = multiplier;
  uint32_t words[2];
  encode_packed<false, 8>(v, mult, e5m2, false, 0, 0, 0, words);
  return make_uint2(words[0], words[1]);
}

}  // namespace encoding
}  // namespace cuda
}  // namespace sfmoe
