// The binding of the grouped quantization (include/sfmoe/quantize.h): amax, quantize, dequantize,
// the scale swizzle and the scale-storage queries.
#include "binding.h"

namespace sfmoe_binding {
namespace {

void grouped_amax(nb::dict input, nb::ndarray<> amax, nb::object status_word, uint64_t stream) {
  const char* function = "grouped_amax";
  std::vector<nb::ndarray<nb::ro>> keep;
  Placement placement;
  sfmoe_grouped_tensor in = describe_grouped(function, "input", input, &keep, &placement);
  const sfmoe_tensor a = describe_field(std::string(function) + ": amax", amax, SFMOE_DTYPE_FP32,
                                        std::max<int64_t>(in.num_groups, 0));
  placement.add("amax", a);
  place(&in, placement);
  sfmoe_status_word* word = word_of(status_word);
  call_released([&] {
    return sfmoe_grouped_amax(&in, static_cast<float*>(a.data), word, stream_pointer(stream));
  });
}

// An input and an output grouped tensor described together (one placement: both on one device)
// with the quantize options; the arrays stay referenced for the call.
struct InputOutput {
  std::vector<nb::ndarray<nb::ro>> keep_input, keep_config;
  std::vector<nb::ndarray<>> keep_output;
  sfmoe_grouped_tensor in, out;
  sfmoe_quantize_config config;

