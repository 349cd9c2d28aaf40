// Layout planning (src/ops/layout_plan.h): the buffers of quantize, permute and activation
// outputs and the ops' workspaces, from host-known bounds alone.
#include "src/ops/layout_plan.h"

#include <string.h>

#include "src/common/activation_args.h"
#include "src/common/grouped_gemm_args.h"
#include "src/common/permute_args.h"
#include "src/common/quantize_args.h"
#include "src/common/router_args.h"
#if defined(SFMOE_WITH_CUDA)
#include "src/cuda/backend.h"
#endif

namespace sfmoe {
namespace ops {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The integer stored in an enum field (a C caller may store any int there).
template <class Enum>
int32_t enum_int(const Enum& field) {
  int32_t value;
  memcpy(&value, &field, sizeof(value));
  return value;
}

// Compact columnwise MX_1X32 / BLOCK_1X128 scales are staged over units of eight 128-row bands
// and stored as whole 32-byte sectors when every column's scales start on a sector, i.e. when the
// capacity is a multiple of 1024 rows (docs/quantization.md: 5-8% faster on large inputs). The
// default capacity is rounded up to it from 16384 rows on, where it costs at most 1/16 more.
constexpr int64_t kStagedCapacityMultiple = 1024;
constexpr int64_t kStagedCapacityFrom = 16 * kStagedCapacityMultiple;

// Bytes of `elements` elements of `dtype`, or -1 past int64.
int64_t element_bytes(int64_t elements, sfmoe_dtype dtype) {
  const int bits = sfmoe_dtype_bits(dtype);
  if (elements < 0 || bits <= 0 || elements > (INT64_MAX - 7) / bits) return -1;
  return (elements * bits + 7) / 8;
}

// A present buffer of [d0] or [d0, d1] elements; the outcome refuses sizes beyond int64.
Outcome buffer(sfmoe_dtype dtype, int32_t ndim, int64_t d0, int64_t d1, sfmoe_buffer_plan* b) {
  int64_t elements = d0;
  if (ndim == 2) {
    if (d1 != 0 && d0 > INT64_MAX / d1) {
      return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "a buffer of [%lld, %lld] overflows int64",
                    static_cast<long long>(d0), static_cast<long long>(d1));
    }
    elements = d0 * d1;
  }
  const int64_t bytes = element_bytes(elements, dtype);
  if (bytes < 0 || bytes > INT64_MAX - SFMOE_PLAN_ALIGNMENT) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "a buffer of %lld elements overflows int64",
                  static_cast<long long>(elements));
  }
  b->dtype = dtype;
  b->ndim = ndim;
  b->shape[0] = d0;
  b->shape[1] = ndim == 2 ? d1 : 0;
  b->bytes = bytes;
  return Outcome{};
}

Outcome scale_buffer(sfmoe_scaling scaling, sfmoe_scale_layout layout, int64_t num_groups,
                     int64_t copy_rows, int64_t copy_cols, sfmoe_buffer_plan* b) {
  int32_t ndim = 0;
  int64_t shape[2] = {0, 0};
  SFMOE_RETURN_IF_REFUSED(
      plan_scale_shape(scaling, layout, num_groups, copy_rows, copy_cols, &ndim, shape));
  return buffer(scale_dtype_of(scaling), ndim, shape[0], shape[1], b);
}

// The buffers in binding order (the order of the plan's fields).
constexpr int kPlanBuffers = 7;
void buffers_of(sfmoe_grouped_tensor_plan* p, sfmoe_buffer_plan* list[kPlanBuffers]) {
  sfmoe_buffer_plan* all[kPlanBuffers] = {
      &p->group_offsets,        &p->rowwise_data, &p->rowwise_scale_inv, &p->columnwise_data,
      &p->columnwise_scale_inv, &p->amax,         &p->columnwise_amax};
  for (int i = 0; i < kPlanBuffers; ++i) list[i] = all[i];
}

Outcome finish_total(sfmoe_grouped_tensor_plan* p) {
  sfmoe_buffer_plan* list[kPlanBuffers];
  buffers_of(p, list);
  int64_t total = 0;
  for (int i = 0; i < kPlanBuffers; ++i) {
    if (list[i]->ndim == 0) continue;
    const int64_t padded = round_up(list[i]->bytes, SFMOE_PLAN_ALIGNMENT);
    if (total > INT64_MAX - padded) {
      return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "the tensor's bytes overflow int64");
    }
    total += padded;
  }
  p->total_bytes = total;
  return Outcome{};
}

