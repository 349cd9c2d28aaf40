// Grouped GEMM on Hopper with FP8 blockwise operands (the DeepSeek-V3 recipe: rows scaled per 1x128
// block along K, weights per 128x128 block), sfmoe's own kernel for fprop and dgrad into BF16
// (docs/grouped_gemm.md, "the contiguous kernel"): the BF16 contiguous kernel's scheme
// (sm90_contiguous_grouped_gemm.cu) -- one TMA descriptor per operand over the whole tensor, the
// weights' expert as B's third coordinate, a persistent tile scheduler over the group offsets on
// the device (sm90_contiguous_schedule.cuh), 2-CTA clusters multicasting W's tile -- around
// CUTLASS's blockwise-scaled mainloop collective, which multiplies each 128-deep K block's partial
// sums by scale_a[row, kb] * scale_b[n_block, kb] and adds them into FP32 accumulators in
// registers. CUTLASS's own grouped blockwise kernel (sm90_grouped_gemm_fp8_blockwise.cu) keeps a
// descriptor per group and operand and rewrites it in shared memory on every change of group.
//
// The scales: the producer warp group's second warp copies each stage's 128 row scales of A (one
// per tile row, from the rowwise [rows, K / 128] matrix at the tile's first row, which need not be
// a multiple of anything) and the stage's one scale of B with cp.async into the stage's scale
// slots, and arrives on the stage's full barrier when they land; the first warp's TMA brings the
// A and B tiles. Rows past the capacity read zeros (their results are never stored).
//
// The operands (both K-major, as FP8 GMMA needs):
//   fprop  A = X rowwise [rows, k], scales [rows, k / 128]; B = W rowwise [G, n, k] (N = n, K = k,
//          L = G), W's scales [G n / 128, k / 128]: block (g n / 128 + n_block, k_block).
//   dgrad  A = dY rowwise [rows, n], scales [rows, n / 128]; B = W's columnwise copy, W^T
//          [k, G n] (N = k, K = G n, L = 1), group g from K coordinate g n, with W's rowwise
//          scales: W_g^T's block (n_block, k_block) is W's (g n / 128 + k_block, n_block).
// Groups of any size (0, 1, odd); n and k multiples of 128 (whole weight blocks, as the recipe
// asks of every kernel).
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "src/cuda/gemm/sm90_contiguous_schedule.cuh"
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"
#include "src/cuda/gemm/sm90_warp_specialized.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace cute;
using contiguous::kTileM;
using contiguous::locate;
using contiguous::WorkTile;
using grouped_gemm_detail::Bf16;
using grouped_gemm_detail::E4M3;
using warp_specialized::aligned16;
using warp_specialized::kMaxGroups;
using warp_specialized::kThreads;

constexpr int kScaleBlock = 128;  // the recipe's block along K (and W's along N)
// The register split of the warp groups (the launch allocates 384 x 168): the producers keep 56,
// not the BF16 kernel's 40, for the scale warp's addresses (with 40 it spills), the consumers take
// 224 (their accumulators and the collective's partial sums are 128 a thread).
constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * 168,
              "setmaxnreg moves registers within the launch's allocation only");
// The threads that copy a stage's scales (the producer warp group's second warp): each arrives on
// the stage's full barrier once its copies land.
constexpr int kScaleThreads = 32;

