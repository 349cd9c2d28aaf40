// sfmoe_grouped_gemm: validate, then run the backend where the tensors live
// (docs/grouped_gemm.md).
#include "sfmoe/grouped_gemm.h"

#include <stdint.h>
#include <string.h>

#include <vector>

#include "sfmoe/quantize.h"
#include "src/api/quantize_common.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/common/grouped_gemm_args.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

namespace sfmoe {
namespace {

// An operand of `cols` columns on the host: FP32, BF16 or FP16 rows, or a quantized grouped
// tensor holding the copy this form reads (`columnwise`).
sfmoe_status expect_operand(const char* context, const char* name, const sfmoe_grouped_tensor* t,
                            int64_t cols, bool columnwise = false) {
  SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, name, t));
  if (t->scaling == SFMOE_SCALING_NONE) {
    if (t->dtype != SFMOE_DTYPE_FP32 && t->dtype != SFMOE_DTYPE_BF16 &&
        t->dtype != SFMOE_DTYPE_FP16) {
      return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: %s must be fp32, bf16 or fp16 (or quantized)",
                  context, name);
    }
    if (t->rowwise_data == nullptr) {
      return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s needs its rowwise data", context, name);
    }
  } else if ((columnwise ? t->columnwise_data : t->rowwise_data) == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: this form reads the %s copy of %s, which is absent",
                context, columnwise ? "columnwise" : "rowwise", name);
  }
  if (t->cols != cols) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s has %lld cols, expected %lld", context, name,
                static_cast<long long>(t->cols), static_cast<long long>(cols));
  }
  return SFMOE_SUCCESS;
}

// A uniform weight-shaped tensor: num_groups groups of n rows.
sfmoe_status expect_weights(const char* context, const char* name, const sfmoe_grouped_tensor* t,
                            int64_t groups, int64_t n) {
  if (t->num_groups != groups || t->uniform_group_rows != n || t->row_capacity < groups * n) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: %s must hold %lld uniform groups of %lld rows",
                context, name, static_cast<long long>(groups), static_cast<long long>(n));
  }
  return SFMOE_SUCCESS;
}

// An operand as the backends take it. `decoded`: the backend decodes it (the host reference, the
// device's emulated recipes), so a quantized tensor is checked as a dequantize input is (its
// scales and amax present) and carries the Hadamard option; the device kernels read the other
// recipes as they lie, checked by run_on_device.
sfmoe_status gemm_operand(const char* context, const char* name, const sfmoe_grouped_tensor* t,
                          bool columnwise, bool hadamard, bool decoded, GemmOperand* out) {
  out->columnwise = columnwise;
  GroupedQuantizeArgs& q = out->tensor;
  if (decoded && t->scaling != SFMOE_SCALING_NONE) {
    sfmoe_quantize_config config = sfmoe_quantize_config_init();
    config.hadamard_columnwise = hadamard ? 1 : 0;
    return describe_quantized(context, name, t, config, &q);
  }
  memset(&q, 0, sizeof(q));
  q.dtype = t->dtype;
  q.scaling = t->scaling;
  q.scale_layout = t->scale_layout;
  q.num_groups = t->num_groups;
  q.cols = t->cols;
  q.row_capacity = t->row_capacity;
  q.row_alignment = t->row_alignment;
  q.offsets = t->group_offsets;
  q.uniform_rows = t->group_offsets ? 0 : t->uniform_group_rows;
  q.rowwise = t->rowwise_data;
  q.rowwise_scale_inv = t->rowwise_scale_inv;
  q.columnwise = t->columnwise_data;
  q.columnwise_scale_inv = t->columnwise_scale_inv;
  q.amax = t->amax;
  q.columnwise_amax = t->columnwise_amax;
  return SFMOE_SUCCESS;
}

