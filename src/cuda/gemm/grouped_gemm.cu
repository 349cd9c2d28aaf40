// Grouped GEMM on Hopper (docs/grouped_gemm.md): CUTLASS's persistent ptr-array kernels (TMA
// loads, warp-specialized cooperative HGMMA) over problem shapes that exist only on the device.
// A setup kernel turns the group offsets into each group's shape, operand pointers and strides in
// the caller's workspace; the GEMM kernel's tile scheduler reads them there, so the host never
// learns a group's size and the work follows the real rows (a group of 0 rows has no tiles).
//
// The three forms map onto one GEMM D[M, N] = A[M, K] . B[K, N] each:
//   fprop  Y_g = X_g W_g^T:    M = rows, N = n, K = k; A = X (K-major), B = W (K-major)
//   dgrad  dX_g = dY_g W_g:    M = rows, N = k, K = n; A = dY (K-major), B = W (N-major)
//   wgrad  dW_g = dY_g^T X_g:  M = n, N = k, K = rows; A = dY (M-major), B = X (N-major)
// A wgrad group with no rows has no K: it is given no tiles, and its dW is zeroed by a separate
// kernel unless the call accumulates.
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include "src/common/error.h"
#include "src/common/fault.h"
#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using Shape3 = ProblemShape::UnderlyingProblemShape;
using Bf16 = cutlass::bfloat16_t;
constexpr int kAlignment = 8;  // 16 bytes of BF16: TMA's requirement on strides and bases

// One CUTLASS grouped GEMM: BF16 operands in the given layouts, ElementOut results.
template <class LayoutA, class LayoutB, class ElementOut>
struct GroupedKernel {
  using TileShape = Shape<_128, _128, _64>;
  using ClusterShape = Shape<_1, _1, _1>;
  static constexpr int kOutAlignment = 16 / static_cast<int>(sizeof(ElementOut));
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut,
      cutlass::layout::RowMajor*, kOutAlignment, ElementOut, cutlass::layout::RowMajor*,
      kOutAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementOut, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, kAlignment, Bf16,
      LayoutB*, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;

  // The per-group arrays, carved out of the workspace.
  struct Arrays {
    Shape3* shapes;
    const Bf16** a;
    const Bf16** b;
    const ElementOut** c;
    ElementOut** d;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideC* stride_c;
    StrideD* stride_d;
    void* cutlass_workspace;
  };
};

// Bytes up to the next multiple of 128 (TMA descriptors and the arrays stay aligned).
constexpr int64_t round_up_128(int64_t bytes) { return (bytes + 127) / 128 * 128; }

