// Grouped quantization on the GPU (docs/quantization.md; the CPU backend is the definition).
//
// Three launches, all sized from host bounds and reading real sizes from device memory:
//   1. padded_offsets_kernel (one block): clamps the input groups, writes the padded output
//      offsets with a block scan, checks the input offsets, clears the amax buffers;
//   2. (TENSOR, NVFP4) quantize_tiles_kernel<..., kAmaxPass = true>: per-group amax (and the
//      Hadamard-transformed columnwise amax), by atomicMax on the FP32 bits (NaN-propagating);
//   3. quantize_tiles_kernel<..., kAmaxPass = false>: the codes and scales of both copies.
// The tile kernels loop persistently over (row tile, column tile) pairs of the real output rows
// [0, out_off[G]); a tile is staged as FP32 in shared memory, padding rows as zeros, so the
// rowwise and the columnwise copies come from one read of the input.
#include <cub/block/block_scan.cuh>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/common/group_offsets.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

using namespace numerics;

constexpr int kThreads = 256;
constexpr int kTileCols = 128;
constexpr int kRowStride = kTileCols + 4;  // floats: rows stay 16-byte aligned, columns conflict-free
constexpr int kRowBeyond = -2;             // row_src marker: at or beyond out_off[G], not written
constexpr int kRowPadding = -1;            // row_src marker: alignment padding, zeros
constexpr int kColTilesPerUnit = 8;         // column tiles per work unit (1024 columns)
// Tuning knobs (docs/KERNEL_NOTES.md records what each setting measured).
#ifndef SFMOE_QUANTIZE_MIN_BLOCKS
#define SFMOE_QUANTIZE_MIN_BLOCKS 2
#endif

// Tile height (a multiple of the block height) and elements per thread per chunk, per recipe.
template <sfmoe_scaling S>
struct Recipe {
  static constexpr int kBlock = S == SFMOE_SCALING_TENSOR ? 0
                                : (S == SFMOE_SCALING_BLOCK_1X128 || S == SFMOE_SCALING_BLOCK_128X128)
                                    ? 128
                                    : S == SFMOE_SCALING_MX_1X32 ? 32 : 16;
  static constexpr bool kNv = S == SFMOE_SCALING_NV_1X16 || S == SFMOE_SCALING_NV_16X16;
  static constexpr bool k2D = S == SFMOE_SCALING_BLOCK_128X128 || S == SFMOE_SCALING_NV_16X16;
  static constexpr int kTileRows = kBlock == 128 ? 128 : (S == SFMOE_SCALING_MX_1X32 ? 64 : 32);
  static constexpr int kChunk = kNv ? 16 : 8;
  static_assert(kTileRows * (kTileCols / kChunk) % kThreads == 0, "uniform rowwise loop");
  static_assert(kTileCols * (kTileRows / kChunk) % kThreads == 0, "uniform columnwise loop");
};

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

// ---- 1. padded offsets -------------------------------------------------------------------------
constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads) padded_offsets_kernel(GroupedQuantizeArgs a,
                                                                      bool clear_amax,
                                                                      bool clear_columnwise_amax) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int64_t groups = a.num_groups;
  const int64_t per_thread = (groups + kScanThreads - 1) / kScanThreads;
  const int64_t first = threadIdx.x * per_thread;
  const int64_t last = first + per_thread < groups ? first + per_thread : groups;
  const int64_t align = a.row_alignment;
  int64_t sum = 0;
  for (int64_t g = first; g < last; ++g) {
    if (a.word != nullptr && a.input.offsets != nullptr) {
      check_group(a.input.offsets, g, a.input.row_capacity, 1, a.word);
    }
    sum += (input_span(a.input, g).rows + align - 1) / align * align;
  }
  int64_t prefix = 0, total = 0;
  Scan(scan_storage).ExclusiveSum(sum, prefix, total);
  // Good offsets always fit (the API checks the capacity bound). Bad ones (overlapping clamped
  // groups) can exceed it: offsets are clamped to the last row that keeps the row-running blocks
  // whole, and a group whose rows no longer fit raises GROUP_OVER_CAPACITY. min(prefix, limit)
  // equals the sequential rule out_off[g+1] = min(out_off[g] + padded_g, limit).
  const int64_t block_height = min_row_alignment(a.scaling, a.columnwise != nullptr);
  const int64_t limit = a.row_capacity - a.row_capacity % block_height;
  if (a.offsets != nullptr) {
    for (int64_t g = first; g < last; ++g) {
      const int64_t rows = input_span(a.input, g).rows;
      const int64_t start = prefix < limit ? prefix : limit;
      if (a.word != nullptr && start + rows > limit) {
        raise_fault(a.word, SFMOE_FAULT_GROUP_OVER_CAPACITY, g, start + rows);
      }
      a.offsets[g] = start;
      prefix += (rows + align - 1) / align * align;
    }
    if (threadIdx.x == 0) a.offsets[groups] = total < limit ? total : limit;
  }
  for (int64_t g = threadIdx.x; g < groups; g += kScanThreads) {
    if (clear_amax) a.amax[g] = 0.0f;
    if (clear_columnwise_amax && a.columnwise_amax) a.columnwise_amax[g] = 0.0f;
  }
}

