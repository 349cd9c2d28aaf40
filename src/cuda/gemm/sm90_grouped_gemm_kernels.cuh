// The grouped GEMM's shared machinery on Hopper (docs/grouped_gemm.md), included by the
// translation units that instantiate kernels (sm90_grouped_gemm.cu: BF16;
// sm90_grouped_gemm_fp8_tensor.cu: FP8 per-tensor; sm90_grouped_gemm_fp8_blockwise.cu: FP8
// blockwise), so each compiles in parallel with the others.
//
// CUTLASS's persistent ptr-array kernels (TMA loads, warp-specialized cooperative GMMA) run over
// problem shapes that exist only on the device. A setup kernel turns the group offsets into each
// group's shape, operand pointers, strides and scales in the caller's workspace; the GEMM
// kernel's tile scheduler reads them there, so the host never learns a group's size and the work
// follows the real rows (a group of 0 rows has no tiles).
//
// The three forms map onto one GEMM D[M, N] = A[M, K] . B[K, N] each. BF16 operands are read as
// the rows lie (16-bit GMMA takes M/N-major operands too):
//   fprop  Y_g = X_g W_g^T:    M = rows, N = n, K = k; A = X (K-major), B = W (K-major)
//   dgrad  dX_g = dY_g W_g:    M = rows, N = k, K = n; A = dY (K-major), B = W (N-major)
//   wgrad  dW_g = dY_g^T X_g:  M = n, N = k, K = rows; A = dY (M-major), B = X (N-major)
// FP8 GMMA reads K-major operands only, which is what each form's copy provides: fprop X and W
// rowwise; dgrad dY rowwise and W columnwise ([k, G n]: W_g^T at column g n); wgrad dY and X
// columnwise ([n or k, rows]: group g at column offsets[g]). Per-tensor scales become
// alpha_g = scale_inv_a[g] scale_inv_b[g] in the epilogue; blockwise scales are applied by the
// mainloop to each 128-deep K block.
// A wgrad group with no rows has no K: it is given no tiles, and its dW is zeroed by a separate
// kernel unless the call accumulates.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include <cute/tensor.hpp>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>
#include <type_traits>

#include "src/common/error.h"
#include "src/common/fault.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/heuristics/launch_overrides.h"

