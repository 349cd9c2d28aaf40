// Grouped GEMM on Hopper, sfmoe's own wgrad kernel (docs/grouped_gemm.md, "sfmoe's own wgrad
// kernel"):
// dW_g [n, k] = dY_g^T X_g, reduced over each group's rows, BF16 operands into BF16 results.
//
// wgrad's tiles are short mainloops (K = a group's rows: 512 for Qwen3-30B-A3B's balanced groups,
// eight 64-row steps) into wide outputs (128 x 256 BF16 = 64 KiB a tile), so the epilogue is a
// large share of a tile's time. Two things differ from CUTLASS's ptr-array kernel, which the
// heuristic ran before:
// - The epilogue stages the tile in shared memory in the 128-byte swizzle and hands it to TMA
//   stores, which drain while the next tile's MMAs run; a tile waits for its predecessor's stores
//   only before it writes the staging buffer again, a whole mainloop later.
// - Each group's two TMA descriptors (dY_g [rows_g, n] and X_g [rows_g, k], their K bound at the
//   group's last row, so the tail of a group's last 64-row step reads zeros, never the next
//   group's rows) are written once per call by a setup kernel into the workspace; the GEMM
//   kernel only fences and prefetches them when a CTA's tile changes group. CUTLASS instead
//   rewrites a descriptor in shared memory whenever a tile changes group, which in wgrad is almost
//   every tile (a wave of 132 CTAs spans one or two groups).
// The mainloop is CUTLASS's warp-specialized cooperative TMA + GMMA collective (its ptr-array
// form, which reads its descriptors through pointers), so a tile sums in the same order as
// CUTLASS's 128 x 256 tile and gives its bits. The scheduler: group g owns the tiles
// [unit_start[g], unit_start[g + 1]) (all of dW_g's when the group has rows, none otherwise),
// its M tiles fastest; the CTAs walk them persistently. Groups without rows get dW_g = 0 from the
// zeroing kernel the CUTLASS path shares.
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "src/common/group_offsets.h"
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"
#include "src/cuda/gemm/sm90_warp_specialized.cuh"
#include "src/cuda/heuristics/launch_overrides.h"

namespace sfmoe {
namespace cuda {
namespace {

using namespace cute;
using grouped_gemm_detail::Bf16;

using warp_specialized::aligned16;
using warp_specialized::kConsumerRegisters;
using warp_specialized::kMaxGroups;
using warp_specialized::kProducerRegisters;
using warp_specialized::kThreads;
constexpr int kTileM = 128;
constexpr int kEpilogueBarrier = 1;  // named barrier of the two consumer warp groups (256 threads)

// The bound on the groups the kernel prefetches into L2 (dY_g and X_g together; a few groups of
// 16 MiB at once stay well inside the H100's and H200's 50 MiB). 0, none: measured on an H100,
// SFMOE_WGRAD_PREFETCH_MIB=16 made the Qwen3-30B-A3B wgrads 6-9% slower and DeepSeek-V3's 2-7%
// (docs/KERNEL_NOTES.md); the setting stays for studies.
constexpr int64_t kPrefetchGroupMiB = 0;

// A = dY_g read M-major (dY is [rows, n] row-major: the GEMM's M = n runs along a row), B = X_g
// read N-major; kTileM x kTileN tiles, kStages pipeline stages, kClusterM CTAs a cluster: the
// cluster's CTAs take neighbouring M tiles of one group and N block, and each loads its share of
// the B tile (X_g's) with TMA multicast into all of them.
template <int kTileN, int kStages, int kClusterM = 1>
struct WgradKernel {
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, _64>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  static constexpr int kCluster = kClusterM;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::ColumnMajor*, 8,
      Bf16, cutlass::layout::RowMajor*, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCount<kStages>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using StrideA = cute::remove_pointer_t<typename Mainloop::StrideA>;  // one group's
  using StrideB = cute::remove_pointer_t<typename Mainloop::StrideB>;
  static constexpr int kN = kTileN;
  // The staged tile: 64-column blocks of 128-byte rows in the 128-byte swizzle (a fragment's 8
  // rows land on distinct banks), the layout the TMA store reads.
  using StagedLayout =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Bf16>{}, Shape<Int<kTileM>, Int<kTileN>>{}));
  // dW as [n, k, G] (k contiguous): the stores clip at n and k, so a partial tile never reaches
  // the next group's dW.
  using OutLayout = Layout<Shape<int, int, int>, Stride<int64_t, _1, int64_t>>;
  using TmaStore = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Bf16*>(nullptr)), OutLayout{}),
      StagedLayout{}));

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;  // TMA's swizzled stages need the alignment
    alignas(1024) Bf16 staged[cosize_v<StagedLayout>];
    typename Mainloop::PipelineStorage pipeline;
    int unit_start[kMaxGroups + 1];
    int rows[kMaxGroups];
    int first_row[kMaxGroups];
    warp_specialized::GroupScan::TempStorage scan;
  };
  // (+1024: the kernel aligns the dynamic shared memory it is given to 1024 bytes)
  static constexpr int kSharedBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;
  static_assert(kSharedBytes <= 232448, "more shared memory than an H100/H200 SM has");

  struct Params {
    typename Mainloop::Params mainloop;  // the descriptors' template (dims and address replaced)
    TmaStore store;
    GroupedGemmDeviceArgs args;              // the offsets, the capacity and the fault word
    const cute::TmaDescriptor* descriptors;  // [G][2]: group g's dY_g and X_g
    int m_tiles, n_tiles;                    // of dW_g: n / kTileM and k / kTileN, rounded up
    int64_t prefetch_group_bytes;  // groups whose dY_g and X_g fit are prefetched into L2 (0: none)
  };
};