// A plan with its descriptor fields set and every buffer absent.
void start_plan(sfmoe_grouped_tensor_plan* p, sfmoe_dtype dtype, sfmoe_scaling scaling,
                sfmoe_scale_layout layout, int64_t num_groups, int64_t row_capacity, int64_t cols,
                int64_t row_alignment, int64_t uniform_group_rows) {
  const size_t struct_size = p->struct_size;
  memset(p, 0, sizeof(*p));
  p->struct_size = struct_size;
  p->dtype = dtype;
  p->scaling = scaling;
  p->scale_layout = layout;
  p->num_groups = num_groups;
  p->row_capacity = row_capacity;
  p->cols = cols;
  p->row_alignment = row_alignment;
  p->uniform_group_rows = uniform_group_rows;
}

Outcome check_layout_enum(sfmoe_scale_layout layout) {
  const int32_t v = enum_int(layout);
  if (v != SFMOE_SCALE_LAYOUT_COMPACT && v != SFMOE_SCALE_LAYOUT_SWIZZLED &&
      v != SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "unknown scale layout %d", static_cast<int>(v));
  }
  return Outcome{};
}

// A rowwise-only output of unquantized rows or of a fused quantization (permute, activations):
// the buffers for `rows` x `cols` with per-group offsets.
Outcome plan_rowwise_output(sfmoe_dtype dtype, sfmoe_scaling scaling, sfmoe_scale_layout layout,
                            int64_t num_groups, int64_t row_capacity, int64_t cols,
                            int64_t row_alignment, bool group_amax, bool allow_nvfp4,
                            sfmoe_grouped_tensor_plan* p) {
  const int32_t scaling_value = enum_int(scaling);
  if (scaling_value < 0 || scaling_value >= SFMOE_SCALING_COUNT) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "unknown scaling %d",
                  static_cast<int>(scaling_value));
  }
  SFMOE_RETURN_IF_REFUSED(check_layout_enum(layout));
  const int32_t dtype_value = enum_int(dtype);
  if (dtype_value < 0 || dtype_value >= SFMOE_DTYPE_COUNT) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype_value));
  }
  if (scaling == SFMOE_SCALING_NONE) {
    if (!is_high_precision(dtype)) {
      return refuse(SFMOE_ERROR_DTYPE_MISMATCH,
                    "unquantized rows are fp32, bf16 or fp16, not '%s' (give a scaling for codes)",
                    sfmoe_dtype_name(dtype));
    }
  } else {
    // The fused quantizations (docs/permute.md, docs/activations.md): rowwise recipes whose
    // blocks lie within a row.
    if (scaling != SFMOE_SCALING_MX_1X32 && scaling != SFMOE_SCALING_BLOCK_1X128 &&
        scaling != SFMOE_SCALING_TENSOR && !(allow_nvfp4 && scaling == SFMOE_SCALING_NV_1X16)) {
      return refuse(SFMOE_ERROR_UNSUPPORTED,
                    "rows can be quantized on the fly into mx_1x32, block_1x128%s or tensor "
                    "(given scales) only, not '%s'",
                    allow_nvfp4 ? ", nv_1x16" : "", sfmoe_scaling_name(scaling));
    }
    if (!scaling_accepts(scaling, dtype)) {
      return refuse(SFMOE_ERROR_DTYPE_MISMATCH, "scaling '%s' cannot hold dtype '%s'",
                    sfmoe_scaling_name(scaling), sfmoe_dtype_name(dtype));
    }
    if (!scaling_has_layout(scaling, layout) ||
        layout == SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED) {
      return refuse(SFMOE_ERROR_UNSUPPORTED, "scaling '%s' has no such rowwise scale layout",
                    sfmoe_scaling_name(scaling));
    }
    // TENSOR rows are written in 8-wide vectors.
    const int64_t block = scaling == SFMOE_SCALING_TENSOR ? 8 : scaling_block_size(scaling);
    if (cols % block != 0) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "%lld columns are not a multiple of the %lld-element block of '%s'",
                    static_cast<long long>(cols), static_cast<long long>(block),
                    sfmoe_scaling_name(scaling));
    }
  }
  start_plan(p, dtype, scaling, layout, num_groups, row_capacity, cols, row_alignment, 0);
  SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT64, 1, num_groups + 1, 0, &p->group_offsets));
  SFMOE_RETURN_IF_REFUSED(buffer(dtype, 2, row_capacity, cols, &p->rowwise_data));
  if (scaling != SFMOE_SCALING_NONE) {
    SFMOE_RETURN_IF_REFUSED(
        scale_buffer(scaling, layout, num_groups, row_capacity, cols, &p->rowwise_scale_inv));
  }
  if (group_amax || scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(scaling)) {
    SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_FP32, 1, num_groups, 0, &p->amax));
  }
  return finish_total(p);
}

}  // namespace