namespace sfmoe {
namespace cuda {
namespace grouped_gemm_detail {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = ProblemShape::UnderlyingProblemShape;
using Bf16 = cutlass::bfloat16_t;

using E4M3 = cutlass::float_e4m3_t;
using E5M2 = cutlass::float_e5m2_t;

// The tile configurations (heuristics/gemm_tiles.h): tile M x N (K: 128 bytes of the operands), the
// cluster (M x N), and the cooperative or ping-pong kernel / epilogue schedules.
template <int kM, int kN, int kClusterM, bool kPingpong, bool kFp8, int kClusterN = 1>
struct TileConfigOf {
  using Tile = Shape<Int<kM>, Int<kN>, std::conditional_t<kFp8, _128, _64>>;
  using Cluster = Shape<Int<kClusterM>, Int<kClusterN>, _1>;
  using Schedule =
      std::conditional_t<kPingpong, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>;
  using EpilogueSchedule =
      std::conditional_t<kPingpong, cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong,
                         cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>;
};
template <GemmTile kTile, bool kFp8>
struct TileConfig;
template <bool kFp8>
struct TileConfig<GemmTile::kCooperative128x128, kFp8> : TileConfigOf<128, 128, 1, false, kFp8> {};
template <bool kFp8>
struct TileConfig<GemmTile::kCooperative128x256, kFp8> : TileConfigOf<128, 256, 2, false, kFp8> {};
template <bool kFp8>
struct TileConfig<GemmTile::kPingpong64x128, kFp8> : TileConfigOf<64, 128, 1, true, kFp8> {};
template <bool kFp8>
struct TileConfig<GemmTile::kCooperative256x128, kFp8> : TileConfigOf<256, 128, 2, false, kFp8, 2> {
};
template <bool kFp8>
struct TileConfig<GemmTile::kPingpong128x128, kFp8> : TileConfigOf<128, 128, 2, true, kFp8> {};

// The per-group scale layouts of a blockwise-scaled kernel (CUTLASS's Sm90BlockwiseScaleConfig);
// placeholders for the others.
template <class Scales, class = void>
struct ScaleLayouts {
  using A = char;
  using B = char;
};
template <class Scales>
struct ScaleLayouts<Scales, std::enable_if_t<!std::is_void_v<Scales>>> {
  using A = decltype(Scales::deduce_layoutSFA());
  using B = decltype(Scales::deduce_layoutSFB());
};

// The mainloop schedule of a recipe on a tile's schedule: FP8 blockwise scaling, or FP8 "fast
// accumulation" (the tensor cores' own accumulation over all of K, no periodic promotion into a
// second FP32 accumulator), or the tile's own.
template <class TileSchedule, bool kBlockwise, bool kFastAccumulation>
struct MainloopScheduleOf {
  using type = TileSchedule;
};
template <bool kFast>
struct MainloopScheduleOf<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, true, kFast> {
  using type = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
};
template <>
struct MainloopScheduleOf<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative, false, true> {
  using type = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum;
};
template <>
struct MainloopScheduleOf<cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong, false, true> {
  using type = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum;
};

// One CUTLASS grouped GEMM: A and B elements in the given layouts, ElementOut results, a tile
// configuration, for FP8 blockwise operands the scale configuration (void: BF16, or FP8 with
// one scale per group applied in the epilogue), and for per-tensor FP8 the accumulation.
template <class ElementA, class ElementB, class LayoutA, class LayoutB, class ElementOut,
          GemmTile kTile, class Scales = void, bool kFastAccumulation = false>
struct GroupedKernel {
  using A = ElementA;
  using B = ElementB;
  using Out = ElementOut;
  static constexpr bool kFp8 = sizeof(ElementA) == 1;
  static constexpr bool kBlockwise = !std::is_void_v<Scales>;
  using ScaleConfig = Scales;
  using LayoutSFA = typename ScaleLayouts<Scales>::A;
  using LayoutSFB = typename ScaleLayouts<Scales>::B;
  using Config = TileConfig<kTile, kFp8>;
  using TileShape = typename Config::Tile;
  using ClusterShape = typename Config::Cluster;
  static constexpr int kAlignmentA = 16 / static_cast<int>(sizeof(ElementA));
  static constexpr int kAlignmentB = 16 / static_cast<int>(sizeof(ElementB));
  static constexpr int kOutAlignment = 16 / static_cast<int>(sizeof(ElementOut));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut,
      cutlass::layout::RowMajor*, kOutAlignment, ElementOut, cutlass::layout::RowMajor*,
      kOutAlignment, typename Config::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float>>::CollectiveOp;
  // Blockwise: the scales travel with the operands' strides, and the mainloop applies them to
  // each K block's partial sums (promotion to FP32 every 128 of K).
  using StridePairA = std::conditional_t<kBlockwise, cute::tuple<LayoutA*, LayoutSFA*>, LayoutA*>;
  using StridePairB = std::conditional_t<kBlockwise, cute::tuple<LayoutB*, LayoutSFB*>, LayoutB*>;
  using MainloopSchedule =
      typename MainloopScheduleOf<typename Config::Schedule, kBlockwise, kFastAccumulation>::type;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, StridePairA, kAlignmentA,
      ElementB, StridePairB, kAlignmentB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;