// ---- tile staging --------------------------------------------------------------------------------
template <sfmoe_dtype In>
__device__ __forceinline__ void load_chunk8(const void* data, int64_t row, int64_t col,
                                            int64_t cols, float v[8]) {
  const int64_t index = row * cols + col;
  if (col + 8 <= cols && cols % 8 == 0) {
    if constexpr (In == SFMOE_DTYPE_FP32) {
      const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(data) + index);
      const float4 x = __ldg(p), y = __ldg(p + 1);
      v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
    } else {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(data) + index));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] = decode_element(In, words[k] & 0xFFFFu);
        v[2 * k + 1] = decode_element(In, words[k] >> 16);
      }
    }
    return;
  }
  constexpr int kBits = In == SFMOE_DTYPE_FP32 ? 32 : 16;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    v[k] = col + k < cols ? decode_element(In, load_code(data, kBits, index + k)) : 0.0f;
  }
}

struct TileRows {
  int64_t* src;   // input row, or kRowPadding / kRowBeyond
  int32_t* group;
};

// The row map of output rows [r0, r0 + TR): which input row (or padding) and which group.
template <int TR>
__device__ void stage_rows(const GroupedQuantizeArgs& a, int64_t total, int64_t r0, TileRows rows) {
  for (int i = threadIdx.x; i < TR; i += kThreads) {
    const int64_t r = r0 + i;
    int64_t src = kRowBeyond;
    int64_t g = 0;
    if (r < total) {
      g = quantized_group_of_row(a, r);
      const InputSpan span = input_span(a.input, g);
      const int64_t inside = r - quantized_group_offset(a, g);
      src = inside < span.rows ? span.begin + inside : kRowPadding;
    }
    rows.src[i] = src;
    rows.group[i] = static_cast<int32_t>(g);
  }
  __syncthreads();
}

// One column tile [TR x 128] of the input on its way to shared memory (8 values per chunk per
// thread). Holding the next tile here while processing the current one was measured slower
// (register pressure; docs/KERNEL_NOTES.md, q2), so loads and processing alternate.
template <int TR>
struct TileLoad {
  static constexpr int kChunks = TR * (kTileCols / 8) / kThreads;
  float v[kChunks][8];
};

template <sfmoe_dtype In, int TR>
__device__ __forceinline__ void load_tile(const GroupedQuantizeArgs& a, int64_t c0,
                                              TileRows rows, TileLoad<TR>& p) {
#pragma unroll
  for (int l = 0; l < TileLoad<TR>::kChunks; ++l) {
    const int q = threadIdx.x + l * kThreads;
    const int i = q / (kTileCols / 8), j = q % (kTileCols / 8);
    const int64_t src = rows.src[i];
#pragma unroll
    for (int k = 0; k < 8; ++k) p.v[l][k] = 0.0f;
    if (src >= 0 && c0 + j * 8 < a.cols) load_chunk8<In>(a.input.data, src, c0 + j * 8, a.cols, p.v[l]);
  }
}

template <int TR>
__device__ __forceinline__ void commit_tile(const TileLoad<TR>& p, float* tile) {
#pragma unroll
  for (int l = 0; l < TileLoad<TR>::kChunks; ++l) {
    const int q = threadIdx.x + l * kThreads;
    const int i = q / (kTileCols / 8), j = q % (kTileCols / 8);
    float4* dst = reinterpret_cast<float4*>(tile + i * kRowStride + j * 8);
    dst[0] = make_float4(p.v[l][0], p.v[l][1], p.v[l][2], p.v[l][3]);
    dst[1] = make_float4(p.v[l][4], p.v[l][5], p.v[l][6], p.v[l][7]);
  }
}

// ---- scale rules per recipe ----------------------------------------------------------------------
struct BlockScale {
  float multiplier;  // applied to the values before encoding
  float stored_f32;  // FP32 scale_inv (FP8 tensor / blockwise)
  uint8_t stored_u8; // E8M0 or E4M3 code (MXFP8 / NVFP4)
};

template <sfmoe_scaling S>
__device__ __forceinline__ BlockScale block_scale(float block_amax, float group_amax,
                                                  float fp8_max, bool power_of_two) {
  BlockScale s{1.0f, 1.0f, 0};
  if constexpr (S == SFMOE_SCALING_TENSOR) {
    s.multiplier = fp8_scale_from_amax(group_amax, fp8_max, power_of_two);
    s.stored_f32 = scale_inverse(s.multiplier);
  } else if constexpr (S == SFMOE_SCALING_BLOCK_1X128 || S == SFMOE_SCALING_BLOCK_128X128) {
    s.multiplier = fp8_scale_from_amax(block_amax, fp8_max, power_of_two);
    s.stored_f32 = scale_inverse(s.multiplier);
  } else if constexpr (S == SFMOE_SCALING_MX_1X32) {
    s.stored_u8 = mx_scale_from_amax(block_amax, fp8_max);
    s.multiplier = mx_multiplier(s.stored_u8);
  } else {
    const float global = nvfp4_global_encode_scale(group_amax);
    s.stored_u8 = nvfp4_block_scale(block_amax, global);
    s.multiplier = nvfp4_block_multiplier(s.stored_u8, global);
  }
  return s;
}