Outcome plan_scale_shape(sfmoe_scaling scaling, sfmoe_scale_layout layout, int64_t num_groups,
                         int64_t copy_rows, int64_t copy_cols, int32_t* ndim, int64_t shape[2]) {
  if (scale_dtype_of(scaling) == static_cast<sfmoe_dtype>(SFMOE_DTYPE_COUNT)) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "scaling '%s' has no scales",
                  sfmoe_scaling_name(scaling));
  }
  SFMOE_RETURN_IF_REFUSED(check_layout_enum(layout));
  if (layout == SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED && !scaling_has_layout(scaling, layout)) {
    return refuse(SFMOE_ERROR_UNSUPPORTED,
                  "the columnwise-transposed layout exists for block_1x128 only (scaling is '%s')",
                  sfmoe_scaling_name(scaling));
  }
  if (layout == SFMOE_SCALE_LAYOUT_SWIZZLED && !scaling_is_swizzlable(scaling)) {
    return refuse(SFMOE_ERROR_UNSUPPORTED,
                  "the swizzled layout exists for mx_1x32 and nv_1x16 only (scaling is '%s')",
                  sfmoe_scaling_name(scaling));
  }
  if (num_groups < 0 || copy_rows < 0 || copy_cols < 0) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "sizes must be >= 0 (num_groups %lld, copy_rows %lld, copy_cols %lld)",
                  static_cast<long long>(num_groups), static_cast<long long>(copy_rows),
                  static_cast<long long>(copy_cols));
  }
  const int64_t block = scaling_block_size(scaling);
  if (scaling == SFMOE_SCALING_TENSOR) {
    *ndim = 1;
    shape[0] = num_groups;
    return Outcome{};
  }
  if (scaling_is_2d(scaling)) {
    *ndim = 2;
    shape[0] = ceil_div(copy_rows, block);
    shape[1] = ceil_div(copy_cols, block);
    return Outcome{};
  }
  const int64_t scale_cols = ceil_div(copy_cols, block);
  if (layout == SFMOE_SCALE_LAYOUT_COLUMNWISE_TRANSPOSED) {  // one dimension for either copy
    if (scale_cols != 0 && copy_rows > INT64_MAX / scale_cols) {
      return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "the size of [%lld, %lld] overflows int64",
                    static_cast<long long>(copy_rows), static_cast<long long>(scale_cols));
    }
    *ndim = 1;
    shape[0] = copy_rows * scale_cols;
    return Outcome{};
  }
  if (layout == SFMOE_SCALE_LAYOUT_SWIZZLED) {
    // roundup(rows, 128) * roundup(scale_cols, 4), refused where it would not fit in int64.
    const int64_t row_tiles = ceil_div(copy_rows, numerics::kSwizzleTileRows);
    const int64_t col_tiles = ceil_div(scale_cols, numerics::kSwizzleTileCols);
    constexpr int64_t kMax = INT64_MAX / numerics::kSwizzleTileElements;
    if (col_tiles != 0 && row_tiles > kMax / col_tiles) {
      return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                    "the swizzled size of [%lld, %lld] overflows int64",
                    static_cast<long long>(copy_rows), static_cast<long long>(scale_cols));
    }
    *ndim = 1;
    shape[0] = row_tiles * col_tiles * numerics::kSwizzleTileElements;
    return Outcome{};
  }
  *ndim = 2;
  shape[0] = copy_rows;
  shape[1] = scale_cols;
  return Outcome{};
}

Outcome quantized_capacity_bound(const sfmoe_quantize_plan_request& r, int64_t* bound) {
  const int64_t a =
      r.row_alignment == 0 ? min_row_alignment(r.scaling, r.columnwise != 0) : r.row_alignment;
  int64_t rows = r.input_rows;
  if (r.uniform_group_rows == 0) {
    const bool aligned_already = r.input_row_alignment > 0 && r.input_row_alignment % a == 0;
    const int64_t padding_per_group = aligned_already ? 0 : a - 1;
    if (padding_per_group != 0 && r.num_groups > (INT64_MAX / 2 - rows) / padding_per_group) {
      return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "the padded row count overflows int64");
    }
    rows += r.num_groups * padding_per_group;
  }
  *bound = rows;
  return Outcome{};
}