  // The per-group arrays, carved out of the workspace.
  struct Arrays {
    Shape3* shapes;
    const ElementA** a;
    const ElementB** b;
    const ElementOut** c;
    ElementOut** d;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideC* stride_c;
    StrideD* stride_d;
    float* alpha;
    const float** alpha_pointers;
    const float** scales_a;  // blockwise: each group's first scale of A and of B
    const float** scales_b;
    LayoutSFA* layout_sfa;  // blockwise: each group's scale layouts
    LayoutSFB* layout_sfb;
    void* cutlass_workspace;
  };
};

// Bytes up to the next multiple of 128 (TMA descriptors and the arrays stay aligned).
inline constexpr int64_t round_up_128(int64_t bytes) { return (bytes + 127) / 128 * 128; }

template <class K>
int64_t arrays_bytes(int64_t groups) {
  const int64_t per_group = static_cast<int64_t>(
      sizeof(Shape3) + 7 * sizeof(void*) + 4 + sizeof(typename K::StrideA) +
      sizeof(typename K::StrideB) + sizeof(typename K::StrideC) + sizeof(typename K::StrideD) +
      sizeof(typename K::LayoutSFA) + sizeof(typename K::LayoutSFB));
  return round_up_128(groups * per_group + 15 * 128);
}

template <class K>
typename K::Arrays carve(void* workspace, int64_t groups) {
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace) + 127) / 128 * 128);
  auto take = [&](int64_t bytes) {
    char* at = p;
    p += round_up_128(bytes);
    return at;
  };
  typename K::Arrays r;
  r.shapes = reinterpret_cast<Shape3*>(take(groups * sizeof(Shape3)));
  r.a = reinterpret_cast<decltype(r.a)>(take(groups * sizeof(void*)));
  r.b = reinterpret_cast<decltype(r.b)>(take(groups * sizeof(void*)));
  r.c = reinterpret_cast<decltype(r.c)>(take(groups * sizeof(void*)));
  r.d = reinterpret_cast<decltype(r.d)>(take(groups * sizeof(void*)));
  r.stride_a = reinterpret_cast<typename K::StrideA*>(take(groups * sizeof(typename K::StrideA)));
  r.stride_b = reinterpret_cast<typename K::StrideB*>(take(groups * sizeof(typename K::StrideB)));
  r.stride_c = reinterpret_cast<typename K::StrideC*>(take(groups * sizeof(typename K::StrideC)));
  r.stride_d = reinterpret_cast<typename K::StrideD*>(take(groups * sizeof(typename K::StrideD)));
  r.alpha = reinterpret_cast<float*>(take(groups * sizeof(float)));
  r.alpha_pointers = reinterpret_cast<const float**>(take(groups * sizeof(void*)));
  r.scales_a = reinterpret_cast<const float**>(take(groups * sizeof(void*)));
  r.scales_b = reinterpret_cast<const float**>(take(groups * sizeof(void*)));
  r.layout_sfa =
      reinterpret_cast<typename K::LayoutSFA*>(take(groups * sizeof(typename K::LayoutSFA)));
  r.layout_sfb =
      reinterpret_cast<typename K::LayoutSFB*>(take(groups * sizeof(typename K::LayoutSFB)));
  r.cutlass_workspace = p;
  return r;
}

// Group g's rows [lo, hi) of a, the offsets clamped into the capacity (bad offsets reported).
__device__ __forceinline__ void group_rows(const GroupedGemmDeviceArgs& a, int64_t g, int64_t* lo,
                                           int64_t* hi) {
  int64_t begin = a.offsets[g], end = a.offsets[g + 1];
  if (begin < 0 || end < begin || (g == 0 && begin != 0)) {
    if (a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_BAD_GROUP_OFFSETS, g, begin);
  }
  if (end > a.row_capacity) {
    if (a.word != nullptr) raise_fault(a.word, SFMOE_FAULT_GROUP_OVER_CAPACITY, g, end);
  }
  begin = begin < 0 ? 0 : (begin > a.row_capacity ? a.row_capacity : begin);
  end = end < begin ? begin : (end > a.row_capacity ? a.row_capacity : end);
  *lo = begin;
  *hi = end;
}

// The multiple of rows a wgrad group must start at: where a columnwise FP8 copy is read at
// column lo, TMA needs 16-byte aligned addresses; blockwise scales come in 128-row blocks.
__device__ __forceinline__ int64_t wgrad_start_multiple(const GroupedGemmDeviceArgs& a) {
  if (a.a.scaling == SFMOE_SCALING_BLOCK_1X128) return 128;
  return a.a.columnwise || a.b.columnwise ? 16 : 1;
}

// Whether wgrad runs group g: it has rows and starts at that multiple (bad offsets break that:
// the group is then skipped, its dW zeroed, and the fault reported by the setup kernel).
__device__ __forceinline__ bool wgrad_group_runs(const GroupedGemmDeviceArgs& a, int64_t lo,
                                                 int64_t hi) {
  return hi > lo && lo % wgrad_start_multiple(a) == 0;
}