template <class K>
int64_t arrays_bytes(int64_t groups) {
  const int64_t per_group = static_cast<int64_t>(sizeof(Shape3) + 4 * sizeof(void*) +
                                                 sizeof(typename K::StrideA) +
                                                 sizeof(typename K::StrideB) +
                                                 sizeof(typename K::StrideC) +
                                                 sizeof(typename K::StrideD));
  return round_up_128(groups * per_group + 9 * 128);
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
  r.a = reinterpret_cast<const Bf16**>(take(groups * sizeof(void*)));
  r.b = reinterpret_cast<const Bf16**>(take(groups * sizeof(void*)));
  r.c = reinterpret_cast<decltype(r.c)>(take(groups * sizeof(void*)));
  r.d = reinterpret_cast<decltype(r.d)>(take(groups * sizeof(void*)));
  r.stride_a = reinterpret_cast<typename K::StrideA*>(take(groups * sizeof(typename K::StrideA)));
  r.stride_b = reinterpret_cast<typename K::StrideB*>(take(groups * sizeof(typename K::StrideB)));
  r.stride_c = reinterpret_cast<typename K::StrideC*>(take(groups * sizeof(typename K::StrideC)));
  r.stride_d = reinterpret_cast<typename K::StrideD*>(take(groups * sizeof(typename K::StrideD)));
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

// One thread per group: its problem shape, operand pointers and strides.
template <class K>
__global__ void grouped_gemm_setup_kernel(GroupedGemmDeviceArgs a, typename K::Arrays r) {
  using Out = std::remove_pointer_t<std::remove_pointer_t<decltype(r.d)>>;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= a.num_groups) return;
  int64_t lo, hi;
  group_rows(a, g, &lo, &hi);
  const int rows = static_cast<int>(hi - lo), n = static_cast<int>(a.n), k = static_cast<int>(a.k);
  const Bf16* in_a = static_cast<const Bf16*>(a.a);
  const Bf16* in_b = static_cast<const Bf16*>(a.b);
  Out* out = static_cast<Out*>(a.out);
  switch (a.form) {
    case GroupedGemmForm::kFprop:
      r.shapes[g] = Shape3(rows, n, k);
      r.a[g] = in_a + lo * a.k;
      r.b[g] = in_b + g * a.n * a.k;
      r.d[g] = out + lo * a.n;
      r.stride_a[g] = cutlass::make_cute_packed_stride(typename K::StrideA{}, {rows, k, 1});
      r.stride_b[g] = cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1});
      r.stride_d[g] = cutlass::make_cute_packed_stride(typename K::StrideD{}, {rows, n, 1});
      break;
    case GroupedGemmForm::kDgrad:
      r.shapes[g] = Shape3(rows, k, n);
      r.a[g] = in_a + lo * a.n;
      r.b[g] = in_b + g * a.n * a.k;
      r.d[g] = out + lo * a.k;
      r.stride_a[g] = cutlass::make_cute_packed_stride(typename K::StrideA{}, {rows, n, 1});
      r.stride_b[g] = cutlass::make_cute_packed_stride(typename K::StrideB{}, {k, n, 1});
      r.stride_d[g] = cutlass::make_cute_packed_stride(typename K::StrideD{}, {rows, k, 1});
      break;
    case GroupedGemmForm::kWgrad:
      // No rows: no K, and no tiles (M = 0); the zeroing kernel writes dW_g when needed.
      r.shapes[g] = Shape3(rows > 0 ? n : 0, k, rows);
      r.a[g] = in_a + lo * a.n;
      r.b[g] = in_b + lo * a.k;
      r.d[g] = out + g * a.n * a.k;
      r.stride_a[g] = cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, rows, 1});
      r.stride_b[g] = cutlass::make_cute_packed_stride(typename K::StrideB{}, {k, rows, 1});
      r.stride_d[g] = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, k, 1});
      break;
  }
  r.c[g] = r.d[g];  // read only when accumulating (beta = 1)
  r.stride_c[g] = r.stride_d[g];
}

// wgrad without accumulation: dW_g = 0 for the groups without rows.
template <class Out>
__global__ void zero_empty_weights_kernel(GroupedGemmDeviceArgs a) {
  const int64_t g = blockIdx.y;
  int64_t lo, hi;
  const int64_t begin = a.offsets[g], end = a.offsets[g + 1];
  lo = begin < 0 ? 0 : (begin > a.row_capacity ? a.row_capacity : begin);
  hi = end < lo ? lo : (end > a.row_capacity ? a.row_capacity : end);
  if (hi > lo) return;
  Out* w = static_cast<Out*>(a.out) + g * a.n * a.k;
  const int64_t count = a.n * a.k;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    w[i] = Out(0);
  }
}

