// Grouped activations on the device (docs/activations.md): the per-element rules of
// src/common/activation_rules.h in numerics::Fp32Arithmetic, so every output has the CPU
// reference's bits. Warps stride over the rows of the groups ([0, offsets[G]) read on the device,
// so the work follows the real rows, not the capacity), one row per warp at a time: a row's group
// comes from a binary search of the offsets, once per row and lane; real rows are computed,
// padding rows written as zeros. Each warp loads a step ahead of its computation (the next step's
// input is in flight in registers while the current one computes).
#include <stdint.h>

#include <utility>

#include "src/common/activation_rules.h"
#include "src/common/fault.h"
#include "src/common/group_offsets.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/common/vector_io.h"
#include "src/cuda/quantize/fused_rowwise.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using Rules = ActivationRules<numerics::Fp32Arithmetic>;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
// Offsets (and per-group amax slots) staged in shared memory up to this many groups.
constexpr int64_t kMaxStagedGroups = 2047;

// This warp's first row and the rows' stride.
__device__ __forceinline__ int64_t first_warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
}
__device__ __forceinline__ int64_t warp_row_stride() {
  return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
}

// Rows [0, end) of the groups, end = offsets[G] clamped into the capacity.
__device__ __forceinline__ int64_t rows_end(const GroupRowsView& g, int64_t row_capacity) {
  const int64_t end = g.offsets[g.num_groups];
  return end < 0 ? 0 : (end > row_capacity ? row_capacity : end);
}

// Whether `row` is one of its group's real rows: the group is the last g with offsets[g] <= row
// (empty groups share their start with the next one). A row count beyond its block is clamped
// and reported (when `word` is given).
__device__ __forceinline__ bool is_real_row(const GroupRowsView& g, const int64_t* offsets,
                                            int64_t row, sfmoe_fault_report* word, int64_t* group) {
  const int64_t lo = group_of_offset_row(offsets, g.num_groups, row);
  *group = lo;
  const int64_t begin = offsets[lo], block = offsets[lo + 1] - begin;
  const int64_t given = g.rows[lo];
  const int64_t real = clamp_real_rows(given, block);
  if (real != given && word != nullptr && threadIdx.x % 32 == 0 && row == begin) {
    raise_fault(word, SFMOE_FAULT_GROUP_OVER_CAPACITY, lo, given);
  }
  return row - begin < real;
}

// The offsets as the block reads them: staged in shared memory when they fit.
__device__ __forceinline__ const int64_t* stage_offsets(const GroupRowsView& g,
                                                        int64_t (&staged)[kMaxStagedGroups + 1]) {
  if (g.num_groups > kMaxStagedGroups) return g.offsets;
  for (int64_t i = threadIdx.x; i <= g.num_groups; i += blockDim.x) staged[i] = g.offsets[i];
  __syncthreads();
  return staged;
}

// A warp's walk over the chunks of its rows: a step is 32 lanes x kVec columns of one row, chunk
// `first + lane`; a row's group is found at the step that enters the row.
struct WarpStep {
  int64_t row, first;
  int64_t group;
  bool real;
};

__device__ __forceinline__ WarpStep first_step(const GroupRowsView& g, const int64_t* offsets,
                                               int64_t end, sfmoe_fault_report* word) {
  WarpStep s{first_warp_row(), 0, 0, false};
  if (s.row < end) s.real = is_real_row(g, offsets, s.row, word, &s.group);
  return s;
}

__device__ __forceinline__ WarpStep next_step(WarpStep s, int64_t chunks, const GroupRowsView& g,
                                              const int64_t* offsets, int64_t end,
                                              sfmoe_fault_report* word) {
  s.first += 32;
  if (s.first >= chunks) {
    s.first = 0;
    s.row += warp_row_stride();
    if (s.row < end) s.real = is_real_row(g, offsets, s.row, word, &s.group);
  }
  return s;
}