// A CuTe stride of one of the kernel's types with its dynamic leading dimension set (row-major
// (ld, 1, 0) or column-major (1, ld, 0)).
template <class Stride>
__device__ __forceinline__ Stride stride_with_leading(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

// Zeroes CUTLASS's part of the workspace (its per-SM TMA descriptors), 16 bytes a thread over the
// whole grid. Nothing reads those bytes before the kernel writes them, but the kernel writes
// them with tensormap.cp_fenceproxy, which compute-sanitizer's initcheck counts as a read of the
// destination: zeroed, a workspace fresh from any allocator checks clean (a few KB per call).
__device__ __forceinline__ void zero_cutlass_workspace(void* workspace, int64_t bytes) {
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint4* words = static_cast<uint4*>(workspace);  // 128-byte aligned (carve)
  for (int64_t i = thread; i < bytes / 16; i += threads) words[i] = make_uint4(0, 0, 0, 0);
  char* tail = static_cast<char*>(workspace) + bytes / 16 * 16;
  if (thread < bytes % 16) tail[thread] = 0;
}

// One thread per group: its problem shape, operand pointers, strides and scale (and the grid
// zeroes CUTLASS's workspace, cutlass_bytes of it, first).
template <class K>
__global__ void grouped_gemm_setup_kernel(GroupedGemmDeviceArgs a, typename K::Arrays r,
                                          int64_t cutlass_bytes) {
  using Out = typename K::Out;
  zero_cutlass_workspace(r.cutlass_workspace, cutlass_bytes);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.num_groups) return;
  int64_t lo, hi;
  group_rows(a, g, &lo, &hi);
  const int rows = static_cast<int>(hi - lo), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  const auto* in_a = static_cast<const typename K::A*>(a.a.data);
  const auto* in_b = static_cast<const typename K::B*>(a.b.data);
  Out* out = static_cast<Out*>(a.out);
  // (pointer offsets and leading dimensions of A, B and D)
  int64_t at = 0, bt = 0, dt = 0, lda = 0, ldb = 0, ldd = 0;
  switch (a.form) {
    case GroupedGemmForm::kFprop:  // X [rows, k] . W_g [n, k]^T, both rowwise
      r.shapes[g] = Shape3(rows, n, k);
      at = lo * a.k, lda = a.k;
      bt = g * a.n * a.k, ldb = a.k;
      dt = lo * a.n, ldd = a.n;
      break;
    case GroupedGemmForm::kDgrad:
      r.shapes[g] = Shape3(rows, k, n);
      at = lo * a.n, lda = a.n;  // dY rowwise
      if (a.b.columnwise) {      // W^T [k, G n], group g at column g n (K-major)
        bt = g * a.n, ldb = a.b.rows;
      } else {  // W_g [n, k] rowwise, read N-major
        bt = g * a.n * a.k, ldb = a.k;
      }
      dt = lo * a.k, ldd = a.k;
      break;
    case GroupedGemmForm::kWgrad:
      // No rows (or a misaligned columnwise start): no tiles (M = 0); the zeroing kernel writes
      // dW_g when needed.
      if (lo % wgrad_start_multiple(a) != 0 && a.word != nullptr) {
        raise_fault(a.word, SFMOE_FAULT_BAD_GROUP_OFFSETS, g, lo);
      }
      r.shapes[g] = Shape3(wgrad_group_runs(a, lo, hi) ? n : 0, k, rows);
      if (a.a.columnwise) {  // dY^T [n, rows of a]: group g at column lo (K-major)
        at = lo, lda = a.a.rows;
      } else {  // dY [rows, n] read M-major
        at = lo * a.n, lda = a.n;
      }
      if (a.b.columnwise) {  // X^T [k, rows of b] (K-major)
        bt = lo, ldb = a.b.rows;
      } else {  // X [rows, k] read N-major
        bt = lo * a.k, ldb = a.k;
      }
      dt = g * a.n * a.k, ldd = a.k;
      break;
  }
  r.a[g] = in_a + at;
  r.b[g] = in_b + bt;
  r.d[g] = out + dt;
  r.c[g] = r.d[g];  // read only when accumulating (beta = 1)
  r.stride_a[g] = stride_with_leading<typename K::StrideA>(lda);
  r.stride_b[g] = stride_with_leading<typename K::StrideB>(ldb);
  r.stride_d[g] = stride_with_leading<typename K::StrideD>(ldd);
  r.stride_c[g] = r.stride_d[g];
  if constexpr (K::kBlockwise) {
    // The scale matrices (docs/grouped_gemm.md): fprop and dgrad read A's 1x128 rowwise scales
    // [rows, K / 128] (K-major: group g from row lo) and B's 128x128 scales of W rowwise
    // [G n / 128, k / 128], K-major in fprop (group g from block row g n / 128) and M/N-major in
    // dgrad (W_g^T's block (k_block, n_block) is W's (g n / 128 + n_block, k_block)). wgrad reads
    // dY's and X's columnwise 1x128 scales transposed, [rows / 128, n] and [rows / 128, k]:
    // M/N-major, group g from block row lo / 128.
    if (a.form == GroupedGemmForm::kWgrad) {
      r.scales_a[g] = a.a.scale_inv + (lo / 128) * a.n;
      r.scales_b[g] = a.b.scale_inv + (lo / 128) * a.k;
    } else {
      const int64_t k_blocks_a = (a.form == GroupedGemmForm::kFprop ? a.k : a.n) / 128;
      r.scales_a[g] = a.a.scale_inv + lo * k_blocks_a;
      r.scales_b[g] = a.b.scale_inv + (g * a.n / 128) * (a.k / 128);
    }
    const auto shape = cute::make_shape(static_cast<int>(cute::get<0>(r.shapes[g])),
                                        static_cast<int>(cute::get<1>(r.shapes[g])),
                                        static_cast<int>(cute::get<2>(r.shapes[g])), 1);
    r.layout_sfa[g] = K::ScaleConfig::tile_atom_to_shape_SFA(shape);
    r.layout_sfb[g] = K::ScaleConfig::tile_atom_to_shape_SFB(shape);
    r.alpha[g] = 1.0f;
  } else {
    const float sa = a.a.scale_inv != nullptr ? a.a.scale_inv[g] : 1.0f;
    const float sb = a.b.scale_inv != nullptr ? a.b.scale_inv[g] : 1.0f;
    r.alpha[g] = __fmul_rn(sa, sb);
  }
  r.alpha_pointers[g] = r.alpha + g;
}