// The workspace: each group's two descriptors, 128 bytes each, from a 128-byte boundary.
int64_t wgrad_workspace_bytes(int64_t groups) { return groups * 2 * 128 + 128; }
cute::TmaDescriptor* descriptors_in(void* workspace) {
  return reinterpret_cast<cute::TmaDescriptor*>((reinterpret_cast<uintptr_t>(workspace) + 127) /
                                                128 * 128);
}

// A copy of the template descriptor, in shared memory, turned into one group's operand: `base` its
// first element, cols x rows its extent (the GEMM's M or N by the group's rows), `stride` its CuTe
// stride.
template <class Tma, class Stride>
__device__ __forceinline__ void make_group_descriptor(cute::TmaDescriptor& desc, const Tma& tma,
                                                      const Bf16* base, int cols, int rows,
                                                      Stride stride) {
  cute::array<uint32_t, 5> shape = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> strides = {0, 0, 0, 0, 0};
  const Tensor view =
      make_tensor(static_cast<const Bf16*>(nullptr), make_shape(cols, rows, Int<1>{}), stride);
  cute::detail::fill_tma_gmem_shape_stride(tma, view, shape, strides);
  for (uint64_t& s : strides) s *= sizeof(Bf16);
  cute::tma_descriptor_replace_dims_strides_in_shared_mem(desc, shape, strides);
  cute::tma_descriptor_replace_addr_in_shared_mem(desc, base);
}