// 128 x 128 x 128 tiles (one scale block of K per stage; the collective takes one B scale a tile,
// so 128 wide), as many stages as fit beside the staged tile and the schedule, kClusterM CTAs a
// cluster (as in the BF16 kernel: neighbouring M tiles sharing W's tile by multicast; a group's odd
// last M tile as two N blocks sharing A).
template <int kClusterM>
struct BlockwiseKernel {
  static constexpr int kN = 128;
  static constexpr int kPitch = kN + 8;  // the staged tile's row pitch (as the BF16 kernel's)
  // The shared memory beside the stages: the staged tile, the schedule, alignment slack.
  static constexpr int kCarveoutBytes =
      static_cast<int>(sizeof(Bf16) * kTileM * kPitch + sizeof(int) * (3 * kMaxGroups + 1) +
                       sizeof(warp_specialized::GroupScan::TempStorage)) +
      1024;
  using TileShape = Shape<Int<kTileM>, Int<kN>, Int<kScaleBlock>>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  static constexpr int kCluster = kClusterM;
  using Scales = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleBlock, kScaleBlock,
                                                           GMMA::Major::K, GMMA::Major::K>;
  using LayoutSFA = decltype(Scales::deduce_layoutSFA());
  using LayoutSFB = decltype(Scales::deduce_layoutSFB());
  template <class Cluster>
  using MainloopOf = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16, E4M3,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16, float, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<kCarveoutBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using Mainloop = MainloopOf<ClusterShape>;
  using MainloopShareA = MainloopOf<Shape<_1, Int<kClusterM>, _1>>;
  static_assert(std::is_same_v<typename Mainloop::MainloopPipeline,
                               typename MainloopShareA::MainloopPipeline> &&
                    sizeof(typename Mainloop::TensorStorage) ==
                        sizeof(typename MainloopShareA::TensorStorage),
                "both mainloops fill the same stages through the same pipeline");
  // The scales reach the stages by this file's copies, not by the collective's TMA.
  static_assert(!Mainloop::IsTmaLoadSFA && !Mainloop::IsTmaLoadSFB &&
                    Mainloop::ScaleMsPerTile == kTileM && Mainloop::ScaleNsPerTile == 1,
                "a stage holds one scale per tile row and one for B");
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;  // first: TMA's swizzled stages need the alignment
    alignas(16) Bf16 staged[kTileM * kPitch];
    typename Mainloop::PipelineStorage pipeline;
    int unit_start[kMaxGroups + 1];
    int row_begin[kMaxGroups];
    int row_end[kMaxGroups];
    warp_specialized::GroupScan::TempStorage scan;
  };
  static constexpr int kSharedBytes = static_cast<int>(sizeof(SharedStorage));
  static_assert(kSharedBytes <= 232448, "more shared memory than an H100/H200 SM has");

  struct Params {
    typename Mainloop::Params mainloop;
    typename MainloopShareA::Params mainloop_share_a;
    GroupedGemmDeviceArgs args;  // the offsets, the capacity and the fault word
    int gemm_m, gemm_n, gemm_k;  // gemm_m: the row capacity
    int n_tiles;
    Bf16* out;
    int64_t ld_out;
    const float* scale_a;  // [gemm_m, gemm_k / 128]
    const float* scale_b;  // W's [G n / 128, k / 128]
    // B's scale of (group, N block, K block): scale_b[g b_group + n_block b_n + k_block b_k]
    int64_t b_group, b_n, b_k;
    // B's descriptor spans (gemm_n, b_extent_k, b_extent_l); group g's B starts at K coordinate
    // g b_group_k and L coordinate g b_group_l (fprop: L = G; dgrad: K = G n)
    int b_extent_k, b_extent_l, b_group_k, b_group_l;
  };
};

// The producer's TMA loads of one tile's A and B through either mainloop (the scales: below).
template <class Mainloop, class K, class Pipeline, class State, class Storage>
__device__ __forceinline__ void load_tile(const typename K::Params& p,
                                          const typename Mainloop::Params& params,
                                          Pipeline& pipeline, State& write, Storage& storage,
                                          const WorkTile& w, int k_tiles, int lane, int rank) {
  Mainloop mainloop;
  Tensor m_a = params.tma_load_a.get_tma_tensor(make_shape(p.gemm_m, p.gemm_k, 1));
  Tensor m_b = params.tma_load_b.get_tma_tensor(make_shape(p.gemm_n, p.b_extent_k, p.b_extent_l));
  Tensor g_a = local_tile(domain_offset(make_coord(w.row0, 0, 0), m_a),
                          typename Mainloop::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
  Tensor g_b =
      local_tile(domain_offset(make_coord(0, w.group * p.b_group_k, w.group * p.b_group_l), m_b),
                 typename Mainloop::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
  // (the collective slices scale tensors too, though it loads none of them: they only need to be
  // well formed)
  Tensor m_sfa = make_tensor(make_gmem_ptr(p.scale_a), params.layout_SFA);
  Tensor m_sfb = make_tensor(make_gmem_ptr(p.scale_b), params.layout_SFB);
  auto k_tile_iter = cute::make_coord_iterator(shape<3>(g_a));
  mainloop.load(params, pipeline, write, cute::make_tuple(g_a, g_b, m_sfa, m_sfb),
                make_coord(0, w.n_block, _, 0), k_tile_iter, k_tiles, lane,
                static_cast<uint32_t>(rank),
                reinterpret_cast<typename Mainloop::TensorStorage&>(storage));
}

// 4 bytes from global memory into shared memory without the register file, or 4 zeros.
__device__ __forceinline__ void copy4_or_zeros(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared), "l"(global),
               "r"(valid ? 4 : 0)
               : "memory");
}

