// sfmoe_grouped_activation / _backward: validate, then run the backend where the tensors live
// (docs/activations.md).
#include "sfmoe/activation.h"

#include <math.h>
#include <string.h>

#include <vector>

#include "src/api/quantize_common.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/ops/backend.h"

namespace sfmoe {
namespace {

static_assert(static_cast<int>(ActivationKind::kClampedSwiGLU) == SFMOE_ACTIVATION_CLAMPED_SWIGLU &&
                  static_cast<int>(ActivationKind::kGeLU) == SFMOE_ACTIVATION_GELU,
              "the C enum and the backend's kinds share their order");

// A grouped tensor's cols as the activation's output width: the input has twice as many when
// gated, so the width is checked before anything is computed from it (the descriptor's own
// checks come later).
sfmoe_status check_activation_cols(const char* context, const char* name, int64_t cols) {
  if (cols < 0 || cols > INT64_MAX / 4) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: %s has %lld cols; it takes 0 to 2^61", context,
                name, static_cast<long long>(cols));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status check_config(const char* context, const sfmoe_activation_config* c,
                          ActivationConfig* out) {
  SFMOE_RETURN_IF_ERROR(check_struct(context, "config", c, "sfmoe_activation_config_init()"));
  const int32_t kind = enum_value(c->kind);
  if (kind < SFMOE_ACTIVATION_SWIGLU || kind > SFMOE_ACTIVATION_CLAMPED_SWIGLU) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: unknown activation %d", context,
                static_cast<int>(kind));
  }
  if (!(isfinite(c->limit) && c->limit > 0.0f && isfinite(c->alpha))) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: limit must be positive and finite, alpha finite",
                context);
  }
  out->kind = static_cast<ActivationKind>(c->kind);
  out->limit = c->limit;
  out->alpha = c->alpha;
  return SFMOE_SUCCESS;
}

// An unquantized grouped tensor of `cols` columns on the host, laid out like `like` (groups,
// capacity, memory).
sfmoe_status expect_grouped_rows(const char* context, const char* name,
                                 const sfmoe_grouped_tensor* g, int64_t cols,
                                 const sfmoe_grouped_tensor* like) {
  SFMOE_RETURN_IF_ERROR(expect_unquantized_rows(context, name, g, cols));
  if (like != nullptr &&
      (g->num_groups != like->num_groups || g->row_capacity != like->row_capacity ||
       g->memory != like->memory || g->device != like->device)) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s must have the input's groups, row capacity and memory", context, name);
  }
  if (g->group_offsets == nullptr) {
    return fail(SFMOE_ERROR_NULL_POINTER, "%s: %s needs group_offsets", context, name);
  }
  return SFMOE_SUCCESS;
}

// The input's offsets and the real rows of each group. On the host they are read and checked
// before anything is written: the offsets by the grouped-tensor contract, the rows within their
// blocks. On the device the kernels clamp them (and report to the status word, which also gets
// the offsets checked on the stream).
sfmoe_status check_groups(const char* context, const sfmoe_grouped_tensor* input,
                          const sfmoe_tensor* group_rows, GroupRowsView* view) {
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, "group_rows", group_rows));
  if (group_rows->dtype != SFMOE_DTYPE_INT64 || group_rows->ndim != 1 ||
      group_rows->shape[0] != input->num_groups || group_rows->memory != input->memory ||
      group_rows->device != input->device) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: group_rows must be [num_groups] int64 beside the input", context);
  }
  if (input->memory == SFMOE_MEMORY_CUDA) {
    *view = GroupRowsView{input->group_offsets, static_cast<const int64_t*>(group_rows->data),
                          input->num_groups};
    return SFMOE_SUCCESS;
  }
  SFMOE_RETURN_IF_ERROR(check_host_group_offsets(context, "input", input));
  const int64_t* offsets = input->group_offsets;
  const int64_t* rows = static_cast<const int64_t*>(group_rows->data);
  for (int64_t g = 0; g < input->num_groups; ++g) {
    if (rows[g] < 0 || rows[g] > offsets[g + 1] - offsets[g]) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                  "%s: group_rows[%lld] = %lld does not fit its block of %lld rows", context,
                  static_cast<long long>(g), static_cast<long long>(rows[g]),
                  static_cast<long long>(offsets[g + 1] - offsets[g]));
    }
  }
  *view = GroupRowsView{offsets, rows, input->num_groups};
  return SFMOE_SUCCESS;
}

// The output's offsets receive the input's (on the device an async copy on the stream, with a
// status word also checked there; on the host the offsets were checked already).
sfmoe_status copy_offsets_and_check(const sfmoe_grouped_tensor* input,
                                    const sfmoe_grouped_tensor* output, sfmoe_status_word* word,
                                    void* stream) {
  if (output->group_offsets != input->group_offsets) {
    SFMOE_RETURN_IF_ERROR(ops::backend_for(input->memory)
                              .copy(output->group_offsets, input->group_offsets,
                                    static_cast<size_t>(input->num_groups + 1) * sizeof(int64_t),
                                    stream));
  }
  return input->memory == SFMOE_MEMORY_CUDA ? check_offsets_on_stream(input, word, stream)
                                            : SFMOE_SUCCESS;
}

}  // namespace
}  // namespace sfmoe