// Encodes K values (already multiplied) and stores them at element `index` of a copy whose rows
// are `row_length` long; vector stores where alignment allows, element stores otherwise.
template <bool kFp4, int K>
__device__ __forceinline__ void store_codes(void* copy, int64_t index, const uint32_t codes[K],
                                            int valid, bool vector_ok) {
  if constexpr (kFp4) {
    uint8_t* out = static_cast<uint8_t*>(copy);
    if (vector_ok && valid == K) {
      uint32_t packed[K / 8];
#pragma unroll
      for (int w = 0; w < K / 8; ++w) {
        packed[w] = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) packed[w] |= (codes[w * 8 + k] & 0xFu) << (4 * k);
      }
      if constexpr (K == 16) {
        *reinterpret_cast<uint2*>(out + index / 2) = make_uint2(packed[0], packed[1]);
      } else {
        *reinterpret_cast<uint32_t*>(out + index / 2) = packed[0];
      }
    } else {
      // Constant indices only (predicated), so `codes` stays in registers.
#pragma unroll
      for (int k = 0; k < K; k += 2) {
        if (k + 1 < valid) {
          out[(index + k) / 2] = static_cast<uint8_t>((codes[k] & 0xFu) | ((codes[k + 1] & 0xFu) << 4));
        }
      }
    }
  } else {
    uint8_t* out = static_cast<uint8_t*>(copy) + index;
    if (vector_ok && valid == K) {
      uint32_t words[K / 4];
#pragma unroll
      for (int w = 0; w < K / 4; ++w) {
        words[w] = codes[4 * w] | (codes[4 * w + 1] << 8) | (codes[4 * w + 2] << 16) | (codes[4 * w + 3] << 24);
      }
      if constexpr (K == 8) {
        *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
      } else {
        *reinterpret_cast<uint4*>(out) = make_uint4(words[0], words[1], words[2], words[3]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k < valid) out[k] = static_cast<uint8_t>(codes[k]);
      }
    }
  }
}

template <sfmoe_scaling S, int K>
__device__ __forceinline__ void encode_values(const float v[K], float multiplier, bool e5m2,
                                              const GroupedQuantizeArgs& a, uint64_t stream_offset,
                                              int64_t first_index, uint32_t codes[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float x = mul_rn(v[k], multiplier);
    if constexpr (Recipe<S>::kNv) {
      if (a.config.stochastic_rounding) {
        codes[k] = f32_to_e2m1_stochastic(x, philox_random_bits(a.config.seed, stream_offset, first_index + k));
      } else {
        codes[k] = f32_to_e2m1(x);
      }
    } else {
      codes[k] = e5m2 ? f32_to_e5m2(x) : f32_to_e4m3(x);
    }
  }
}

template <int N>
__device__ __forceinline__ float chunk_amax(const float* v) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) m = amax_accumulate(m, v[k]);
  return m;
}

__device__ __forceinline__ void maybe_trap(const GroupedQuantizeArgs& a, float amax, int64_t group,
                                           int64_t where) {
  if (a.config.trap_nan_amax && a.word != nullptr && f32_is_nan(amax)) {
    raise_fault(a.word, SFMOE_FAULT_NAN_AMAX, group, where);
  }
}