// The scale warp's copies for one tile: lane l copies, for each of the tile's K blocks, the scales
// of tile rows l, l + 32, l + 64 and l + 96 (zeros past the capacity), and lane 0 B's scale (zero
// for a CTA without a tile in its cluster's unit), then each lane arrives on the stage's full
// barrier when its copies land. `write` is the tile's first stage.
template <class K, class Pipeline, class State, class Storage>
__device__ __forceinline__ void load_scales(const typename K::Params& p, Pipeline& pipeline,
                                            State write, Storage& storage, const WorkTile& w,
                                            int k_tiles, int lane) {
  using Mainloop = typename K::Mainloop;
  // (row, k, stage) -> the stage's slot for the row's scale; (0, k, stage) -> B's
  Tensor s_sfa =
      make_tensor(make_smem_ptr(storage.smem_SFA.data()), typename Mainloop::SmemLayoutSFA{});
  Tensor s_sfb =
      make_tensor(make_smem_ptr(storage.smem_SFB.data()), typename Mainloop::SmemLayoutSFB{});
  constexpr int kRowsPerLane = kTileM / kScaleThreads;
  // (the producers run on 40 registers: one base address and a count of valid rows, not a pointer
  // per row)
  const int64_t k_blocks = p.gemm_k / kScaleBlock;
  const int64_t first_row = static_cast<int64_t>(w.row0) + lane;
  const int valid_rows =
      first_row < p.gemm_m
          ? static_cast<int>(min<int64_t>(
                kRowsPerLane, (p.gemm_m - first_row + kScaleThreads - 1) / kScaleThreads))
          : 0;
  const float* row_scales = p.scale_a + (valid_rows > 0 ? first_row * k_blocks : 0);
  const int64_t row_step = kScaleThreads * k_blocks;
  const bool b_valid = w.n_block < p.n_tiles;
  const float* b_scales = p.scale_b + (b_valid ? w.group * p.b_group + w.n_block * p.b_n : 0);
  for (int k = 0; k < k_tiles; ++k) {
    pipeline.producer_acquire(write);  // (not the leader: it only waits for the stage)
    const int stage = write.index();
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kRowsPerLane; ++j) {
      const bool valid = j < valid_rows;
      copy4_or_zeros(cute::cast_smem_ptr_to_uint(&s_sfa(lane + kScaleThreads * j, 0, stage)),
                     valid ? row_scales + j * row_step + k : p.scale_a, valid);
    }
    if (lane == 0) {
      copy4_or_zeros(cute::cast_smem_ptr_to_uint(&s_sfb(0, 0, stage)),
                     b_scales + (b_valid ? k * p.b_k : 0), b_valid);
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(
        reinterpret_cast<const uint64_t*>(pipeline.producer_get_barrier(write)));
    ++write;
  }
}

