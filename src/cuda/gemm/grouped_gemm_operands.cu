// The grouped GEMM as the backend table calls it (src/ops/backend.h): operands the kernels read as
// they lie go to launch_grouped_gemm; MXFP8 / NVFP4 operands (no block-scaled MMA on Hopper) are
// first decoded into BF16 in the workspace, after the kernels' part, by the dequantize kernels.
#include "src/common/error.h"
#include "src/common/grouped_gemm_args.h"
#include "src/cuda/backend.h"

namespace sfmoe {
namespace cuda {
namespace {

#if defined(SFMOE_WITH_CUTE)
// The copy the kernel reads, with the scales that go with it.
GemmDeviceOperand device_operand(const GemmOperand& o) {
  const GroupedQuantizeArgs& t = o.tensor;
  GemmDeviceOperand d{};
  d.data = o.columnwise ? t.columnwise : t.rowwise;
  d.dtype = t.dtype;
  d.scaling = t.scaling;
  d.columnwise = o.columnwise;
  d.rows = t.row_capacity;
  if (t.scaling == SFMOE_SCALING_TENSOR || t.scaling == SFMOE_SCALING_BLOCK_1X128) {
    d.scale_inv =
        static_cast<const float*>(o.columnwise ? t.columnwise_scale_inv : t.rowwise_scale_inv);
  } else if (t.scaling == SFMOE_SCALING_BLOCK_128X128) {  // W: the rowwise scales (same values)
    d.scale_inv = static_cast<const float*>(t.rowwise_scale_inv);
  }
  return d;
}

// `o` decoded into BF16 rows at `values` (the rowwise orientation), and the operand over them.
sfmoe_status decoded(const GemmOperand& o, void* values, void* stream, GemmOperand* out) {
  SFMOE_RETURN_IF_ERROR(grouped_dequantize(
      GroupedDequantizeArgs{o.tensor, o.columnwise, values, SFMOE_DTYPE_BF16}, stream));
  GroupedQuantizeArgs rows{};
  rows.dtype = SFMOE_DTYPE_BF16;
  rows.scaling = SFMOE_SCALING_NONE;
  rows.num_groups = o.tensor.num_groups;
  rows.cols = o.tensor.cols;
  rows.row_capacity = o.tensor.row_capacity;
  rows.row_alignment = o.tensor.row_alignment;
  rows.offsets = o.tensor.offsets;
  rows.uniform_rows = o.tensor.uniform_rows;
  rows.rowwise = values;
  *out = GemmOperand{rows, false};
  return SFMOE_SUCCESS;
}
#endif

}  // namespace

sfmoe_status grouped_gemm(const GroupedGemmArgs& g, void* stream) {
#if defined(SFMOE_WITH_CUTE)
  if (gemm_emulated_on_device(g.a.tensor.scaling) && gemm_emulated_on_device(g.b.tensor.scaling)) {
    const GemmEmulationWorkspace layout = gemm_emulation_workspace(
        grouped_gemm_workspace_bytes(g.num_groups), g.a.tensor.row_capacity, g.a.tensor.cols,
        g.b.tensor.row_capacity, g.b.tensor.cols);
    if (g.workspace_bytes < layout.total_bytes()) {
      return report(SFMOE_ERROR_INVALID_ARGUMENT,
                    "the workspace holds %lld bytes, the emulated operands need %lld",
                    static_cast<long long>(g.workspace_bytes),
                    static_cast<long long>(layout.total_bytes()));
    }
    uint8_t* base = static_cast<uint8_t*>(g.workspace);
    GroupedGemmArgs bf16 = g;
    SFMOE_RETURN_IF_ERROR(decoded(g.a, base + layout.kernel_bytes, stream, &bf16.a));
    SFMOE_RETURN_IF_ERROR(
        decoded(g.b, base + layout.kernel_bytes + layout.a_bytes, stream, &bf16.b));
    bf16.workspace_bytes = layout.kernel_bytes;  // the kernels' part leads the workspace
    return grouped_gemm(bf16, stream);
  }
  const GroupedGemmDeviceArgs d{g.form,
                                g.num_groups,
                                g.offsets,
                                g.row_capacity,
                                g.n,
                                g.k,
                                device_operand(g.a),
                                device_operand(g.b),
                                g.out,
                                g.out_dtype,
                                g.accumulate,
                                g.fast_accumulation,
                                g.workspace,
                                g.workspace_bytes,
                                g.word,
                                g.a_row_index,
                                g.a_source_rows};
  return launch_grouped_gemm(d, stream);
#else
  (void)g, (void)stream;
  return report(SFMOE_ERROR_UNSUPPORTED,
                "this build has no CUDA grouped GEMM (it needs the CUDA backend and CUTLASS)");
#endif
}

}  // namespace cuda
}  // namespace sfmoe
