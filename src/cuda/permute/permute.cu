// Permute / unpermute on the device (docs/permute.md), equal to the CPU reference bit for bit.
//
// Permute, four kernels, no float atomics and no host reads:
//   count:   per chunk of 64 tokens, each expert's count in the chunk (into the workspace);
//   scan:    one block: each chunk's base rank per expert, the kept and dropped counts (the
//            lowest token indices are kept), and the padded block starts;
//   place:   per chunk, each slot's row (row_map);
//   copy:    one block per token reads its row once and writes it to each of its k destination
//            rows; further blocks write the padding rows' zeros. Rows of a multiple of 16 bytes
//            move by bulk copies (one warp per token: the row is loaded into shared memory by
//            one instruction and stored to each destination by one more per slot), others by
//            16-, 4- or 2-byte vectors.
// The scan, place and copy kernels are programmatic dependents of the kernel before them
// (src/cuda/common/sm90_dependent_launch.h): each starts while its predecessor runs, does what
// needs only the inputs (place builds its chunk's bitmap from the ids, the bulk copy loads its
// token row), and waits for the predecessor before it reads what that one writes. Unpermute: one
// block per token gathers its k rows, FP32 sums in slot order. Its backward: one block per token
// scatters probs * d_out and reduces d_probs; padding blocks write zeros.
#include <stdint.h>

#include "sfmoe/numerics/float_formats.h"
#include "sfmoe/numerics/scale_swizzle.h"
#include "sfmoe/numerics/scaling.h"
#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/common/raw_amax.h"
#include "src/cuda/common/sm90_bulk_copy.h"
#include "src/cuda/common/sm90_dependent_launch.h"
#include "src/cuda/common/vector_io.h"
#include "src/cuda/heuristics/permute_launch.h"
#include "src/cuda/quantize/fused_rowwise.cuh"