template <class K>
__global__ void __launch_bounds__(kThreads, 1)
    blockwise_contiguous_gemm_kernel(const __grid_constant__ typename K::Params p) {
  extern __shared__ char shared_bytes[];
  auto& s = *reinterpret_cast<typename K::SharedStorage*>(shared_bytes);
  const int thread = static_cast<int>(threadIdx.x);
  const int warp_group = thread / 128;
  const int warp_in_group = (thread / 32) % 4;
  const int groups = static_cast<int>(p.args.num_groups);
  contiguous::schedule_groups<K::kCluster>(p.args, thread, p.n_tiles, s.scan, s.unit_start,
                                           s.row_begin, s.row_end);

  // Producers: the first warp (its leader expects the TMA bytes) and the scale warp; a stage fills
  // on the leader's arrival, the TMA bytes and the scale warp's 32 arrivals.
  const auto pipeline_params = warp_specialized::pipeline_params<typename K::Pipeline>(
      thread, p.mainloop.tma_transaction_bytes, 32 + kScaleThreads, 1 + kScaleThreads);
  typename K::Pipeline pipeline(s.pipeline, pipeline_params, typename K::ClusterShape{});
  __syncthreads();  // the barriers initialized, the tile starts written
  warp_specialized::cluster_sync_after_init<K::kCluster>();
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  const int first_unit = static_cast<int>(blockIdx.x) / K::kCluster;
  const int unit_stride = static_cast<int>(gridDim.x) / K::kCluster;
  const int total_units = s.unit_start[groups];
  const int k_tiles = p.gemm_k / kScaleBlock;
  typename K::Mainloop mainloop;

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (warp_in_group == 1) {
      auto write = cutlass::make_producer_start_state<typename K::Pipeline>();
      for (int unit = first_unit; unit < total_units; unit += unit_stride) {
        const WorkTile w = locate<K::kCluster>(s.unit_start, s.row_begin, s.row_end, groups,
                                               p.n_tiles, unit, rank);
        load_scales<K>(p, pipeline, write, s.tensors, w, k_tiles, thread % 32);
        write.advance(k_tiles);
      }
      cute::cp_async_wait<0>();  // (no copy outlives its thread)
      return;
    }
    if (warp_in_group != 0) return;
    if (cute::elect_one_sync()) {
      cute::prefetch_tma_descriptor(p.mainloop.tma_load_a.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.mainloop.tma_load_b.get_tma_descriptor());
      if constexpr (K::kCluster > 1) {
        cute::prefetch_tma_descriptor(p.mainloop_share_a.tma_load_a.get_tma_descriptor());
        cute::prefetch_tma_descriptor(p.mainloop_share_a.tma_load_b.get_tma_descriptor());
      }
    }
    auto write = cutlass::make_producer_start_state<typename K::Pipeline>();
    for (int unit = first_unit; unit < total_units; unit += unit_stride) {
      const WorkTile w =
          locate<K::kCluster>(s.unit_start, s.row_begin, s.row_end, groups, p.n_tiles, unit, rank);
      if (K::kCluster > 1 && w.share_a) {
        load_tile<typename K::MainloopShareA, K>(p, p.mainloop_share_a, pipeline, write, s.tensors,
                                                 w, k_tiles, thread % 32, rank);
      } else {
        load_tile<typename K::Mainloop, K>(p, p.mainloop, pipeline, write, s.tensors, w, k_tiles,
                                           thread % 32, rank);
      }
      write.advance(k_tiles);
    }
    mainloop.load_tail(pipeline, write);
    return;
  }

  cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
  typename K::TiledMma tiled_mma;
  typename K::PipelineState read;
  const int mma_thread = thread - 128;
  const int consumer = mma_thread / 128;  // rows [64 consumer, 64 consumer + 64) of each tile
  const int in_group = mma_thread % 128;
  Tensor staged = make_tensor(
      make_smem_ptr(s.staged),
      make_layout(make_shape(Int<kTileM>{}, Int<K::kN>{}), make_stride(Int<K::kPitch>{}, _1{})));
  Tensor staged_of_thread = tiled_mma.get_thread_slice(mma_thread).partition_C(staged);
  for (int unit = first_unit; unit < total_units; unit += unit_stride) {
    const WorkTile w =
        locate<K::kCluster>(s.unit_start, s.row_begin, s.row_end, groups, p.n_tiles, unit, rank);
    auto accumulators = partition_fragment_C(tiled_mma, take<0, 2>(typename K::TileShape{}));
    if (w.rows <= 64 * consumer) {
      // None of this warp group's rows are the group's: it passes the stages on (as in the BF16
      // kernel), and nothing is stored.
      warp_specialized::pass_stages(pipeline, read, k_tiles);
      continue;
    }
    // (the collective adds each K block's scaled partial sums into these: they start at zero)
    clear(accumulators);
    mainloop.mma(pipeline, read, accumulators, k_tiles, mma_thread, s.tensors, p.mainloop);
    mainloop.mma_tail(pipeline, read, k_tiles);
    read.advance(k_tiles);

    contiguous::store_tile_rows<K::kN, K::kPitch>(accumulators, staged_of_thread, s.staged, w,
                                                  consumer, in_group, p.out, p.ld_out, p.gemm_n);
  }
}