// The step's input vectors, loaded where the lane has a chunk of a real row.
template <int kVec>
struct StepInput {
  RawVector<kVec> gate, up, d;
};

template <int kVec, bool kGated, bool kBackward>
__device__ __forceinline__ StepInput<kVec> load_step(const WarpStep& s, int64_t chunks, int64_t end,
                                                     const void* input, sfmoe_dtype input_dtype,
                                                     const void* d_output, sfmoe_dtype d_dtype,
                                                     int64_t cols) {
  StepInput<kVec> in;
  const int64_t c = s.first + threadIdx.x % 32;
  if (s.row < end && s.real && c < chunks) {
    const int64_t in_cols = kGated ? 2 * cols : cols, j = c * kVec;
    in.gate = load_raw_vector<kVec>(input, input_dtype, s.row * in_cols + j);
    if constexpr (kGated)
      in.up = load_raw_vector<kVec>(input, input_dtype, s.row * in_cols + cols + j);
    if constexpr (kBackward) in.d = load_raw_vector<kVec>(d_output, d_dtype, s.row * cols + j);
  }
  return in;
}

// The step's gate and up values as FP32 (up is 0 for the non-gated kinds).
template <int kVec, bool kGated>
__device__ __forceinline__ void decode_gate_up(const StepInput<kVec>& in, sfmoe_dtype dtype,
                                               float (&gate)[kVec], float (&up)[kVec]) {
  decode_raw_vector<kVec>(in.gate, dtype, gate);
  if constexpr (kGated) {
    decode_raw_vector<kVec>(in.up, dtype, up);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) up[i] = 0.0f;
  }
}

