// Grouped activations on the device (docs/activations.md): the per-element rules of
// src/common/activation_rules.h in numerics::Fp32Arithmetic, so every output has the CPU
// reference's bits. Blocks stride over the rows of the groups ([0, offsets[G]) read on the
// device, so the work follows the real rows, not the capacity); a row's group comes from a binary
// search of the offsets; real rows are computed, padding rows written as zeros.
#include <stdint.h>

#include <utility>

#include "src/common/activation_rules.h"
#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/common/rowwise_quantize.h"
#include "src/cuda/common/vector_io.h"

namespace sfmoe {
namespace cuda {
namespace {

using Rules = ActivationRules<numerics::Fp32Arithmetic>;
constexpr int kThreads = 256;

// Rows [0, end) of the groups, end = offsets[G] clamped into the capacity.
__device__ __forceinline__ int64_t rows_end(const GroupRowsView& g, int64_t row_capacity) {
  const int64_t end = g.offsets[g.num_groups];
  return end < 0 ? 0 : (end > row_capacity ? row_capacity : end);
}

// The offsets as the block reads them: staged in shared memory when they fit.
constexpr int kMaxStagedOffsets = 2048;
__device__ __forceinline__ const int64_t* stage_offsets(const GroupRowsView& g,
                                                        int64_t (&staged)[kMaxStagedOffsets]) {
  if (g.num_groups + 1 > kMaxStagedOffsets) return g.offsets;
  for (int64_t i = threadIdx.x; i <= g.num_groups; i += blockDim.x) staged[i] = g.offsets[i];
  __syncthreads();
  return staged;
}

// Whether `row` is one of its group's real rows: the group is the last g with offsets[g] <= row
// (empty groups share their start with the next one). A row count beyond its block is clamped
// and reported.
__device__ __forceinline__ bool is_real_row(const GroupRowsView& g, const int64_t* offsets,
                                            int64_t row, sfmoe_fault_report* word,
                                            int64_t* group = nullptr) {
  const int64_t lo = group_of_offset_row(offsets, g.num_groups, row);
  if (group != nullptr) *group = lo;
  const int64_t begin = offsets[lo], block = offsets[lo + 1] - begin;
  int64_t real = g.rows[lo];
  if (real < 0 || real > block) {
    if (word != nullptr && threadIdx.x == 0 && row == begin) {
      raise_fault(word, SFMOE_FAULT_GROUP_OVER_CAPACITY, lo, real);
    }
    real = real < 0 ? 0 : block;
  }
  return row - begin < real;
}

// Kernels are compiled per kind (the rules' switch folds away) and per output form: kQuantBlock
// 0 writes values, 32 (MX_1X32) or 128 (BLOCK_1X128) quantizes them on the fly
// (src/cuda/common/rowwise_quantize.h). With a.amax, each group's amax of the FP32 activations is
// gathered per block in shared memory (the bit patterns' max: order-free) and added to the output
// by one atomic max per group and block.
template <int kVec, ActivationKind kKind, int kQuantBlock>
__global__ void __launch_bounds__(kThreads)
    activation_forward_kernel(ActivationArgs a, int64_t row_capacity, sfmoe_fault_report* word,
                              FusedQuantization q) {
  a.config.kind = kKind;
  __shared__ int64_t staged[kMaxStagedOffsets];
  __shared__ uint32_t block_amax[kMaxStagedOffsets];
  const int64_t* offsets = stage_offsets(a.groups, staged);
  const bool staged_amax = a.amax != nullptr && a.groups.num_groups < kMaxStagedOffsets;
  if (staged_amax) {
    for (int64_t g = threadIdx.x; g < a.groups.num_groups; g += kThreads) block_amax[g] = 0u;
    __syncthreads();
  }
  const int64_t end = rows_end(a.groups, row_capacity);
  constexpr bool gated = activation_is_gated(kKind);
  const int64_t in_cols = gated ? 2 * a.cols : a.cols;
  const int64_t chunks = (a.cols + kVec - 1) / kVec;
  for (int64_t row = blockIdx.x; row < end; row += gridDim.x) {
    int64_t group = 0;
    const bool real = is_real_row(a.groups, offsets, row, word, &group);
    uint32_t row_amax = 0u;
    // The same trip count in every lane: a quantization block's amax is a shuffle.
    for (int64_t first = 0; first < chunks; first += kThreads) {
      const int64_t c = first + threadIdx.x, j = c * kVec;
      const bool active = c < chunks;
      float out[kVec];
      if (real && active) {
        float gate[kVec], up[kVec];
        load_vector<kVec>(a.input, a.input_dtype, row * in_cols + j, gate);
        if constexpr (gated) {
          load_vector<kVec>(a.input, a.input_dtype, row * in_cols + a.cols + j, up);
        } else {
#pragma unroll
          for (int i = 0; i < kVec; ++i) up[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          out[i] = Rules::forward(a.config, gate[i], up[i]);
          const uint32_t bits = numerics::amax_bits(out[i]);
          row_amax = bits > row_amax ? bits : row_amax;
        }
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) out[i] = 0.0f;
      }
      if constexpr (kQuantBlock == 0) {
        if (active) store_vector<kVec>(a.output, a.output_dtype, row * a.cols + j, out);
      } else {
        BlockScales<kQuantBlock> s;
        const uint2 codes = quantize_eight<kQuantBlock>(out, q, &s);
        if (active) {
          reinterpret_cast<uint2*>(q.codes + row * a.cols)[c] = codes;
          if (c % (kQuantBlock / 8) == 0)
            s.store(q, row, c / (kQuantBlock / 8), a.cols / kQuantBlock);
        }
      }
    }
    if constexpr (kQuantBlock != 0) {
      if (q.swizzled && threadIdx.x == 0) zero_swizzle_padding(q, row, a.cols / kQuantBlock);
    }
    if (a.amax != nullptr && real) {
      for (int width = 16; width >= 1; width /= 2) {
        const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, row_amax, width);
        row_amax = other > row_amax ? other : row_amax;
      }
      if (threadIdx.x % 32 == 0 && row_amax != 0u) {
        if (staged_amax) {
          atomicMax(&block_amax[group], row_amax);
        } else {
          atomicMax(reinterpret_cast<uint32_t*>(a.amax) + group, row_amax);
        }
      }
    }
  }
  if (staged_amax) {
    __syncthreads();
    for (int64_t g = threadIdx.x; g < a.groups.num_groups; g += kThreads) {
      if (block_amax[g] != 0u) atomicMax(reinterpret_cast<uint32_t*>(a.amax) + g, block_amax[g]);
    }
  }
}

template <int kVec, ActivationKind kKind>
__global__ void __launch_bounds__(kThreads)
    activation_backward_kernel(ActivationBackwardArgs a, int64_t row_capacity,
                               sfmoe_fault_report* word) {
  a.config.kind = kKind;
  __shared__ int64_t staged[kMaxStagedOffsets];
  const int64_t* offsets = stage_offsets(a.groups, staged);
  const int64_t end = rows_end(a.groups, row_capacity);
  constexpr bool gated = activation_is_gated(kKind);
  const int64_t in_cols = gated ? 2 * a.cols : a.cols;
  for (int64_t row = blockIdx.x; row < end; row += gridDim.x) {
    const bool real = is_real_row(a.groups, offsets, row, word);
    for (int64_t j = threadIdx.x * kVec; j < a.cols; j += kThreads * kVec) {
      float dg[kVec], du[kVec];
      if (real) {
        float gate[kVec], up[kVec], d[kVec];
        load_vector<kVec>(a.input, a.input_dtype, row * in_cols + j, gate);
        if constexpr (gated) {
          load_vector<kVec>(a.input, a.input_dtype, row * in_cols + a.cols + j, up);
        } else {
#pragma unroll
          for (int i = 0; i < kVec; ++i) up[i] = 0.0f;
        }
        load_vector<kVec>(a.d_output, a.d_output_dtype, row * a.cols + j, d);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          Rules::backward(a.config, gate[i], up[i], d[i], &dg[i], &du[i]);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) dg[i] = du[i] = 0.0f;
      }
      store_vector<kVec>(a.d_input, a.d_input_dtype, row * in_cols + j, dg);
      if constexpr (gated)
        store_vector<kVec>(a.d_input, a.d_input_dtype, row * in_cols + a.cols + j, du);
    }
  }
}

// Blocks: one per row up to a few waves of the device; they stride over the real rows.
unsigned activation_grid(int64_t row_capacity) {
  const int64_t most = static_cast<int64_t>(multiprocessor_count()) * 16;
  const int64_t blocks = row_capacity < most ? row_capacity : most;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <template <int, ActivationKind> class Launch, class... Args>
sfmoe_status by_kind(ActivationKind kind, int64_t cols, Args&&... args) {
  switch (kind) {
#define SFMOE_ACTIVATION_CASE(K)                                          \
  case K:                                                                 \
    return cols % 8 == 0 ? Launch<8, K>::run(std::forward<Args>(args)...) \
                         : Launch<1, K>::run(std::forward<Args>(args)...);
    SFMOE_ACTIVATION_CASE(ActivationKind::kSwiGLU)
    SFMOE_ACTIVATION_CASE(ActivationKind::kGeGLU)
    SFMOE_ACTIVATION_CASE(ActivationKind::kSiLU)
    SFMOE_ACTIVATION_CASE(ActivationKind::kGeLU)
    SFMOE_ACTIVATION_CASE(ActivationKind::kSquaredReLU)
    SFMOE_ACTIVATION_CASE(ActivationKind::kClampedSwiGLU)
#undef SFMOE_ACTIVATION_CASE
  }
  return SFMOE_ERROR_INTERNAL;
}

template <int kVec, ActivationKind kKind>
struct LaunchForward {
  static sfmoe_status run(const ActivationArgs& a, int64_t row_capacity, sfmoe_fault_report* word,
                          cudaStream_t stream) {
    const unsigned grid = activation_grid(row_capacity);
    if (a.amax != nullptr) {
      SFMOE_CUDA_RETURN_IF_ERROR(
          "sfmoe_grouped_activation",
          cudaMemsetAsync(a.amax, 0, sizeof(float) * a.groups.num_groups, stream));
    }
    if (a.quantized == nullptr) {
      activation_forward_kernel<kVec, kKind, 0>
          <<<grid, kThreads, 0, stream>>>(a, row_capacity, word, FusedQuantization{});
    } else if constexpr (kVec == 8) {  // a quantized output has a multiple of 32 columns
      const FusedQuantization q = fused_quantization_of(*a.quantized);
      if (a.quantized->scaling == SFMOE_SCALING_MX_1X32) {
        activation_forward_kernel<8, kKind, 32>
            <<<grid, kThreads, 0, stream>>>(a, row_capacity, word, q);
      } else {
        activation_forward_kernel<8, kKind, 128>
            <<<grid, kThreads, 0, stream>>>(a, row_capacity, word, q);
      }
    } else {
      return SFMOE_ERROR_INTERNAL;
    }
    return check_launch("sfmoe_grouped_activation", "activation_forward_kernel");
  }
};

template <int kVec, ActivationKind kKind>
struct LaunchBackward {
  static sfmoe_status run(const ActivationBackwardArgs& a, int64_t row_capacity,
                          sfmoe_fault_report* word, cudaStream_t stream) {
    activation_backward_kernel<kVec, kKind>
        <<<activation_grid(row_capacity), kThreads, 0, stream>>>(a, row_capacity, word);
    return check_launch("sfmoe_grouped_activation_backward", "activation_backward_kernel");
  }
};

}  // namespace

sfmoe_status activation_forward(const ActivationArgs& a, int64_t row_capacity,
                                sfmoe_fault_report* word, void* stream) {
  return by_kind<LaunchForward>(a.config.kind, a.cols, a, row_capacity, word,
                                static_cast<cudaStream_t>(stream));
}

sfmoe_status activation_backward(const ActivationBackwardArgs& a, int64_t row_capacity,
                                 sfmoe_fault_report* word, void* stream) {
  return by_kind<LaunchBackward>(a.config.kind, a.cols, a, row_capacity, word,
                                 static_cast<cudaStream_t>(stream));
}

}  // namespace cuda
}  // namespace sfmoe