Outcome plan_grouped_quantize(const sfmoe_quantize_plan_request& r,
                              sfmoe_grouped_tensor_plan* plan) {
  const int32_t scaling_value = enum_int(r.scaling);
  if (scaling_value <= SFMOE_SCALING_NONE || scaling_value >= SFMOE_SCALING_COUNT) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "scaling %d is not a quantized recipe (tensor, block_1x128, block_128x128, "
                  "mx_1x32, nv_1x16 or nv_16x16)",
                  static_cast<int>(scaling_value));
  }
  const int32_t dtype_value = enum_int(r.dtype);
  if (dtype_value < 0 || dtype_value >= SFMOE_DTYPE_COUNT) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "unknown dtype %d", static_cast<int>(dtype_value));
  }
  if (!scaling_accepts(r.scaling, r.dtype)) {
    return refuse(SFMOE_ERROR_DTYPE_MISMATCH, "scaling '%s' cannot hold dtype '%s'",
                  sfmoe_scaling_name(r.scaling), sfmoe_dtype_name(r.dtype));
  }
  SFMOE_RETURN_IF_REFUSED(check_layout_enum(r.scale_layout));
  if (!scaling_has_layout(r.scaling, r.scale_layout)) {
    return refuse(SFMOE_ERROR_UNSUPPORTED, "scaling '%s' has no such scale layout",
                  sfmoe_scaling_name(r.scaling));
  }
  const bool rowwise = r.rowwise != 0, columnwise = r.columnwise != 0;
  if (!rowwise && !columnwise) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "neither copy is asked for");
  }
  if (r.hadamard_columnwise && r.scaling != SFMOE_SCALING_NV_1X16) {
    return refuse(SFMOE_ERROR_UNSUPPORTED, "the Hadamard transform applies to nv_1x16 only");
  }
  if (r.num_groups < 1 || r.cols < 1 || r.input_rows < 0 || r.uniform_group_rows < 0 ||
      r.row_capacity < 0 || r.input_row_alignment < 0) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "num_groups and cols must be >= 1, the row counts >= 0 (num_groups %lld, cols "
                  "%lld, input_rows %lld)",
                  static_cast<long long>(r.num_groups), static_cast<long long>(r.cols),
                  static_cast<long long>(r.input_rows));
  }
  const int64_t block = scaling_block_size(r.scaling);
  if (block > 0 && r.cols % block != 0) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                  "scaling '%s' scales blocks of %lld columns, so cols must be a multiple of it "
                  "(got %lld)",
                  sfmoe_scaling_name(r.scaling), static_cast<long long>(block),
                  static_cast<long long>(r.cols));
  }
  const int64_t minimum = min_row_alignment(r.scaling, columnwise);
  const int64_t a = r.row_alignment == 0 ? minimum : r.row_alignment;
  if (!is_power_of_two(a) || a % minimum != 0) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                  "row_alignment %lld must be a power of two and a multiple of %lld (scaling "
                  "'%s'%s)",
                  static_cast<long long>(a), static_cast<long long>(minimum),
                  sfmoe_scaling_name(r.scaling), columnwise ? " with a columnwise copy" : "");
  }
  if (r.uniform_group_rows > 0) {
    if (r.uniform_group_rows % a != 0) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "uniform_group_rows %lld is not a multiple of row_alignment %lld",
                    static_cast<long long>(r.uniform_group_rows), static_cast<long long>(a));
    }
    if (r.uniform_group_rows > INT64_MAX / r.num_groups ||
        r.input_rows != r.num_groups * r.uniform_group_rows) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "uniform groups: input_rows must be num_groups x uniform_group_rows (%lld x "
                    "%lld), got %lld",
                    static_cast<long long>(r.num_groups),
                    static_cast<long long>(r.uniform_group_rows),
                    static_cast<long long>(r.input_rows));
    }
  }
  sfmoe_quantize_plan_request resolved = r;
  resolved.row_alignment = a;
  int64_t bound = 0;
  SFMOE_RETURN_IF_REFUSED(quantized_capacity_bound(resolved, &bound));
  int64_t capacity = r.row_capacity;
  if (capacity == 0) {
    capacity = bound;
    if (minimum > 1) capacity = round_up(capacity, minimum);  // whole blocks down the rows
    // The columnwise copy's leading dimension aligned like its groups: the FP8 grouped GEMM
    // reads each group's columns from an aligned start.
    if (columnwise) capacity = round_up(capacity, a);
    const bool staged =
        columnwise && r.scale_layout == SFMOE_SCALE_LAYOUT_COMPACT &&
        (r.scaling == SFMOE_SCALING_MX_1X32 || r.scaling == SFMOE_SCALING_BLOCK_1X128) &&
        capacity >= kStagedCapacityFrom;
    if (staged) capacity = round_up(capacity, kStagedCapacityMultiple);
    if (r.dtype == SFMOE_DTYPE_FP4_E2M1) capacity = round_up(capacity, 2);
  } else {
    if (capacity < bound) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "row_capacity %lld cannot hold the padded groups: at least %lld is needed",
                    static_cast<long long>(capacity), static_cast<long long>(bound));
    }
    if (minimum > 1 && capacity % minimum != 0) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "row_capacity %lld must be a multiple of the %lld-row block of '%s'",
                    static_cast<long long>(capacity), static_cast<long long>(minimum),
                    sfmoe_scaling_name(r.scaling));
    }
    if (r.dtype == SFMOE_DTYPE_FP4_E2M1 && capacity % 2 != 0) {
      return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                    "fp4_e2m1 packs two per byte, so row_capacity must be even (got %lld)",
                    static_cast<long long>(capacity));
    }
  }
  sfmoe_grouped_tensor_plan p;
  p.struct_size = plan->struct_size;
  start_plan(&p, r.dtype, r.scaling, r.scale_layout, r.num_groups, capacity, r.cols, a,
             r.uniform_group_rows);
  if (r.uniform_group_rows == 0) {
    SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT64, 1, r.num_groups + 1, 0, &p.group_offsets));
  }
  if (rowwise) {
    SFMOE_RETURN_IF_REFUSED(buffer(r.dtype, 2, capacity, r.cols, &p.rowwise_data));
    SFMOE_RETURN_IF_REFUSED(scale_buffer(r.scaling, r.scale_layout, r.num_groups, capacity, r.cols,
                                         &p.rowwise_scale_inv));
  }
  if (columnwise) {
    SFMOE_RETURN_IF_REFUSED(buffer(r.dtype, 2, r.cols, capacity, &p.columnwise_data));
    SFMOE_RETURN_IF_REFUSED(scale_buffer(r.scaling, r.scale_layout, r.num_groups, r.cols, capacity,
                                         &p.columnwise_scale_inv));
  }
  if (r.scaling == SFMOE_SCALING_TENSOR || scaling_is_nvfp4(r.scaling)) {
    SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_FP32, 1, r.num_groups, 0, &p.amax));
  }
  if (r.hadamard_columnwise && columnwise) {
    SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_FP32, 1, r.num_groups, 0, &p.columnwise_amax));
  }
  SFMOE_RETURN_IF_REFUSED(finish_total(&p));
  *plan = p;
  return Outcome{};
}

