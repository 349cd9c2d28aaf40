// Grouped quantization entry points: validate against docs/quantization.md, pick the backend
// from where the tensors live, run.
#include "sfmoe/quantize.h"

#include <string.h>

#include "src/api/quantize_common.h"
#include "src/api/status_word_impl.h"
#include "src/api/validate.h"
#include "src/common/error.h"
#include "src/ops/backend.h"
#include "src/ops/layout_plan.h"

extern "C" {

sfmoe_quantize_config sfmoe_quantize_config_init(void) {
  sfmoe_quantize_config c = sfmoe::sized_zero_config<sfmoe_quantize_config>();
  return c;
}

sfmoe_status sfmoe_grouped_amax(const sfmoe_grouped_tensor* input, float* amax,
                                sfmoe_status_word* word, void* stream) {
  using namespace sfmoe;
  const char* context = "sfmoe_grouped_amax";
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, "input", input));
    SFMOE_RETURN_IF_ERROR(check_high_precision(context, "input", input));
    if (amax == nullptr) return fail(SFMOE_ERROR_NULL_POINTER, "%s: amax is NULL", context);
    SFMOE_RETURN_IF_ERROR(
        validate_pointer_memory(context, "amax", "amax", amax, input->memory, input->device));
    SFMOE_RETURN_IF_ERROR(check_word(context, word, input->memory, input->device));
    const GroupedAmaxArgs args{input_of(input), input->num_groups, input->cols, amax,
                               word ? word->word : nullptr};
    return ops::backend_for(input->memory).grouped_amax(args, stream);
  });
}

sfmoe_status sfmoe_grouped_quantize(const sfmoe_grouped_tensor* input,
                                    const sfmoe_grouped_tensor* output,
                                    const sfmoe_quantize_config* config, sfmoe_status_word* word,
                                    void* stream) {
  using namespace sfmoe;
  const char* context = "sfmoe_grouped_quantize";
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, "input", input));
    SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, "output", output));
    SFMOE_RETURN_IF_ERROR(check_quantize_config(context, config));
    SFMOE_RETURN_IF_ERROR(check_high_precision(context, "input", input));
    if (input->memory != output->memory || input->device != output->device) {
      return fail(SFMOE_ERROR_MEMORY_SPACE,
                  "%s: input and output are in different memory spaces or devices", context);
    }
    SFMOE_RETURN_IF_ERROR(check_word(context, word, input->memory, input->device));
    if (input->num_groups != output->num_groups || input->cols != output->cols) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: input has %lld groups x %lld cols but output has %lld x %lld", context,
                  static_cast<long long>(input->num_groups), static_cast<long long>(input->cols),
                  static_cast<long long>(output->num_groups), static_cast<long long>(output->cols));
    }
    GroupedQuantizeArgs args;
    SFMOE_RETURN_IF_ERROR(describe_quantized(context, "output", output, *config, &args));
    args.input = input_of(input);
    const int64_t a = output->row_alignment;
    if (output->group_offsets == nullptr) {
      if (input->group_offsets != nullptr ||
          input->uniform_group_rows != output->uniform_group_rows) {
        return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                    "%s: output has uniform groups (%lld rows) but the input's groups are not the "
                    "same uniform groups",
                    context, static_cast<long long>(output->uniform_group_rows));
      }
    } else {
      if (output->group_offsets == input->group_offsets) {
        return fail(SFMOE_ERROR_INVALID_ARGUMENT,
                    "%s: output group_offsets must be a buffer of its own (the op writes the "
                    "padded offsets there)",
                    context);
      }
      const int64_t input_rows = input->group_offsets
                                     ? input->row_capacity
                                     : input->num_groups * input->uniform_group_rows;
      sfmoe_quantize_plan_request request = sfmoe_quantize_plan_request_init();
      request.scaling = output->scaling;
      request.columnwise = output->columnwise_data != nullptr;
      request.num_groups = input->num_groups;
      request.input_rows = input_rows;
      request.input_row_alignment = input->group_offsets ? input->row_alignment : 1;
      request.row_alignment = a;
      int64_t bound = 0;
      const Outcome outcome = ops::quantized_capacity_bound(request, &bound);
      if (!outcome.ok()) return fail_with(context, outcome);
      if (output->row_capacity < bound) {
        return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                    "%s: output row_capacity %lld cannot hold the padded groups: it needs %lld "
                    "(%lld input rows + %lld groups' alignment padding; "
                    "sfmoe_plan_grouped_quantize gives the layout)",
                    context, static_cast<long long>(output->row_capacity),
                    static_cast<long long>(bound), static_cast<long long>(input_rows),
                    static_cast<long long>(input->num_groups));
      }
    }
    args.word = word ? word->word : nullptr;
    return ops::backend_for(input->memory).grouped_quantize(args, stream);
  });
}

