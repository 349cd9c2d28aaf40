// Grouped GEMM on Hopper, sfmoe's own kernel (docs/grouped_gemm.md, "the contiguous kernel"):
// BF16 fprop and dgrad with one TMA descriptor per operand over the whole tensor -- A's rows as
// they lie, all groups in one [rows, K] tensor, and the weights as one [G, N, K] tensor whose third
// coordinate is the expert -- and a persistent tile scheduler that reads the group offsets on the
// device. CUTLASS's ptr-array kernels instead hold a descriptor per group and operand and rewrite
// it in shared memory whenever a tile changes group.
//
// The work: each group's rows in 128-row tiles from the group's own first row (the offsets need no
// alignment and nothing is padded). A tile's last rows may belong to the next group, or lie past
// the capacity (TMA reads those as zeros); they are computed and never stored. Group g owns the
// units of work [unit_start[g], unit_start[g + 1]) (units_of_group below), its M tiles fastest, so
// the CTAs of one wave share the group's B tiles and its rows in L2.
//
// The pieces: CUTLASS's warp-specialized TMA + GMMA mainloop collective (one producer warp issuing
// TMA loads into a multi-stage shared-memory pipeline, two consumer warp groups each running
// 64 x kTileN wgmma over their half of the tile), inside this file's kernel: the scheduler, the
// coordinates of A and B per tile (the group's first row, the expert), and an epilogue that stages
// the BF16 tile in shared memory and writes the group's rows only, with 16-byte stores.
//
// In 2-CTA clusters the two CTAs take neighbouring M tiles of one group and N block and each loads
// half of W's tile, multicast into both (the GPU runs these GEMMs at its power limit, so the L2
// traffic saved buys clock); a group's odd last M tile the pair takes as two N blocks, each CTA
// loading half of the A tile into both. A warp group none of whose 64 rows are the group's passes
// the pipeline stages on without MMAs, so a group's last tile of at most 64 rows costs about half
// a tile.
//
// Gathered A (a_row_index): A's rows read straight from a source matrix (the tokens a permutation
// would have copied into expert order), so the permuted rows are never written and read back. TMA
// on Hopper moves boxes, not lists of rows, so all four warps of the producer warp group copy the
// tile's rows with cp.async, 16 bytes a thread and 128 contiguous bytes a row segment (eight
// lanes a row), into the same swizzled stage layout the TMA would have written, zeros for rows
// without a source; each thread's copies arrive on the stage's full barrier when they land
// (cp.async.mbarrier.arrive.noinc: the barrier counts 128 such arrivals besides the TMA thread's),
// so the producers never wait for their own copies. B comes by TMA as before (multicast in
// clusters); a group's odd last tile, where the pair would share A, loads B whole in each CTA.
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <cutlass/pipeline/pipeline.hpp>

#include "src/cuda/gemm/sm90_contiguous_schedule.cuh"
#include "src/cuda/gemm/sm90_grouped_gemm_kernels.cuh"
#include "src/cuda/gemm/sm90_warp_specialized.cuh"