// The operands and a's offsets of a validated call: the copy each form reads
// (docs/grouped_gemm.md); in wgrad b's rows are grouped by a's offsets.
sfmoe_status complete_args(const char* context, const sfmoe_grouped_tensor* a,
                           const sfmoe_grouped_tensor* b, const sfmoe_grouped_gemm_config* config,
                           bool a_columnwise, bool b_columnwise, bool decoded,
                           GroupedGemmArgs* args) {
  const bool hadamard = config->hadamard_columnwise != 0;
  SFMOE_RETURN_IF_ERROR(gemm_operand(context, "a", a, a_columnwise, hadamard, decoded, &args->a));
  SFMOE_RETURN_IF_ERROR(gemm_operand(context, "b", b, b_columnwise, hadamard, decoded, &args->b));
  if (config->form == SFMOE_GEMM_WGRAD) {
    args->b.tensor.offsets = a->group_offsets;
    args->b.tensor.uniform_rows = 0;
  }
  args->offsets = a->group_offsets;
  args->row_capacity = a->row_capacity;
  return SFMOE_SUCCESS;
}

// fprop and dgrad: out's offsets receive a's (its rows are a's rows).
sfmoe_status copy_out_offsets(const ops::Backend& backend, const sfmoe_grouped_tensor* a,
                              const sfmoe_grouped_gemm_config* config,
                              const sfmoe_grouped_tensor* out, void* stream) {
  if (config->form == SFMOE_GEMM_WGRAD || out->group_offsets == nullptr ||
      out->group_offsets == a->group_offsets || out->uniform_group_rows != 0) {
    return SFMOE_SUCCESS;
  }
  return backend.copy(out->group_offsets, a->group_offsets, sizeof(int64_t) * (a->num_groups + 1),
                      stream);
}