// Kernels are compiled per kind (the rules' switch folds away) and per output form: kQuantBlock
// 0 writes values, kAmaxOnly writes nothing (the group amax before an NVFP4 output), 1 (TENSOR
// with given scales: the row's group scale), 16 (NVFP4 1x16, from the group amax in q.amax), 32
// (MX_1X32) or 128 (BLOCK_1X128) quantizes them on the fly
// (src/cuda/quantize/fused_rowwise.cuh; a quantization block spans 2, 4 or 16 lanes of the row's
// warp).
// With a.amax, each group's amax of the FP32 activations is gathered per block in shared memory
// (the bit patterns' max: order-free) and added to the output by one atomic max per group and
// block.
// Four blocks per multiprocessor (64 registers) where the output is written as values: the warps'
// steps in flight must cover the memory latency (the quantizing forms would spill at 64).
constexpr int kAmaxOnly = -1;
template <int kVec, ActivationKind kKind, int kQuantBlock>
__global__ void __launch_bounds__(kThreads, kQuantBlock <= kTensorQuantBlock ? 4 : 1)
    activation_forward_kernel(ActivationArgs a, int64_t row_capacity, sfmoe_fault_report* word,
                              FusedQuantization q) {
  a.config.kind = kKind;
  constexpr bool gated = activation_is_gated(kKind);
  __shared__ int64_t staged[kMaxStagedGroups + 1];
  __shared__ uint32_t block_amax[kMaxStagedGroups];
  const bool staged_amax = a.amax != nullptr && a.groups.num_groups <= kMaxStagedGroups;
  if (staged_amax) {
    for (int64_t g = threadIdx.x; g < a.groups.num_groups; g += kThreads) block_amax[g] = 0u;
  }
  const int64_t* offsets = stage_offsets(a.groups, staged);
  __syncthreads();
  const int64_t end = rows_end(a.groups, row_capacity);
  const int64_t chunks = (a.cols + kVec - 1) / kVec;
  const bool want_amax = a.amax != nullptr;
  const int lane = threadIdx.x % 32;
  WarpStep next = first_step(a.groups, offsets, end, word);
  StepInput<kVec> next_in = load_step<kVec, gated, false>(next, chunks, end, a.input, a.input_dtype,
                                                          nullptr, a.input_dtype, a.cols);
  uint32_t row_amax = 0u;
  int64_t scaled_group = -1;  // NVFP4: the group whose global scale `group_scale` holds
  Nvfp4GroupScale group_scale{1.0f, 1.0f};
  while (next.row < end) {
    const WarpStep step = next;
    const StepInput<kVec> in = next_in;
    next = next_step(next, chunks, a.groups, offsets, end, word);
    next_in = load_step<kVec, gated, false>(next, chunks, end, a.input, a.input_dtype, nullptr,
                                            a.input_dtype, a.cols);
    // Every lane takes part in every step: a quantization block's amax is a shuffle.
    const int64_t row = step.row, c = step.first + lane, j = c * kVec;
    const bool active = c < chunks;
    float out[kVec];
    if (step.real && active) {
      float gate[kVec], up[kVec];
      decode_gate_up<kVec, gated>(in, a.input_dtype, gate, up);
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = Rules::forward(a.config, gate[i], up[i]);
      if (want_amax) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const uint32_t bits = numerics::amax_bits(out[i]);
          row_amax = bits > row_amax ? bits : row_amax;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = 0.0f;
    }
    if constexpr (kQuantBlock == 0) {
      if (active) store_vector<kVec>(a.output, a.output_dtype, row * a.cols + j, out);
    } else if constexpr (kQuantBlock == kAmaxOnly) {
      // the amax below is the only output
    } else if constexpr (kQuantBlock == kNvfp4QuantBlock) {
      if (step.group != scaled_group) {  // the same for the warp's lanes
        group_scale = Nvfp4GroupScale::of(q.amax[step.group]);
        scaled_group = step.group;
      }
      uint8_t scale_code;
      const uint32_t codes = quantize_eight_nvfp4(out, group_scale, &scale_code);
      if (active) {
        reinterpret_cast<uint32_t*>(q.codes + row * (a.cols / 2))[c] = codes;
        if (c % 2 == 0) {
          static_cast<uint8_t*>(
              q.scales)[byte_scale_offset(q, row, c / 2, a.cols / kNvfp4QuantBlock)] = scale_code;
        }
      }
    } else if constexpr (kQuantBlock == kTensorQuantBlock) {  // the group's given scale
      if (active) {
        reinterpret_cast<uint2*>(q.codes + row * a.cols)[c] =
            encode_eight(out, q.tensor_scales[step.group], q.e5m2);
      }
    } else {
      BlockScales<kQuantBlock> s;
      const uint2 codes = quantize_eight<kQuantBlock>(out, q, &s);
      if (active) {
        reinterpret_cast<uint2*>(q.codes + row * a.cols)[c] = codes;
        if (c % (kQuantBlock / 8) == 0)
          s.store(q, row, c / (kQuantBlock / 8), a.cols / kQuantBlock);
      }
    }
    if (step.first + 32 < chunks) continue;
    // The row's last step.
    if constexpr (kQuantBlock > kTensorQuantBlock) {
      if (q.swizzled && lane == 0) zero_swizzle_padding(q, row, a.cols / kQuantBlock);
    }
    if (want_amax && step.real) {
      for (int width = 16; width >= 1; width /= 2) {
        const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, row_amax, width);
        row_amax = other > row_amax ? other : row_amax;
      }
      if (lane == 0 && row_amax != 0u) {
        if (staged_amax) {
          atomicMax(&block_amax[step.group], row_amax);
        } else {
          atomicMax(reinterpret_cast<uint32_t*>(a.amax) + step.group, row_amax);
        }
      }
      row_amax = 0u;
    }
  }
  if (staged_amax) {
    __syncthreads();
    for (int64_t g = threadIdx.x; g < a.groups.num_groups; g += kThreads) {
      if (block_amax[g] != 0u) atomicMax(reinterpret_cast<uint32_t*>(a.amax) + g, block_amax[g]);
    }
  }
}