namespace sfmoe {
namespace cuda {
namespace {

constexpr int kCopyThreads = 256;
// The vector row copy's block and the vectors each thread keeps in flight.
constexpr int kRowCopyThreads = 128;
constexpr int kRowCopyUnroll = 8;
static_assert(kRowCopyThreads >= kMaxDevicePermuteTopK, "a thread per slot places the rows");
constexpr int kMaxDeviceSlots = kMaxDevicePermuteTopK;
constexpr int kPaddingSplit = 8;  // blocks per expert that write its padding rows

// ---- rank -------------------------------------------------------------------------------------
//
// Tokens are taken in chunks of kChunkTokens, a thread each. A chunk's experts are a bitmap in
// shared memory: bit t of expert e's words says token t of the chunk names e. Its popcount is the
// chunk's count of e (count kernel, into the workspace [chunks, E]); the bits below t give the
// token's rank among the chunk's tokens of e, in token order (place kernel). Between the two, one
// block turns the counts into each chunk's base rank per expert (an exclusive scan over chunks),
// the kept and dropped counts, and the padded offsets.

constexpr int kChunkTokens = static_cast<int>(kPermuteChunkTokens);
constexpr int kChunkWords = kChunkTokens / 32;

// Builds the chunk's bitmap (dynamic shared memory, experts x kChunkWords words). Ids outside
// [0, E) take no part.
__device__ __forceinline__ void build_chunk_bitmap(uint32_t* bitmap, const int32_t* ids,
                                                   int64_t num_tokens, int64_t top_k,
                                                   int64_t experts, int64_t chunk) {
  for (int64_t w = threadIdx.x; w < experts * kChunkWords; w += blockDim.x) bitmap[w] = 0u;
  __syncthreads();
  const int64_t t = chunk * kChunkTokens + threadIdx.x;
  if (t < num_tokens) {
    for (int64_t i = 0; i < top_k; ++i) {
      const int32_t e = ids[t * top_k + i];
      if (e >= 0 && e < experts) {
        atomicOr(&bitmap[e * kChunkWords + threadIdx.x / 32], 1u << (threadIdx.x % 32));
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kChunkTokens)
    permute_count_kernel(const int32_t* ids, int64_t num_tokens, int64_t top_k, int64_t experts,
                         int32_t* chunk_counts) {
  let_dependents_start();
  extern __shared__ uint32_t bitmap[];
  const int64_t chunk = blockIdx.x;
  build_chunk_bitmap(bitmap, ids, num_tokens, top_k, experts, chunk);
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) {
    int count = 0;
#pragma unroll
    for (int w = 0; w < kChunkWords; ++w) count += __popc(bitmap[e * kChunkWords + w]);
    chunk_counts[chunk * experts + e] = count;
  }
}

// One block: per expert, the chunks' counts become base ranks (in place) and the total gives the
// kept and dropped rows; then the padded block starts.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads)
    permute_scan_kernel(int32_t* chunk_counts, int64_t chunks, int64_t experts,
                        int64_t expert_capacity, int64_t alignment, int64_t* tokens_per_expert,
                        int64_t* dropped_per_expert, int64_t* offsets, float* group_amax) {
  __shared__ int64_t partial[kScanThreads];
  __shared__ int64_t carry;
  let_dependents_start();
  wait_for_previous_kernel();  // the counts
  if (threadIdx.x == 0) carry = 0;
  for (int64_t first = 0; first < experts; first += kScanThreads) {
    const int64_t e = first + threadIdx.x;
    int64_t kept = 0;
    if (e < experts) {
      int64_t received = 0;
      constexpr int kUnroll = 8;  // loads of several chunks in flight
      int64_t c = 0;
      for (; c + kUnroll <= chunks; c += kUnroll) {
        int32_t v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = chunk_counts[(c + u) * experts + e];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          chunk_counts[(c + u) * experts + e] = static_cast<int32_t>(received);
          received += v[u];
        }
      }
      for (; c < chunks; ++c) {
        const int32_t v = chunk_counts[c * experts + e];
        chunk_counts[c * experts + e] = static_cast<int32_t>(received);
        received += v;
      }
      kept = expert_capacity > 0 && received > expert_capacity ? expert_capacity : received;
      tokens_per_expert[e] = kept;
      if (dropped_per_expert != nullptr) dropped_per_expert[e] = received - kept;
      if (group_amax != nullptr) group_amax[e] = 0.0f;  // the copy kernel folds into it
    }
    partial[threadIdx.x] = (kept + alignment - 1) / alignment * alignment;
    __syncthreads();
    for (int width = 1; width < kScanThreads; width *= 2) {  // inclusive scan (Hillis-Steele)
      const int64_t add = threadIdx.x >= width ? partial[threadIdx.x - width] : 0;
      __syncthreads();
      partial[threadIdx.x] += add;
      __syncthreads();
    }
    const int64_t inclusive = carry + partial[threadIdx.x];
    if (e < experts) offsets[e + 1] = inclusive;
    __syncthreads();
    if (threadIdx.x == kScanThreads - 1) carry = inclusive;
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[0] = 0;
}

// The row of the `rank`-th token routed to expert e: offsets[e] + rank, or -1 past the expert's
// capacity (0: none). The place kernel and the bulk copy that places its own slots share it.
__device__ __forceinline__ int64_t slot_row(const int64_t* offsets, int32_t e, int64_t rank,
                                            int64_t expert_capacity) {
  return expert_capacity > 0 && rank >= expert_capacity ? -1 : offsets[e] + rank;
}

// Each token's rows: offsets[e] + the chunk's base rank + the token's rank in the chunk, or -1
// past the capacity. A token's second naming of an expert, and ids outside [0, E), are skipped
// (-1) and reported.
__global__ void __launch_bounds__(kChunkTokens)
    permute_place_kernel(const int32_t* ids, int64_t num_tokens, int64_t top_k, int64_t experts,
                         int64_t expert_capacity, const int32_t* chunk_bases,
                         const int64_t* offsets, int64_t* row_map, sfmoe_fault_report* word) {
  let_dependents_start();
  extern __shared__ uint32_t bitmap[];
  const int64_t chunk = blockIdx.x;
  build_chunk_bitmap(bitmap, ids, num_tokens, top_k, experts, chunk);
  wait_for_previous_kernel();  // the chunk bases and offsets
  const int64_t t = chunk * kChunkTokens + threadIdx.x;
  if (t >= num_tokens) return;
  const int word_index = threadIdx.x / 32;
  const uint32_t below = (1u << (threadIdx.x % 32)) - 1u;
  for (int64_t i = 0; i < top_k; ++i) {
    const int64_t slot = t * top_k + i;
    const int32_t e = ids[slot];
    bool named_before = false;
    for (int64_t j = 0; j < i; ++j) named_before |= ids[t * top_k + j] == e;
    if (e < 0 || e >= experts || named_before) {
      row_map[slot] = -1;
      if (word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, t, e);
      continue;
    }
    const uint32_t* mine = bitmap + e * kChunkWords;
    int64_t rank = chunk_bases[chunk * experts + e] + __popc(mine[word_index] & below);
    for (int w = 0; w < word_index; ++w) rank += __popc(mine[w]);
    row_map[slot] = slot_row(offsets, e, rank, expert_capacity);
  }
}

// ---- row copies ----------------------------------------------------------------------------

// A token's row amax (FP32 bits) folded into the amax of the experts of its kept slots: by
// atomicMax on the bits (non-negative FP32 bits order like their values, NaN above Inf), into
// amaxes the scan kernel cleared.
__device__ __forceinline__ void fold_row_amax(float* group_amax, int32_t expert, uint32_t bits) {
  if (bits != 0) atomicMax(reinterpret_cast<unsigned*>(group_amax + expert), bits);
}

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
  for (int width = 16; width >= 1; width /= 2) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, width));
  return v;
}

// Rows move as 16-byte vectors when the row size allows, else as elements of their size; each
// thread has four vectors of the row in flight before it writes them to every destination (null
// destinations are slots without a row).
template <class Vec>
__device__ __forceinline__ void copy_row_to(const Vec* source, Vec* const* destinations, int count,
                                            int64_t vectors) {
  constexpr int kUnroll = kRowCopyUnroll;
  for (int64_t first = threadIdx.x; first < vectors; first += blockDim.x * kUnroll) {
    Vec value[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = first + u * blockDim.x;
      if (v < vectors) value[u] = source[v];
    }
    for (int i = 0; i < count; ++i) {
      Vec* destination = destinations[i];
      if (destination == nullptr) continue;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = first + u * blockDim.x;
        if (v < vectors) destination[v] = value[u];
      }
    }
  }
}

template <class Vec>
__device__ __forceinline__ void zero_row(Vec* row, int64_t vectors) {
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) row[v] = Vec{};
}