  InputOutput(const char* function, nb::dict input, nb::dict output, nb::handle options) {
    Placement placement;
    in = describe_grouped(function, "input", input, &keep_input, &placement);
    out = describe_grouped(function, "output", output, &keep_output, &placement);
    place(&in, placement);
    place(&out, placement);
    config = describe_config(function, options, &keep_config);
  }
};

void grouped_quantize(nb::dict input, nb::dict output, nb::object config, nb::object status_word,
                      uint64_t stream) {
  InputOutput io("grouped_quantize", input, output, config);
  sfmoe_status_word* word = word_of(status_word);
  call_released([&] {
    return sfmoe_grouped_quantize(&io.in, &io.out, &io.config, word, stream_pointer(stream));
  });
}

void grouped_dequantize(nb::dict input, nb::dict output, int32_t source, nb::object config,
                        uint64_t stream) {
  InputOutput io("grouped_dequantize", input, output, config);
  const bool defaults = config.is_none();
  call_released([&] {
    return sfmoe_grouped_dequantize(&io.in, &io.out, to_enum<sfmoe_dequantize_source>(source),
                                    defaults ? nullptr : &io.config, stream_pointer(stream));
  });
}

// The scale swizzle's two directions: one call with the arrays' roles swapped. Each array is named
// for the layout it holds, in the keywords and in the error messages alike.
struct SwizzleDirection {
  const char* function;
  const char* from;
  const char* from_dtype;
  const char* to;
  const char* to_dtype;
  const char* doc;
  bool inverse;
};
constexpr SwizzleDirection kSwizzleDirections[] = {
    {"swizzle_scales", "compact", "compact_dtype", "swizzled", "swizzled_dtype",
     "sfmoe_swizzle_scales.", false},
    {"unswizzle_scales", "swizzled", "swizzled_dtype", "compact", "compact_dtype",
     "sfmoe_unswizzle_scales.", true},
};

// The library checks both arrays' sizes itself.
void swizzle(const SwizzleDirection& direction, nb::ndarray<nb::ro> from, int32_t from_dtype,
             int64_t rows, int64_t scale_cols, nb::ndarray<> to, int32_t to_dtype,
             uint64_t stream) {
  const std::string function = direction.function;
  const sfmoe_tensor a = describe_array(direction.from, from, from_dtype);
  const sfmoe_tensor b = describe_array(direction.to, to, to_dtype);
  Placement placement;
  placement.add(function + ": " + direction.from, a);
  placement.add(function + ": " + direction.to, b);
  call_released([&] {
    return direction.inverse
               ? sfmoe_unswizzle_scales(&a, rows, scale_cols, &b, stream_pointer(stream))
               : sfmoe_swizzle_scales(&a, rows, scale_cols, &b, stream_pointer(stream));
  });
}

}  // namespace

void register_quantize(nb::module_& m) {
  m.def("grouped_amax", &grouped_amax, "input"_a, "amax"_a.noconvert(),
        "status_word"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_amax: amax[g] = max |x| over group g of the grouped tensor `input` (a\n"
        "dict of fields, see grouped_quantize).");
  m.def("grouped_quantize", &grouped_quantize, "input"_a, "output"_a, "config"_a = nb::none(),
        "status_word"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_quantize. `input` and `output` are dicts of the sfmoe_grouped_tensor\n"
        "fields: dtype, scaling, scale_layout (int); num_groups, row_capacity, cols,\n"
        "row_alignment, uniform_group_rows (int); group_offsets, rowwise_data, rowwise_scale_inv,\n"
        "columnwise_data, columnwise_scale_inv, amax, columnwise_amax (arrays or None); memory\n"
        "and device come from the arrays. `config`: a dict of sfmoe_quantize_config fields.\n"
        "Every array must hold what the descriptor implies (docs/quantization.md).");
  m.def("grouped_dequantize", &grouped_dequantize, "input"_a, "output"_a, "source"_a = 0,
        "config"_a = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_dequantize; dicts as for grouped_quantize (the output: scaling 0, its\n"
        "rowwise_data the [row_capacity, cols] result).");
  for (const SwizzleDirection& direction : kSwizzleDirections) {
    m.def(
        direction.function,
        [d = &direction](nb::ndarray<nb::ro> from, int32_t from_dtype, int64_t rows,
                         int64_t scale_cols, nb::ndarray<> to, int32_t to_dtype, uint64_t stream) {
          swizzle(*d, from, from_dtype, rows, scale_cols, to, to_dtype, stream);
        },
        nb::arg(direction.from).noconvert(), nb::arg(direction.from_dtype), "rows"_a,
        "scale_cols"_a, nb::arg(direction.to).noconvert(), nb::arg(direction.to_dtype),
        "stream"_a = 0, direction.doc);
  }
  m.def(
      "scale_shape",
      [](int32_t scaling, int32_t scale_layout, int64_t num_groups, int64_t copy_rows,
         int64_t copy_cols) {
        return as_tuple(scale_shape(scaling, scale_layout, num_groups, copy_rows, copy_cols));
      },
      "scaling"_a, "scale_layout"_a, "num_groups"_a, "copy_rows"_a, "copy_cols"_a,
      "The shape of one copy's scale array (docs/quantization.md): [copy_rows, copy_cols] is\n"
      "[R, C] for the rowwise copy and [C, R] for the columnwise one; swizzled layouts are 1-D.");
  m.def(
      "scaling_block_size", [](int32_t scaling) { return scaling_block(scaling); }, "scaling"_a,
      "Elements per scale along a copy's rows (the side of 2D blocks); 0 for one scale per group.");
  m.def(
      "min_row_alignment",
      [](int32_t scaling, bool columnwise) {
        return sfmoe_min_row_alignment(to_enum<sfmoe_scaling>(scaling), columnwise ? 1 : 0);
      },
      "scaling"_a, "columnwise"_a,
      "The smallest output row alignment of a quantized grouped tensor (docs/quantization.md).");
  m.def(
      "scale_dtype", [](int32_t scaling) { return scale_dtype_of(scaling); }, "scaling"_a,
      "The sfmoe dtype of a scaling's scale entries (-1: none).");
  m.def(
      "swizzled_scale_padded_size",
      [](int64_t rows, int64_t scale_cols) { return swizzled_size(rows, scale_cols); }, "rows"_a,
      "scale_cols"_a, "Bytes of the swizzled layout of a [rows, scale_cols] scale matrix.");
}

}  // namespace sfmoe_binding