// One warp per group with rows: its two descriptors, built in shared memory from the template and
// copied to the workspace with the release fence the GEMM kernel's acquire pairs with. Lane 0 of
// each group's warp reports the group's bad offsets (the GEMM kernel clamps them alike, silently).
constexpr int kSetupWarps = 4;
template <class K>
__global__ void __launch_bounds__(kSetupWarps * 32)
    wgrad_descriptors_kernel(const __grid_constant__ typename K::Params p) {
  __shared__ alignas(128) cute::TmaDescriptor staged[kSetupWarps][2];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kSetupWarps + warp;
  if (g >= p.args.num_groups) return;
  int64_t lo, hi;
  GroupedGemmDeviceArgs a = p.args;
  if (lane != 0) a.word = nullptr;
  grouped_gemm_detail::group_rows(a, g, &lo, &hi);
  if (hi <= lo) return;  // no tiles read its descriptors
  if (lane == 0) {
    staged[warp][0] = *p.mainloop.tma_load_a.get_tma_descriptor();
    staged[warp][1] = *p.mainloop.tma_load_b.get_tma_descriptor();
    const int rows = static_cast<int>(hi - lo), n = static_cast<int>(a.n),
              k = static_cast<int>(a.k);
    make_group_descriptor(staged[warp][0], p.mainloop.tma_load_a,
                          static_cast<const Bf16*>(a.a.data) + lo * a.n, n, rows,
                          grouped_gemm_detail::stride_with_leading<typename K::StrideA>(a.n));
    make_group_descriptor(staged[warp][1], p.mainloop.tma_load_b,
                          static_cast<const Bf16*>(a.b.data) + lo * a.k, k, rows,
                          grouped_gemm_detail::stride_with_leading<typename K::StrideB>(a.k));
  }
  __syncwarp();
  cute::TmaDescriptor* out = const_cast<cute::TmaDescriptor*>(p.descriptors) + 2 * g;
  cute::tma_descriptor_cp_fence_release(out, staged[warp][0]);
  cute::tma_descriptor_cp_fence_release(out + 1, staged[warp][1]);
}

// A bulk prefetch of `bytes` (a multiple of 16) from `address` (16-byte aligned) into L2.
__device__ __forceinline__ void prefetch_l2(const void* address, int64_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(address),
               "r"(static_cast<uint32_t>(bytes))
               : "memory");
}

struct WgradTile {
  int group, m_block, n_block;
};