sfmoe_status sfmoe_grouped_dequantize(const sfmoe_grouped_tensor* input,
                                      const sfmoe_grouped_tensor* output,
                                      sfmoe_dequantize_source source,
                                      const sfmoe_quantize_config* config, void* stream) {
  using namespace sfmoe;
  const char* context = "sfmoe_grouped_dequantize";
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, "input", input));
    SFMOE_RETURN_IF_ERROR(validate_grouped_tensor(context, "output", output));
    const sfmoe_quantize_config defaults = sfmoe_quantize_config_init();
    if (config != nullptr) SFMOE_RETURN_IF_ERROR(check_quantize_config(context, config));
    SFMOE_RETURN_IF_ERROR(check_high_precision(context, "output", output));
    if (input->memory != output->memory || input->device != output->device) {
      return fail(SFMOE_ERROR_MEMORY_SPACE,
                  "%s: input and output are in different memory spaces or devices", context);
    }
    if (input->row_capacity != output->row_capacity || input->cols != output->cols) {
      return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                  "%s: output must be [%lld, %lld] like the input, got [%lld, %lld]", context,
                  static_cast<long long>(input->row_capacity), static_cast<long long>(input->cols),
                  static_cast<long long>(output->row_capacity),
                  static_cast<long long>(output->cols));
    }
    GroupedDequantizeArgs args;
    SFMOE_RETURN_IF_ERROR(
        describe_quantized(context, "input", input, config ? *config : defaults, &args.quantized));
    if (source != SFMOE_DEQUANTIZE_AUTO && source != SFMOE_DEQUANTIZE_ROWWISE &&
        source != SFMOE_DEQUANTIZE_COLUMNWISE) {
      return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: source %d is not a sfmoe_dequantize_source",
                  context, static_cast<int>(source));
    }
    const bool from_columnwise =
        source == SFMOE_DEQUANTIZE_COLUMNWISE ||
        (source == SFMOE_DEQUANTIZE_AUTO && input->rowwise_data == nullptr);
    if ((from_columnwise ? input->columnwise_data : input->rowwise_data) == nullptr) {
      return fail(SFMOE_ERROR_NULL_POINTER, "%s: input has no %s copy to decode", context,
                  from_columnwise ? "columnwise" : "rowwise");
    }
    args.from_columnwise = from_columnwise;
    args.output = output->rowwise_data;
    args.output_dtype = output->dtype;
    return ops::backend_for(input->memory).grouped_dequantize(args, stream);
  });
}

namespace {

sfmoe_status swizzle_common(const char* context, const sfmoe_tensor* from, const char* from_name,
                            int64_t from_elements, const sfmoe_tensor* to, const char* to_name,
                            int64_t to_elements, int64_t rows, int64_t scale_cols) {
  using namespace sfmoe;
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, from_name, from));
  SFMOE_RETURN_IF_ERROR(validate_tensor(context, to_name, to));
  if (rows < 0 || scale_cols < 0) {
    return fail(SFMOE_ERROR_INVALID_ARGUMENT, "%s: rows and scale_cols must be >= 0", context);
  }
  const sfmoe_tensor* tensors[] = {from, to};
  for (const sfmoe_tensor* t : tensors) {
    if (t->dtype != SFMOE_DTYPE_E8M0 && t->dtype != SFMOE_DTYPE_FP8_E4M3) {
      return fail(SFMOE_ERROR_DTYPE_MISMATCH, "%s: scales must be e8m0 or fp8_e4m3 bytes, got %s",
                  context, sfmoe_dtype_name(t->dtype));
    }
  }
  if (from->memory != to->memory || from->device != to->device) {
    return fail(SFMOE_ERROR_MEMORY_SPACE, "%s: the two tensors are in different memory spaces",
                context);
  }
  if (tensor_element_count(from) < from_elements || tensor_element_count(to) < to_elements) {
    return fail(SFMOE_ERROR_SHAPE_MISMATCH,
                "%s: %s needs %lld bytes and %s %lld bytes for %lld x %lld scales", context,
                from_name, static_cast<long long>(from_elements), to_name,
                static_cast<long long>(to_elements), static_cast<long long>(rows),
                static_cast<long long>(scale_cols));
  }
  return SFMOE_SUCCESS;
}

}  // namespace

sfmoe_status sfmoe_swizzle_scales(const sfmoe_tensor* compact, int64_t rows, int64_t scale_cols,
                                  const sfmoe_tensor* swizzled, void* stream) {
  using namespace sfmoe;
  const char* context = "sfmoe_swizzle_scales";
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(
        swizzle_common(context, compact, "compact", rows * scale_cols, swizzled, "swizzled",
                       numerics::swizzled_scale_padded_size(rows, scale_cols), rows, scale_cols));
    const SwizzleArgs args{static_cast<const uint8_t*>(compact->data), rows, scale_cols,
                           static_cast<uint8_t*>(swizzled->data), false};
    return ops::backend_for(compact->memory).swizzle_scales(args, stream);
  });
}

sfmoe_status sfmoe_unswizzle_scales(const sfmoe_tensor* swizzled, int64_t rows, int64_t scale_cols,
                                    const sfmoe_tensor* compact, void* stream) {
  using namespace sfmoe;
  const char* context = "sfmoe_unswizzle_scales";
  return guarded(context, [&]() -> sfmoe_status {
    SFMOE_RETURN_IF_ERROR(swizzle_common(context, swizzled, "swizzled",
                                         numerics::swizzled_scale_padded_size(rows, scale_cols),
                                         compact, "compact", rows * scale_cols, rows, scale_cols));
    const SwizzleArgs args{static_cast<const uint8_t*>(swizzled->data), rows, scale_cols,
                           static_cast<uint8_t*>(compact->data), true};
    return ops::backend_for(swizzled->memory).swizzle_scales(args, stream);
  });
}

}  // extern "C"