// wgrad without accumulation: dW_g = 0 for the groups wgrad does not run.
template <class Out>
__global__ void zero_empty_weights_kernel(GroupedGemmDeviceArgs a) {
  for (int64_t g = blockIdx.y; g < a.num_groups; g += gridDim.y) {
    const int64_t begin = a.offsets[g], end = a.offsets[g + 1];
    const int64_t lo = begin < 0 ? 0 : (begin > a.row_capacity ? a.row_capacity : begin);
    const int64_t hi = end < lo ? lo : (end > a.row_capacity ? a.row_capacity : end);
    if (wgrad_group_runs(a, lo, hi)) continue;
    Out* w = static_cast<Out*>(a.out) + g * a.n * a.k;
    const int64_t count = a.n * a.k;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      w[i] = Out(0);
    }
  }
}

template <class K>
typename K::Gemm::Arguments gemm_arguments(const GroupedGemmDeviceArgs& a,
                                           const typename K::Arrays& r) {
  cutlass::KernelHardwareInfo hw;
  (void)cudaGetDevice(&hw.device_id);
  hw.sm_count = multiprocessor_count();
  typename K::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {static_cast<int>(a.num_groups), r.shapes, nullptr};
  if constexpr (K::kBlockwise) {
    args.mainloop = {r.a,        r.stride_a,   r.b,        r.stride_b,
                     r.scales_a, r.layout_sfa, r.scales_b, r.layout_sfb};
  } else {
    args.mainloop = {r.a, r.stride_a, r.b, r.stride_b};
  }
  args.epilogue = {{}, r.c, r.stride_c, r.d, r.stride_d};
  args.hw_info = hw;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = a.accumulate ? 1.0f : 0.0f;
  if constexpr (K::kFp8 && !K::kBlockwise) {  // one scale per group
    args.epilogue.thread.alpha_ptr_array = r.alpha_pointers;
    args.epilogue.thread.dAlpha = {_0{}, _0{}, 1};
  }
  return args;
}

template <class K>
int64_t kernel_workspace_bytes(int64_t groups) {
  GroupedGemmDeviceArgs a{};
  a.num_groups = groups;
  const typename K::Arrays r{};
  return arrays_bytes<K>(groups) + 128 +
         static_cast<int64_t>(K::Gemm::get_workspace_size(gemm_arguments<K>(a, r)));
}