// Blocks [0, T): token rows to their destinations. Blocks [T, T + E * kPaddingSplit): expert
// e = (b - T) / split writes every split-th of its padding rows.
template <class Vec>
__global__ void __launch_bounds__(kRowCopyThreads)
    permute_copy_kernel(const Vec* tokens, int64_t num_tokens, int64_t top_k, int64_t row_vectors,
                        int64_t row_capacity, const int64_t* offsets,
                        const int64_t* tokens_per_expert, const int64_t* row_map, Vec* permuted,
                        sfmoe_dtype dtype, int64_t hidden, const int32_t* topk_ids,
                        float* group_amax) {
  wait_for_previous_kernel();  // the row map and offsets
  const int64_t b = blockIdx.x;
  if (b < num_tokens) {
    // Each of the first k threads places one slot.
    __shared__ Vec* by_slot[kMaxDeviceSlots];
    if (threadIdx.x < top_k) {
      const int64_t row = row_map[b * top_k + threadIdx.x];
      // The API checked the capacity against the worst case; the bound is kept regardless.
      by_slot[threadIdx.x] =
          row >= 0 && row < row_capacity ? permuted + row * row_vectors : nullptr;
    }
    __syncthreads();
    copy_row_to(tokens + b * row_vectors, by_slot, static_cast<int>(top_k), row_vectors);
    bool kept = false;  // by some slot (the same answer in every thread)
    for (int64_t i = 0; i < top_k; ++i) kept |= by_slot[i] != nullptr;
    if (group_amax != nullptr && kept) {
      // The row's amax, element by element from the token row the block just read (a second
      // read, from cache; the bulk form reads its staged row instead).
      RawAmax amax(dtype);
      const int bits = dtype == SFMOE_DTYPE_FP32 ? 32 : 16;
      for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
        amax.add_code(load_code(tokens, bits, b * hidden + h));
      __shared__ uint32_t warp_amax[kRowCopyThreads / 32];
      const uint32_t m = warp_max(amax.bits());
      if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = m;
      __syncthreads();
      if (threadIdx.x < top_k && by_slot[threadIdx.x] != nullptr) {
        uint32_t row_bits = 0;
        for (int w = 0; w < kRowCopyThreads / 32; ++w) row_bits = max(row_bits, warp_amax[w]);
        fold_row_amax(group_amax, topk_ids[b * top_k + threadIdx.x], row_bits);
      }
    }
    return;
  }
  const int64_t pad = b - num_tokens;
  const int64_t e = pad / kPaddingSplit, part = pad % kPaddingSplit;
  const int64_t end = offsets[e + 1] < row_capacity ? offsets[e + 1] : row_capacity;
  for (int64_t row = offsets[e] + tokens_per_expert[e] + part; row < end; row += kPaddingSplit) {
    zero_row(permuted + row * row_vectors, row_vectors);
  }
}

// The bulk form: a one-warp block per token. Lane 0 loads the row (in segments of at most
// kBulkSegmentBytes) into shared memory; lane i stores it to the rows of slots i and i + 32. The
// warps issue a few instructions per row instead of one load or store per 16 bytes and thread,
// and many rows are in flight per multiprocessor (one per block, as many blocks as the shared
// memory holds). Padding blocks fill their segment with zeros once and store it to each padding
// row.
constexpr int kBulkThreads = 32;
static_assert(kChunkTokens == 2 * kBulkThreads, "a lane reads two tokens of a rank chunk");
constexpr int kBulkSlotsPerLane = (kMaxDeviceSlots + kBulkThreads - 1) / kBulkThreads;
constexpr int64_t kBulkSegmentBytes = 32768;

// The block also does permute_place_kernel's work for its token (the place kernel is not
// launched before it): before waiting for the scan it finds each slot's expert and its rank among
// the chunk's earlier tokens (lane l reads tokens l and l + 32 of the chunk and marks which slots'
// experts they name; a ballot per slot counts them), and after it adds the chunk's base rank and
// the expert's offset, writes the row map and reports bad ids, as the place kernel does.
struct PlaceArgs {
  const int32_t* ids;
  int64_t experts, expert_capacity;
  const int32_t* chunk_bases;
  int64_t* row_map;
  sfmoe_fault_report* word;
};