template <class K>
typename K::Gemm::Arguments gemm_arguments(const GroupedGemmDeviceArgs& a,
                                           const typename K::Arrays& r) {
  cutlass::KernelHardwareInfo hw;
  (void)cudaGetDevice(&hw.device_id);
  hw.sm_count = multiprocessor_count();
  typename K::Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {static_cast<int>(a.num_groups), r.shapes, nullptr},
      {r.a, r.stride_a, r.b, r.stride_b},
      {{}, r.c, r.stride_c, r.d, r.stride_d},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = a.accumulate ? 1.0f : 0.0f;
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
  const char* context = "sfmoe_grouped_gemm";
  if (a.workspace_bytes < kernel_workspace_bytes<K>(a.num_groups)) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: the workspace holds %lld bytes, %lld needed",
                context, static_cast<long long>(a.workspace_bytes),
                static_cast<long long>(kernel_workspace_bytes<K>(a.num_groups)));
  }
  const typename K::Arrays r = carve<K>(a.workspace, a.num_groups);
  constexpr int kSetupThreads = 128;
  grouped_gemm_setup_kernel<K>
      <<<static_cast<unsigned>((a.num_groups + kSetupThreads - 1) / kSetupThreads), kSetupThreads,
         0, stream>>>(a, r);
  SFMOE_RETURN_IF_ERROR(check_launch(context, "grouped_gemm_setup_kernel"));
  using Out = std::remove_pointer_t<std::remove_pointer_t<decltype(r.d)>>;
  if (a.form == GroupedGemmForm::kWgrad && !a.accumulate) {
    zero_empty_weights_kernel<Out>
        <<<dim3(8, static_cast<unsigned>(a.num_groups)), 256, 0, stream>>>(a);
    SFMOE_RETURN_IF_ERROR(check_launch(context, "zero_empty_weights_kernel"));
  }
  typename K::Gemm gemm;
  const typename K::Gemm::Arguments args = gemm_arguments<K>(a, r);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    return fail(SFMOE_ERROR_UNSUPPORTED, "%s: the CUTLASS kernel cannot run these operands",
                context);
  }
  if (gemm.initialize(args, r.cutlass_workspace, stream) != cutlass::Status::kSuccess ||
      gemm.run(stream) != cutlass::Status::kSuccess) {
    return check_launch(context, "cutlass grouped GEMM") == SFMOE_SUCCESS
               ? fail(SFMOE_ERROR_CUDA, "%s: the CUTLASS grouped GEMM failed to launch", context)
               : SFMOE_ERROR_CUDA;
  }
  return check_launch(context, "cutlass grouped GEMM");
}

using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;
template <class Out>
using FpropKernel = GroupedKernel<RowMajor, ColumnMajor, Out>;
template <class Out>
using DgradKernel = GroupedKernel<RowMajor, RowMajor, Out>;
template <class Out>
using WgradKernel = GroupedKernel<ColumnMajor, RowMajor, Out>;

template <class Out>
sfmoe_status run_form(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  switch (a.form) {
    case GroupedGemmForm::kFprop:
      return run_kernel<FpropKernel<Out>>(a, stream);
    case GroupedGemmForm::kDgrad:
      return run_kernel<DgradKernel<Out>>(a, stream);
    case GroupedGemmForm::kWgrad:
      return run_kernel<WgradKernel<Out>>(a, stream);
  }
  return SFMOE_ERROR_INTERNAL;
}

}  // namespace

bool grouped_gemm_available() { return true; }

int64_t grouped_gemm_workspace_bytes(int64_t num_groups) {
  const int64_t sizes[] = {
      kernel_workspace_bytes<FpropKernel<Bf16>>(num_groups),
      kernel_workspace_bytes<DgradKernel<Bf16>>(num_groups),
      kernel_workspace_bytes<WgradKernel<Bf16>>(num_groups),
      kernel_workspace_bytes<FpropKernel<float>>(num_groups),
      kernel_workspace_bytes<DgradKernel<float>>(num_groups),
      kernel_workspace_bytes<WgradKernel<float>>(num_groups)};
  int64_t most = 0;
  for (int64_t s : sizes) most = s > most ? s : most;
  return most;
}

sfmoe_status grouped_gemm(const GroupedGemmDeviceArgs& a, void* stream_pointer) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_pointer);
  if (a.num_groups == 0) return SFMOE_SUCCESS;
  return a.out_dtype == SFMOE_DTYPE_FP32 ? run_form<float>(a, stream) : run_form<Bf16>(a, stream);
}

}  // namespace cuda
}  // namespace sfmoe