template <class K>
sfmoe_status run_kernel(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  if (a.workspace_bytes < kernel_workspace_bytes<K>(a.num_groups)) {
    return report(SFMOE_ERROR_INVALID_ARGUMENT, "the workspace holds %lld bytes, %lld needed",
                  static_cast<long long>(a.workspace_bytes),
                  static_cast<long long>(kernel_workspace_bytes<K>(a.num_groups)));
  }
  const typename K::Arrays r = carve<K>(a.workspace, a.num_groups);
  typename K::Gemm gemm;
  const typename K::Gemm::Arguments args = gemm_arguments<K>(a, r);
  const int64_t cutlass_bytes = static_cast<int64_t>(K::Gemm::get_workspace_size(args));
  constexpr int kSetupThreads = 128;
  const int64_t group_blocks = (a.num_groups + kSetupThreads - 1) / kSetupThreads;
  const int64_t zero_blocks = (cutlass_bytes / 16 + kSetupThreads - 1) / kSetupThreads;
  grouped_gemm_setup_kernel<K>
      <<<static_cast<unsigned>(group_blocks > zero_blocks ? group_blocks : zero_blocks),
         kSetupThreads, 0, stream>>>(a, r, cutlass_bytes);
  SFMOE_RETURN_IF_ERROR(check_launch("grouped_gemm_setup_kernel"));
  using Out = typename K::Out;
  if (a.form == GroupedGemmForm::kWgrad && !a.accumulate) {
    const int64_t groups_per_launch = a.num_groups < 65535 ? a.num_groups : 65535;
    zero_empty_weights_kernel<Out>
        <<<dim3(8, static_cast<unsigned>(groups_per_launch)), 256, 0, stream>>>(a);
    SFMOE_RETURN_IF_ERROR(check_launch("zero_empty_weights_kernel"));
  }
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    return report(SFMOE_ERROR_UNSUPPORTED, "the CUTLASS kernel cannot run these operands");
  }
  if (gemm.initialize(args, r.cutlass_workspace, stream) != cutlass::Status::kSuccess ||
      gemm.run(stream) != cutlass::Status::kSuccess) {
    return check_launch("cutlass grouped GEMM") == SFMOE_SUCCESS
               ? report(SFMOE_ERROR_CUDA, "the CUTLASS grouped GEMM failed to launch")
               : SFMOE_ERROR_CUDA;
  }
  return check_launch("cutlass grouped GEMM");
}

template <class K>
void most_workspace(int64_t groups, int64_t* most) {
  const int64_t bytes = kernel_workspace_bytes<K>(groups);
  *most = bytes > *most ? bytes : *most;
}

using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

}  // namespace grouped_gemm_detail

// The recipes' translation units: the launch on the tile chosen by heuristics/gemm_tiles.h (a tile
// the recipe does not compile runs its default), and the workspace their kernels need.
sfmoe_status grouped_gemm_fp8_tensor(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                     cudaStream_t stream);
int64_t grouped_gemm_fp8_tensor_workspace_bytes(int64_t num_groups);
sfmoe_status grouped_gemm_blockwise(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                    cudaStream_t stream);
int64_t grouped_gemm_blockwise_workspace_bytes(int64_t num_groups);

// sfmoe's own BF16 kernel (sm90_contiguous_grouped_gemm.cu): whether it takes these operands
// (BF16 fprop or dgrad into BF16, row-major operands, 16-byte aligned, N and K multiples of 8, at
// most 768 groups; A's rows as they lie or gathered through a_row_index), and its launch on one
// of its tiles (is_contiguous_tile; it needs no workspace).
bool contiguous_grouped_gemm_runs(const GroupedGemmDeviceArgs& a);
sfmoe_status contiguous_grouped_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                     cudaStream_t stream);

// sfmoe's own FP8 blockwise kernel (sm90_contiguous_blockwise_gemm.cu): whether it takes these
// operands (fprop or dgrad into BF16: E4M3 1x128 rows, E4M3 128x128 weights -- rowwise in fprop,
// the columnwise copy in dgrad --, n and k multiples of 128, at most 768 groups, 16-byte aligned),
// and its launch on one of its tiles (is_blockwise_contiguous_tile; it needs no workspace).
bool contiguous_blockwise_gemm_runs(const GroupedGemmDeviceArgs& a);
sfmoe_status contiguous_blockwise_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                       cudaStream_t stream);

// sfmoe's own wgrad kernel (sm90_wgrad_grouped_gemm.cu): whether it takes these operands (BF16
// wgrad into BF16 without accumulation, row-major operands, 16-byte aligned, n and k multiples of
// 8, at most 768 groups), its launch on its tile (is_wgrad_tile), and the workspace it needs (each
// group's TMA descriptors).
bool wgrad_grouped_gemm_runs(const GroupedGemmDeviceArgs& a);
sfmoe_status wgrad_grouped_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile, cudaStream_t stream);
int64_t wgrad_grouped_gemm_workspace_bytes(int64_t num_groups);
}  // namespace cuda
}  // namespace sfmoe