template <class K>
__global__ void __launch_bounds__(kThreads, 1)
    wgrad_grouped_gemm_kernel(const __grid_constant__ typename K::Params p) {
  extern __shared__ char shared_bytes[];
  auto& s = *reinterpret_cast<typename K::SharedStorage*>(
      (reinterpret_cast<uintptr_t>(shared_bytes) + 1023) / 1024 * 1024);
  const int thread = static_cast<int>(threadIdx.x);
  const int warp_group = thread / 128;
  const int warp_in_group = (thread / 32) % 4;
  const int groups = static_cast<int>(p.args.num_groups);
  // A group's units of work: its N blocks times its M tiles, in the cluster's groups of M tiles.
  const int m_units = (p.m_tiles + K::kCluster - 1) / K::kCluster;
  const int units_per_group = m_units * p.n_tiles;

  // Each group's rows (clamped as the setup kernel does; it reports bad offsets) and the exclusive
  // prefix of their tiles, in shared memory.
  {
    GroupedGemmDeviceArgs a = p.args;
    a.word = nullptr;
    warp_specialized::prefix_units(thread, groups, s.scan, s.unit_start, [&](int g) {
      int64_t lo, hi;
      grouped_gemm_detail::group_rows(a, g, &lo, &hi);
      s.rows[g] = static_cast<int>(hi - lo);
      s.first_row[g] = static_cast<int>(lo);
      return hi > lo ? units_per_group : 0;
    });
  }

  const auto pipeline_params = warp_specialized::pipeline_params<typename K::Pipeline>(
      thread, p.mainloop.tma_transaction_bytes);
  typename K::Pipeline pipeline(s.pipeline, pipeline_params, typename K::ClusterShape{});
  __syncthreads();  // the barriers initialized, the tile starts written
  warp_specialized::cluster_sync_after_init<K::kCluster>();
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  // The cluster's CTAs walk the same units, each a tile of its own: neighbouring M tiles (the
  // last CTA's past dW_g's rows when the M tiles do not divide: its MMAs skipped, nothing stored).
  const int first_unit = static_cast<int>(blockIdx.x) / K::kCluster;
  const int unit_stride = static_cast<int>(gridDim.x) / K::kCluster;

  const int total_units = s.unit_start[groups];
  auto locate = [&](int unit) {
    WgradTile t;
    t.group = static_cast<int>(group_of_offset_row(s.unit_start, groups, unit));
    const int local = unit - s.unit_start[t.group];
    t.m_block = (local % m_units) * K::kCluster + rank;
    t.n_block = local / m_units;
    return t;
  };
  const int n = static_cast<int>(p.args.n), k = static_cast<int>(p.args.k);
  typename K::Mainloop mainloop;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (warp_in_group != 0) return;
    auto write = cutlass::make_producer_start_state<typename K::Pipeline>();
    int loaded_group = -1;
    for (int unit = first_unit; unit < total_units; unit += unit_stride) {
      const WgradTile t = locate(unit);
      // The CTA's next unit, a tile from now, mostly lies in a group no CTA has read yet (at
      // Qwen3-30B-A3B's shape the 132 CTAs span 1.4 groups, and every CTA changes group at every
      // tile): its first loads would all miss L2 together. So each unit prefetches into L2 its
      // share of the rows of the group its CTA takes next (the group's units' shares cover dY_g
      // and X_g once), for groups small enough to stay in L2 until read.
      const int next = unit + unit_stride;
      if (p.prefetch_group_bytes > 0 && next < total_units && rank == 0 && cute::elect_one_sync()) {
        const int g = static_cast<int>(group_of_offset_row(s.unit_start, groups, next));
        const int64_t rows = s.rows[g], share = next - s.unit_start[g];
        if (rows * (n + k) * static_cast<int64_t>(sizeof(Bf16)) <= p.prefetch_group_bytes) {
          const int64_t r0 = share * rows / units_per_group,
                        r1 = (share + 1) * rows / units_per_group;
          if (r1 > r0) {
            const int64_t row = s.first_row[g] + r0;
            prefetch_l2(static_cast<const Bf16*>(p.args.a.data) + row * n,
                        (r1 - r0) * n * sizeof(Bf16));
            prefetch_l2(static_cast<const Bf16*>(p.args.b.data) + row * k,
                        (r1 - r0) * k * sizeof(Bf16));
          }
        }
      }
      const cute::TmaDescriptor* desc_a = p.descriptors + 2 * t.group;
      const cute::TmaDescriptor* desc_b = desc_a + 1;
      if (t.group != loaded_group) {  // (the whole warp: the fences are aligned)
        cute::tma_descriptor_fence_acquire(desc_a);
        cute::tma_descriptor_fence_acquire(desc_b);
        if (cute::elect_one_sync()) {
          cute::prefetch_tma_descriptor(desc_a);
          cute::prefetch_tma_descriptor(desc_b);
        }
        loaded_group = t.group;
      }
      const int rows = s.rows[t.group];
      const int k_tiles = (rows + 63) / 64;
      // Coordinates only: the group's descriptors hold its base and bounds.
      Tensor m_a = p.mainloop.tma_load_a.get_tma_tensor(make_shape(n, rows, 1));
      Tensor m_b = p.mainloop.tma_load_b.get_tma_tensor(make_shape(k, rows, 1));
      Tensor g_a = local_tile(m_a, typename K::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
      Tensor g_b = local_tile(m_b, typename K::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
      auto k_tile_iter = cute::make_coord_iterator(shape<3>(g_a));
      mainloop.load(p.mainloop, pipeline, write, cute::make_tuple(g_a, g_b),
                    cute::make_tuple(desc_a, desc_b), make_coord(t.m_block, t.n_block, _, 0),
                    k_tile_iter, k_tiles, thread % 32, static_cast<uint32_t>(rank), s.tensors);
      write.advance(k_tiles);
    }
    mainloop.load_tail(pipeline, write);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  typename K::TiledMma tiled_mma;
  typename K::PipelineState read;
  const int mma_thread = thread - 128;
  Tensor staged = make_tensor(make_smem_ptr(s.staged), typename K::StagedLayout{});
  Tensor staged_of_thread = tiled_mma.get_thread_slice(mma_thread).partition_C(staged);
  Tensor out = p.store.get_tma_tensor(make_shape(n, k, groups));
  auto store_slice = p.store.get_slice(Int<0>{});
  const bool issues_stores = mma_thread == 0;
  const int consumer = mma_thread / 128;  // rows [64 consumer, 64 consumer + 64) of each tile
  for (int unit = first_unit; unit < total_units; unit += unit_stride) {
    const WgradTile t = locate(unit);
    const int k_tiles = (s.rows[t.group] + 63) / 64;
    const int rows_in_tile = n - t.m_block * kTileM;  // of dW_g's n rows (none, or fewer than 128)
    if (rows_in_tile <= 64 * consumer) {
      // None of this warp group's rows lie in dW_g: it passes the stages on without MMAs (the
      // other warp group's MMAs run alone), and its part of the staged tile is clipped by the
      // stores. The epilogue's barriers still count it.
      warp_specialized::pass_stages(pipeline, read, k_tiles);
      cutlass::arch::NamedBarrier::arrive_and_wait(256, kEpilogueBarrier);
      cutlass::arch::NamedBarrier::arrive_and_wait(256, kEpilogueBarrier);
      continue;
    }
    auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(typename K::TileShape{}));
    mainloop.mma(pipeline, read, accumulators, k_tiles, mma_thread, s.tensors, p.mainloop);
    mainloop.mma_tail(pipeline, read, k_tiles);
    read.advance(k_tiles);

    // The previous tile's stores have read the staging buffer (issued a mainloop ago: this rarely
    // waits).
    if (issues_stores) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::arrive_and_wait(256, kEpilogueBarrier);
    Tensor converted = make_tensor_like<Bf16>(accumulators);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accumulators); ++i) converted(i) = Bf16(accumulators(i));
    copy(converted, staged_of_thread);
    cutlass::arch::fence_view_async_shared();  // the writes, visible to the TMA unit
    cutlass::arch::NamedBarrier::arrive_and_wait(256, kEpilogueBarrier);
    if (issues_stores) {  // (warp group 0 always has rows when the tile has any)
      Tensor tile = local_tile(out, Shape<Int<kTileM>, Int<K::kN>>{},
                               make_coord(t.m_block, t.n_block, t.group));
      copy(p.store, store_slice.partition_S(staged), store_slice.partition_D(tile));
      tma_store_arrive();
    }
  }
  if (issues_stores) tma_store_wait<0>();  // the staging buffer outlives the last stores' reads
}