Outcome drop_rowwise_codes(sfmoe_grouped_tensor_plan* plan) {
  if (!scaling_is_2d(plan->scaling) || plan->rowwise_scale_inv.ndim == 0 ||
      plan->columnwise_data.ndim == 0) {
    return refuse(SFMOE_ERROR_UNSUPPORTED,
                  "only a 2D-block plan with both copies keeps its rowwise scales without codes");
  }
  plan->rowwise_data = sfmoe_buffer_plan{};
  return finish_total(plan);
}

int64_t permute_workspace_bytes(int64_t num_tokens, int64_t num_experts) {
  if (num_tokens < 0 || num_experts < 1 || num_tokens > INT64_MAX - kPermuteChunkTokens ||
      permute_chunks(num_tokens) > INT64_MAX / static_cast<int64_t>(sizeof(int32_t)) / num_experts)
    return -1;
  return permute_workspace_elements(num_tokens, num_experts) *
         static_cast<int64_t>(sizeof(int32_t));
}

int64_t router_workspace_bytes(int64_t tokens, int64_t num_experts) {
  if (tokens < 0 || num_experts < 1 || tokens > INT64_MAX - kRouterTokensPerBlock ||
      num_experts >= INT64_MAX / static_cast<int64_t>(sizeof(float)) / kRouterMaxBlocks)
    return -1;
  return router_workspace_floats(tokens, num_experts) * static_cast<int64_t>(sizeof(float));
}

int64_t grouped_gemm_kernel_workspace_bytes(int64_t num_groups) {
#if defined(SFMOE_WITH_CUDA) && defined(SFMOE_WITH_CUTE)
  return (cuda::grouped_gemm_workspace_bytes(num_groups) + 7) / 8 * 8;  // whole 8-byte words
#else
  (void)num_groups;
  return 0;
#endif
}

int64_t grouped_gemm_workspace_bytes(int64_t num_groups, sfmoe_scaling a_scaling, int64_t a_rows,
                                     int64_t a_cols, sfmoe_scaling b_scaling, int64_t b_rows,
                                     int64_t b_cols) {
  if (num_groups < 0 || a_rows < 0 || a_cols < 0 || b_rows < 0 || b_cols < 0) return -1;
  // (the BF16 copies' bytes, 2 per element, must fit in int64 with room for alignment)
  const int64_t most = INT64_MAX / 8;
  if ((a_cols > 0 && a_rows > most / a_cols) || (b_cols > 0 && b_rows > most / b_cols)) return -1;
#if defined(SFMOE_WITH_CUDA) && defined(SFMOE_WITH_CUTE)
  if (cuda::device_count() == 0) return 0;
  const int64_t kernel = grouped_gemm_kernel_workspace_bytes(num_groups);
  if (!gemm_emulated_on_device(a_scaling) || !gemm_emulated_on_device(b_scaling)) return kernel;
  return gemm_emulation_workspace(kernel, a_rows, a_cols, b_rows, b_cols).total_bytes();
#else
  (void)a_scaling, (void)b_scaling;
  return 0;
#endif
}