// ---- 2 and 3: the tile kernel --------------------------------------------------------------------
template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass>
__global__ void __launch_bounds__(kThreads, SFMOE_QUANTIZE_MIN_BLOCKS) quantize_tiles_kernel(GroupedQuantizeArgs a) {
  using R = Recipe<S>;
  constexpr int TR = R::kTileRows, K = R::kChunk, B = R::kBlock;
  constexpr bool kFp4 = R::kNv;
  extern __shared__ float4 shared_raw[];
  float* tile = reinterpret_cast<float*>(shared_raw);
  TileRows rows{reinterpret_cast<int64_t*>(tile + TR * kRowStride), nullptr};
  rows.group = reinterpret_cast<int32_t*>(rows.src + TR);
  unsigned* row_bits = reinterpret_cast<unsigned*>(rows.group + TR);        // TR (amax pass)
  float* column_partial = reinterpret_cast<float*>(row_bits + TR);          // (TR/K) x 128
  unsigned* block_bits = reinterpret_cast<unsigned*>(column_partial + (TR / K) * kTileCols);  // 2D

  const int64_t groups = a.num_groups, cols = a.cols, capacity = a.row_capacity;
  const int64_t total = quantized_group_offset(a, groups);
  const bool e5m2 = a.dtype == SFMOE_DTYPE_FP8_E5M2;
  const float fp8_max = e5m2 ? kE5M2Max : kE4M3Max;
  const bool pow2 = a.config.power_of_two_scales != 0;
  const bool hadamard = R::kNv && a.config.hadamard_columnwise && a.columnwise != nullptr;

  if constexpr (!kAmaxPass) {
    // Per-group outputs, once: TENSOR scale_inv, and NaN group amax traps.
    if (blockIdx.x == 0) {
      for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
        if constexpr (S == SFMOE_SCALING_TENSOR) {
          const float inv = scale_inverse(fp8_scale_from_amax(a.amax[g], fp8_max, pow2));
          if (a.rowwise_scale_inv) static_cast<float*>(a.rowwise_scale_inv)[g] = inv;
          if (a.columnwise_scale_inv) static_cast<float*>(a.columnwise_scale_inv)[g] = inv;
        }
        if (S == SFMOE_SCALING_TENSOR || R::kNv) maybe_trap(a, a.amax[g], g, -1);
      }
    }
  }

  // Work unit: one row tile x up to kColTilesPerUnit column tiles; the row map is built once per
  // unit.
  const int64_t row_tiles = (total + TR - 1) / TR;
  const int64_t col_tiles = (cols + kTileCols - 1) / kTileCols;
  const int64_t col_units = (col_tiles + kColTilesPerUnit - 1) / kColTilesPerUnit;
  TileLoad<TR> staged;
  for (int64_t unit = blockIdx.x; unit < row_tiles * col_units; unit += gridDim.x) {
    const int64_t r0 = (unit / col_units) * TR;
    const int64_t ct_begin = (unit % col_units) * kColTilesPerUnit;
    const int64_t ct_end = ct_begin + kColTilesPerUnit < col_tiles ? ct_begin + kColTilesPerUnit : col_tiles;
    stage_rows<TR>(a, total, r0, rows);
  for (int64_t ct = ct_begin; ct < ct_end; ++ct) {
    const int64_t c0 = ct * kTileCols;
    load_tile<In, TR>(a, c0, rows, staged);
    commit_tile<TR>(staged, tile);
    __syncthreads();

    if constexpr (kAmaxPass) {
      for (int i = threadIdx.x; i < TR; i += kThreads) row_bits[i] = 0;
      for (int k = threadIdx.x; k < TR / 16; k += kThreads) block_bits[k] = 0;
      __syncthreads();
      for (int q = threadIdx.x; q < TR * (kTileCols / 8); q += kThreads) {
        const int i = q / (kTileCols / 8), j = q % (kTileCols / 8);
        const unsigned bits = amax_bits(chunk_amax<8>(tile + i * kRowStride + j * 8));
        if (bits != 0) atomicMax(&row_bits[i], bits);
      }
      if (hadamard) {
        for (int q = threadIdx.x; q < kTileCols * (TR / 16); q += kThreads) {
          const int c = q % kTileCols, k = q / kTileCols;
          float v[16];
#pragma unroll
          for (int m = 0; m < 16; ++m) v[m] = tile[(k * 16 + m) * kRowStride + c];
          hadamard16_transform(v);
          const unsigned bits = amax_bits(chunk_amax<16>(v));
          if (bits != 0) atomicMax(&block_bits[k], bits);
        }
      }
      __syncthreads();
      for (int i = threadIdx.x; i < TR; i += kThreads) {
        if (rows.src[i] == kRowBeyond || (i > 0 && rows.group[i] == rows.group[i - 1])) continue;
        unsigned m = 0;  // the first row of its group in this tile gathers the group's rows
        for (int k = i; k < TR && rows.group[k] == rows.group[i] && rows.src[k] != kRowBeyond; ++k) {
          m = max(m, row_bits[k]);
        }
        if (m != 0) atomicMax(reinterpret_cast<unsigned*>(a.amax + rows.group[i]), m);
      }
      if (hadamard) {
        for (int k = threadIdx.x; k < TR / 16; k += kThreads) {
          if (rows.src[k * 16] == kRowBeyond || block_bits[k] == 0) continue;
          atomicMax(reinterpret_cast<unsigned*>(a.columnwise_amax + rows.group[k * 16]), block_bits[k]);
        }
      }
      __syncthreads();
      continue;
    }

    // 2D blocks: the block amax of every B x B block of the tile, from per-chunk maxima.
    if constexpr (R::k2D) {
      constexpr int kBlocksPerRow = kTileCols / B;
      for (int k = threadIdx.x; k < (TR / B) * kBlocksPerRow; k += kThreads) block_bits[k] = 0;
      __syncthreads();
      for (int q = threadIdx.x; q < TR * (kTileCols / K); q += kThreads) {
        const int i = q / (kTileCols / K), j = q % (kTileCols / K);
        const unsigned bits = amax_bits(chunk_amax<K>(tile + i * kRowStride + j * K));
        if (bits != 0) atomicMax(&block_bits[(i / B) * kBlocksPerRow + (j * K) / B], bits);
      }
      __syncthreads();
    }

    // Rowwise copy: thread = (row i, chunk j of K columns); the L = B/K lanes of a block are
    // consecutive lanes of one warp and reduce by shuffles.
    if (a.rowwise != nullptr) {
      constexpr int kChunksPerRow = kTileCols / K;
      constexpr int L = (B > 0 && !R::k2D) ? B / K : 1;
      const bool vector_ok = cols % K == 0;
      for (int q = threadIdx.x; q < TR * kChunksPerRow; q += kThreads) {
        const int i = q / kChunksPerRow, j = q % kChunksPerRow;
        float v[K];
#pragma unroll
        for (int k = 0; k < K; k += 4) {
          const float4 x = *reinterpret_cast<const float4*>(tile + i * kRowStride + j * K + k);
          v[k] = x.x; v[k + 1] = x.y; v[k + 2] = x.z; v[k + 3] = x.w;
        }
        float amax = 0.0f;
        if constexpr (R::k2D) {
          amax = __uint_as_float(block_bits[(i / B) * (kTileCols / B) + (j * K) / B]);
        } else if constexpr (B > 0) {
          amax = chunk_amax<K>(v);
#pragma unroll
          for (int lane_mask = 1; lane_mask < L; lane_mask <<= 1) {
            amax = amax_accumulate(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lane_mask));
          }
        }
        const int64_t r = r0 + i, c = c0 + j * K;
        if (rows.src[i] == kRowBeyond || c >= cols) continue;
        const int64_t g = rows.group[i];
        const float group_amax = (S == SFMOE_SCALING_TENSOR || R::kNv) ? a.amax[g] : 0.0f;
        const BlockScale s = block_scale<S>(amax, group_amax, fp8_max, pow2);
        uint32_t codes[K];
        encode_values<S, K>(v, s.multiplier, e5m2, a, 2 * a.config.offset, r * cols + c, codes);
        const int valid = cols - c < K ? static_cast<int>(cols - c) : K;
        store_codes<kFp4, K>(a.rowwise, r * cols + c, codes, valid, vector_ok);
        if constexpr (B > 0) {
          const bool writes_scale = R::k2D ? (i % B == 0 && (j * K) % B == 0) : (j % L == 0);
          if (writes_scale) {
            maybe_trap(a, amax, g, r);
            const int64_t scale_cols = cols / B;
            const int64_t offset = R::k2D ? (r / B) * scale_cols + c / B
                                          : scale_offset(a.scale_layout, r, c / B, scale_cols);
            if constexpr (R::kNv || S == SFMOE_SCALING_MX_1X32) {
              uint8_t* scales = static_cast<uint8_t*>(a.rowwise_scale_inv);
              scales[offset] = s.stored_u8;
              // Swizzled: the padding columns of a written row hold 0 (the last block writes them).
              if (!R::k2D && a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && c / B == scale_cols - 1) {
                for (int64_t k = scale_cols; k < round_up(scale_cols, kSwizzleTileCols); ++k) {
                  scales[swizzled_scale_offset(r, k, scale_cols)] = 0;
                }
              }
            } else {
              static_cast<float*>(a.rowwise_scale_inv)[offset] = s.stored_f32;
            }
          }
        }
      }
    }

    // Columnwise copy: thread = (column, chunk k of K rows); a warp covers 32 consecutive
    // columns of one chunk row (conflict-free shared reads). Blocks of L = B/K chunks reduce
    // through shared memory.
    if (a.columnwise != nullptr) {
      constexpr int kChunksPerCol = TR / K;
      constexpr int L = (B > 0 && !R::k2D) ? B / K : 1;
      if constexpr (L > 1) {
        for (int q = threadIdx.x; q < kTileCols * kChunksPerCol; q += kThreads) {
          const int c = q % kTileCols, k = q / kTileCols;
          float v[K];
#pragma unroll
          for (int m = 0; m < K; ++m) v[m] = tile[(k * K + m) * kRowStride + c];
          column_partial[k * kTileCols + c] = chunk_amax<K>(v);
        }
        __syncthreads();
      }
      const bool vector_ok = capacity % K == 0;
      for (int q = threadIdx.x; q < kTileCols * kChunksPerCol; q += kThreads) {
        const int cl = q % kTileCols, k = q / kTileCols;
        const int64_t c = c0 + cl, r = r0 + k * K;
        if (c >= cols || rows.src[k * K] == kRowBeyond) continue;
        float v[K];
#pragma unroll
        for (int m = 0; m < K; ++m) v[m] = tile[(k * K + m) * kRowStride + cl];
        if (hadamard) hadamard16_transform(v);
        const int64_t g = rows.group[k * K];
        float amax = 0.0f;
        if constexpr (R::k2D) {
          amax = __uint_as_float(block_bits[((k * K) / B) * (kTileCols / B) + cl / B]);
        } else if constexpr (B > 0) {
          if constexpr (L > 1) {
            const int first = (k / L) * L;
            for (int l = 0; l < L; ++l) amax = amax_accumulate(amax, column_partial[(first + l) * kTileCols + cl]);
          } else {
            amax = chunk_amax<K>(v);
          }
        }
        uint32_t codes[K];
        if constexpr (S == SFMOE_SCALING_TENSOR) {
          // Rows of one chunk may belong to different groups (alignment 1) or lie beyond the end.
#pragma unroll
          for (int m = 0; m < K; ++m) {
            const float mult = fp8_scale_from_amax(a.amax[rows.group[k * K + m]], fp8_max, pow2);
            codes[m] = e5m2 ? f32_to_e5m2(mul_rn(v[m], mult)) : f32_to_e4m3(mul_rn(v[m], mult));
          }
          int valid = 0;
          while (valid < K && rows.src[k * K + valid] != kRowBeyond) ++valid;
          store_codes<false, K>(a.columnwise, c * capacity + r, codes, valid, vector_ok);
        } else {
          const float group_amax = R::kNv ? (hadamard ? a.columnwise_amax[g] : a.amax[g]) : 0.0f;
          const BlockScale s = block_scale<S>(amax, group_amax, fp8_max, pow2);
          encode_values<S, K>(v, s.multiplier, e5m2, a, 2 * a.config.offset + 1, c * capacity + r, codes);
          store_codes<kFp4, K>(a.columnwise, c * capacity + r, codes, K, vector_ok);
          const bool writes_scale = R::k2D ? ((k * K) % B == 0 && cl % B == 0) : (k % L == 0);
          if (writes_scale) {
            if (!R::k2D) maybe_trap(a, amax, g, r);
            const int64_t scale_cols = capacity / B;
            const int64_t offset = R::k2D ? (c / B) * scale_cols + r / B
                                          : scale_offset(a.scale_layout, c, r / B, scale_cols);
            if constexpr (R::kNv || S == SFMOE_SCALING_MX_1X32) {
              uint8_t* scales = static_cast<uint8_t*>(a.columnwise_scale_inv);
              scales[offset] = s.stored_u8;
              // Swizzled: the padding rows (columns >= C) under a written block hold 0.
              if (!R::k2D && a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && c == cols - 1) {
                for (int64_t m = cols; m < round_up(cols, kSwizzleTileRows); ++m) {
                  scales[swizzled_scale_offset(m, r / B, scale_cols)] = 0;
                }
              }
            } else {
              static_cast<float*>(a.columnwise_scale_inv)[offset] = s.stored_f32;
            }
          }
        }
      }
    }
    __syncthreads();
  }
  }
}

