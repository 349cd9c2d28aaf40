// The grouped quantization's tile kernel: codes and scales of the rowwise and columnwise copies
// (and, NVFP4 with the Hadamard transform, the amax pass), one template over input dtype, recipe
// and form, launched by grouped_quantize.cu. Its layout is in that file's comment.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include "sfmoe/numerics.h"
#include "src/common/element_codec.h"
#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/common/quantize_args.h"
#include "src/cuda/common/cp_async.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/heuristics/quantize_launch.h"
#include "src/cuda/quantize/input_chunks.cuh"
#include "src/cuda/quantize/recipe_encoder.cuh"

namespace sfmoe {
namespace cuda {
namespace quantizer {

using namespace numerics;
using namespace encoding;

constexpr int kRowBeyond = -2;   // row map marker: at or beyond out_off[G], not written
constexpr int kRowPadding = -1;  // row map marker: alignment padding, zeros

// Tile geometry, shared by every recipe: 128 x 128 elements.
constexpr int kTile = 128;
constexpr int kChunksPerRow = kTile / kChunk;  // 16 lanes cover a tile row

// Thread geometry. The rowwise-only path runs 256 threads, each with 8 chunks of a tile in flight
// from global memory. The columnwise path runs 512 threads (4 chunks and one 16-row column
// segment each; 128 registers, one block per SM). Columnwise, a warp owns the whole height of
// four column pairs: lane l takes segment l % 8 of pair 4 warp + l / 8. A column's block amax
// (MXFP8: 2 segments, 1x128: 8) is then reduced by shuffles, every warp has the same share of
// the scale work, and the eight lanes of a column store its 128 rows as one line.
template <bool kColumnwise>
struct Geometry {
  static constexpr int kThreads = kColumnwise ? 512 : 256;
  static constexpr int kRowsPerStep = kThreads / kChunksPerRow;  // 16 or 32
  static constexpr int kSteps = kTile / kRowsPerStep;            // chunks per thread per tile
  static constexpr int kSegment = 16;                            // rows per columnwise thread
  static constexpr int kSegments = kTile / kSegment;             // 8, the low 3 bits of a lane
  static_assert(!kColumnwise || (kTile / 2) * kSegments == kThreads,
                "columnwise: one thread per column pair x segment");
  static_assert(kSegments == 8, "columnwise: a lane's segment is lane % 8");
  __device__ static int segment(int tid) { return tid & (kSegments - 1); }
  __device__ static int pair(int tid) { return (tid / 32) * 4 + (tid & 31) / kSegments; }
};

// Columnwise tiles in shared memory: chunk j of tile row i (8 elements: 16 bytes of 16-bit input,
// 32 of FP32) is stored at chunk position j ^ (i / 16), so that the eight segments of a column
// pair, read by eight lanes of one warp, fall in different banks (16-bit input: all 32 banks;
// FP32: segments s and s ^ 4 share banks, a 2-way conflict); the 16 chunks of a row stay within
// the row.
__device__ __forceinline__ int swizzled_chunk(int row, int chunk) {
  return chunk ^ ((row / 16) & 7);
}
// Group offsets are staged in shared memory when there are at most this many groups.
constexpr int64_t kMaxStagedGroups = 1024;

__device__ __forceinline__ void maybe_trap(const GroupedQuantizeArgs& a, float amax, int64_t group,
                                           int64_t where) {
  if (a.config.trap_nan_amax && a.word != nullptr && f32_is_nan(amax)) {
    raise_fault(a.word, SFMOE_FAULT_NAN_AMAX, group, where);
  }
}

// ---- the tile kernel ---------------------------------------------------------------------------
struct TileSchedule {
  int64_t col_tiles;       // ceil(cols / kTile)
  int64_t tiles_per_unit;  // column tiles per work unit
  int64_t col_units;       // ceil(col_tiles / tiles_per_unit)
  int64_t staged_groups;   // num_groups + 1 when the offsets are staged in shared memory, else 0
};

// Compact columnwise scales (MXFP8 [C, R / 32] bytes, FP8 1x128 [C, R / 128] floats) hold a
// column's scales along the rows: one band puts 4 bytes in each of 128 columns, 128 partial
// sectors per tile, which cost these recipes 11-13% (measured on the H200). So their units
// span kUnitBands bands, walked down each column tile before the next; the columnwise scales
// wait in shared memory (scale_stage) and leave as 32 bytes per column, whole sectors when the
// capacity is a multiple of 1024 rows (launch_codes keeps the former stores otherwise). The other
// requests keep one band per unit (kBanded = false): per-row scales and folded amaxes (TENSOR,
// NVFP4) are kept for one band only, and the band arithmetic folds away.
constexpr int kUnitBands = 8;
template <bool kBanded>
constexpr int kBandsPerUnit = kBanded ? kUnitBands : 1;

// Shared tile buffers of the columnwise path: raw input words, 128 rows of 128 elements, in a
// ring of three filled by cp.async two tiles ahead, so that each block keeps two tiles of loads in
// flight while it works on a third.
constexpr int kStages = kTileRingStages;
template <sfmoe_dtype In, bool kColumnwise>
struct TileBuffers {
  static constexpr int kWordsPerRow = kTile * (In == SFMOE_DTYPE_FP32 ? 4 : 2) / 4;
  static constexpr int kCount = kColumnwise ? kStages : 0;
  static constexpr size_t kBytes = static_cast<size_t>(kCount) * kTile * kWordsPerRow * 4;
};

// Starts the copy of tile column c0 (rows from the row map) into a shared buffer; each thread
// copies the chunks it reads back in the rowwise pass. A chunk cut by the end of a row (cols not
// a multiple of 8) is loaded and stored synchronously.
template <sfmoe_dtype In, class G>
__device__ __forceinline__ void issue_tile(uint32_t* buffer, const GroupedInput& in, int64_t cols,
                                           int64_t c0, int i0, int j, const int64_t* row_src,
                                           const uint8_t* const* row_input) {
  using Raw = RawChunk<In>;
  constexpr int W = kTile * (In == SFMOE_DTYPE_FP32 ? 4 : 2) / 4;
  constexpr int kBytes = In == SFMOE_DTYPE_FP32 ? 4 : 2;
  const int64_t c = c0 + j * kChunk;
  const bool whole = c + kChunk <= cols && cols % kChunk == 0;
  const bool inside = c < cols;
#pragma unroll
  for (int l = 0; l < G::kSteps; ++l) {
    const int i = i0 + G::kRowsPerStep * l;
    const uint8_t* row = row_input[i];  // NULL: padding or beyond
    uint32_t* dst = buffer + i * W + swizzled_chunk(i, j) * Raw::kWords;
    if (row == nullptr || !inside || whole) {
      const bool fill = row != nullptr && inside;
      const uint8_t* from = fill ? row + c * kBytes : static_cast<const uint8_t*>(in.data);
#pragma unroll
      for (int v = 0; v < Raw::kWords / 4; ++v) cp_async_16(dst + 4 * v, from + 16 * v, fill);
    } else {
      Raw raw;
      load_raw<In>(in.data, row_src[i], c, cols, raw);
#pragma unroll
      for (int v = 0; v < Raw::kWords / 4; ++v) {
        reinterpret_cast<uint4*>(dst)[v] =
            make_uint4(raw.w[4 * v], raw.w[4 * v + 1], raw.w[4 * v + 2], raw.w[4 * v + 3]);
      }
    }
  }
}

// Blocks per SM the registers must allow (launch bounds; heuristics/quantize_launch.h).
template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass, bool kColumnwise>
constexpr int tile_min_blocks() {
  if (In == SFMOE_DTYPE_FP32) return kColumnwise ? 1 : 2;  // twice the words per chunk
  if (kColumnwise) return kColumnwiseMinBlocks;
  if (kAmaxPass) return kAmaxPassMinBlocks;
  return Recipe<S>::kNv ? kNvfp4RowwiseMinBlocks : kRowwiseMinBlocks;
}

// The amax bits of columns 2p and 2p + 1 over `count` rows of a columnwise segment (16-bit
// inputs: one word holds both columns; FP32: two words per row).
template <sfmoe_dtype In, int kCount>
__device__ __forceinline__ void column_pair_amax_bits(const uint32_t* words, uint32_t out[2]) {
  if constexpr (In == SFMOE_DTYPE_FP32) {
    uint32_t m0 = 0, m1 = 0;
#pragma unroll
    for (int m = 0; m < kCount; ++m) {
      m0 = max(m0, words[2 * m] & kF32AbsMask);
      m1 = max(m1, words[2 * m + 1] & kF32AbsMask);
    }
    out[0] = m0;
    out[1] = m1;
  } else {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kCount; ++k) m = abs_max_u16x2(m, words[k]);
    out[0] = half_magnitude_amax_bits(In, m & 0xFFFFu);
    out[1] = half_magnitude_amax_bits(In, m >> 16);
  }
}

// Value of column e (0 or 1) at row m of a columnwise segment's words.
template <sfmoe_dtype In>
__device__ __forceinline__ float column_value(const uint32_t* words, int m, int e) {
  if constexpr (In == SFMOE_DTYPE_FP32) {
    return __uint_as_float(words[2 * m + e]);
  } else {
    return decode_half_word<In>(words[m], e);
  }
}

// The raw words of a columnwise segment: columns 2 pair and 2 pair + 1 of `count` tile rows from
// `first_row` (16-bit inputs: one word per row holds both; FP32: two words per row). The rows lie
// in one 16-row segment, so they share the chunk swizzle.
template <sfmoe_dtype In, int kCount>
__device__ __forceinline__ void load_segment_words(const uint32_t* tile, int words_per_row,
                                                   int first_row, int pair, uint32_t* words) {
  static_assert(kCount <= 16, "one swizzle per 16-row segment");
  constexpr int kWordsPerPair = In == SFMOE_DTYPE_FP32 ? 2 : 1;
  constexpr int kChunkWords = RawChunk<In>::kWords;  // 4 pairs per chunk
  const uint32_t* column = tile + first_row * words_per_row +
                           swizzled_chunk(first_row, pair / 4) * kChunkWords +
                           (pair % 4) * kWordsPerPair;
#pragma unroll
  for (int m = 0; m < kCount; ++m) {
    if constexpr (In == SFMOE_DTYPE_FP32) {
      const uint2 x = *reinterpret_cast<const uint2*>(column + m * words_per_row);
      words[2 * m] = x.x;
      words[2 * m + 1] = x.y;
    } else {
      words[m] = column[m * words_per_row];
    }
  }
}

// Rowwise 1D blocks: each thread holds the amax of its 8 chunks (steps l = 0..7, one per row it
// covers) and the L consecutive lanes of a block must reduce each. Exchanging halves of the set
// at each butterfly step reduces all eight in 8 - 8 / L + log2 shuffles instead of 8 log2(L), and
// leaves every block's amax in one lane (two for L = 16), so the scale math runs once per block
// instead of once per lane: lane q of its L-group holds steps spread_first_step(q) + k,
// k < kSpreadPerLane.
template <int L, int kSteps>
struct Spread {
  static constexpr int kPerLane = L >= kSteps ? 1 : kSteps / L;
  static constexpr int kCopies = L > kSteps ? L / kSteps : 1;  // lanes left holding each amax
  // The lane (in its L-group) and the register that hold step l's block amax.
  static constexpr int owner_lane(int l) { return L > kSteps ? kCopies * l : l / kPerLane; }
  static constexpr int owner_register(int l) { return L > kSteps ? 0 : l % kPerLane; }
  __device__ static int first_step(int lane) {
    return L > kSteps ? (lane & (L - 1)) / kCopies : (lane & (L - 1)) * kPerLane;
  }
  // Where an amax sits in several lanes, only the first of them stores.
  __device__ static bool stores(int lane) { return (lane & (kCopies - 1)) == 0; }
};

template <int L, int kSteps>
__device__ __forceinline__ void reduce_spread(uint32_t v[kSteps], int lane) {
  int count = kSteps;
#pragma unroll
  for (int mask = L / 2; mask >= 1; mask >>= 1) {
    if (count > 1) {
      const bool upper = lane & mask;
#pragma unroll
      for (int k = 0; k < kSteps / 2; ++k) {
        if (k < count / 2) {
          const uint32_t send = upper ? v[k] : v[k + count / 2];
          const uint32_t keep = upper ? v[k + count / 2] : v[k];
          v[k] = max(keep, __shfl_xor_sync(0xFFFFFFFFu, send, mask));
        }
      }
      count /= 2;
    } else {
      v[0] = shfl_max(v[0], mask);
    }
  }
}

// NVFP4 stochastic rounding is a template parameter of the codes kernel (kStochastic): compiled
// into every NVFP4 kernel, its Philox draws set the register budget of the deterministic encoding
// too (64-232 bytes of spills at 128 registers; without them NVFP4 ran 8-11% faster).
template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass, bool kColumnwise, bool kStochastic,
          bool kBanded>
__global__ void __launch_bounds__(Geometry<kColumnwise>::kThreads,
                                  (tile_min_blocks<In, S, kAmaxPass, kColumnwise>()))
    quantize_tiles_kernel(GroupedQuantizeArgs a, TileSchedule sched) {
  using R = Recipe<S>;
  using G = Geometry<kColumnwise>;
  constexpr int kThreads = G::kThreads, kRowsPerStep = G::kRowsPerStep, kSteps = G::kSteps;
  constexpr int kSegment = G::kSegment, kSegments = G::kSegments;
  constexpr int kPieces = kSegment / 16;  // 16-row pieces per columnwise segment
  using Raw = RawChunk<In>;
  using Buffers = TileBuffers<In, kColumnwise>;
  constexpr int B = R::kBlock;
  constexpr bool kFp4 = R::kNv;
  constexpr int W = Buffers::kWordsPerRow;
  constexpr int kSegmentWords = kSegment * (In == SFMOE_DTYPE_FP32 ? 2 : 1);
  extern __shared__ uint4 dynamic_shared[];
  uint32_t* const tiles = reinterpret_cast<uint32_t*>(dynamic_shared);
  int64_t* const staged =
      reinterpret_cast<int64_t*>(reinterpret_cast<uint8_t*>(dynamic_shared) + Buffers::kBytes);
  // Row maps of the unit's bands (a band's 128 rows at kTile b).
  static_assert(!kBanded || (kColumnwise && !kAmaxPass &&
                             (S == SFMOE_SCALING_MX_1X32 || S == SFMOE_SCALING_BLOCK_1X128)),
                "banded units: compact columnwise MXFP8 / 1x128 scales");
  constexpr int unit_bands = kBandsPerUnit<kBanded>;
  __shared__ int64_t unit_row_src[kTile * unit_bands];  // input row, or kRowPadding / kRowBeyond
  __shared__ const uint8_t* unit_row_input[kTile * unit_bands];  // its start; NULL: the others
  __shared__ int32_t unit_row_group[kTile * unit_bands];
  // Compact columnwise scales of the unit's bands, per column of the tile: 32 bytes (MXFP8: 4
  // bytes per band; 1x128: a float per band), in two buffers (column tiles alternate).
  __shared__ uint32_t scale_stage[kBanded ? 2 : 1][kBanded ? kTile : 1][kUnitBands];
  __shared__ float row_scale[kTile];              // TENSOR: the group's scale; NVFP4: rowwise S_enc
  __shared__ float row_decode[kTile];             // NVFP4: 1 / S_enc
  __shared__ float row_col_scale[kTile];          // NVFP4: the columnwise S_enc
  __shared__ float row_col_decode[kTile];         // NVFP4: its inverse
  __shared__ uint32_t row_bits[kTile];            // folded amax: each row's amax over the unit
  __shared__ uint32_t block_bits[3][64];          // 2D block amax, three rotating sets
  __shared__ uint32_t hadamard_bits[kTile / 16];  // amax pass: transformed 16-row blocks

  const int tid = threadIdx.x, lane = tid & 31;
  const int64_t groups = a.num_groups, cols = a.cols, capacity = a.row_capacity;
  const bool e5m2 = a.dtype == SFMOE_DTYPE_FP8_E5M2;
  const float fp8_max = e5m2 ? kE5M2Max : kE4M3Max;
  const Fp8Limits fp8{fp8_max, div_rn(1.0f, fp8_max)};
  const bool pow2 = a.config.power_of_two_scales != 0;
  const bool hadamard = R::kNv && a.config.hadamard_columnwise && a.columnwise != nullptr;
  static_assert(!kStochastic || (R::kNv && !kAmaxPass), "stochastic rounding: NVFP4 codes only");
  // The row stream (amax_rows.cuh) is the amax pass of every other request; this one serves NVFP4
  // with the Hadamard transform only, whose transformed columnwise amax needs the tile.
  static_assert(!kAmaxPass || (kColumnwise && S == SFMOE_SCALING_NV_1X16),
                "the tile amax pass: NVFP4 with the Hadamard transform only");
  constexpr bool stochastic = kStochastic;
  // (the offset the caller advances on the device, sfmoe_quantize_config.offset_device, read here)
  const uint64_t offset =
      a.config.offset + (stochastic && a.config.offset_device ? *a.config.offset_device : 0);
  const uint64_t seed = a.config.seed, stream_rowwise = 2 * offset;
  // TENSOR with given scales (delayed scaling): no amax pass runs before this kernel; it folds
  // the group amax from the rows it encodes, as the amax pass does, in the same read.
  constexpr bool kMayFoldAmax = !kAmaxPass && R::kTensor;
  const bool fold_amax = kAmaxPass || (kMayFoldAmax && a.config.tensor_scales != nullptr);

  // Offsets staged in shared memory: the row maps below search them without global latency.
  const int64_t* out_off = a.offsets;
  GroupedInput in = a.input;
  if (sched.staged_groups > 0) {
    for (int64_t g = tid; g < sched.staged_groups; g += kThreads) {
      if (a.offsets != nullptr) staged[g] = a.offsets[g];
      if (a.input.offsets != nullptr) staged[sched.staged_groups + g] = a.input.offsets[g];
    }
    if (a.offsets != nullptr) out_off = staged;
    if (a.input.offsets != nullptr) in.offsets = staged + sched.staged_groups;
  }
  if (R::k2D && tid < 3 * 64) block_bits[tid / 64][tid % 64] = 0;
  __syncthreads();
  const int64_t total = out_off != nullptr ? out_off[groups] : groups * a.uniform_rows;

  if constexpr (!kAmaxPass && R::kGroupAmax) {
    // Per-group outputs, once: TENSOR scale_inv; NaN group amax traps.
    if (blockIdx.x == 0) {
      for (int64_t g = tid; g < groups; g += kThreads) {
        const int64_t first_row = out_off != nullptr ? out_off[g] : g * a.uniform_rows;
        // (A folded amax is still being made here: trap_group_amax_kernel traps after it.)
        const float group_amax = fold_amax ? 0.0f : a.amax[g];
        if constexpr (R::kTensor) {
          const float inv = scale_inverse(tensor_scale_of_group(a.config, g, group_amax, fp8_max));
          if (a.rowwise_scale_inv) static_cast<float*>(a.rowwise_scale_inv)[g] = inv;
          if (a.columnwise_scale_inv) static_cast<float*>(a.columnwise_scale_inv)[g] = inv;
        }
        if (!fold_amax) maybe_trap(a, group_amax, g, first_row);
        if (hadamard) maybe_trap(a, a.columnwise_amax[g], g, first_row);
      }
    }
  }

  const int64_t bands = (total + kTile - 1) / kTile;
  const int64_t units = (bands + unit_bands - 1) / unit_bands * sched.col_units;
  const int j = tid % kChunksPerRow;   // rowwise: chunk j of each tile row it covers
  const int i0 = tid / kChunksPerRow;  // rowwise: tile rows i0 + kRowsPerStep l
  const int pair = G::pair(tid);       // columnwise: tile columns 2 pair, 2 pair + 1
  const int seg = G::segment(tid);     // columnwise: tile rows [16 seg, 16 seg + 16)
  int parity = 0;                      // tiles done by this block: selects the rotating buffers
  for (int64_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int64_t unit_r0 = unit / sched.col_units * (kTile * unit_bands);
    const int64_t ct_begin = unit % sched.col_units * sched.tiles_per_unit;
    const int64_t ct_end = ct_begin + sched.tiles_per_unit < sched.col_tiles
                               ? ct_begin + sched.tiles_per_unit
                               : sched.col_tiles;
    const int64_t first_band = unit_r0 / kTile;
    const int nb =  // bands of this unit
        unit_bands == 1
            ? 1
            : static_cast<int>(bands - first_band < unit_bands ? bands - first_band : unit_bands);
    const int tile_count = static_cast<int>(ct_end - ct_begin) * nb;  // column tiles x bands
    __syncthreads();  // the previous unit is done with the row maps and the scale stage
    for (int k = tid; k < kTile * nb; k += kThreads) {
      const int64_t r = unit_r0 + k;
      int64_t src = kRowBeyond, g = 0;
      if (r < total) {
        g = out_off != nullptr ? group_of_offset_row(out_off, groups, r) : r / a.uniform_rows;
        const InputSpan span = input_span(in, g);
        const int64_t inside = r - (out_off != nullptr ? out_off[g] : g * a.uniform_rows);
        src = inside < span.rows ? span.begin + inside : kRowPadding;
      }
      unit_row_src[k] = src;
      unit_row_input[k] = src >= 0 ? static_cast<const uint8_t*>(in.data) +
                                         src * cols * (In == SFMOE_DTYPE_FP32 ? 4 : 2)
                                   : nullptr;
      unit_row_group[k] = static_cast<int32_t>(g);
      if (k >= kTile) continue;  // (one band: the per-row scales and amaxes below)
      if constexpr (kMayFoldAmax)
        row_scale[k] = tensor_scale_of_group(a.config, g, fold_amax ? 0.0f : a.amax[g], fp8_max);
      if constexpr (!kAmaxPass && R::kNv) {
        const float s = nvfp4_global_encode_scale(a.amax[g]);
        const float sc = hadamard ? nvfp4_global_encode_scale(a.columnwise_amax[g]) : s;
        row_scale[k] = s;
        row_decode[k] = nvfp4_global_decode_scale(s);
        row_col_scale[k] = sc;
        row_col_decode[k] = nvfp4_global_decode_scale(sc);
      }
      if (fold_amax) row_bits[k] = 0;
      if (kAmaxPass && k < kTile / 16) hadamard_bits[k] = 0;
    }
    __syncthreads();

    uint32_t unit_bits[kSteps];  // amax pass: running row amax of the rows this thread covers
    uint32_t unit_hadamard[kPieces] = {};  // amax pass: transformed blocks of its column segment
#pragma unroll
    for (int l = 0; l < kSteps; ++l) unit_bits[l] = 0;

    // Tile t of the unit: column tile ct_begin + t / nb, band t % nb.
    auto issue_unit_tile = [&](uint32_t* buffer, int64_t ct, int band) {
      issue_tile<In, G>(buffer, in, cols, ct * kTile, i0, j, unit_row_src + kTile * band,
                        unit_row_input + kTile * band);
    };
    // The staged compact columnwise scales of column tile ct (every band of the unit done), as
    // 32-bit words: column-major along the rows, so each column's words are contiguous. A word
    // holding scales of rows beyond out_off[G] is written byte by byte (MXFP8).
    auto flush_column_scales = [&](int64_t ct) {
      if constexpr (kBanded) {
        const uint32_t(&stage)[kTile][kUnitBands] = scale_stage[(ct - ct_begin) & 1];
        for (int k = tid; k < kTile * kUnitBands; k += kThreads) {
          const int col = k / kUnitBands, w = k % kUnitBands;
          const int64_t ce = ct * kTile + col;
          if (ce >= cols || w >= nb) continue;
          const uint32_t word = stage[col][w];
          if constexpr (S == SFMOE_SCALING_BLOCK_1X128) {
            static_cast<float*>(a.columnwise_scale_inv)[ce * (capacity / B) + unit_r0 / B + w] =
                __uint_as_float(word);
          } else {
            uint8_t* const p = static_cast<uint8_t*>(a.columnwise_scale_inv) + ce * (capacity / B) +
                               unit_r0 / B + 4 * w;
            const int64_t written = (total - unit_r0 + B - 1) / B - 4 * w;  // blocks below the end
            if (written >= 4 && reinterpret_cast<uintptr_t>(p) % 4 == 0) {
              *reinterpret_cast<uint32_t*>(p) = word;
            } else {
              for (int q = 0; q < written && q < 4; ++q)
                p[q] = static_cast<uint8_t>(word >> (8 * q));
            }
          }
        }
      }
    };
    // Columnwise path: the first two tiles of the unit start loading now (one cp.async group
    // per tile, empty groups included, so that "all but the newest group done" always means
    // "this tile done").
    if constexpr (kColumnwise) {
#pragma unroll
      for (int k = 0; k < kStages - 1; ++k) {
        if (k < tile_count) issue_unit_tile(tiles + k * kTile * W, ct_begin + k / nb, k % nb);
        cp_async_commit();
      }
    }
    int stage = 0;  // the shared buffer of this tile (columnwise path)
    // Banded units: tile t is column tile banded_ct, band banded_band, and the tile kStages - 1
    // ahead is ahead_ct, ahead_band (counters: no divisions per tile). Otherwise tile t is column
    // tile ct_begin + t, as simply as that (extra loop state here cost NVFP4 3%).
    int64_t banded_ct = ct_begin, ahead_ct = ct_begin + (kStages - 1) / nb;
    int banded_band = 0, ahead_band = (kStages - 1) % nb;
    auto next_band = [&](int64_t& c, int& b) {
      b = b + 1 == nb ? 0 : b + 1;
      c += b == 0 ? 1 : 0;
    };
    for (int t = 0; t < tile_count; ++t, ++parity, stage = stage + 1 == kStages ? 0 : stage + 1) {
      const int64_t ct = kBanded ? banded_ct : ct_begin + t;
      const int band = kBanded ? banded_band : 0;
      if constexpr (kBanded) next_band(banded_ct, banded_band);  // (for the next tile)
      const int64_t r0 = unit_r0 + kTile * band;                 // the tile's first row
      const int64_t* const row_src = unit_row_src + kTile * band;
      const uint8_t* const* const row_input = unit_row_input + kTile * band;
      const int32_t* const row_group = unit_row_group + kTile * band;
      const int64_t c0 = ct * kTile;
      const int64_t c = c0 + j * kChunk;
      const bool chunk_in = c < cols;
      uint32_t* const tile = tiles + (kColumnwise ? stage * kTile * W : 0);
      // Rowwise-only path: the chunks go straight to registers.
      Raw raw[kColumnwise ? 1 : kSteps];
      if constexpr (!kColumnwise) {
        // Whole 16-byte chunks (the usual case) load from the row's start pointer in the row map;
        // a chunk cut by the end of a row, element by element.
        constexpr int kInBytes = In == SFMOE_DTYPE_FP32 ? 4 : 2;
        const bool whole = c + kChunk <= cols && cols % kChunk == 0;
#pragma unroll
        for (int l = 0; l < kSteps; ++l) {
          const int i = i0 + kRowsPerStep * l;
          const uint8_t* row = row_input[i];  // NULL: padding or beyond
          if (row != nullptr && whole) {
            load_raw_vectors<In>(row + c * kInBytes, raw[l]);
          } else if (row != nullptr && chunk_in) {
            load_raw<In>(in.data, row_src[i], c, cols, raw[l]);
          } else {
            zero_raw<In>(raw[l]);
          }
        }
      } else {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // this tile is in shared memory; every thread is done with the tile
                          // before
        if (t + kStages - 1 < tile_count) {
          const int ahead_stage =
              stage == 0 ? kStages - 1 : stage - 1;  // (stage + kStages - 1) % kStages
          if constexpr (kBanded) {
            issue_unit_tile(tiles + ahead_stage * kTile * W, ahead_ct, ahead_band);
            next_band(ahead_ct, ahead_band);
          } else {
            issue_unit_tile(tiles + ahead_stage * kTile * W, ct + kStages - 1, 0);
          }
        }
        cp_async_commit();
        // The previous column tile's bands are all done: its staged scales leave.
        if constexpr (kBanded) {
          if (band == 0 && t > 0) flush_column_scales(ct - 1);
        }
      }
      // Chunk l of this thread: from the registers, or back from the shared tile.
      auto chunk_at = [&](int l) -> Raw {
        if constexpr (kColumnwise) {
          Raw r;
          const int i = i0 + kRowsPerStep * l;
          const uint4* p =
              reinterpret_cast<const uint4*>(tile + i * W + swizzled_chunk(i, j) * Raw::kWords);
#pragma unroll
          for (int v = 0; v < Raw::kWords / 4; ++v) {
            const uint4 x = p[v];
            r.w[4 * v] = x.x;
            r.w[4 * v + 1] = x.y;
            r.w[4 * v + 2] = x.z;
            r.w[4 * v + 3] = x.w;
          }
          return r;
        } else {
          return raw[l];
        }
      };
      uint32_t bits[kSteps];
#pragma unroll
      for (int l = 0; l < kSteps; ++l) bits[l] = raw_amax_bits<In>(chunk_at(l));

      // Columnwise segment of this thread (rows r0 + [rs, rs + kSegment), columns c0 + cl, + 1).
      const int cl = 2 * pair, rs = kSegment * seg;
      const int64_t cc = c0 + cl, rseg = r0 + rs;
      const int64_t rows_left = total - rseg;
      const int valid_rows =
          rows_left <= 0 ? 0 : (rows_left < kSegment ? static_cast<int>(rows_left) : kSegment);
      const bool segment_active = cc < cols && valid_rows > 0;

      if constexpr (kAmaxPass) {
#pragma unroll
        for (int l = 0; l < kSteps; ++l) unit_bits[l] = max(unit_bits[l], bits[l]);
        if constexpr (kColumnwise) {  // NVFP4 + Hadamard: the amax of the transformed blocks
          if (segment_active) {
            uint32_t words[kSegmentWords];
            load_segment_words<In, kSegment>(tile, W, rs, pair, words);
#pragma unroll
            for (int h = 0; h < kPieces; ++h) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float v[16];
#pragma unroll
                for (int m = 0; m < 16; ++m) v[m] = column_value<In>(words, 16 * h + m, e);
                hadamard16_transform(v);
                uint32_t m16 = 0;
#pragma unroll
                for (int m = 0; m < 16; ++m) m16 = max(m16, amax_bits(v[m]));
                unit_hadamard[h] = max(unit_hadamard[h], m16);
              }
            }
          }
        }
        continue;
      }
      if constexpr (kMayFoldAmax) {
        // The tile's row amaxes into row_bits: the 16 lanes of each row reduce all of a thread's
        // steps at once, and the lane left holding a row's amax folds it in. A row has the same
        // owner in every tile of the unit, so plain stores do. (Running maxima in registers over
        // the unit, as the amax pass keeps them, made this kernel 20% slower.)
        if (fold_amax) {
          using RowSpread = Spread<kChunksPerRow, kSteps>;
          uint32_t rows_amax[kSteps];
#pragma unroll
          for (int l = 0; l < kSteps; ++l) rows_amax[l] = bits[l];
          reduce_spread<kChunksPerRow, kSteps>(rows_amax, lane);
          if (RowSpread::stores(lane)) {
            const int first = RowSpread::first_step(lane);
#pragma unroll
            for (int k = 0; k < RowSpread::kPerLane; ++k) {
              uint32_t& row = row_bits[i0 + kRowsPerStep * (first + k)];
              row = max(row, rows_amax[k]);
            }
          }
        }
      }

      // Columnwise path: full tiles (every row below out_off[G], every column inside, rows of
      // whole vectors) run a copy of the encoding compiled without the bounds checks; edge tiles
      // keep them. The condition is the same for the whole block (the encoding may hold
      // barriers). The rowwise-only kernels and NVFP4 keep one copy: a second one made them
      // spill at their register bounds (NVFP4 +columnwise: 1.97 -> 2.10 ms).
      constexpr bool kFullTileCopy = kColumnwise && !kFp4;
      const bool full_tile = kFullTileCopy && r0 + kTile <= total && c0 + kTile <= cols &&
                             cols % kChunk == 0 && capacity % 16 == 0;
      auto encode_tile = [&](auto full_tag) {
        constexpr bool kFull = decltype(full_tag)::value;
        // 2D blocks: the amax of each B x B block of the tile, by shared atomics on a set that was
        // cleared two tiles ago (the tile before the previous one was its last reader).
        uint32_t* const block_set = block_bits[parity % 3];
        if constexpr (R::k2D) {
          if (tid < 64) block_bits[(parity + 1) % 3][tid] = 0;
          if constexpr (B == 128) {
            uint32_t m = 0;
#pragma unroll
            for (int l = 0; l < kSteps; ++l) m = max(m, bits[l]);
            m = __reduce_max_sync(0xFFFFFFFFu, m);
            if (lane == 0 && m != 0) atomicMax(&block_set[0], m);
          } else {
#pragma unroll
            for (int l = 0; l < kSteps; ++l) {
              const uint32_t m =
                  shfl_max(shfl_max(bits[l], 1), 16);  // 16 columns x the warp's 2 rows
              const int row_block = (i0 + kRowsPerStep * l) / 16;
              if (lane < 16 && (lane & 1) == 0 && m != 0)
                atomicMax(&block_set[row_block * 8 + j / 2], m);
            }
          }
          __syncthreads();
          // Scales of the tile's 2D blocks, for both copies; NaN traps once per block.
          constexpr int kBlocksPerSide = kTile / B;
          if (tid < kBlocksPerSide * kBlocksPerSide) {
            const int bl = tid / kBlocksPerSide, bc = tid % kBlocksPerSide;
            const int64_t br = r0 + B * bl, bcol = c0 + B * bc;
            if (br < total && bcol < cols) {
              const int i = B * bl;
              const float block_amax = __uint_as_float(block_set[bl * 8 + bc]);
              const BlockScale s =
                  block_scale<S>(block_amax, fp8, pow2, row_scale[i], row_decode[i]);
              maybe_trap(a, block_amax, row_group[i], br);
              if (a.rowwise_scale_inv)
                store_scale<S>(a.rowwise_scale_inv, (br / B) * (cols / B) + bcol / B, s);
              if (a.columnwise_scale_inv)
                store_scale<S>(a.columnwise_scale_inv, (bcol / B) * (capacity / B) + br / B, s);
            }
          }
        }
        // FP8 128x128: the tile is one block, so one multiplier (one division) serves every value
        // of both copies.
        [[maybe_unused]] float tile_multiplier = 1.0f;
        if constexpr (R::k2D && B == kTile) {
          tile_multiplier =
              block_scale<S>(__uint_as_float(block_set[0]), fp8, pow2, 0.0f, 0.0f).multiplier;
        }

        // ---- rowwise copy, from the registers ----
        if (a.rowwise != nullptr) {
          // 1D recipes: block amax spread over the lanes, one scale computation per block.
          constexpr int L = (B > 0 && !R::k2D) ? B / kChunk : 1;  // lanes per block: 16, 4 or 2
          using Sp = Spread<L, kSteps>;
          float own_multiplier[Sp::kPerLane];
          if constexpr (L > 1) {
            uint32_t reduced[kSteps];
#pragma unroll
            for (int l = 0; l < kSteps; ++l) reduced[l] = bits[l];
            reduce_spread<L, kSteps>(reduced, lane);
            const int first = Sp::first_step(lane);
            const int64_t scale_cols = cols / B;
            const int64_t scale_col = blocks_before<B>(c);
#pragma unroll
            for (int k = 0; k < Sp::kPerLane; ++k) {
              const int i = i0 + kRowsPerStep * (first + k);
              const float amax = __uint_as_float(reduced[k]);
              const BlockScale s = block_scale<S>(amax, fp8, pow2, row_scale[i], row_decode[i]);
              own_multiplier[k] = s.multiplier;
              if (Sp::stores(lane) && (kFull || (chunk_in && row_src[i] != kRowBeyond))) {
                const int64_t r = r0 + i;
                maybe_trap(a, amax, row_group[i], r);
                const int64_t offset = scale_offset(a.scale_layout, r, scale_col, scale_cols);
                store_scale<S>(a.rowwise_scale_inv, offset, s);
                if constexpr (R::kNv || S == SFMOE_SCALING_MX_1X32) {
                  if (a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED &&
                      scale_col == scale_cols - 1) {
                    zero_swizzle_padding_columns(static_cast<uint8_t*>(a.rowwise_scale_inv), r,
                                                 scale_cols);
                  }
                }
              }
            }
          }
          const bool vector_ok = kFull || cols % kChunk == 0;
          // This thread's chunk of step 0 in the rowwise copy, and the bytes between two steps'
          // rows (FP4: cols is even), so that a step's address is one add.
          const int64_t first_element = (r0 + i0) * cols + c;
          uint8_t* const step0_out =
              static_cast<uint8_t*>(a.rowwise) + (kFp4 ? first_element / 2 : first_element);
          const int64_t step_bytes = kFp4 ? kRowsPerStep * cols / 2 : kRowsPerStep * cols;
          // One step at a time (multiplier, then codes), which keeps few values live.
#pragma unroll
          for (int l = 0; l < kSteps; ++l) {
            const int i = i0 + kRowsPerStep * l;
            const int64_t r = r0 + i;
            const bool written = kFull || (chunk_in && row_src[i] != kRowBeyond);
            float mult = 1.0f;
            if constexpr (R::kTensor) {
              mult = row_scale[i];
            } else if constexpr (R::k2D && B == kTile) {
              mult = tile_multiplier;
            } else if constexpr (R::k2D) {
              const uint32_t m = block_set[(i / 16) * 8 + j / 2];
              mult = block_scale<S>(__uint_as_float(m), fp8, pow2, row_scale[i], row_decode[i])
                         .multiplier;
            } else {
              mult = __shfl_sync(0xFFFFFFFFu, own_multiplier[Sp::owner_register(l)],
                                 (lane & ~(L - 1)) | Sp::owner_lane(l));
            }
            if (written) {
              float v[kChunk], m[kChunk];
              decode_raw<In>(chunk_at(l), v);
#pragma unroll
              for (int k = 0; k < kChunk; ++k) m[k] = mult;
              uint32_t words[kFp4 ? 1 : 2];
              encode_packed<kFp4, kChunk>(v, m, e5m2, stochastic, seed, stream_rowwise,
                                          r * cols + c, words);
              const int valid = (kFull || cols - c >= kChunk) ? kChunk : static_cast<int>(cols - c);
              store_packed_at<kFp4, kChunk>(step0_out + l * step_bytes, words, valid, vector_ok);
            }
          }
        }

        // ---- columnwise copy, from the shared tile: two columns x kSegment rows per thread ----
        if constexpr (kColumnwise) {
          uint32_t words[kSegmentWords];
          const bool active = kFull || segment_active;
          if (active) load_segment_words<In, kSegment>(tile, W, rs, pair, words);
          // Block multipliers of the segment: [column e][16-row piece h].
          float col_mult[2][kPieces];
#pragma unroll
          for (int h = 0; h < kPieces; ++h) col_mult[0][h] = col_mult[1][h] = 1.0f;
          if constexpr (B > kSegment && !R::k2D) {
            // Blocks taller than a segment (BLOCK_1X128: 8 segments, MXFP8: 2): the segments of a
            // block are neighbouring lanes of one warp, so the block amax is a few shuffles.
            constexpr int kSegmentsPerBlock = B / kSegment;
            static_assert(kSegmentsPerBlock >= 2, "two segments per block share its scales");
            uint32_t block_amax[2] = {0, 0};
            if (active) column_pair_amax_bits<In, kSegment>(words, block_amax);
#pragma unroll
            for (int mask = 1; mask < kSegmentsPerBlock; mask <<= 1) {
              block_amax[0] = shfl_max(block_amax[0], mask);
              block_amax[1] = shfl_max(block_amax[1], mask);
            }
            const int first_seg = seg & ~(kSegmentsPerBlock - 1);
            const int block_row = kSegment * first_seg;  // tile row of the block's first row
            // The block holds written rows when its first segment does.
            const bool block_written = kFull || (cc < cols && r0 + block_row < total);
            auto store_column_scale = [&](int e, const BlockScale& s, float block_amax_e) {
              const int64_t ce = cc + e, r = r0 + block_row, scale_cols = capacity / B;
              maybe_trap(a, block_amax_e, row_group[block_row], r);
              if constexpr (kBanded) {  // compact, banded: staged (kUnitBands)
                uint32_t* const word = &scale_stage[(ct - ct_begin) & 1][cl + e][band];
                if constexpr (S == SFMOE_SCALING_BLOCK_1X128) {
                  *word = __float_as_uint(s.stored_f32);
                } else {
                  reinterpret_cast<uint8_t*>(word)[block_row / B] = s.stored_u8;
                }
                return;
              }
              const int64_t at =
                  S == SFMOE_SCALING_BLOCK_1X128
                      ? block_1x128_scale_offset(a.scale_layout, true, ce, blocks_before<B>(r),
                                                 scale_cols, cols)
                      : scale_offset(a.scale_layout, ce, blocks_before<B>(r), scale_cols);
              store_scale<S>(a.columnwise_scale_inv, at, s);
              if constexpr (S == SFMOE_SCALING_MX_1X32) {
                if (a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && ce == cols - 1) {
                  zero_swizzle_padding_rows(static_cast<uint8_t*>(a.columnwise_scale_inv), cols,
                                            blocks_before<B>(r), scale_cols);
                }
              }
            };
            if (a.scale_layout == SFMOE_SCALE_LAYOUT_COMPACT && !kBanded) {
              // Compact scales stored straight from the kernel (one band per unit: capacities off
              // the 32-byte sectors): every lane makes both scales
              // and the block's first segment stores them (MXFP8: the block-first lanes of a column
              // store its four neighbouring scales in one instruction).
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const float m = __uint_as_float(block_amax[e]);
                const BlockScale s = block_scale<S>(m, fp8, pow2, 0.0f, 0.0f);
#pragma unroll
                for (int h = 0; h < kPieces; ++h) col_mult[e][h] = s.multiplier;
                if (seg == first_seg && block_written && (kFull || cc + e < cols))
                  store_column_scale(e, s, m);
              }
            } else {
              // Swizzled, transposed or staged compact scales: the block's first two segments
              // split the scale work, segment first + e making (and storing) column e's scale,
              // and the block's lanes take both multipliers by shuffles: one scale per lane
              // instead of two (for BLOCK_1X128 each is two correctly rounded divisions). With
              // compact scales stored from the kernel this measured slower, hence the two forms;
              // with the compact scales staged in shared memory it measured faster.
              const int own = (seg - first_seg) & 1;  // the column whose scale this lane makes
              const float m = __uint_as_float(own ? block_amax[1] : block_amax[0]);
              const BlockScale s = block_scale<S>(m, fp8, pow2, 0.0f, 0.0f);
              const int first_lane = lane & ~(kSegmentsPerBlock - 1);
              const float multiplier[2] = {__shfl_sync(0xFFFFFFFFu, s.multiplier, first_lane),
                                           __shfl_sync(0xFFFFFFFFu, s.multiplier, first_lane + 1)};
#pragma unroll
              for (int e = 0; e < 2; ++e) {
#pragma unroll
                for (int h = 0; h < kPieces; ++h) col_mult[e][h] = multiplier[e];
              }
              if (seg - first_seg < 2 && block_written && (kFull || cc + own < cols))
                store_column_scale(own, s, m);
            }
          } else if constexpr (R::k2D && B == kTile) {
#pragma unroll
            for (int h = 0; h < kPieces; ++h) col_mult[0][h] = col_mult[1][h] = tile_multiplier;
          } else if constexpr (R::k2D) {
#pragma unroll
            for (int h = 0; h < kPieces; ++h) {
              const int i = rs + 16 * h;
              const uint32_t m = block_set[(i / 16) * 8 + cl / 16];
              col_mult[0][h] = col_mult[1][h] =
                  block_scale<S>(__uint_as_float(m), fp8, pow2, row_scale[i], row_decode[i])
                      .multiplier;
            }
          }
          if (active) {
            const bool vector_ok = kFull || capacity % 16 == 0;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t ce = cc + e;
              if (!kFull && ce >= cols) continue;
#pragma unroll
              for (int h = 0; h < kPieces; ++h) {
                const int first = 16 * h;
                if (!kFull && first >= valid_rows) continue;
                float v[16], m[16];
#pragma unroll
                for (int k = 0; k < 16; ++k) v[k] = column_value<In>(words, first + k, e);
                float mult = col_mult[e][h];
                if constexpr (R::kNv && !R::k2D) {
                  // NVFP4 1x16: each 16-row half is a block (optionally Hadamard-transformed).
                  if (hadamard) hadamard16_transform(v);
                  uint32_t mb = 0;
#pragma unroll
                  for (int k = 0; k < 16; ++k) mb = max(mb, amax_bits(v[k]));
                  const int i = rs + first;
                  const BlockScale s = block_scale<S>(__uint_as_float(mb), fp8, pow2,
                                                      row_col_scale[i], row_col_decode[i]);
                  mult = s.multiplier;
                  const int64_t scale_cols = capacity / B;
                  maybe_trap(a, __uint_as_float(mb), row_group[i], rseg + first);
                  uint8_t* scales = static_cast<uint8_t*>(a.columnwise_scale_inv);
                  scales[scale_offset(a.scale_layout, ce, blocks_before<B>(rseg + first),
                                      scale_cols)] = s.stored_u8;
                  if (a.scale_layout == SFMOE_SCALE_LAYOUT_SWIZZLED && ce == cols - 1) {
                    zero_swizzle_padding_rows(scales, cols, blocks_before<B>(rseg + first),
                                              scale_cols);
                  }
                }
                if constexpr (R::kTensor) {
                  // Per-row group scales; one load when the piece's written rows lie in one group
                  // (groups are contiguous, so its first and last written rows decide; rows at and
                  // beyond out_off[G] carry no group).
                  const int i = rs + first;
                  const int last =
                      (kFull || valid_rows - first >= 16) ? 15 : valid_rows - first - 1;
                  if (row_group[i] == row_group[i + last]) {
                    const float one = row_scale[i];
#pragma unroll
                    for (int k = 0; k < 16; ++k) m[k] = one;
                  } else {
#pragma unroll
                    for (int k = 0; k < 16; ++k) m[k] = row_scale[i + k];
                  }
                } else {
#pragma unroll
                  for (int k = 0; k < 16; ++k) m[k] = mult;
                }
                uint32_t out[kFp4 ? 2 : 4];
                const int64_t index = ce * capacity + rseg + first;
                encode_packed<kFp4, 16>(v, m, e5m2, stochastic, seed, stream_rowwise + 1, index,
                                        out);
                const int valid = (kFull || valid_rows - first >= 16) ? 16 : valid_rows - first;
                store_packed<kFp4, 16>(a.columnwise, index, out, valid, vector_ok);
              }
            }
          }
        }
      };
      if constexpr (kFullTileCopy) {
        if (full_tile) {
          encode_tile(std::true_type{});
        } else {
          encode_tile(std::false_type{});
        }
      } else {
        encode_tile(std::false_type{});
      }
    }
    if constexpr (kBanded) {  // the last column tile's staged scales
      __syncthreads();
      flush_column_scales(ct_end - 1);
    }

    if (fold_amax) {
      if constexpr (kAmaxPass) {
        // Row amax over the unit: the 16 lanes of a row reduce, lane 0 owns the row's entry.
#pragma unroll
        for (int l = 0; l < kSteps; ++l) {
          uint32_t m = unit_bits[l];
#pragma unroll
          for (int mask = 1; mask < kChunksPerRow; mask <<= 1) m = shfl_max(m, mask);
          if (j == 0) row_bits[i0 + kRowsPerStep * l] = m;
        }
      }
      if constexpr (kAmaxPass && kColumnwise) {
        // The lanes of one segment (lane % 8 equal) reduce; the first of them folds.
#pragma unroll
        for (int h = 0; h < kPieces; ++h) {
          const uint32_t m = shfl_max(shfl_max(unit_hadamard[h], 8), 16);
          if (lane < kSegments && m != 0) {
            atomicMax(&hadamard_bits[(kSegment * seg) / 16 + h], m);
          }
        }
      }
      __syncthreads();
      if (tid < kTile) {
        // Rows to groups, a warp per 32 rows: a segmented maximum over runs of one group (groups
        // are contiguous; rows beyond out_off[G] carry group 0 and count as 0), after which the
        // first row of each run in the warp holds the run's amax and folds it.
        const int g = unit_row_group[tid];  // (folded amaxes: one band per unit)
        uint32_t m = unit_row_src[tid] != kRowBeyond ? row_bits[tid] : 0u;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
          const uint32_t other = __shfl_down_sync(0xFFFFFFFFu, m, d);
          const int other_group = __shfl_down_sync(0xFFFFFFFFu, g, d);
          if (lane + d < 32 && other_group == g) m = max(m, other);
        }
        const int previous_group = __shfl_up_sync(0xFFFFFFFFu, g, 1);
        if ((lane == 0 || previous_group != g) && m != 0)
          atomicMax(reinterpret_cast<unsigned*>(a.amax + g), m);
      }
      if (kAmaxPass && kColumnwise && tid < kTile / 16) {
        if (unit_row_src[16 * tid] != kRowBeyond && hadamard_bits[tid] != 0) {
          atomicMax(reinterpret_cast<unsigned*>(a.columnwise_amax + unit_row_group[16 * tid]),
                    hadamard_bits[tid]);
        }
      }
    }
  }
}