// One mainloop's parameters for the call's operands: A's descriptor over (gm, gk, 1), B's over
// (gn, b_k, b_l).
template <class M, class K>
typename M::Params mainloop_params(const GroupedGemmDeviceArgs& a, const typename K::StrideA& da,
                                   const typename K::StrideB& db,
                                   const typename K::LayoutSFA& layout_sfa,
                                   const typename K::LayoutSFB& layout_sfb, int gm, int gn, int gk,
                                   int b_k, int b_l) {
  const typename M::Arguments operands{static_cast<const E4M3*>(a.a.data),
                                       da,
                                       static_cast<const E4M3*>(a.b.data),
                                       db,
                                       a.a.scale_inv,
                                       layout_sfa,
                                       a.b.scale_inv,
                                       layout_sfb};
  typename M::Params params =
      M::to_underlying_arguments(make_shape(gm, gn, gk, 1), operands, nullptr);
  params.tma_load_b =
      M::to_underlying_arguments(make_shape(gm, gn, b_k, b_l), operands, nullptr).tma_load_b;
  return params;
}

template <class K>
sfmoe_status run(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  const bool fprop = a.form == GroupedGemmForm::kFprop;
  const int64_t gemm_n = fprop ? a.n : a.k, gemm_k = fprop ? a.k : a.n;
  const int64_t m = a.row_capacity, groups = a.num_groups;
  // A [rows, K] K-major (one copy: L 1). B K-major: fprop (n, k, G), W_g [n, k] at g n k; dgrad
  // W^T (k, G n, 1), leading dimension a.b.rows = G n, group g at K coordinate g n.
  typename K::StrideA stride_a{};
  get<0>(stride_a) = gemm_k;
  get<2>(stride_a) = m * gemm_k;
  typename K::StrideB stride_b{};
  get<0>(stride_b) = fprop ? gemm_k : a.b.rows;
  get<2>(stride_b) = fprop ? a.n * a.k : a.b.rows * a.k;
  const int gm = static_cast<int>(m), gn = static_cast<int>(gemm_n), gk = static_cast<int>(gemm_k);
  const auto problem = make_shape(gm, gn, gk, 1);
  const typename K::LayoutSFA layout_sfa = K::Scales::tile_atom_to_shape_SFA(problem);
  const typename K::LayoutSFB layout_sfb = K::Scales::tile_atom_to_shape_SFB(problem);
  typename K::Params p;
  p.b_extent_k = fprop ? gk : static_cast<int>(groups * a.n);
  p.b_extent_l = fprop ? static_cast<int>(groups) : 1;
  p.b_group_k = fprop ? 0 : static_cast<int>(a.n);
  p.b_group_l = fprop ? 1 : 0;
  p.mainloop = mainloop_params<typename K::Mainloop, K>(
      a, stride_a, stride_b, layout_sfa, layout_sfb, gm, gn, gk, p.b_extent_k, p.b_extent_l);
  if constexpr (K::kCluster > 1) {  // (the descriptors multicasting A instead)
    p.mainloop_share_a = mainloop_params<typename K::MainloopShareA, K>(
        a, stride_a, stride_b, layout_sfa, layout_sfb, gm, gn, gk, p.b_extent_k, p.b_extent_l);
  }
  p.args = a;
  p.gemm_m = gm;
  p.gemm_n = gn;
  p.gemm_k = gk;
  p.n_tiles = static_cast<int>((gemm_n + K::kN - 1) / K::kN);
  p.out = static_cast<Bf16*>(a.out);
  p.ld_out = gemm_n;
  p.scale_a = a.a.scale_inv;
  p.scale_b = a.b.scale_inv;
  const int64_t w_k_blocks = a.k / kScaleBlock;
  p.b_group = (a.n / kScaleBlock) * w_k_blocks;
  p.b_n = fprop ? w_k_blocks : 1;
  p.b_k = fprop ? 1 : w_k_blocks;

  constexpr auto kKernel = blockwise_contiguous_gemm_kernel<K>;
  const int resident = warp_specialized::resident_clusters<kKernel, K::kCluster>(
      K::kSharedBytes, "blockwise_contiguous_gemm_kernel");
  if (resident < 1) return SFMOE_ERROR_CUDA;
  const int64_t unit_bound = contiguous::unit_bound(m, groups, p.n_tiles);
  const int64_t clusters = unit_bound < resident ? unit_bound : resident;
  if (clusters <= 0) return SFMOE_SUCCESS;
  return warp_specialized::launch_clusters<kKernel, K::kCluster>(
      p, clusters, K::kSharedBytes, stream, "blockwise_contiguous_gemm_kernel");
}