// Raw codes of an 8-element chunk (8 FP32 words, or 8 16-bit codes in 4 words): loads stay in
// flight as compact vectors and are decoded only when processed.
template <sfmoe_dtype In>
struct RawChunk {
  static constexpr int kWords = In == SFMOE_DTYPE_FP32 ? 8 : 4;
  uint32_t w[kWords];
};

template <sfmoe_dtype In>
__device__ __forceinline__ void load_raw(const void* data, int64_t row, int64_t col, int64_t cols,
                                         RawChunk<In>& r) {
  constexpr int kBits = In == SFMOE_DTYPE_FP32 ? 32 : 16;
  const int64_t index = row * cols + col;
  if (col + 8 <= cols && cols % 8 == 0) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(data) + index * (kBits / 8));
#pragma unroll
    for (int v = 0; v < RawChunk<In>::kWords / 4; ++v) {
      const uint4 x = __ldg(p + v);
      r.w[4 * v] = x.x; r.w[4 * v + 1] = x.y; r.w[4 * v + 2] = x.z; r.w[4 * v + 3] = x.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < RawChunk<In>::kWords; ++k) r.w[k] = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t code = col + k < cols ? load_code(data, kBits, index + k) : 0u;
    if (kBits == 32) r.w[k] = code; else r.w[k / 2] |= code << (16 * (k & 1));
  }
}