__global__ void __launch_bounds__(kBulkThreads)
    permute_bulk_copy_kernel(const uint8_t* tokens, int64_t num_tokens, int64_t top_k,
                             int64_t row_bytes, int64_t segment_bytes, int64_t row_capacity,
                             const int64_t* offsets, const int64_t* tokens_per_expert,
                             uint8_t* permuted, PlaceArgs place, sfmoe_dtype dtype,
                             float* group_amax) {
  extern __shared__ __align__(128) uint8_t staged[];
  __shared__ uint64_t loaded;
  __shared__ int32_t slot_expert[kMaxDeviceSlots];
  const int lane = threadIdx.x;
  const int64_t b = blockIdx.x;
  if (b < num_tokens) {
    // The first segment of the token's row is loaded before the row map exists.
    if (lane == 0) {
      mbarrier_init_single(&loaded);
      const uint32_t bytes =
          static_cast<uint32_t>(row_bytes < segment_bytes ? row_bytes : segment_bytes);
      bulk_load_to_shared(staged, tokens + b * row_bytes, bytes, &loaded);
    }
    int64_t rows[kBulkSlotsPerLane];
    int32_t expert[kBulkSlotsPerLane];  // the slots' experts
    bool stores = false;
#pragma unroll
    for (int i = 0; i < kBulkSlotsPerLane; ++i) {
      const int64_t slot = lane + i * kBulkThreads;
      expert[i] = slot < top_k ? place.ids[b * top_k + slot] : -1;
    }
    // Each slot's expert, whether it counts (in [0, E) and not named by an earlier slot), and
    // its rank among the chunk's earlier tokens that name it.
#pragma unroll
    for (int i = 0; i < kBulkSlotsPerLane; ++i) {
      const int64_t slot = lane + i * kBulkThreads;
      if (slot < top_k) slot_expert[slot] = expert[i];
    }
    __syncwarp();
    bool valid[kBulkSlotsPerLane];
#pragma unroll
    for (int i = 0; i < kBulkSlotsPerLane; ++i) {
      const int64_t slot = lane + i * kBulkThreads;
      valid[i] = slot < top_k && expert[i] >= 0 && expert[i] < place.experts;
      for (int64_t j = 0; valid[i] && j < slot; ++j) valid[i] = slot_expert[j] != expert[i];
    }
    const int64_t chunk = b / kChunkTokens, chunk_first = chunk * kChunkTokens;
    uint64_t names[2] = {0u, 0u};  // bit s: the lane's token names slot s's expert (s < 64)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t other = chunk_first + lane + h * kBulkThreads;
      if (other >= b) continue;
      for (int64_t j = 0; j < top_k; ++j) {
        const int32_t id = place.ids[other * top_k + j];
        for (int64_t s = 0; s < top_k; ++s) {
          if (slot_expert[s] == id) names[h] |= uint64_t{1} << s;
        }
      }
    }
    int32_t rank[kBulkSlotsPerLane] = {};
    for (int64_t s = 0; s < top_k; ++s) {
      const int count = __popc(__ballot_sync(0xFFFFFFFFu, (names[0] >> s) & 1u)) +
                        __popc(__ballot_sync(0xFFFFFFFFu, (names[1] >> s) & 1u));
#pragma unroll
      for (int i = 0; i < kBulkSlotsPerLane; ++i) {
        if (s == lane + i * kBulkThreads) rank[i] = count;
      }
    }
    wait_for_previous_kernel();  // the chunk bases and offsets
#pragma unroll
    for (int i = 0; i < kBulkSlotsPerLane; ++i) {
      const int64_t slot = lane + i * kBulkThreads;
      rows[i] = -1;
      if (slot >= top_k) continue;
      if (valid[i]) {
        const int64_t r = place.chunk_bases[chunk * place.experts + expert[i]] + rank[i];
        rows[i] = slot_row(offsets, expert[i], r, place.expert_capacity);
      } else if (place.word != nullptr) {
        raise_fault(place.word, SFMOE_FAULT_BAD_INDEX, b, expert[i]);
      }
      place.row_map[b * top_k + slot] = rows[i];
    }
#pragma unroll
    for (int i = 0; i < kBulkSlotsPerLane; ++i) {
      // The API checked the capacity against the worst case; the bound is kept regardless.
      if (rows[i] >= row_capacity) rows[i] = -1;
      stores |= rows[i] >= 0;
    }
    __syncwarp();
    // The row's amax, when asked for and some slot keeps the row: read back from the staged
    // segments by the whole warp.
    const bool fold_amax = group_amax != nullptr && __any_sync(0xFFFFFFFFu, stores);
    RawAmax amax(dtype);
    uint32_t phase = 0;
    for (int64_t at = 0; at < row_bytes; at += segment_bytes, phase ^= 1u) {
      const int64_t left = row_bytes - at;
      const uint32_t bytes = static_cast<uint32_t>(left < segment_bytes ? left : segment_bytes);
      if (lane == 0 && at > 0)
        bulk_load_to_shared(staged, tokens + b * row_bytes + at, bytes, &loaded);
      mbarrier_wait(&loaded, phase);
      if (fold_amax) {
        for (uint32_t v = lane; v < bytes / 16; v += kBulkThreads)
          amax.add(reinterpret_cast<const uint4*>(staged)[v]);
      }
      if (stores) {
#pragma unroll
        for (int i = 0; i < kBulkSlotsPerLane; ++i) {
          if (rows[i] >= 0)
            bulk_store_from_shared(permuted + rows[i] * row_bytes + at, staged, bytes);
        }
        bulk_commit();
        bulk_wait_source_read();  // before the next segment overwrites the staged bytes
      }
      __syncwarp();
    }
    if (fold_amax) {
      const uint32_t row_bits = warp_max(amax.bits());
#pragma unroll
      for (int i = 0; i < kBulkSlotsPerLane; ++i) {
        if (rows[i] >= 0) fold_row_amax(group_amax, expert[i], row_bits);
      }
    }
    return;
  }
  wait_for_previous_kernel();  // the offsets and counts
  const int64_t pad = b - num_tokens;
  const int64_t e = pad / kPaddingSplit, part = pad % kPaddingSplit;
  const int64_t end = offsets[e + 1] < row_capacity ? offsets[e + 1] : row_capacity;
  const int64_t first = offsets[e] + tokens_per_expert[e] + part;
  if (first >= end) return;
  for (int64_t v = lane; v < segment_bytes / 16; v += kBulkThreads) {
    reinterpret_cast<uint4*>(staged)[v] = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_shared_for_bulk_copies();
  __syncwarp();
  for (int64_t row = first + lane * kPaddingSplit; row < end; row += kBulkThreads * kPaddingSplit) {
    for (int64_t at = 0; at < row_bytes; at += segment_bytes) {
      const int64_t left = row_bytes - at;
      const uint32_t bytes = static_cast<uint32_t>(left < segment_bytes ? left : segment_bytes);
      bulk_store_from_shared(permuted + row * row_bytes + at, staged, bytes);
    }
    bulk_commit();
  }
  bulk_wait_source_read();
}