// 128 x 128 x 128: 32.5 KiB a stage (A, B and their scales), five beside the 34 KiB staged tile.
using Blockwise128 = BlockwiseKernel<1>;
using Blockwise128x2 = BlockwiseKernel<2>;
static_assert(Blockwise128::Mainloop::DispatchPolicy::Stages == 5, "the stages the notes state");

}  // namespace

bool contiguous_blockwise_gemm_runs(const GroupedGemmDeviceArgs& a) {
  const bool fprop = a.form == GroupedGemmForm::kFprop;
  const bool dgrad = a.form == GroupedGemmForm::kDgrad;
  const int64_t gemm_n = fprop ? a.n : a.k;
  // (the kernel counts its work tiles in int)
  const int64_t tile_bound = (a.row_capacity / kTileM + 1 + a.num_groups) * (gemm_n / 128 + 1);
  auto scales_aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; };
  return (fprop || dgrad) && tile_bound < (int64_t{1} << 31) &&
         a.a.scaling == SFMOE_SCALING_BLOCK_1X128 && a.b.scaling == SFMOE_SCALING_BLOCK_128X128 &&
         a.a.dtype == SFMOE_DTYPE_FP8_E4M3 && a.b.dtype == SFMOE_DTYPE_FP8_E4M3 &&
         a.out_dtype == SFMOE_DTYPE_BF16 && !a.a.columnwise && a.b.columnwise == dgrad &&
         (fprop || a.b.rows >= a.num_groups * a.n) && !a.accumulate && a.a_row_index == nullptr &&
         a.num_groups >= 1 && a.num_groups <= kMaxGroups && a.row_capacity >= 1 &&
         a.row_capacity <= (int64_t{1} << 30) && a.n >= kScaleBlock && a.k >= kScaleBlock &&
         a.n % kScaleBlock == 0 && a.k % kScaleBlock == 0 && a.n < (int64_t{1} << 30) &&
         a.k < (int64_t{1} << 30) && a.num_groups * a.n < (int64_t{1} << 31) &&
         aligned16(a.a.data) && aligned16(a.b.data) && aligned16(a.out) &&
         a.a.scale_inv != nullptr && a.b.scale_inv != nullptr && scales_aligned(a.a.scale_inv) &&
         scales_aligned(a.b.scale_inv);
}

sfmoe_status contiguous_blockwise_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                       cudaStream_t stream) {
  switch (tile) {
    case GemmTile::kBlockwiseContiguous128x128:
      return run<Blockwise128>(a, stream);
    case GemmTile::kBlockwiseContiguous128x128Cluster2:
      return run<Blockwise128x2>(a, stream);
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "not a tile of the blockwise contiguous GEMM");
  }
}

}  // namespace cuda
}  // namespace sfmoe