template <sfmoe_dtype In>
__device__ __forceinline__ void decode_raw(const RawChunk<In>& r, float v[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    v[k] = In == SFMOE_DTYPE_FP32 ? __uint_as_float(r.w[k])
                                  : decode_element(In, (r.w[k / 2] >> (16 * (k & 1))) & 0xFFFFu);
  }
}

// ---- rowwise-only path: no transpose, so no shared tile ----------------------------------------
// A work unit is kFastRows output rows; its row map sits in shared memory and each thread streams
// 8-element chunks straight from global memory (kFastUnroll loads in flight), reduces the block
// amax over the B/8 lanes that share a block with shuffles, and stores codes and scale.
constexpr int kFastRows = 16;
#ifndef SFMOE_QUANTIZE_FAST_UNROLL
#define SFMOE_QUANTIZE_FAST_UNROLL 4
#endif
#ifndef SFMOE_QUANTIZE_FAST_MIN_BLOCKS
#define SFMOE_QUANTIZE_FAST_MIN_BLOCKS 4
#endif
constexpr int kFastUnroll = SFMOE_QUANTIZE_FAST_UNROLL;

template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass>
__global__ void __launch_bounds__(kThreads, Recipe<S>::kNv ? 2 : SFMOE_QUANTIZE_FAST_MIN_BLOCKS)
    quantize_rowwise_kernel(GroupedQuantizeArgs a) {
  using R = Recipe<S>;
  constexpr int B = R::kBlock;
  constexpr int L = B > 0 ? B / 8 : 1;  // lanes per block (chunks of 8 elements)
  constexpr bool kFp4 = R::kNv;
  __shared__ int64_t row_src[kFastRows];
  __shared__ int32_t row_group[kFastRows];
  __shared__ unsigned row_bits[kFastRows];
  __shared__ float row_scale[kFastRows];  // TENSOR: the group's scale; NVFP4: its encode scale
  const TileRows rows{row_src, row_group};
  const int64_t groups = a.num_groups, cols = a.cols;
  const int64_t total = quantized_group_offset(a, groups);
  const bool e5m2 = a.dtype == SFMOE_DTYPE_FP8_E5M2;
  const float fp8_max = e5m2 ? kE5M2Max : kE4M3Max;
  const bool pow2 = a.config.power_of_two_scales != 0;
  if constexpr (!kAmaxPass) {
    if (blockIdx.x == 0) {
      for (int64_t g = threadIdx.x; g < groups; g += kThreads) {
        if constexpr (S == SFMOE_SCALING_TENSOR) {
          static_cast<float*>(a.rowwise_scale_inv)[g] = scale_inverse(fp8_scale_from_amax(a.amax[g], fp8_max, pow2));
        }
        if (S == SFMOE_SCALING_TENSOR || R::kNv) maybe_trap(a, a.amax[g], g, -1);
      }
    }
  }
  const int64_t chunks_per_row = (cols + 7) / 8;
  const int64_t unit_chunks = kFastRows * chunks_per_row;
  const int64_t units = (total + kFastRows - 1) / kFastRows;
  const bool vector_ok = cols % 8 == 0;
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t r0 = unit * kFastRows;
    if (kAmaxPass && threadIdx.x < kFastRows) row_bits[threadIdx.x] = 0;
    stage_rows<kFastRows>(a, total, r0, rows);
    if (!kAmaxPass && (S == SFMOE_SCALING_TENSOR || R::kNv)) {
      if (threadIdx.x < kFastRows) {
        const float group_amax = a.amax[rows.group[threadIdx.x]];
        row_scale[threadIdx.x] = S == SFMOE_SCALING_TENSOR ? fp8_scale_from_amax(group_amax, fp8_max, pow2)
                                                           : nvfp4_global_encode_scale(group_amax);
      }
      __syncthreads();
    }
    // (row i, chunk j) advance by kThreads chunks per step without a division per chunk.
    int i_next = static_cast<int>(threadIdx.x / chunks_per_row);
    int64_t j_next = threadIdx.x % chunks_per_row;
    for (int64_t base = 0; base < unit_chunks; base += kThreads * kFastUnroll) {
      RawChunk<In> raw[kFastUnroll];
      int row_of[kFastUnroll];
      int64_t chunk_of[kFastUnroll];
#pragma unroll
      for (int u = 0; u < kFastUnroll; ++u) {
        row_of[u] = i_next;
        chunk_of[u] = j_next;
        j_next += kThreads;
        while (j_next >= chunks_per_row) {
          j_next -= chunks_per_row;
          ++i_next;
        }
        const int64_t src = row_of[u] < kFastRows ? rows.src[row_of[u]] : kRowBeyond;
        if (src >= 0) {
          load_raw<In>(a.input.data, src, chunk_of[u] * 8, cols, raw[u]);
        } else {
#pragma unroll
          for (int k = 0; k < RawChunk<In>::kWords; ++k) raw[u].w[k] = 0;  // padding: zeros
        }
      }
#pragma unroll
      for (int u = 0; u < kFastUnroll; ++u) {
        const bool in_unit = row_of[u] < kFastRows;
        const int i = in_unit ? row_of[u] : 0;
        const int64_t c = chunk_of[u] * 8;
        float values[8];
        decode_raw<In>(raw[u], values);
        float amax = chunk_amax<8>(values);
        if constexpr (kAmaxPass) {
          if (in_unit && rows.src[i] >= 0 && amax_bits(amax) != 0) atomicMax(&row_bits[i], amax_bits(amax));
        } else {
#pragma unroll
        for (int lane_mask = 1; lane_mask < L; lane_mask <<= 1) {
          amax = amax_accumulate(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, lane_mask));
        }
        if (!in_unit || rows.src[i] == kRowBeyond) continue;
        const int64_t r = r0 + i, g = rows.group[i];
        BlockScale sc;
        if constexpr (S == SFMOE_SCALING_TENSOR) {
          sc.multiplier = row_scale[i];  // the group's scale, computed once per row
        } else if constexpr (R::kNv) {
          const float global = row_scale[i];  // the group's NVFP4 encode scale
          sc.stored_u8 = nvfp4_block_scale(amax, global);
          sc.multiplier = nvfp4_block_multiplier(sc.stored_u8, global);
        } else {
          sc = block_scale<S>(amax, 0.0f, fp8_max, pow2);
        }
        uint32_t codes[8];
        encode_values<S, 8>(values, sc.multiplier, e5m2, a, 2 * a.config.offset, r * cols + c, codes);
        const int valid = cols - c < 8 ? static_cast<int>(cols - c) : 8;
        store_codes<kFp4, 8>(a.rowwise, r * cols + c, codes, valid, vector_ok);
        if constexpr (B > 0) {
          if ((c / 8) % L == 0) {
            maybe_trap(a, amax, g, r);
            const int64_t scale_cols = cols / B;
            const int64_t offset = scale_offset(a.scale_layout, r, c / B, scale_cols);
            if constexpr (R::kNv || S == SFMOE_SCALING_MX_1X32) {
              uint8_t* scales = static_cast<uint8_t*>(a.rowwise_scale_inv);
              scales[offset] = sc.stored_u8;
              if (a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && c / B == scale_cols - 1) {
                for (int64_t k = scale_cols; k < round_up(scale_cols, kSwizzleTileCols); ++k) {
                  scales[swizzled_scale_offset(r, k, scale_cols)] = 0;
                }
              }
            } else {
              static_cast<float*>(a.rowwise_scale_inv)[offset] = sc.stored_f32;
            }
          }
        }
        }
      }
    }
    if constexpr (kAmaxPass) {
      __syncthreads();
      if (threadIdx.x < kFastRows) {
        const int i = threadIdx.x;
        if (rows.src[i] != kRowBeyond && (i == 0 || rows.group[i] != rows.group[i - 1])) {
          unsigned m = 0;
          for (int k = i; k < kFastRows && rows.group[k] == rows.group[i] && rows.src[k] != kRowBeyond; ++k) {
            m = max(m, row_bits[k]);
          }
          if (m != 0) atomicMax(reinterpret_cast<unsigned*>(a.amax + rows.group[i]), m);
        }
      }
    }
    __syncthreads();
  }
}