template <class K>
sfmoe_status run(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  if (a.workspace_bytes < wgrad_workspace_bytes(a.num_groups)) {
    return report(SFMOE_ERROR_INVALID_ARGUMENT, "the workspace holds %lld bytes, %lld needed",
                  static_cast<long long>(a.workspace_bytes),
                  static_cast<long long>(wgrad_workspace_bytes(a.num_groups)));
  }
  using Mainloop = typename K::Mainloop;
  const int groups = static_cast<int>(a.num_groups), n = static_cast<int>(a.n),
            k = static_cast<int>(a.k);
  typename K::Params p;
  // The template descriptors: the operands' first elements (each group's descriptor gets its own
  // base, bounds and strides on the device).
  const typename Mainloop::Arguments operands{
      reinterpret_cast<const Bf16**>(const_cast<void*>(a.a.data)), nullptr,
      reinterpret_cast<const Bf16**>(const_cast<void*>(a.b.data)), nullptr};
  p.mainloop = Mainloop::to_underlying_arguments(
      grouped_gemm_detail::ProblemShape{groups, nullptr, nullptr}, operands, nullptr);
  p.store = make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Bf16*>(a.out)),
                  typename K::OutLayout(
                      make_shape(n, k, groups),
                      make_stride(static_cast<int64_t>(k), _1{}, static_cast<int64_t>(n) * k))),
      typename K::StagedLayout{});
  p.args = a;
  p.descriptors = descriptors_in(a.workspace);
  p.m_tiles = (n + kTileM - 1) / kTileM;
  p.n_tiles = (k + K::kN - 1) / K::kN;
  p.prefetch_group_bytes = launch_overrides().wgrad_prefetch_mib.value_or(kPrefetchGroupMiB) << 20;

  // Persistent: as many clusters as fit on the GPU at once (one CTA an SM), or fewer when there
  // are fewer units of work. (Checked before anything is launched.)
  constexpr auto kKernel = wgrad_grouped_gemm_kernel<K>;
  const int resident = warp_specialized::resident_clusters<kKernel, K::kCluster>(
      K::kSharedBytes, "wgrad_grouped_gemm_kernel");
  if (resident < 1) return SFMOE_ERROR_CUDA;
  wgrad_descriptors_kernel<K><<<static_cast<unsigned>((groups + kSetupWarps - 1) / kSetupWarps),
                                kSetupWarps * 32, 0, stream>>>(p);
  SFMOE_RETURN_IF_ERROR(check_launch("wgrad_descriptors_kernel"));
  const int64_t groups_per_launch = a.num_groups < 65535 ? a.num_groups : 65535;
  grouped_gemm_detail::zero_empty_weights_kernel<Bf16>
      <<<dim3(8, static_cast<unsigned>(groups_per_launch)), 256, 0, stream>>>(a);
  SFMOE_RETURN_IF_ERROR(check_launch("zero_empty_weights_kernel"));
  const int64_t m_units = (p.m_tiles + K::kCluster - 1) / K::kCluster;
  const int64_t unit_bound = static_cast<int64_t>(groups) * m_units * p.n_tiles;
  const int64_t clusters = unit_bound < resident ? unit_bound : resident;
  if (clusters <= 0) return SFMOE_SUCCESS;
  return warp_specialized::launch_clusters<kKernel, K::kCluster>(
      p, clusters, K::kSharedBytes, stream, "wgrad_grouped_gemm_kernel");
}