namespace sfmoe {
namespace cuda {
namespace {

using namespace cute;
using grouped_gemm_detail::Bf16;

using contiguous::kTileM;
using contiguous::locate;
using contiguous::WorkTile;
using warp_specialized::aligned16;
using warp_specialized::kConsumerRegisters;
using warp_specialized::kMaxGroups;
using warp_specialized::kProducerRegisters;
using warp_specialized::kThreads;

// The kernel for one form: B K-major (fprop: W_g [n, k]) or N-major (dgrad: W_g read as [K = n,
// N = k]), a kTileM x kTileN tile, kStages pipeline stages, and kClusterM CTAs a cluster: the
// cluster's CTAs take neighbouring M tiles of one group and N block, and each loads its share of
// the B tile with TMA multicast into all of them (B's traffic from L2 divided by kClusterM); where
// they take neighbouring N blocks of one M tile instead (a group's odd last tile), they multicast
// A through a second pair of descriptors (MainloopShareA: the same tiles, stages and pipeline).
template <class LayoutB, int kTileN, int kStages, int kClusterM = 1, bool kGatherA = false>
struct ContiguousKernel {
  static constexpr bool kGather = kGatherA;
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, _64>;
  using ClusterShape = Shape<Int<kClusterM>, _1, _1>;
  static constexpr int kCluster = kClusterM;
  template <class Cluster>
  using MainloopOf = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, 8, Bf16,
      LayoutB, 8, float, TileShape, Cluster, cutlass::gemm::collective::StageCount<kStages>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = MainloopOf<ClusterShape>;
  using MainloopShareA = MainloopOf<Shape<_1, Int<kClusterM>, _1>>;
  static_assert(std::is_same_v<typename Mainloop::MainloopPipeline,
                               typename MainloopShareA::MainloopPipeline> &&
                    sizeof(typename Mainloop::TensorStorage) ==
                        sizeof(typename MainloopShareA::TensorStorage),
                "both mainloops fill the same stages through the same pipeline");
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;
  // The staged tile's row pitch: 16 bytes of padding put a fragment's 8 rows on distinct banks.
  static constexpr int kN = kTileN;
  static constexpr int kPitch = kTileN + 8;

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
    // kGather: A's row r is row a_row_index[r] of a_source ([a_source_rows, gemm_k]), or zeros.
    const int32_t* a_row_index;
    const Bf16* a_source;
    int a_source_rows;
  };
  // The bytes a stage's TMA brings when A is gathered: the B tile only.
  static constexpr uint32_t kGatherTransactionBytes = kTileN * 64 * sizeof(Bf16);
};

// The producer's loads of one tile through either mainloop.
template <class Mainloop, class Params, class Pipeline, class State, class Storage>
__device__ __forceinline__ void load_tile(const Params& params, Pipeline& pipeline, State& write,
                                          Storage& storage, int gemm_m, int gemm_n, int gemm_k,
                                          int groups, const WorkTile& w, int k_tiles, int lane,
                                          int rank) {
  Mainloop mainloop;
  Tensor m_a = params.tma_load_a.get_tma_tensor(make_shape(gemm_m, gemm_k, 1));
  Tensor m_b = params.tma_load_b.get_tma_tensor(make_shape(gemm_n, gemm_k, groups));
  // A from the tile's first row, B at the group's expert: one descriptor each, new coordinates.
  Tensor g_a = local_tile(domain_offset(make_coord(w.row0, 0, 0), m_a),
                          typename Mainloop::TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
  Tensor g_b = local_tile(domain_offset(make_coord(0, 0, w.group), m_b),
                          typename Mainloop::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
  auto k_tile_iter = cute::make_coord_iterator(shape<3>(g_a));
  mainloop.load(params, pipeline, write, cute::make_tuple(g_a, g_b), make_coord(0, w.n_block, _, 0),
                k_tile_iter, k_tiles, lane, static_cast<uint32_t>(rank),
                reinterpret_cast<typename Mainloop::TensorStorage&>(storage));
}

// 16 bytes from global memory into shared memory without the register file, or 16 zeros.
__device__ __forceinline__ void copy16_or_zeros(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}

// The producer warp group's loads of one tile with A gathered (kGather): thread t of 128 copies,
// for each of the tile's k blocks, 16-byte chunk t % 8 of rows 16 j + t / 8 (j < 8) -- eight lanes
// read a row's 128 contiguous bytes -- into the stage's swizzled A tile, zeros past the group's
// rows, for a source index outside the source, or past K; thread 0 loads B by TMA as the
// collective does (its share, multicast, in a B-sharing cluster). `write` is the tile's first
// stage (the caller advances past its k_tiles).
template <class K, class Mainloop, class Params, class Pipeline, class State, class Storage>
__device__ __forceinline__ void gather_tile(const typename K::Params& p, const Params& params,
                                            Pipeline& pipeline, State write, Storage& storage,
                                            int groups, const WorkTile& w, int k_tiles, int thread,
                                            int rank) {
  using ClusterShape = typename Mainloop::DispatchPolicy::ClusterShape;
  Tensor s_a = make_tensor(make_smem_ptr(storage.smem_A.data()), typename Mainloop::SmemLayoutA{});
  Tensor s_b = make_tensor(make_smem_ptr(storage.smem_B.data()), typename Mainloop::SmemLayoutB{});
  // B as the collective partitions it: this CTA's slice of the tile (its share of a multicast).
  constexpr int kClusterX = size<0>(ClusterShape{});
  const int block_x = rank % kClusterX, block_y = rank / kClusterX;
  Tensor m_b = params.tma_load_b.get_tma_tensor(make_shape(p.gemm_n, p.gemm_k, groups));
  Tensor g_b = local_tile(domain_offset(make_coord(0, 0, w.group), m_b),
                          typename Mainloop::TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
  auto block_tma_b = params.tma_load_b.get_slice(block_x);
  Tensor t_gb = block_tma_b.partition_S(g_b(_, _, w.n_block, _, 0));  // (TMA, TMA_N, TMA_K, k)
  Tensor t_sb = block_tma_b.partition_D(s_b);                         // (TMA, TMA_N, TMA_K, PIPE)
  uint16_t multicast_b = 0;
  if constexpr (is_same_v<typename Mainloop::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
    auto block_layout = Layout<ClusterShape>{};  // (m, n) -> block id
    for (int m = 0; m < size<0>(block_layout); ++m) {
      multicast_b |= static_cast<uint16_t>(1u << block_layout(m, block_y, Int<0>{}));
    }
  }
  // This thread's eight rows and their sources (nullptr: a zero row).
  const int chunk = thread % 8, first = thread / 8;
  const Bf16* source[8];
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < 8; ++j) {
    const int r = 16 * j + first;
    const int index = r < w.rows ? p.a_row_index[w.row0 + r] : -1;
    source[j] = index >= 0 && index < p.a_source_rows
                    ? p.a_source + static_cast<int64_t>(index) * p.gemm_k
                    : nullptr;
  }
  for (int k = 0; k < k_tiles; ++k) {
    pipeline.producer_acquire(write);  // every thread waits; thread 0 expects B's bytes
    const int stage = write.index();
    auto* full = pipeline.producer_get_barrier(write);
    if (thread == 0) {
      copy(params.tma_load_b.with(*full, multicast_b), t_gb(_, _, _, k), t_sb(_, _, _, stage));
    }
    const int col = k * 64 + chunk * 8;
    const bool in_k = col < p.gemm_k;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 8; ++j) {
      const bool valid = in_k && source[j] != nullptr;
      copy16_or_zeros(cute::cast_smem_ptr_to_uint(&s_a(16 * j + first, chunk * 8, stage)),
                      valid ? static_cast<const void*>(source[j] + col) : p.a_source, valid);
    }
    cutlass::arch::cpasync_barrier_arrive_noinc(reinterpret_cast<const uint64_t*>(full));
    ++write;
  }
}

template <class K>
__global__ void __launch_bounds__(kThreads, 1)
    contiguous_grouped_gemm_kernel(const __grid_constant__ typename K::Params p) {
  extern __shared__ char shared_bytes[];
  auto& s = *reinterpret_cast<typename K::SharedStorage*>(shared_bytes);
  const int thread = static_cast<int>(threadIdx.x);
  const int warp_group = thread / 128;
  const int warp_in_group = (thread / 32) % 4;
  const int groups = static_cast<int>(p.args.num_groups);

  contiguous::schedule_groups<K::kCluster>(p.args, thread, p.n_tiles, s.scan, s.unit_start,
                                           s.row_begin, s.row_end);

  // (gathering: the producer warp group's 128 threads arrive on each stage besides the TMA)
  const auto pipeline_params = K::kGather ? warp_specialized::pipeline_params<typename K::Pipeline>(
                                                thread, K::kGatherTransactionBytes, 128, 1 + 128)
                                          : warp_specialized::pipeline_params<typename K::Pipeline>(
                                                thread, p.mainloop.tma_transaction_bytes);
  typename K::Pipeline pipeline(s.pipeline, pipeline_params, typename K::ClusterShape{});
  __syncthreads();  // the barriers initialized, the tile starts written
  warp_specialized::cluster_sync_after_init<K::kCluster>();
  const int rank = K::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  // The cluster's CTAs walk the same units (each its own tile of them).
  const int first_unit = static_cast<int>(blockIdx.x) / K::kCluster;
  const int unit_stride = static_cast<int>(gridDim.x) / K::kCluster;

  const int total_units = s.unit_start[groups];
  const int k_tiles = (p.gemm_k + 63) / 64;
  typename K::Mainloop mainloop;
  if (warp_group == 0) {
    // (The producers keep 40 registers also when they gather: the consumers' 232 take the rest of
    // the CTA's launch allocation, 384 x 168, and setmaxnreg can only move registers within it --
    // with more left to the producers, the consumers' request would wait forever.)
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if constexpr (K::kGather) {
      if (thread == 0) {
        cute::prefetch_tma_descriptor(p.mainloop.tma_load_b.get_tma_descriptor());
        if constexpr (K::kCluster > 1) {
          cute::prefetch_tma_descriptor(p.mainloop_share_a.tma_load_b.get_tma_descriptor());
        }
      }
      auto write = cutlass::make_producer_start_state<typename K::Pipeline>();
      for (int unit = first_unit; unit < total_units; unit += unit_stride) {
        const WorkTile w = locate<K::kCluster>(s.unit_start, s.row_begin, s.row_end, groups,
                                               p.n_tiles, unit, rank);
        if (K::kCluster > 1 && w.share_a) {  // (each CTA gathers its own A; B whole)
          gather_tile<K, typename K::MainloopShareA>(p, p.mainloop_share_a, pipeline, write,
                                                     s.tensors, groups, w, k_tiles, thread, rank);
        } else {
          gather_tile<K, typename K::Mainloop>(p, p.mainloop, pipeline, write, s.tensors, groups, w,
                                               k_tiles, thread, rank);
        }
        write.advance(k_tiles);
      }
      cute::cp_async_wait<0>();  // (no copy outlives its thread)
      if (warp_in_group == 0) mainloop.load_tail(pipeline, write);
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
        load_tile<typename K::MainloopShareA>(p.mainloop_share_a, pipeline, write, s.tensors,
                                              p.gemm_m, p.gemm_n, p.gemm_k, groups, w, k_tiles,
                                              thread % 32, rank);
      } else {
        load_tile<typename K::Mainloop>(p.mainloop, pipeline, write, s.tensors, p.gemm_m, p.gemm_n,
                                        p.gemm_k, groups, w, k_tiles, thread % 32, rank);
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
      // None of this warp group's rows are the group's (a group's last tile, or no tile for this
      // CTA in its cluster's unit): it only passes the stages on, so the other warp group's MMAs
      // run alone at the tensor cores, and nothing is stored.
      warp_specialized::pass_stages(pipeline, read, k_tiles);
      continue;
    }
    mainloop.mma(pipeline, read, accumulators, k_tiles, mma_thread, s.tensors, p.mainloop);
    mainloop.mma_tail(pipeline, read, k_tiles);
    read.advance(k_tiles);

    contiguous::store_tile_rows<K::kN, K::kPitch>(accumulators, staged_of_thread, s.staged, w,
                                                  consumer, in_group, p.out, p.ld_out, p.gemm_n);
  }
}

template <class K>
sfmoe_status run(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  const bool fprop = a.form == GroupedGemmForm::kFprop;
  const int64_t gemm_n = fprop ? a.n : a.k, gemm_k = fprop ? a.k : a.n;
  const int64_t m = a.row_capacity, groups = a.num_groups;
  using Mainloop = typename K::Mainloop;
  // fprop: A = X [rows, k] and B = W_g [n, k], both K-major; dgrad: A = dY [rows, n] K-major and
  // B = W_g [n, k] read as [K = n, N = k], N-major. A's L mode is one copy (size 1).
  typename K::StrideA stride_a{};
  get<0>(stride_a) = gemm_k;
  get<2>(stride_a) = m * gemm_k;
  typename K::StrideB stride_b{};
  if constexpr (is_static<remove_cvref_t<decltype(get<0>(stride_b))>>::value) {
    get<1>(stride_b) = gemm_n;  // N-major: K's stride is N
  } else {
    get<0>(stride_b) = gemm_k;  // K-major: N's stride is K
  }
  get<2>(stride_b) = a.n * a.k;
  const typename Mainloop::Arguments operands{static_cast<const Bf16*>(a.a.data), stride_a,
                                              static_cast<const Bf16*>(a.b.data), stride_b};
  const int gm = static_cast<int>(m), gn = static_cast<int>(gemm_n), gk = static_cast<int>(gemm_k);
  typename K::Params p;
  // (the mainloop's one problem shape sets both descriptors' L: A's from L = 1, B's from L = G)
  p.mainloop = Mainloop::to_underlying_arguments(make_shape(gm, gn, gk, 1), operands, nullptr);
  p.mainloop.tma_load_b = Mainloop::to_underlying_arguments(
                              make_shape(gm, gn, gk, static_cast<int>(groups)), operands, nullptr)
                              .tma_load_b;
  if constexpr (K::kCluster > 1) {  // (the descriptors multicasting A instead)
    using ShareA = typename K::MainloopShareA;
    const typename ShareA::Arguments share_a{static_cast<const Bf16*>(a.a.data), stride_a,
                                             static_cast<const Bf16*>(a.b.data), stride_b};
    p.mainloop_share_a =
        ShareA::to_underlying_arguments(make_shape(gm, gn, gk, 1), share_a, nullptr);
    p.mainloop_share_a.tma_load_b =
        ShareA::to_underlying_arguments(make_shape(gm, gn, gk, static_cast<int>(groups)), share_a,
                                        nullptr)
            .tma_load_b;
  }
  p.args = a;
  p.gemm_m = gm;
  p.gemm_n = gn;
  p.gemm_k = gk;
  p.n_tiles = static_cast<int>((gemm_n + K::kN - 1) / K::kN);
  p.out = static_cast<Bf16*>(a.out);
  p.ld_out = gemm_n;
  p.a_row_index = a.a_row_index;
  p.a_source = static_cast<const Bf16*>(a.a.data);
  p.a_source_rows = static_cast<int>(a.a_source_rows);

  // Persistent: as many clusters as fit on the GPU at once (one CTA an SM), or fewer when the
  // units' bound (below) is smaller.
  constexpr auto kKernel = contiguous_grouped_gemm_kernel<K>;
  const int resident = warp_specialized::resident_clusters<kKernel, K::kCluster>(
      K::kSharedBytes, "contiguous_grouped_gemm_kernel");
  if (resident < 1) return SFMOE_ERROR_CUDA;
  // (a cluster's unit is at most one tile each; every group adds at most one partial M tile)
  const int64_t unit_bound = contiguous::unit_bound(m, groups, p.n_tiles);
  const int64_t clusters = unit_bound < resident ? unit_bound : resident;
  if (clusters <= 0) return SFMOE_SUCCESS;
  return warp_specialized::launch_clusters<kKernel, K::kCluster>(
      p, clusters, K::kSharedBytes, stream, "contiguous_grouped_gemm_kernel");
}

// 128 x 256: 48 KiB a stage, three of them beside the 66 KiB staged tile; 128 x 192: 40 KiB a
// stage, four beside 50 KiB; 128 x 128: 32 KiB a stage, five.
using Fprop256 = ContiguousKernel<cutlass::layout::ColumnMajor, 256, 3>;
using Dgrad256 = ContiguousKernel<cutlass::layout::RowMajor, 256, 3>;
using Fprop192 = ContiguousKernel<cutlass::layout::ColumnMajor, 192, 4>;
using Dgrad192 = ContiguousKernel<cutlass::layout::RowMajor, 192, 4>;
// (2-CTA clusters multicasting B)
using Fprop256x2 = ContiguousKernel<cutlass::layout::ColumnMajor, 256, 3, 2>;
using Dgrad256x2 = ContiguousKernel<cutlass::layout::RowMajor, 256, 3, 2>;
using Fprop192x2 = ContiguousKernel<cutlass::layout::ColumnMajor, 192, 4, 2>;
using Dgrad192x2 = ContiguousKernel<cutlass::layout::RowMajor, 192, 4, 2>;
using Fprop128 = ContiguousKernel<cutlass::layout::ColumnMajor, 128, 5>;
using Dgrad128 = ContiguousKernel<cutlass::layout::RowMajor, 128, 5>;

// Each of them with A gathered (a_row_index).
template <class K>
struct Gathered;
template <class LayoutB, int kTileN, int kStages, int kClusterM>
struct Gathered<ContiguousKernel<LayoutB, kTileN, kStages, kClusterM, false>> {
  using type = ContiguousKernel<LayoutB, kTileN, kStages, kClusterM, true>;
};

// The launch of a tile's kernel for the form, its rows as they lie or gathered.
template <class Fprop, class Dgrad>
sfmoe_status run_form(const GroupedGemmDeviceArgs& a, cudaStream_t stream) {
  const bool fprop = a.form == GroupedGemmForm::kFprop;
  if (a.a_row_index != nullptr) {
    return fprop ? run<typename Gathered<Fprop>::type>(a, stream)
                 : run<typename Gathered<Dgrad>::type>(a, stream);
  }
  return fprop ? run<Fprop>(a, stream) : run<Dgrad>(a, stream);
}

}  // namespace

bool contiguous_grouped_gemm_runs(const GroupedGemmDeviceArgs& a) {
  const bool fprop = a.form == GroupedGemmForm::kFprop;
  const int64_t gemm_n = fprop ? a.n : a.k, gemm_k = fprop ? a.k : a.n;
  // (the kernel counts its work tiles in int: their bound, every group adding at most one partial
  // M tile, times the N tiles of the narrower 128 tile, must fit)
  const int64_t tile_bound = (a.row_capacity / kTileM + 1 + a.num_groups) * (gemm_n / 128 + 1);
  return (fprop || a.form == GroupedGemmForm::kDgrad) && tile_bound < (int64_t{1} << 31) &&
         a.a.scaling == SFMOE_SCALING_NONE && a.b.scaling == SFMOE_SCALING_NONE &&
         a.a.dtype == SFMOE_DTYPE_BF16 && a.b.dtype == SFMOE_DTYPE_BF16 &&
         a.out_dtype == SFMOE_DTYPE_BF16 && !a.a.columnwise && !a.b.columnwise && !a.accumulate &&
         a.num_groups >= 1 && a.num_groups <= kMaxGroups && a.row_capacity >= 1 &&
         a.row_capacity <= (int64_t{1} << 30) && gemm_n >= 8 && gemm_k >= 8 && gemm_n % 8 == 0 &&
         gemm_k % 8 == 0 && gemm_n < (int64_t{1} << 30) && gemm_k < (int64_t{1} << 30) &&
         aligned16(a.a.data) && aligned16(a.b.data) && aligned16(a.out) &&
         (a.a_row_index == nullptr || (a.a_source_rows >= 0 && a.a_source_rows <= INT32_MAX));
}

sfmoe_status contiguous_grouped_gemm(const GroupedGemmDeviceArgs& a, GemmTile tile,
                                     cudaStream_t stream) {
  switch (tile) {
    case GemmTile::kContiguous128x256:
      return run_form<Fprop256, Dgrad256>(a, stream);
    case GemmTile::kContiguous128x192:
      return run_form<Fprop192, Dgrad192>(a, stream);
    case GemmTile::kContiguous128x128:
      return run_form<Fprop128, Dgrad128>(a, stream);
    case GemmTile::kContiguous128x256Cluster2:
      return run_form<Fprop256x2, Dgrad256x2>(a, stream);
    case GemmTile::kContiguous128x192Cluster2:
      return run_form<Fprop192x2, Dgrad192x2>(a, stream);
    default:
      return report(SFMOE_ERROR_UNSUPPORTED, "not a tile of the contiguous grouped GEMM");
  }
}

}  // namespace cuda
}  // namespace sfmoe