// The device path's extra requirements (docs/grouped_gemm.md), then the launch.
sfmoe_status run_on_device(const char* context, const sfmoe_grouped_tensor* a,
                           const sfmoe_grouped_tensor* b, const sfmoe_grouped_gemm_config* config,
                           const sfmoe_grouped_tensor* out, GroupedGemmArgs args,
                           const sfmoe_tensor* workspace, sfmoe_status_word* word, void* stream) {
#if defined(SFMOE_WITH_CUDA) && defined(SFMOE_WITH_CUTE)
  // MXFP8 / NVFP4 (emulated): the copy each form reads (the one the host reference decodes)
  // decoded into BF16 in the workspace by the backend, then the BF16 kernels. MXFP8 values (E4M3
  // or E5M2 times a power of two) are exact in BF16 unless they fall among BF16's subnormals
  // (below 2^-126), where they may round; NVFP4 values times their global decode scale are
  // rounded to BF16 once. In wgrad b is decoded with a's offsets, which the GEMM takes for both.
  const bool emulated = gemm_emulated_on_device(a->scaling) && gemm_emulated_on_device(b->scaling);
  // Operands: both BF16 rows; both FP8 per-tensor (B E4M3; A E4M3, or E5M2 for gradients); or
  // FP8 blockwise, the DeepSeek-V3 recipe (A 1x128, B = W 128x128, both E4M3; in wgrad B = X
  // 1x128).
  const bool fp8 = a->scaling == SFMOE_SCALING_TENSOR && b->scaling == SFMOE_SCALING_TENSOR &&
                   (a->dtype == SFMOE_DTYPE_FP8_E4M3 || a->dtype == SFMOE_DTYPE_FP8_E5M2) &&
                   b->dtype == SFMOE_DTYPE_FP8_E4M3;
  // (wgrad's b is X, rows like a: 1x128 as well.)
  const bool blockwise =
      a->scaling == SFMOE_SCALING_BLOCK_1X128 &&
      b->scaling == (config->form == SFMOE_GEMM_WGRAD ? SFMOE_SCALING_BLOCK_1X128
                                                      : SFMOE_SCALING_BLOCK_128X128) &&
      a->dtype == SFMOE_DTYPE_FP8_E4M3 && b->dtype == SFMOE_DTYPE_FP8_E4M3;
  const bool bf16 = a->scaling == SFMOE_SCALING_NONE && b->scaling == SFMOE_SCALING_NONE &&
                    a->dtype == SFMOE_DTYPE_BF16 && b->dtype == SFMOE_DTYPE_BF16;
  if (!fp8 && !blockwise && !bf16 && !emulated) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the CUDA grouped GEMM takes BF16 x BF16, FP8 per-tensor (E4M3 or E5M2 x "
                "E4M3), FP8 blockwise (E4M3 1x128 rows x E4M3 128x128 weights; 1x128 x 1x128 in "
                "wgrad) or MXFP8 / NVFP4 (emulated) operands; other pairings run on the host",
                context);
  }
  if (out->dtype != SFMOE_DTYPE_BF16 && out->dtype != SFMOE_DTYPE_FP32) {
    return fail(SFMOE_ERROR_UNSUPPORTED, "%s: the CUDA grouped GEMM writes BF16 or FP32", context);
  }
  if (args.a_row_index != nullptr && (!bf16 || out->dtype != SFMOE_DTYPE_BF16)) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the CUDA grouped GEMM gathers A's rows (a_row_index) with BF16 a, b and out "
                "only",
                context);
  }
  // TMA: 16-byte rows and bases; blockwise: whole 128 x 128 weight blocks per group.
  const int64_t multiple = blockwise ? 128 : (fp8 ? 16 : 8);
  if (args.n % multiple != 0 || args.k % multiple != 0 || args.n > INT32_MAX ||
      args.k > INT32_MAX || a->row_capacity > INT32_MAX || a->num_groups > INT32_MAX) {
    return fail(SFMOE_ERROR_UNSUPPORTED,
                "%s: the CUDA grouped GEMM needs n and k multiples of %lld (%s) and n, k, a's "
                "row_capacity and the group count below 2^31 (n = %lld, k = %lld, row_capacity "
                "= %lld, num_groups = %lld)",
                context, static_cast<long long>(multiple),
                blockwise ? "whole 128x128 weight blocks" : "16-byte rows for TMA",
                static_cast<long long>(args.n), static_cast<long long>(args.k),
                static_cast<long long>(a->row_capacity), static_cast<long long>(a->num_groups));
  }
  // The copy each form reads (FP8: K-major, docs/grouped_gemm.md).
  const bool quantized = fp8 || blockwise;
  const bool a_columnwise = (quantized || emulated) && config->form == SFMOE_GEMM_WGRAD;
  const bool b_columnwise = (quantized || emulated) && config->form != SFMOE_GEMM_FPROP;
  if (quantized) {
    // The kernels read the compact scale matrices; blockwise wgrad reads the columnwise 1x128
    // scales transposed (each group's blocks with one leading dimension, docs/grouped_gemm.md).
    const bool blockwise_wgrad = blockwise && config->form == SFMOE_GEMM_WGRAD;
    for (const sfmoe_grouped_tensor* t : {a, b}) {
      // (fprop and dgrad read rowwise 1x128 scales, compact in either layout)
      const bool compact_ok =
          !blockwise_wgrad && (t->scale_layout == SFMOE_SCALE_LAYOUT_COMPACT ||
                               (t->scaling == SFMOE_SCALING_BLOCK_1X128 &&
                                t->scale_layout == SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED));
      if (blockwise_wgrad ? t->scale_layout != SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED
                          : !compact_ok) {
        return fail(SFMOE_ERROR_UNSUPPORTED,
                    blockwise_wgrad
                        ? "%s: FP8 blockwise wgrad reads dY's and X's columnwise scales "
                          "transposed: quantize them with the columnwise-transposed scale layout"
                        : "%s: the CUDA grouped GEMM reads FP8 scales in the compact layout",
                    context);
      }
      if (blockwise_wgrad && t->row_alignment < 128) {
        return fail(SFMOE_ERROR_UNSUPPORTED,
                    "%s: FP8 blockwise wgrad needs groups aligned to 128 rows", context);
      }
    }
    // A columnwise copy's row_capacity is its leading dimension: TMA needs 16-byte strides.
    for (const sfmoe_grouped_tensor* t : {a, b}) {
      const bool columnwise = t == a ? a_columnwise : b_columnwise;
      if (columnwise && t->row_capacity % 16 != 0) {
        return fail(SFMOE_ERROR_UNSUPPORTED,
                    "%s: a columnwise FP8 operand needs row_capacity a multiple of 16 (its "
                    "leading dimension)",
                    context);
      }
    }
  }
  if (blockwise) {
    // fprop and dgrad read rowwise scales: a's, and W's (the same values as its columnwise
    // ones); wgrad the columnwise ones of dY and X.
    const bool wgrad = config->form == SFMOE_GEMM_WGRAD;
    for (const sfmoe_grouped_tensor* t : {a, b}) {
      if ((wgrad ? t->columnwise_scale_inv : t->rowwise_scale_inv) == nullptr) {
        return fail(SFMOE_ERROR_NULL_POINTER,
                    "%s: FP8 blockwise operands need the scale_inv of the copy the form reads "
                    "(rowwise in fprop and dgrad, W's too; columnwise in wgrad)",
                    context);
      }
    }
  }
  if (fp8) {
    for (const sfmoe_grouped_tensor* t : {a, b}) {
      const bool columnwise = t == a ? a_columnwise : b_columnwise;
      if ((columnwise ? t->columnwise_scale_inv : t->rowwise_scale_inv) == nullptr) {
        return fail(SFMOE_ERROR_NULL_POINTER, "%s: an FP8 operand needs its scale_inv", context);
      }
    }
    if (config->form == SFMOE_GEMM_WGRAD && (a->row_alignment < 16 || b->row_alignment < 16)) {
      return fail(SFMOE_ERROR_UNSUPPORTED,
                  "%s: FP8 wgrad reads the groups' columns of the columnwise copies, which needs "
                  "groups aligned to 16 rows (row_alignment >= 16)",
                  context);
    }
  }
  for (const sfmoe_grouped_tensor* t : {a, b, out}) {
    if (t->memory != SFMOE_MEMORY_CUDA || t->device != a->device) {
      return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: a, b and out must be on the same CUDA device",
                  context);
    }
    const void* data = t == a && a_columnwise   ? a->columnwise_data
                       : t == b && b_columnwise ? b->columnwise_data
                                                : t->rowwise_data;
    // (emulated operands are decoded into the workspace, whose parts are aligned)
    if ((!emulated || t == out) && reinterpret_cast<uintptr_t>(data) % kDataAlignment != 0) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: operand data must be 16-byte aligned",
                  context);
    }
  }
  if (a->group_offsets == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: a needs its group offsets", context);
  }
  // The kernels' per-group arguments; emulated operands' BF16 values after them.
  const int64_t workspace_bytes =
      emulated ? gemm_emulation_workspace(ops::grouped_gemm_kernel_workspace_bytes(a->num_groups),
                                          a->row_capacity, a->cols, b->row_capacity, b->cols)
                     .total_bytes()
               : ops::grouped_gemm_kernel_workspace_bytes(a->num_groups);
  SFMOE_RETURN_IF_ERROR(expect_workspace(context, workspace, workspace_bytes,
                                         "sfmoe_grouped_gemm_workspace_bytes", nullptr, nullptr));
  if (workspace->memory != SFMOE_MEMORY_CUDA || workspace->device != a->device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: the workspace must be on a's device", context);
  }
  SFMOE_RETURN_IF_ERROR(check_word(context, word, a->memory, a->device));
  SFMOE_RETURN_IF_ERROR(
      complete_args(context, a, b, config, a_columnwise, b_columnwise, emulated, &args));
  args.out = out->rowwise_data;
  args.fast_accumulation = fp8 && config->fp8_fast_accumulation != 0;
  args.workspace = workspace->data;
  args.workspace_bytes = workspace_bytes;
  args.word = word != nullptr ? word->word : nullptr;
  const ops::Backend& device = ops::backend_for(SFMOE_MEMORY_CUDA);
  SFMOE_RETURN_IF_ERROR(device.grouped_gemm(args, stream));
  // out shares a's offsets in fprop and dgrad (as on the host); copied once the GEMM is enqueued
  // (it reads a's), so a refused call leaves out's offsets as they were.
  return copy_out_offsets(device, a, config, out, stream);