// kWeighted: the rows' weights (ActivationBackwardArgs::row_weights) scale the upstream gradient,
// and the weighted activations and each row's d weight (a warp sum at the row's last step) are
// written too. Each lane reads its chunk before writing it, so the in-place forms are safe.
template <int kVec, ActivationKind kKind, bool kWeighted>
__global__ void __launch_bounds__(kThreads)  // (at 64 registers, SwiGLU's would spill)
    activation_backward_kernel(ActivationBackwardArgs a, int64_t row_capacity,
                               sfmoe_fault_report* word) {
  a.config.kind = kKind;
  constexpr bool gated = activation_is_gated(kKind);
  __shared__ int64_t staged[kMaxStagedGroups + 1];
  const int64_t* offsets = stage_offsets(a.groups, staged);
  const int64_t end = rows_end(a.groups, row_capacity);
  const int64_t in_cols = gated ? 2 * a.cols : a.cols;
  const int64_t chunks = (a.cols + kVec - 1) / kVec;
  const int lane = threadIdx.x % 32;
  WarpStep next = first_step(a.groups, offsets, end, word);
  StepInput<kVec> next_in = load_step<kVec, gated, true>(next, chunks, end, a.input, a.input_dtype,
                                                         a.d_output, a.d_output_dtype, a.cols);
  float d_weight = 0.0f;  // this lane's part of the row's d weight
  while (next.row < end) {
    const WarpStep step = next;
    const StepInput<kVec> in = next_in;
    next = next_step(next, chunks, a.groups, offsets, end, word);
    next_in = load_step<kVec, gated, true>(next, chunks, end, a.input, a.input_dtype, a.d_output,
                                           a.d_output_dtype, a.cols);
    const int64_t c = step.first + lane, j = c * kVec;
    const bool active = c < chunks;
    if constexpr (!kWeighted) {
      if (!active) continue;
    }
    float dg[kVec], du[kVec], weighted[kVec];
    if (step.real && active) {
      float gate[kVec], up[kVec], d[kVec];
      decode_gate_up<kVec, gated>(in, a.input_dtype, gate, up);
      decode_raw_vector<kVec>(in.d, a.d_output_dtype, d);
      if constexpr (kWeighted) {
        const float w = a.row_weights[step.row];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          const float y = Rules::forward(a.config, gate[i], up[i]);
          d_weight = numerics::add_rn(d_weight, numerics::mul_rn(d[i], y));
          weighted[i] = numerics::mul_rn(w, y);
          d[i] = numerics::mul_rn(w, d[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        Rules::backward(a.config, gate[i], up[i], d[i], &dg[i], &du[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) dg[i] = du[i] = weighted[i] = 0.0f;
    }
    if (active) {
      store_vector<kVec>(a.d_input, a.d_input_dtype, step.row * in_cols + j, dg);
      if constexpr (gated)
        store_vector<kVec>(a.d_input, a.d_input_dtype, step.row * in_cols + a.cols + j, du);
      if constexpr (kWeighted)
        store_vector<kVec>(a.weighted_output, a.d_output_dtype, step.row * a.cols + j, weighted);
    }
    if constexpr (kWeighted) {
      if (step.first + 32 < chunks) continue;
      // The row's last step: its d weight (0 for a padding row).
      for (int width = 16; width >= 1; width /= 2)
        d_weight += __shfl_xor_sync(0xFFFFFFFFu, d_weight, width);
      if (lane == 0) a.d_row_weights[step.row] = d_weight;
      d_weight = 0.0f;
    }
  }
}

// Blocks: a warp per row up to one wave of resident blocks; the warps stride over the real rows
// (a second, partial wave would leave most multiprocessors idle at the end).
unsigned activation_grid(const void* kernel, int64_t row_capacity) {
  const int64_t most = resident_wave(kernel, kThreads, 0);
  const int64_t wanted = (row_capacity + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t blocks = wanted < most ? wanted : most;
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
  using Kernel = void (*)(ActivationArgs, int64_t, sfmoe_fault_report*, FusedQuantization);
  static sfmoe_status launch(Kernel kernel, const ActivationArgs& a, int64_t row_capacity,
                             sfmoe_fault_report* word, const FusedQuantization& q,
                             cudaStream_t stream) {
    kernel<<<activation_grid(reinterpret_cast<const void*>(kernel), row_capacity), kThreads, 0,
             stream>>>(a, row_capacity, word, q);
    return check_launch("activation_forward_kernel");
  }

  static sfmoe_status run(const ActivationArgs& a, int64_t row_capacity, sfmoe_fault_report* word,
                          cudaStream_t stream) {
    if (a.amax != nullptr) {
      SFMOE_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(a.amax, 0, sizeof(float) * a.groups.num_groups, stream));
    }
    if (a.quantized == nullptr) {
      return launch(activation_forward_kernel<kVec, kKind, 0>, a, row_capacity, word,
                    FusedQuantization{}, stream);
    }
    if constexpr (kVec == 8) {  // a quantized output has a multiple of 8 (TENSOR) or 32 columns
      const FusedQuantization q = fused_quantization_of(*a.quantized);
      if (a.quantized->scaling == SFMOE_SCALING_TENSOR) {
        // The quantized output's group amax is the activations' amax (the API passes the
        // output's amax as both).
        SFMOE_CUDA_RETURN_IF_ERROR(prepare_tensor_quantization(q, stream));
        ActivationArgs with_amax = a;
        with_amax.amax = q.amax;
        return launch(activation_forward_kernel<8, kKind, kTensorQuantBlock>, with_amax,
                      row_capacity, word, q, stream);
      }
      if (a.quantized->scaling == SFMOE_SCALING_NV_1X16) {
        // Two passes: the group amax of the activations (into the output's amax, which the API
        // passes as both a.amax, cleared above, and q.amax), then the activations again, encoded
        // under each group's global scale. The input is read twice; the FP32 activations are
        // never written.
        ActivationArgs amax_pass = a;
        amax_pass.amax = q.amax;
        SFMOE_RETURN_IF_ERROR(launch(activation_forward_kernel<8, kKind, kAmaxOnly>, amax_pass,
                                     row_capacity, word, q, stream));
        ActivationArgs encode_pass = a;
        encode_pass.amax = nullptr;
        return launch(activation_forward_kernel<8, kKind, kNvfp4QuantBlock>, encode_pass,
                      row_capacity, word, q, stream);
      }
      if (a.quantized->scaling == SFMOE_SCALING_MX_1X32) {
        return launch(activation_forward_kernel<8, kKind, 32>, a, row_capacity, word, q, stream);
      }
      return launch(activation_forward_kernel<8, kKind, 128>, a, row_capacity, word, q, stream);
    }
    return SFMOE_ERROR_INTERNAL;
  }
};

template <int kVec, ActivationKind kKind>
struct LaunchBackward {
  static sfmoe_status run(const ActivationBackwardArgs& a, int64_t row_capacity,
                          sfmoe_fault_report* word, cudaStream_t stream) {
    const auto kernel = a.row_weights != nullptr ? activation_backward_kernel<kVec, kKind, true>
                                                 : activation_backward_kernel<kVec, kKind, false>;
    kernel<<<activation_grid(reinterpret_cast<const void*>(kernel), row_capacity), kThreads, 0,
             stream>>>(a, row_capacity, word);
    return check_launch("activation_backward_kernel");
  }
};

}  // namespace

sfmoe_status activation_forward(const ActivationArgs& a, void* stream) {
  return by_kind<LaunchForward>(a.config.kind, a.cols, a, a.row_capacity, a.word,
                                static_cast<cudaStream_t>(stream));
}

sfmoe_status activation_backward(const ActivationBackwardArgs& a, void* stream) {
  return by_kind<LaunchBackward>(a.config.kind, a.cols, a, a.row_capacity, a.word,
                                 static_cast<cudaStream_t>(stream));
}

}  // namespace cuda
}  // namespace sfmoe