// 128 x 256: 48 KiB a stage, three of them beside the 64 KiB staged tile; alone or in 2-CTA
// clusters multicasting X's tile.
using Wgrad256 = WgradKernel<256, 3>;
using Wgrad256x2 = WgradKernel<256, 3, 2>;
// 128 x 192: 40 KiB a stage, four of them beside the 48 KiB staged tile.
using Wgrad192 = WgradKernel<192, 4>;

}  // namespace

int64_t wgrad_grouped_gemm_workspace_bytes(int64_t num_groups) {
  return wgrad_workspace_bytes(num_groups);
}

bool wgrad_grouped_gemm_runs(const GroupedGemmDeviceArgs& a) {
  const bool operands = a.form == GroupedGemmForm::kWgrad && a.a.scaling == SFMOE_SCALING_NONE &&
                        a.b.scaling == SFMOE_SCALING_NONE && a.a.dtype == SFMOE_DTYPE_BF16 &&
                        a.b.dtype == SFMOE_DTYPE_BF16 && a.out_dtype == SFMOE_DTYPE_BF16 &&
                        !a.accumulate && !a.a.columnwise && !a.b.columnwise &&
                        aligned16(a.a.data) && aligned16(a.b.data) && aligned16(a.out);
  // Rows, n and k bounded first (the products below stay far inside int64): a group's 64-row
  // steps and dW's [n, k, G] coordinates are counted in int, and TMA strides stay below 2^40 bytes.
  const bool bounded = a.num_groups >= 1 && a.num_groups <= kMaxGroups && a.row_capacity >= 1 &&
                       a.row_capacity <= (int64_t{1} << 30) && a.n >= 8 && a.k >= 8 &&
                       a.n % 8 == 0 && a.k % 8 == 0 && a.n < (int64_t{1} << 30) &&
                       a.k < (int64_t{1} << 30);
  // (the tiles are counted in int: G (n / 128 + 1) (k / 128 + 1) must fit)
  return operands && bounded &&
         a.num_groups * (a.n / kTileM + 1) * (a.k / 128 + 1) < (int64_t{1} << 31) &&
         a.n * a.k * 4 < (int64_t{1} << 40);
}

sfmoe_status wgrad_grouped_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                cudaStream_t stream) {
  switch (tile) {
    case GemmTile::kWgrad128x256:
      return run<Wgrad256>(a, stream);
    case GemmTile::kWgrad128x256Cluster2:
      return run<Wgrad256x2>(a, stream);
    case GemmTile::kWgrad128x192:
      return run<Wgrad192>(a, stream);
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "not a tile of the wgrad grouped GEMM");
  }
}

}  // namespace cuda
}  // namespace sfmoe