// ---- fused quantization ----------------------------------------------------------------------
//
// Permute followed by sfmoe_grouped_quantize of the permuted rows, in one pass, for the rowwise
// recipes whose blocks lie within a row (src/cuda/quantize/fused_rowwise.cuh): a token's codes and
// scales are the same in each of its k rows, so they are computed once from its row and written
// k times.

// Blocks [0, T): a token's row quantized once, written to its rows. Blocks [T, T + E * split):
// padding rows, quantized zeros (zero codes, the scale of a zero block).
template <int kBlock>
__global__ void __launch_bounds__(kCopyThreads)
    permute_quantize_kernel(const void* tokens, sfmoe_dtype dtype, int64_t num_tokens,
                            int64_t top_k, int64_t hidden, int64_t row_capacity,
                            const int64_t* offsets, const int64_t* tokens_per_expert,
                            const int64_t* row_map, FusedQuantization q) {
  constexpr int kLanesPerBlock = kBlock / 8;
  const int64_t scale_cols = hidden / kBlock, chunks = hidden / 8;
  const int64_t b = blockIdx.x;
  if (b >= num_tokens) {
    const int64_t pad = b - num_tokens;
    const int64_t e = pad / kPaddingSplit, part = pad % kPaddingSplit;
    const int64_t end = offsets[e + 1] < row_capacity ? offsets[e + 1] : row_capacity;
    const BlockScales<kBlock> zero = BlockScales<kBlock>::of(0.0f, q.e5m2, q.power_of_two);
    for (int64_t row = offsets[e] + tokens_per_expert[e] + part; row < end; row += kPaddingSplit) {
      for (int64_t c = threadIdx.x; c < chunks; c += kCopyThreads) {
        reinterpret_cast<uint2*>(q.codes + row * hidden)[c] = make_uint2(0u, 0u);
        if (c % kLanesPerBlock == 0) zero.store(q, row, c / kLanesPerBlock, scale_cols);
      }
      if (q.swizzled && threadIdx.x == 0) zero_swizzle_padding(q, row, scale_cols);
    }
    return;
  }
  __shared__ int64_t rows[kMaxDeviceSlots];
  if (threadIdx.x < top_k) {
    const int64_t row = row_map[b * top_k + threadIdx.x];
    rows[threadIdx.x] = row >= 0 && row < row_capacity ? row : -1;
  }
  __syncthreads();
  // Every lane runs the same trip count (the block amax is a shuffle over neighbouring lanes).
  for (int64_t first = 0; first < chunks; first += kCopyThreads) {
    const int64_t c = first + threadIdx.x;
    const bool active = c < chunks;
    float v[8];
    if (active) {
      load_vector<8>(tokens, dtype, b * hidden + c * 8, v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    BlockScales<kBlock> s;
    const uint2 codes = quantize_eight<kBlock>(v, q, &s);  // every lane: shuffles inside
    if (!active) continue;
    for (int i = 0; i < top_k; ++i) {
      const int64_t row = rows[i];
      if (row < 0) continue;
      reinterpret_cast<uint2*>(q.codes + row * hidden)[c] = codes;
      if (c % kLanesPerBlock == 0) s.store(q, row, c / kLanesPerBlock, scale_cols);
    }
  }
  if (q.swizzled && threadIdx.x == 0) {
    for (int i = 0; i < top_k; ++i) {
      if (rows[i] >= 0) zero_swizzle_padding(q, rows[i], scale_cols);
    }
  }
}

// TENSOR with given scales: each expert has its own scale, so a token's row is encoded once per
// destination; the row's amax (bit-pattern max of |x|: order-free) goes to each destination
// expert's group amax. Padding rows are the codes of zeros (which do not change an amax).
__global__ void __launch_bounds__(kCopyThreads)
    permute_quantize_tensor_kernel(const void* tokens, sfmoe_dtype dtype, int64_t num_tokens,
                                   int64_t top_k, int64_t hidden, int64_t row_capacity,
                                   const int64_t* offsets, const int64_t* tokens_per_expert,
                                   const int64_t* row_map, const int32_t* topk_ids,
                                   FusedQuantization q) {
  const int64_t chunks = hidden / 8;
  const int64_t b = blockIdx.x;
  if (b >= num_tokens) {
    const int64_t pad = b - num_tokens;
    const int64_t e = pad / kPaddingSplit, part = pad % kPaddingSplit;
    const int64_t end = offsets[e + 1] < row_capacity ? offsets[e + 1] : row_capacity;
    // Zeros times the expert's scale (not bare zero codes: a given Inf or NaN scale makes NaN
    // codes, as the grouped quantization of the padding's zeros does).
    const float zeros[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    const uint2 zero_codes = encode_eight(zeros, q.tensor_scales[e], q.e5m2);
    for (int64_t row = offsets[e] + tokens_per_expert[e] + part; row < end; row += kPaddingSplit) {
      for (int64_t c = threadIdx.x; c < chunks; c += kCopyThreads) {
        reinterpret_cast<uint2*>(q.codes + row * hidden)[c] = zero_codes;
      }
    }
    return;
  }
  __shared__ int64_t rows[kMaxDeviceSlots];
  __shared__ int32_t experts[kMaxDeviceSlots];
  __shared__ float scales[kMaxDeviceSlots];
  __shared__ uint32_t block_amax;
  if (threadIdx.x == 0) block_amax = 0u;
  if (threadIdx.x < top_k) {
    const int64_t slot = b * top_k + threadIdx.x;
    const int64_t row = row_map[slot];
    // A kept slot's id was checked by the place kernel (a bad id has row -1).
    const bool kept = row >= 0 && row < row_capacity;
    rows[threadIdx.x] = kept ? row : -1;
    experts[threadIdx.x] = kept ? topk_ids[slot] : 0;
    scales[threadIdx.x] = kept ? q.tensor_scales[topk_ids[slot]] : 0.0f;
  }
  __syncthreads();
  uint32_t amax = 0u;
  for (int64_t c = threadIdx.x; c < chunks; c += kCopyThreads) {
    float v[8];
    load_vector<8>(tokens, dtype, b * hidden + c * 8, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t bits = numerics::amax_bits(v[i]);
      amax = bits > amax ? bits : amax;
    }
    for (int i = 0; i < top_k; ++i) {
      if (rows[i] < 0) continue;
      reinterpret_cast<uint2*>(q.codes + rows[i] * hidden)[c] = encode_eight(v, scales[i], q.e5m2);
    }
  }
  for (int width = 16; width >= 1; width /= 2) {
    const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, amax, width);
    amax = other > amax ? other : amax;
  }
  if (threadIdx.x % 32 == 0 && amax != 0u) atomicMax(&block_amax, amax);
  __syncthreads();
  if (threadIdx.x < top_k && rows[threadIdx.x] >= 0 && block_amax != 0u) {
    atomicMax(reinterpret_cast<uint32_t*>(q.amax) + experts[threadIdx.x], block_amax);
  }
}

// ---- unpermute -----------------------------------------------------------------------------

// The token's slots: rows (checked: one outside [0, row_capacity) is skipped and reported) and
// weights, staged in shared memory by the first k threads.
struct TokenSlots {
  int64_t row[kMaxDeviceSlots];
  float weight[kMaxDeviceSlots];
};

__device__ __forceinline__ void stage_slots(TokenSlots* slots, const int64_t* row_map,
                                            const float* probs, int64_t t, int64_t top_k,
                                            int64_t row_capacity, sfmoe_fault_report* word) {
  if (threadIdx.x < top_k) {
    const int64_t slot = t * top_k + threadIdx.x;
    int64_t row = row_map[slot];
    if (row < -1 || row >= row_capacity) {
      if (word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, t, row);
      row = -1;
    }
    slots->row[threadIdx.x] = row;
    slots->weight[threadIdx.x] = probs != nullptr ? probs[slot] : 1.0f;
  }
  __syncthreads();
}

template <int kVec>
__global__ void __launch_bounds__(kCopyThreads) unpermute_kernel(UnpermuteArgs a) {
  __shared__ TokenSlots slots;
  const int64_t t = blockIdx.x;
  stage_slots(&slots, a.row_map, a.probs, t, a.top_k, a.row_capacity, a.word);
  for (int64_t first = threadIdx.x * kVec; first < a.hidden; first += kCopyThreads * kVec) {
    float sum[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum[j] = 0.0f;
    for (int i = 0; i < a.top_k; ++i) {
      const int64_t row = slots.row[i];
      if (row < 0) continue;
      float v[kVec];
      load_vector<kVec>(a.rows, a.rows_dtype, row * a.hidden + first, v);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        sum[j] = numerics::add_rn(
            sum[j], a.probs != nullptr ? numerics::mul_rn(slots.weight[i], v[j]) : v[j]);
      }
    }
    store_vector<kVec>(a.out, a.out_dtype, t * a.hidden + first, sum);
  }
}

// Blocks [0, T): tokens. Blocks [T, T + E * kPaddingSplit): padding rows of d_rows.
template <int kVec>
__global__ void __launch_bounds__(kCopyThreads) unpermute_backward_kernel(UnpermuteBackwardArgs a) {
  __shared__ TokenSlots slots;
  __shared__ float partial[kMaxDeviceSlots][kCopyThreads / 32];
  const int64_t b = blockIdx.x;
  if (b >= a.num_tokens) {
    // The offsets and row counts come from the caller here: clamped into the capacity and the
    // group's block, so that bad ones cannot write out of bounds (bad offsets are reported when
    // they are checked against the status word, row counts outside the block here).
    const int64_t pad = b - a.num_tokens;
    const int64_t e = pad / kPaddingSplit, part = pad % kPaddingSplit;
    const GroupRows block = clamp_group_rows(a.offsets, e, a.row_capacity);
    const int64_t given = a.group_rows[e];
    const int64_t real = clamp_real_rows(given, block.end - block.begin);
    if (real != given && part == 0 && threadIdx.x == 0 && a.word != nullptr) {
      raise_fault(a.word, SFMOE_FAULT_GROUP_OVER_CAPACITY, e, given);  // as the activations do
    }
    for (int64_t row = block.begin + real + part; row < block.end; row += kPaddingSplit) {
      for (int64_t h = threadIdx.x; h < a.hidden; h += kCopyThreads) {
        store_element(a.d_rows, a.d_rows_dtype, row * a.hidden + h, 0.0f);
      }
    }
    return;
  }
  const int64_t t = b;
  stage_slots(&slots, a.row_map, a.probs, t, a.top_k, a.row_capacity, a.word);
  // Slot by slot: d_rows = weight * d_out, and the slot's d_prob partial reduced over the block.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < a.top_k; ++i) {
    const int64_t row = slots.row[i];
    float dot = 0.0f;
    if (row >= 0) {
      for (int64_t first = threadIdx.x * kVec; first < a.hidden; first += kCopyThreads * kVec) {
        float d[kVec], g[kVec];
        load_vector<kVec>(a.d_out, a.d_out_dtype, t * a.hidden + first, d);
        if (a.rows != nullptr) {
          float v[kVec];
          load_vector<kVec>(a.rows, a.rows_dtype, row * a.hidden + first, v);
#pragma unroll
          for (int j = 0; j < kVec; ++j) dot += d[j] * v[j];
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) g[j] = numerics::mul_rn(slots.weight[i], d[j]);
        store_vector<kVec>(a.d_rows, a.d_rows_dtype, row * a.hidden + first, g);
      }
    }
    if (a.d_probs == nullptr) continue;
    for (int width = 16; width >= 1; width /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, width);
    if (lane == 0) partial[i][warp] = dot;
  }
  if (a.d_probs == nullptr) return;
  __syncthreads();
  if (threadIdx.x < a.top_k) {
    float total = 0.0f;
    for (int w = 0; w < kCopyThreads / 32; ++w) total += partial[threadIdx.x][w];
    a.d_probs[t * a.top_k + threadIdx.x] = slots.row[threadIdx.x] >= 0 ? total : 0.0f;
  }
}

// (after the rows were set to -1)
__global__ void row_sources_kernel(RowSourcesArgs a) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= a.num_tokens * a.top_k) return;
  const int64_t row = a.row_map[s];
  if (row >= 0 && row < a.row_capacity) {
    a.sources[row] = static_cast<int32_t>(s / a.top_k);
  } else if (row != -1 && a.word != nullptr) {
    raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, s, row);
  }
}