template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass>
sfmoe_status launch_rowwise(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  auto kernel = quantize_rowwise_kernel<In, S, kAmaxPass>;
  int blocks_per_sm = 0;
  SFMOE_CUDA_RETURN_IF_ERROR("sfmoe_grouped_quantize",
                             cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, 0));
  const int64_t units_bound = (a.row_capacity + kFastRows - 1) / kFastRows;
  const int64_t wave = static_cast<int64_t>(multiprocessor_count()) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  const int grid = static_cast<int>(units_bound < wave ? (units_bound > 0 ? units_bound : 1) : wave);
  kernel<<<grid, kThreads, 0, stream>>>(a);
  return check_launch("sfmoe_grouped_quantize", "quantize_rowwise_kernel");
}

template <sfmoe_dtype In, sfmoe_scaling S>
size_t tile_shared_bytes() {
  using R = Recipe<S>;
  constexpr int TR = R::kTileRows;
  return TR * kRowStride * sizeof(float) + TR * (sizeof(int64_t) + sizeof(int32_t)) +
         TR * sizeof(unsigned) + (TR / R::kChunk) * kTileCols * sizeof(float) +
         (TR / 16) * (kTileCols / 16) * sizeof(unsigned) + 16;
}

template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass>
sfmoe_status launch_tiles(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  auto kernel = quantize_tiles_kernel<In, S, kAmaxPass>;
  const size_t shared = tile_shared_bytes<In, S>();
  // Per device, and not a stream operation: set on every launch (cheap, capture-safe).
  SFMOE_CUDA_RETURN_IF_ERROR("sfmoe_grouped_quantize",
                             cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(shared)));
  int blocks_per_sm = 0;
  SFMOE_CUDA_RETURN_IF_ERROR("sfmoe_grouped_quantize",
                             cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, shared));
  const int64_t col_tiles = (a.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles_bound = (a.row_capacity + Recipe<S>::kTileRows - 1) / Recipe<S>::kTileRows *
                              ((col_tiles + kColTilesPerUnit - 1) / kColTilesPerUnit);
  const int64_t wave = static_cast<int64_t>(multiprocessor_count()) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
  const int grid = static_cast<int>(tiles_bound < wave ? (tiles_bound > 0 ? tiles_bound : 1) : wave);
  kernel<<<grid, kThreads, shared, stream>>>(a);
  return check_launch("sfmoe_grouped_quantize", "quantize_tiles_kernel");
}