Outcome permute_row_capacity_bound(int64_t num_tokens, int64_t topk, int64_t num_experts,
                                   int64_t row_alignment, int64_t expert_capacity, int64_t* bound) {
  // Products checked for overflow: a wrapped bound would let a small buffer pass.
  int64_t slots = 0, padding = 0, needed = 0;
  if (__builtin_mul_overflow(num_tokens, topk, &slots) ||
      __builtin_mul_overflow(num_experts, row_alignment - 1, &padding)) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the worst-case row count overflows int64");
  }
  int64_t kept = slots, capacity_rows = 0;
  if (expert_capacity > 0 &&
      !__builtin_mul_overflow(num_experts, expert_capacity, &capacity_rows) &&
      capacity_rows < slots) {
    kept = capacity_rows;
  }
  if (__builtin_add_overflow(kept, padding, &needed)) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the worst-case row count overflows int64");
  }
  *bound = needed;
  return Outcome{};
}

Outcome plan_permute(const sfmoe_permute_plan_request& r, sfmoe_permute_plan* plan) {
  if (r.num_tokens < 0 || r.topk < 1 || r.num_experts < 1 || r.hidden < 1 ||
      r.expert_capacity < 0) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "num_tokens and expert_capacity must be >= 0, topk, num_experts and hidden >= 1 "
                  "(got %lld, %lld, %lld, %lld, %lld)",
                  static_cast<long long>(r.num_tokens), static_cast<long long>(r.expert_capacity),
                  static_cast<long long>(r.topk), static_cast<long long>(r.num_experts),
                  static_cast<long long>(r.hidden));
  }
  const int64_t a = r.row_alignment;
  if (!permute_alignment_is_valid(a)) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "row_alignment must be 1, 8, 16, 32, 64 or 128 (got %lld)",
                  static_cast<long long>(a));
  }
  int64_t row_capacity = 0;
  SFMOE_RETURN_IF_REFUSED(permute_row_capacity_bound(r.num_tokens, r.topk, r.num_experts, a,
                                                     r.expert_capacity, &row_capacity));
  sfmoe_permute_plan p;
  memset(&p, 0, sizeof(p));
  p.struct_size = plan->struct_size;
  p.permuted.struct_size = sizeof(sfmoe_grouped_tensor_plan);
  SFMOE_RETURN_IF_REFUSED(plan_rowwise_output(r.dtype, r.scaling, r.scale_layout, r.num_experts,
                                              row_capacity, r.hidden, a, r.group_amax != 0,
                                              /*allow_nvfp4=*/false, &p.permuted));
  SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT64, 2, r.num_tokens, r.topk, &p.row_map));
  SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT64, 1, r.num_experts, 0, &p.tokens_per_expert));
  SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT64, 1, r.num_experts, 0, &p.dropped_per_expert));
  SFMOE_RETURN_IF_REFUSED(buffer(SFMOE_DTYPE_INT32, 1,
                                 permute_workspace_elements(r.num_tokens, r.num_experts), 0,
                                 &p.workspace));
  *plan = p;
  return Outcome{};
}

Outcome plan_grouped_activation(const sfmoe_activation_plan_request& r,
                                sfmoe_grouped_tensor_plan* plan) {
  const int32_t kind = enum_int(r.kind);
  if (kind < SFMOE_ACTIVATION_SWIGLU || kind > SFMOE_ACTIVATION_CLAMPED_SWIGLU) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT, "unknown activation %d", static_cast<int>(kind));
  }
  if (r.num_groups < 1 || r.row_capacity < 0 || r.input_cols < 1 ||
      !is_power_of_two(r.row_alignment)) {
    return refuse(SFMOE_ERROR_INVALID_ARGUMENT,
                  "num_groups and input_cols must be >= 1, row_capacity >= 0, row_alignment a "
                  "power of two (got %lld, %lld, %lld, %lld)",
                  static_cast<long long>(r.num_groups), static_cast<long long>(r.input_cols),
                  static_cast<long long>(r.row_capacity), static_cast<long long>(r.row_alignment));
  }
  const bool gated = activation_is_gated(static_cast<ActivationKind>(kind));
  if (gated && r.input_cols % 2 != 0) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                  "a gated activation reads [gate | up]: input_cols must be even (got %lld)",
                  static_cast<long long>(r.input_cols));
  }
  if (r.dtype == SFMOE_DTYPE_FP4_E2M1 && r.row_capacity % 2 != 0) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH,
                  "an fp4_e2m1 output needs an even row capacity (the input's is %lld)",
                  static_cast<long long>(r.row_capacity));
  }
  sfmoe_grouped_tensor_plan p;
  p.struct_size = plan->struct_size;
  SFMOE_RETURN_IF_REFUSED(plan_rowwise_output(
      r.dtype, r.scaling, r.scale_layout, r.num_groups, r.row_capacity,
      gated ? r.input_cols / 2 : r.input_cols, r.row_alignment, r.group_amax != 0,
      /*allow_nvfp4=*/true, &p));
  *plan = p;
  return Outcome{};
}