__global__ void slot_values_kernel(SlotValuesArgs a) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= a.slots) return;
  const int64_t row = a.row_map[s];
  const bool kept = row >= 0 && row < a.row_capacity;
  if (!kept && row != -1 && a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_INDEX, s, row);
  if (a.to_rows) {
    if (kept) a.out[row] = a.in[s];
  } else {
    a.out[s] = kept ? a.in[row] : 0.0f;
  }
}

}  // namespace

sfmoe_status permute(const PermuteArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  if (a.permuted == nullptr && a.quantized == nullptr && a.group_amax != nullptr) {
    return report(SFMOE_ERROR_INTERNAL, "permute: the routing alone reads no row for an amax");
  }
  const int64_t chunks = permute_chunks(a.num_tokens);
  // Each expert's amax of its rows: unquantized rows only (a fused quantization has its own).
  float* const group_amax = a.quantized == nullptr ? a.group_amax : nullptr;
  const size_t bitmap_bytes = static_cast<size_t>(a.num_experts) * kChunkWords * sizeof(uint32_t);
  if (chunks > 0) {
    permute_count_kernel<<<static_cast<unsigned>(chunks), kChunkTokens, bitmap_bytes, stream>>>(
        a.topk_ids, a.num_tokens, a.top_k, a.num_experts, a.workspace);
    SFMOE_RETURN_IF_ERROR(check_launch("permute_count_kernel"));
  }
  SFMOE_CUDA_RETURN_IF_ERROR(launch_dependent(permute_scan_kernel, dim3(1), dim3(kScanThreads), 0,
                                              stream, a.workspace, chunks, a.num_experts,
                                              a.expert_capacity, a.alignment, a.tokens_per_expert,
                                              a.dropped_per_expert, a.expert_offsets, group_amax));
  SFMOE_RETURN_IF_ERROR(check_launch("permute_scan_kernel"));
  const int64_t row_bytes = a.hidden * (sfmoe_dtype_bits(a.dtype) / 8);
  // The bulk copy places its own token's slots; the vector copy, the fused quantizations and the
  // routing alone (no rows moved) read the place kernel's row map.
  const bool routing_only = a.permuted == nullptr && a.quantized == nullptr;
  const bool bulk = a.quantized == nullptr && !routing_only &&
                    permute_copy_by_bulk(a.tokens, a.permuted, row_bytes);
  if (chunks > 0 && !bulk) {
    SFMOE_CUDA_RETURN_IF_ERROR(launch_dependent(
        permute_place_kernel, dim3(static_cast<unsigned>(chunks)), dim3(kChunkTokens), bitmap_bytes,
        stream, a.topk_ids, a.num_tokens, a.top_k, a.num_experts, a.expert_capacity, a.workspace,
        a.expert_offsets, a.row_map, a.word));
    SFMOE_RETURN_IF_ERROR(check_launch("permute_place_kernel"));
  }
  if (routing_only) return SFMOE_SUCCESS;
  const int64_t blocks = a.num_tokens + (a.alignment > 1 ? a.num_experts * kPaddingSplit : 0);
  if (a.quantized != nullptr && a.quantized->scaling == SFMOE_SCALING_TENSOR) {
    // Every group's scale_inv and amax are outputs, also with no rows to move.
    SFMOE_CUDA_RETURN_IF_ERROR(
        prepare_tensor_quantization(fused_quantization_of(*a.quantized), stream));
  }
  if (blocks == 0) return SFMOE_SUCCESS;
  if (a.quantized != nullptr) {
    const GroupedQuantizeArgs& q = *a.quantized;
    const FusedQuantization fused = fused_quantization_of(q);
    if (q.scaling == SFMOE_SCALING_TENSOR) {
      permute_quantize_tensor_kernel<<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
          a.tokens, a.dtype, a.num_tokens, a.top_k, a.hidden, a.row_capacity, a.expert_offsets,
          a.tokens_per_expert, a.row_map, a.topk_ids, fused);
    } else if (q.scaling == SFMOE_SCALING_MX_1X32) {
      permute_quantize_kernel<32><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
          a.tokens, a.dtype, a.num_tokens, a.top_k, a.hidden, a.row_capacity, a.expert_offsets,
          a.tokens_per_expert, a.row_map, fused);
    } else {
      permute_quantize_kernel<128><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(
          a.tokens, a.dtype, a.num_tokens, a.top_k, a.hidden, a.row_capacity, a.expert_offsets,
          a.tokens_per_expert, a.row_map, fused);
    }
    return check_launch("permute_quantize_kernel");
  }
  if (bulk) {
    const int64_t segment = row_bytes < kBulkSegmentBytes ? row_bytes : kBulkSegmentBytes;
    const PlaceArgs place{a.topk_ids,  a.num_experts, a.expert_capacity,
                          a.workspace, a.row_map,     a.word};
    SFMOE_CUDA_RETURN_IF_ERROR(launch_dependent(
        permute_bulk_copy_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kBulkThreads),
        static_cast<size_t>(segment), stream, static_cast<const uint8_t*>(a.tokens), a.num_tokens,
        a.top_k, row_bytes, segment, a.row_capacity, a.expert_offsets, a.tokens_per_expert,
        static_cast<uint8_t*>(a.permuted), place, a.dtype, group_amax));
    return check_launch("permute_bulk_copy_kernel");
  }
  auto launch = [&](auto vec) {
    using Vec = decltype(vec);
    const int64_t vectors = row_bytes / static_cast<int64_t>(sizeof(Vec));
    return launch_dependent(permute_copy_kernel<Vec>, dim3(static_cast<unsigned>(blocks)),
                            dim3(kRowCopyThreads), 0, stream, static_cast<const Vec*>(a.tokens),
                            a.num_tokens, a.top_k, vectors, a.row_capacity, a.expert_offsets,
                            a.tokens_per_expert, a.row_map, static_cast<Vec*>(a.permuted), a.dtype,
                            a.hidden, a.topk_ids, group_amax);
  };
  const int vector_bytes = permute_vector_bytes(a.tokens, a.permuted, row_bytes);
  const cudaError_t launched = vector_bytes == 16  ? launch(uint4{})
                               : vector_bytes == 4 ? launch(uint32_t{})
                                                   : launch(uint16_t{});
  SFMOE_CUDA_RETURN_IF_ERROR(launched);
  return check_launch("permute_copy_kernel");
}