template <sfmoe_dtype In, sfmoe_scaling S, bool kAmaxPass, bool kColumnwise,
          bool kStochastic = false, bool kBanded = false>
sfmoe_status launch_tiles(const GroupedQuantizeArgs& a, cudaStream_t stream) {
  using Buffers = TileBuffers<In, kColumnwise>;
  constexpr int kThreads = Geometry<kColumnwise>::kThreads;
  auto kernel = quantize_tiles_kernel<In, S, kAmaxPass, kColumnwise, kStochastic, kBanded>;
  TileSchedule sched{};
  const bool has_offsets = a.offsets != nullptr || a.input.offsets != nullptr;
  sched.staged_groups = has_offsets && a.num_groups <= kMaxStagedGroups ? a.num_groups + 1 : 0;
  const size_t shared =
      Buffers::kBytes + 2 * sizeof(int64_t) * static_cast<size_t>(sched.staged_groups);
  // Per device, and not a stream operation: set on every launch (cheap, capture-safe).
  SFMOE_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  const int64_t wave = resident_wave(reinterpret_cast<const void*>(kernel), kThreads, shared);
  // Work units: 32 (rowwise-only) or 16 (columnwise) per resident block over the row bound, so
  // that the last wave is short and each unit's row map is reused over a few column tiles; the
  // columnwise path wants at least 8 tiles per unit (its copy pipeline restarts with every unit).
  // (A sweep of the unit counts chose these; docs/KERNEL_NOTES.md, grouped quantization.)
  constexpr int64_t unit_bands = kBandsPerUnit<kBanded>;
  const int64_t bands_bound = ((a.row_capacity + kTile - 1) / kTile + unit_bands - 1) / unit_bands;
  sched.col_tiles = (a.cols + kTile - 1) / kTile;
  const int64_t units_per_block = kColumnwise ? kColumnwiseUnitsPerBlock : kRowwiseUnitsPerBlock;
  int64_t col_units =
      bands_bound > 0 ? (units_per_block * wave + bands_bound - 1) / bands_bound : 1;
  if (kColumnwise) col_units = std::min<int64_t>(col_units, (sched.col_tiles * unit_bands + 7) / 8);
  col_units = col_units < 1 ? 1 : (col_units > sched.col_tiles ? sched.col_tiles : col_units);
  sched.tiles_per_unit = col_units > 0 ? (sched.col_tiles + col_units - 1) / col_units : 1;
  sched.col_units = sched.tiles_per_unit > 0
                        ? (sched.col_tiles + sched.tiles_per_unit - 1) / sched.tiles_per_unit
                        : 0;
  const int64_t units_bound = bands_bound * sched.col_units;
  const int grid =
      static_cast<int>(units_bound < wave ? (units_bound > 0 ? units_bound : 1) : wave);
  kernel<<<grid, kThreads, shared, stream>>>(a, sched);
  return check_launch("quantize_tiles_kernel");
}

}  // namespace quantizer
}  // namespace cuda
}  // namespace sfmoe