Outcome bind_grouped_tensor(const sfmoe_grouped_tensor_plan& plan, sfmoe_memory memory,
                            int32_t device, void* base, sfmoe_grouped_tensor* out) {
  if (reinterpret_cast<uintptr_t>(base) % SFMOE_PLAN_ALIGNMENT != 0) {
    return refuse(SFMOE_ERROR_MISALIGNED, "base %p is not %d-byte aligned", base,
                  SFMOE_PLAN_ALIGNMENT);
  }
  if (base == nullptr && plan.total_bytes > 0) {
    return refuse(SFMOE_ERROR_NULL_POINTER, "base is NULL");
  }
  *out = carve_grouped_tensor(plan, memory, device, base);
  return Outcome{};
}

sfmoe_grouped_tensor carve_grouped_tensor(const sfmoe_grouped_tensor_plan& plan,
                                          sfmoe_memory memory, int32_t device, void* base) {
  sfmoe_grouped_tensor_plan copy = plan;
  sfmoe_buffer_plan* list[kPlanBuffers];
  buffers_of(&copy, list);
  void* pointers[kPlanBuffers] = {};
  int64_t offset = 0;
  for (int i = 0; i < kPlanBuffers; ++i) {
    if (list[i]->ndim == 0) continue;
    pointers[i] = static_cast<uint8_t*>(base) + offset;
    offset += round_up(list[i]->bytes, SFMOE_PLAN_ALIGNMENT);
  }
  sfmoe_grouped_tensor t = sfmoe_grouped_tensor_init();
  t.memory = memory;
  t.device = device;
  t.dtype = plan.dtype;
  t.scaling = plan.scaling;
  t.scale_layout = plan.scale_layout;
  t.num_groups = plan.num_groups;
  t.row_capacity = plan.row_capacity;
  t.cols = plan.cols;
  t.row_alignment = plan.row_alignment;
  t.uniform_group_rows = plan.uniform_group_rows;
  t.group_offsets = static_cast<int64_t*>(pointers[0]);
  t.rowwise_data = pointers[1];
  t.rowwise_scale_inv = pointers[2];
  t.columnwise_data = pointers[3];
  t.columnwise_scale_inv = pointers[4];
  t.amax = static_cast<float*>(pointers[5]);
  t.columnwise_amax = static_cast<float*>(pointers[6]);
  return t;
}