sfmoe_status unpermute(const UnpermuteArgs& a, void* stream_pointer) {
  if (a.num_tokens == 0) return SFMOE_SUCCESS;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const unsigned blocks = static_cast<unsigned>(a.num_tokens);
  if (a.hidden % 8 == 0) {
    unpermute_kernel<8><<<blocks, kCopyThreads, 0, stream>>>(a);
  } else {
    unpermute_kernel<1><<<blocks, kCopyThreads, 0, stream>>>(a);
  }
  return check_launch("unpermute_kernel");
}

sfmoe_status unpermute_backward(const UnpermuteBackwardArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  const int64_t blocks = a.num_tokens + a.num_groups * kPaddingSplit;
  if (blocks == 0) return SFMOE_SUCCESS;
  if (a.hidden % 8 == 0) {
    unpermute_backward_kernel<8><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(a);
  } else {
    unpermute_backward_kernel<1><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(a);
  }
  return check_launch("unpermute_backward_kernel");
}

sfmoe_status row_sources(const RowSourcesArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  if (a.row_capacity == 0) return SFMOE_SUCCESS;
  // -1 in every row (bytes 0xFF), then each kept slot's token in its row.
  SFMOE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      a.sources, 0xFF, static_cast<size_t>(a.row_capacity) * sizeof(int32_t), stream));
  const int64_t slots = a.num_tokens * a.top_k;
  if (slots == 0) return SFMOE_SUCCESS;
  constexpr int kThreads = 256;
  row_sources_kernel<<<static_cast<unsigned>((slots + kThreads - 1) / kThreads), kThreads, 0,
                       stream>>>(a);
  return check_launch("row_sources_kernel");
}

sfmoe_status slot_values(const SlotValuesArgs& a, void* stream_pointer) {
  if (a.slots == 0) return SFMOE_SUCCESS;
  constexpr int kThreads = 256;
  const int64_t blocks = (a.slots + kThreads - 1) / kThreads;
  slot_values_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                       static_cast<cudaStream_t>(stream_pointer)>>>(a);
  return check_launch("slot_values_kernel");
}

}  // namespace cuda
}  // namespace sfmoe