template <sfmoe_dtype In, sfmoe_scaling S>
sfmoe_status run_recipe(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  const bool needs_amax = S == SFMOE_SCALING_TENSOR || Recipe<S>::kNv;
  if constexpr (!Recipe<S>::k2D) {
    if (a.columnwise == nullptr) {  // no transpose: the streaming path
      if (needs_amax) SFMOE_RETURN_IF_ERROR((launch_rowwise<In, S, true>(a, stream)));
      return launch_rowwise<In, S, false>(a, stream);
    }
  }
  if (needs_amax) SFMOE_RETURN_IF_ERROR((launch_tiles<In, S, true>(a, stream)));
  return launch_tiles<In, S, false>(a, stream);
}

template <sfmoe_dtype In>
sfmoe_status run_input(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  switch (a.scaling) {
    case SFMOE_SCALING_TENSOR: return run_recipe<In, SFMOE_SCALING_TENSOR>(a, stream);
    case SFMOE_SCALING_BLOCK_1X128: return run_recipe<In, SFMOE_SCALING_BLOCK_1X128>(a, stream);
    case SFMOE_SCALING_BLOCK_128X128: return run_recipe<In, SFMOE_SCALING_BLOCK_128X128>(a, stream);
    case SFMOE_SCALING_MX_1X32: return run_recipe<In, SFMOE_SCALING_MX_1X32>(a, stream);
    case SFMOE_SCALING_NV_1X16: return run_recipe<In, SFMOE_SCALING_NV_1X16>(a, stream);
    case SFMOE_SCALING_NV_16X16: return run_recipe<In, SFMOE_SCALING_NV_16X16>(a, stream);
    default: return fail(SFMOE_ERROR_UNSUPPORTED, "sfmoe_grouped_quantize: no kernel for this scaling");
  }
}

// ---- standalone amax: one block row-slice per (group, split) -----------------------------------
template <sfmoe_dtype In>
__global__ void __launch_bounds__(kThreads) group_amax_kernel(GroupedInput in, int64_t groups,
                                                              int64_t cols, float* amax) {
  __shared__ unsigned block_max;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    if (threadIdx.x == 0) block_max = 0;
    __syncthreads();
    const InputSpan span = input_span(in, g);
    const int64_t chunks_per_row = (cols + 7) / 8;
    const int64_t chunks = span.rows * chunks_per_row;
    const int64_t per_split = (chunks + gridDim.y - 1) / gridDim.y;
    const int64_t begin = blockIdx.y * per_split;
    const int64_t end = begin + per_split < chunks ? begin + per_split : chunks;
    unsigned m = 0;
    for (int64_t q = begin + threadIdx.x; q < end; q += kThreads) {
      float v[8];
      load_chunk8<In>(in.data, span.begin + q / chunks_per_row, (q % chunks_per_row) * 8, cols, v);
      m = max(m, amax_bits(chunk_amax<8>(v)));
    }
    for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, lane_mask));
    if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(&block_max, m);
    __syncthreads();
    if (threadIdx.x == 0 && block_max != 0) atomicMax(reinterpret_cast<unsigned*>(amax + g), block_max);
    __syncthreads();
  }
}

__global__ void clear_amax_kernel(GroupedInput in, int64_t groups, float* amax, sfmoe_fault_report* word) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    amax[g] = 0.0f;
    if (word != nullptr && in.offsets != nullptr) check_group(in.offsets, g, in.row_capacity, 1, word);
  }
}

}  // namespace

sfmoe_status grouped_quantize(const GroupedQuantizeArgs& a, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const bool clear_columnwise = a.columnwise_amax != nullptr && a.config.hadamard_columnwise &&
                                a.columnwise != nullptr;
  const bool clear_amax = a.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(a.scaling);
  padded_offsets_kernel<<<1, kScanThreads, 0, stream>>>(a, clear_amax, clear_columnwise);
  SFMOE_RETURN_IF_ERROR(check_launch("sfmoe_grouped_quantize", "padded_offsets_kernel"));
  switch (a.input.dtype) {
    case SFMOE_DTYPE_FP32: return run_input<SFMOE_DTYPE_FP32>(a, stream);
    case SFMOE_DTYPE_BF16: return run_input<SFMOE_DTYPE_BF16>(a, stream);
    case SFMOE_DTYPE_FP16: return run_input<SFMOE_DTYPE_FP16>(a, stream);
    default: return fail(SFMOE_ERROR_UNSUPPORTED, "sfmoe_grouped_quantize: input dtype");
  }
}

sfmoe_status grouped_amax(const GroupedInput& in, int64_t groups, int64_t cols, float* amax,
                          sfmoe_fault_report* word, void* stream_handle) {
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  clear_amax_kernel<<<grid_for(groups, kThreads), kThreads, 0, stream>>>(in, groups, amax, word);
  SFMOE_RETURN_IF_ERROR(check_launch("sfmoe_grouped_amax", "clear_amax_kernel"));
  const dim3 grid(static_cast<unsigned>(groups < 65535 ? groups : 65535), 8);
  switch (in.dtype) {
    case SFMOE_DTYPE_FP32: group_amax_kernel<SFMOE_DTYPE_FP32><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax); break;
    case SFMOE_DTYPE_BF16: group_amax_kernel<SFMOE_DTYPE_BF16><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax); break;
    case SFMOE_DTYPE_FP16: group_amax_kernel<SFMOE_DTYPE_FP16><<<grid, kThreads, 0, stream>>>(in, groups, cols, amax); break;
    default: return fail(SFMOE_ERROR_UNSUPPORTED, "sfmoe_grouped_amax: input dtype");
  }
  return check_launch("sfmoe_grouped_amax", "group_amax_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