#else
  (void)a, (void)b, (void)config, (void)out, (void)args, (void)workspace, (void)word, (void)stream;
  return fail(SFMOE_ERROR_UNSUPPORTED,
              "%s: this build has no CUDA grouped GEMM (it needs the CUDA backend and CUTLASS)",
              context);
#endif
}

}  // namespace
}  // namespace sfmoe

extern "C" {

int64_t sfmoe_grouped_gemm_workspace_bytes(int64_t num_groups, sfmoe_scaling a_scaling,
                                           int64_t a_rows, int64_t a_cols, sfmoe_scaling b_scaling,
                                           int64_t b_rows, int64_t b_cols) {
  return sfmoe::ops::grouped_gemm_workspace_bytes(num_groups, a_scaling, a_rows, a_cols, b_scaling,
                                                  b_rows, b_cols);
}

sfmoe_grouped_gemm_config sfmoe_grouped_gemm_config_init(void) {
  return sfmoe::sized_zero_config<sfmoe_grouped_gemm_config>();
}

sfmoe_status sfmoe_grouped_gemm(const sfmoe_grouped_tensor* a, const sfmoe_grouped_tensor* b,
                                const sfmoe_grouped_gemm_config* config,
                                const sfmoe_grouped_tensor* out, const sfmoe_tensor* workspace,
                                sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_grouped_gemm";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(
        sfmoe::check_struct(context, "config", config, "sfmoe_grouped_gemm_config_init()"));
    const int32_t form = sfmoe::enum_value(config->form);
    if (form != SFMOE_GEMM_FPROP && form != SFMOE_GEMM_DGRAD && form != SFMOE_GEMM_WGRAD) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown form %d", context,
                         static_cast<int>(form));
    }
    if (a == nullptr || b == nullptr || out == nullptr) {
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: a, b and out must not be NULL", context);
    }
    if (config->accumulate &&
        (config->form != SFMOE_GEMM_WGRAD || out->dtype != SFMOE_DTYPE_FP32)) {
      return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                         "%s: accumulate applies to wgrad into an fp32 dW", context);
    }
    if (config->a_row_index != nullptr &&
        (config->form == SFMOE_GEMM_WGRAD || a->scaling != SFMOE_SCALING_NONE)) {
      return sfmoe::fail(SFMOE_ERROR_UNSUPPORTED,
                         "%s: a_row_index gathers unquantized rows of a in fprop and dgrad only",
                         context);
    }
    const int64_t groups = a->num_groups;
    sfmoe::GroupedGemmArgs args{};
    args.num_groups = groups;
    args.accumulate = config->accumulate != 0;
    args.out_dtype = out->dtype;
    // a is grouped rows in every form; out shares a's offsets in fprop and dgrad.
    switch (config->form) {
      case SFMOE_GEMM_FPROP:  // a = X [R, K], b = W [G n, K], out = Y [R, n]
        args.form = sfmoe::GroupedGemmForm::kFprop;
        args.k = a->cols;
        args.n = b->uniform_group_rows;
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "a (X)", a, args.k));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "b (W)", b, args.k));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_weights(context, "b (W)", b, groups, args.n));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "out (Y)", out, args.n));
        break;
      case SFMOE_GEMM_DGRAD:  // a = dY [R, n], b = W [G n, K], out = dX [R, K]
        args.form = sfmoe::GroupedGemmForm::kDgrad;
        args.n = a->cols;
        args.k = b->cols;
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "a (dY)", a, args.n));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "b (W)", b, args.k, true));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_weights(context, "b (W)", b, groups, args.n));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "out (dX)", out, args.k));
        break;
      case SFMOE_GEMM_WGRAD:  // a = dY [R, n], b = X [R, K], out = dW [G n, K]
        args.form = sfmoe::GroupedGemmForm::kWgrad;
        args.n = a->cols;
        args.k = b->cols;
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "a (dY)", a, args.n, true));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "b (X)", b, args.k, true));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_operand(context, "out (dW)", out, args.k));
        SFMOE_RETURN_IF_ERROR(sfmoe::expect_weights(context, "out (dW)", out, groups, args.n));
        if (b->num_groups != groups || b->row_capacity != a->row_capacity ||
            b->group_offsets == nullptr) {
          return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                             "%s: b (X) must have a's groups and row capacity", context);
        }
        break;
    }
    if (out->scaling != SFMOE_SCALING_NONE) {
      return sfmoe::fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: out must be fp32, bf16 or fp16", context);
    }
    if (config->a_row_index != nullptr) {  // A's rows gathered from a's data
      if (config->a_source_rows < 0 || config->a_source_rows > INT32_MAX) {
        return sfmoe::fail(SFMOE_ERROR_INVALID_ARGUMENT,
                           "%s: a_source_rows must lie in [0, 2^31), got %lld", context,
                           static_cast<long long>(config->a_source_rows));
      }
      SFMOE_RETURN_IF_ERROR(sfmoe::validate_pointer_memory(
          context, "config", "a_row_index", config->a_row_index, a->memory, a->device));
      args.a_row_index = config->a_row_index;
      args.a_source_rows = config->a_source_rows;
    }
    if (config->form != SFMOE_GEMM_WGRAD &&
        (out->num_groups != groups || out->row_capacity != a->row_capacity)) {
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: out must have a's groups and row capacity", context);
    }
    if (a->memory == SFMOE_MEMORY_CUDA) {
      return sfmoe::run_on_device(context, a, b, config, out, args, workspace, word, stream);
    }
    (void)workspace;
    (void)word;
    for (const sfmoe_grouped_tensor* t : {b, out}) {
      if (t->memory != SFMOE_MEMORY_HOST) {
        return sfmoe::fail(SFMOE_ERROR_MEMORY_SPACE, "%s: a, b and out must share a memory space",
                           context);
      }
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::check_host_group_offsets(context, "a", a));
    if (config->form == SFMOE_GEMM_WGRAD && b->group_offsets != a->group_offsets) {
      for (int64_t g = 0; g <= groups; ++g) {
        if (b->group_offsets[g] != a->group_offsets[g]) {
          return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH, "%s: a and b group their rows differently",
                             context);
        }
      }
    }
    // The copies each form reads (docs/grouped_gemm.md): A's columnwise copy only in wgrad; B's
    // columnwise copy in dgrad (W) and wgrad (X).
    SFMOE_RETURN_IF_ERROR(sfmoe::complete_args(context, a, b, config,
                                               config->form == SFMOE_GEMM_WGRAD,
                                               config->form != SFMOE_GEMM_FPROP, true, &args));
    args.out = out->rowwise_data;
    const sfmoe::ops::Backend& host = sfmoe::ops::backend_for(SFMOE_MEMORY_HOST);
    SFMOE_RETURN_IF_ERROR(sfmoe::copy_out_offsets(host, a, config, out, nullptr));
    return host.grouped_gemm(args, nullptr);
  });
}

}  // extern "C"