extern "C" {

sfmoe_activation_config sfmoe_activation_config_init(void) {
  sfmoe_activation_config c = sfmoe::sized_zero_config<sfmoe_activation_config>();
  c.kind = SFMOE_ACTIVATION_SWIGLU;
  c.limit = 7.0f;
  c.alpha = 1.702f;
  return c;
}

sfmoe_status sfmoe_grouped_activation(const sfmoe_grouped_tensor* input,
                                      const sfmoe_tensor* group_rows,
                                      const sfmoe_activation_config* config,
                                      const sfmoe_grouped_tensor* output, sfmoe_status_word* word,
                                      void* stream) {
  const char* context = "sfmoe_grouped_activation";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    sfmoe::ActivationConfig c;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_config(context, config, &c));
    if (output == nullptr)
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: output is NULL", context);
    const int64_t cols = output->cols;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_activation_cols(context, "output", cols));
    const int64_t in_cols = sfmoe::activation_is_gated(c.kind) ? 2 * cols : cols;
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_grouped_rows(context, "input", input, in_cols, nullptr));
    // A quantized output: the fused quantization of the FP32 activations.
    const bool fused = output->scaling != SFMOE_SCALING_NONE;
    sfmoe::GroupedQuantizeArgs quantized;
    if (fused) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_rowwise_fusion(context, "output", output, cols,
                                                        input->memory, input->device,
                                                        config->quantize, true, &quantized));
      if (output->num_groups != input->num_groups || output->row_capacity != input->row_capacity ||
          output->group_offsets == nullptr) {
        return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                           "%s: output must have the input's groups and row capacity, and "
                           "group_offsets",
                           context);
      }
    } else {
      SFMOE_RETURN_IF_ERROR(sfmoe::expect_grouped_rows(context, "output", output, cols, input));
    }
    if (output->amax != nullptr) {
      SFMOE_RETURN_IF_ERROR(sfmoe::validate_pointer_memory(context, "output", "amax", output->amax,
                                                           input->memory, input->device));
    }
    sfmoe::GroupRowsView groups;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_groups(context, input, group_rows, &groups));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, input->memory, input->device));
    const sfmoe::ActivationArgs args{c,
                                     groups,
                                     cols,
                                     input->rowwise_data,
                                     input->dtype,
                                     fused ? nullptr : output->rowwise_data,
                                     output->dtype,
                                     output->amax,
                                     fused ? &quantized : nullptr,
                                     input->row_capacity,
                                     word ? word->word : nullptr};
    SFMOE_RETURN_IF_ERROR(sfmoe::copy_offsets_and_check(input, output, word, stream));
    return sfmoe::ops::backend_for(input->memory).activation_forward(args, stream);
  });
}

sfmoe_status sfmoe_grouped_activation_backward(const sfmoe_grouped_tensor* input,
                                               const sfmoe_tensor* group_rows,
                                               const sfmoe_grouped_tensor* d_output,
                                               const sfmoe_activation_config* config,
                                               const sfmoe_grouped_tensor* d_input,
                                               sfmoe_status_word* word, void* stream) {
  const char* context = "sfmoe_grouped_activation_backward";
  return sfmoe::guarded(context, [&]() -> sfmoe_status {
    sfmoe::ActivationConfig c;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_config(context, config, &c));
    if (d_output == nullptr)
      return sfmoe::fail(SFMOE_ERROR_NULL_POINTER, "%s: d_output is NULL", context);
    const int64_t cols = d_output->cols;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_activation_cols(context, "d_output", cols));
    const bool gated = sfmoe::activation_is_gated(c.kind);
    const int64_t in_cols = gated ? 2 * cols : cols;
    if (input != nullptr && input->cols != in_cols) {
      // Either may be the one at fault: both are named.
      return sfmoe::fail(SFMOE_ERROR_SHAPE_MISMATCH,
                         "%s: d_output has %lld cols, so input must have %lld (%s), but input has "
                         "%lld",
                         context, static_cast<long long>(cols), static_cast<long long>(in_cols),
                         gated ? "[gate | up]: twice d_output's" : "as many as d_output",
                         static_cast<long long>(input->cols));
    }
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_grouped_rows(context, "input", input, in_cols, nullptr));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_grouped_rows(context, "d_output", d_output, cols, input));
    SFMOE_RETURN_IF_ERROR(sfmoe::expect_grouped_rows(context, "d_input", d_input, in_cols, input));
    sfmoe::GroupRowsView groups;
    SFMOE_RETURN_IF_ERROR(sfmoe::check_groups(context, input, group_rows, &groups));
    SFMOE_RETURN_IF_ERROR(sfmoe::check_word(context, word, input->memory, input->device));
    const sfmoe::ActivationBackwardArgs args{c,
                                             groups,
                                             cols,
                                             input->rowwise_data,
                                             input->dtype,
                                             d_output->rowwise_data,
                                             d_output->dtype,
                                             d_input->rowwise_data,
                                             d_input->dtype,
                                             input->row_capacity,
                                             word ? word->word : nullptr};
    if (input->memory == SFMOE_MEMORY_CUDA) {
      SFMOE_RETURN_IF_ERROR(sfmoe::check_offsets_on_stream(input, word, stream));
    }
    return sfmoe::ops::backend_for(input->memory).activation_backward(args, stream);
  });
}

}  // extern "C"