Outcome plan_ep(const sfmoe_ep_config& c, sfmoe_memory memory, EpLayout* layout) {
  *layout = EpLayout{};
  const bool spill = c.overflow == SFMOE_EP_OVERFLOW_SPILL;
  int64_t experts = 0, slots = 0, worst = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(c.world_size), c.experts_per_rank, &experts) ||
      __builtin_mul_overflow(c.max_tokens_per_rank, c.top_k, &slots) ||
      __builtin_mul_overflow(slots, static_cast<int64_t>(c.world_size), &worst) ||
      slots > INT64_MAX / 16) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the expert-parallel group's sizes overflow");
  }
  EpShape& s = layout->shape;
  s.world = c.world_size;
  s.experts_per_rank = c.experts_per_rank;
  s.top_k = c.top_k;
  s.row_alignment = c.row_alignment;
  // (a capacity above the worst case holds nothing more)
  s.receive_capacity =
      c.receive_capacity > 0 && c.receive_capacity < worst ? c.receive_capacity : worst;
  s.rounds = spill ? 2 : 1;
  if (spill) {
    const int64_t left = worst - s.receive_capacity;
    s.spill_capacity = c.spill_capacity > 0 && c.spill_capacity < left ? c.spill_capacity : left;
  }
  // Rows: each round's kept ones plus each local expert's padding, a multiple of nothing more.
  int64_t padding = 0, spill_rows = 0;
  if (__builtin_mul_overflow(c.experts_per_rank, c.row_alignment - 1, &padding) ||
      __builtin_add_overflow(s.receive_capacity, padding, &s.spill_row_base) ||
      __builtin_add_overflow(s.spill_capacity, spill ? padding : 0, &spill_rows) ||
      __builtin_add_overflow(s.spill_row_base, spill_rows, &s.receive_rows)) {
    return refuse(SFMOE_ERROR_SHAPE_MISMATCH, "the expert-parallel group's sizes overflow");
  }
  if (!spill) s.spill_row_base = 0;
  s.pair_capacity = c.pair_capacity > 0 ? c.pair_capacity : INT64_MAX;
  const int32_t scaling = static_cast<int32_t>(c.payload_scaling);
  if (scaling == SFMOE_SCALING_TENSOR) layout->scale_columns = 1;
  if (scaling == SFMOE_SCALING_BLOCK_1X128) layout->scale_columns = (c.hidden + 127) / 128;
  if (scaling == SFMOE_SCALING_MX_1X32) {
    layout->scale_columns = (c.hidden + 31) / 32;
    layout->scale_dtype = SFMOE_DTYPE_E8M0;
  }
  layout->scale_bytes = layout->scale_columns * sfmoe_dtype_bits(layout->scale_dtype) / 8;
  layout->per_rank = c.transport != SFMOE_EP_TRANSPORT_LOOPBACK;
  if (layout->per_rank) {
    // What one source can send one rank: each token names each of its E_l experts once at most.
    const int64_t per_token = c.top_k < c.experts_per_rank ? c.top_k : c.experts_per_rank;
    const int64_t kept = s.receive_capacity + s.spill_capacity;
    layout->pair_rows =
        c.max_tokens_per_rank * per_token < kept ? c.max_tokens_per_rank * per_token : kept;
    if (s.pair_capacity < layout->pair_rows) layout->pair_rows = s.pair_capacity;
    if (layout->pair_rows < 1) layout->pair_rows = 1;
    const int64_t element = sfmoe_dtype_bits(c.payload) / 8;
    layout->staging_row_bytes = c.hidden * (element > 2 ? element : 2);
  }
  EpHandleLayout& h = layout->handle;
  int64_t at = 0;
  auto place = [&](int64_t bytes, int64_t* offset) {
    *offset = at;
    at += (bytes + SFMOE_PLAN_ALIGNMENT - 1) / SFMOE_PLAN_ALIGNMENT * SFMOE_PLAN_ALIGNMENT;
  };
  place(slots * 4, &h.send_rank);
  place(slots * 8, &h.send_row);
  place(s.rounds * (c.experts_per_rank + 1) * 8, &h.offsets);
  place(s.rounds * c.experts_per_rank * 8, &h.kept);
  place(c.experts_per_rank * 8, &h.routed);
  place(experts * 8, &h.dropped);
  // (the device routes every slot the process holds: all ranks' with the loopback)
  place(
      memory == SFMOE_MEMORY_CUDA ? ep_route_scratch_bytes(s, layout->per_rank ? slots : worst) : 0,
      &h.route_scratch);
  if (layout->per_rank) {
    const int64_t R = c.world_size;
    place(experts * 8, &h.expert_counts);
    place(R * experts * 8, &h.all_counts);
    place(experts * 16, &h.expert_kept);
    place(R * experts * 16, &h.all_kept);
    place((R + experts) * 8, &h.bases);
    place(4 * experts * 8, &h.expert_rows);
    place(slots * 8, &h.expert_position);
    place(R * 8, &h.received_from);
    place(R * layout->pair_rows * 8, &h.received_row);
    place(8, &h.rank);
  }
  h.bytes = at;
  return Outcome{};
}

EpRankRouting ep_routing_at(const EpLayout& layout, void* handle) {
  uint8_t* base = static_cast<uint8_t*>(handle);
  const EpHandleLayout& h = layout.handle;
  auto part = [&](int64_t offset) {
    return offset < 0 ? nullptr : reinterpret_cast<int64_t*>(base + offset);
  };
  return EpRankRouting{reinterpret_cast<int32_t*>(base + h.send_rank),
                       part(h.send_row),
                       part(h.offsets),
                       part(h.kept),
                       part(h.routed),
                       part(h.dropped),
                       reinterpret_cast<int32_t*>(base + h.route_scratch),
                       part(h.expert_counts),
                       part(h.all_counts),
                       part(h.expert_kept),
                       part(h.all_kept),
                       part(h.bases),
                       part(h.expert_rows),
                       part(h.expert_position),
                       part(h.received_from),
                       part(h.received_row),
                       part(h.rank)};
}

}  // namespace ops
}  // namespace sfmoe
