// The binding of the grouped activations (include/sfmoe/activation.h).
#include "binding.h"

namespace sfmoe_binding {
namespace {

sfmoe_activation_config activation_config(int32_t kind, double limit, double alpha) {
  sfmoe_activation_config c = sfmoe_activation_config_init();
  c.kind = to_enum<sfmoe_activation>(kind);
  c.limit = static_cast<float>(limit);
  c.alpha = static_cast<float>(alpha);
  return c;
}

// What every activation call takes: the input rows in their groups, and each group's real rows.
struct ActivationInput {
  sfmoe_tensor offsets, rows;
  sfmoe_grouped_tensor input;
  int64_t groups;

  ActivationInput(nb::ndarray<nb::ro> data, int32_t dtype, nb::ndarray<nb::ro> group_offsets,
                  nb::ndarray<nb::ro> group_rows)
      : offsets(describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64)),
        rows(describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64)) {
    groups = offsets.ndim == 1 ? offsets.shape[0] - 1 : 0;
    input = rows_descriptor(describe_array("input", data, dtype), groups, 1, offsets);
  }

  // Rows beside the input: the same groups and offsets.
  sfmoe_grouped_tensor like(const sfmoe_tensor& t) const {
    return rows_descriptor(t, groups, 1, offsets);
  }
};

void grouped_activation(nb::ndarray<nb::ro> input, int32_t input_dtype,
                        nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                        int32_t kind, double limit, double alpha, nb::ndarray<> output,
                        int32_t output_dtype, nb::object amax, uint64_t stream) {
  const ActivationInput in(input, input_dtype, group_offsets, group_rows);
  sfmoe_grouped_tensor g_out = in.like(describe_array("output", output, output_dtype));
  const OptionalArray<nb::ndarray<>> group_amax("amax", amax, SFMOE_DTYPE_FP32);
  if (group_amax.given) g_out.amax = static_cast<float*>(group_amax.tensor.data);
  const sfmoe_activation_config c = activation_config(kind, limit, alpha);
  call_released([&] {
    return sfmoe_grouped_activation(&in.input, &in.rows, &c, &g_out, nullptr,
                                    stream_pointer(stream));
  });
}

// The activation quantized on the fly: `output` is a dict of the quantized grouped tensor's
// fields (as for grouped_quantize), `config` the quantize options.
void grouped_activation_quantized(nb::ndarray<nb::ro> input, int32_t input_dtype,
                                  nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                                  int32_t kind, double limit, double alpha, nb::dict output,
                                  nb::object config, uint64_t stream) {
  const ActivationInput in(input, input_dtype, group_offsets, group_rows);
  const QuantizedOutput quantized("grouped_activation", output, config);
  sfmoe_activation_config c = activation_config(kind, limit, alpha);
  c.quantize = &quantized.config;
  call_released([&] {
    return sfmoe_grouped_activation(&in.input, &in.rows, &c, &quantized.out, nullptr,
                                    stream_pointer(stream));
  });
}

void grouped_activation_backward(nb::ndarray<nb::ro> input, int32_t input_dtype,
                                 nb::ndarray<nb::ro> group_offsets, nb::ndarray<nb::ro> group_rows,
                                 nb::ndarray<nb::ro> d_output, int32_t d_output_dtype, int32_t kind,
                                 double limit, double alpha, nb::ndarray<> d_input,
                                 int32_t d_input_dtype, uint64_t stream) {
  const ActivationInput in(input, input_dtype, group_offsets, group_rows);
  const sfmoe_grouped_tensor g_dout = in.like(describe_array("d_output", d_output, d_output_dtype));
  const sfmoe_grouped_tensor g_din = in.like(describe_array("d_input", d_input, d_input_dtype));
  const sfmoe_activation_config c = activation_config(kind, limit, alpha);
  call_released([&] {
    return sfmoe_grouped_activation_backward(&in.input, &in.rows, &g_dout, &c, &g_din, nullptr,
                                             stream_pointer(stream));
  });
}

}  // namespace

void register_activation(nb::module_& m) {
  m.def("grouped_activation", &grouped_activation, "input"_a, "input_dtype"_a, "group_offsets"_a,
        "group_rows"_a, "kind"_a, "limit"_a, "alpha"_a, "output"_a.noconvert(), "output_dtype"_a,
        "amax"_a.none() = nb::none(), "stream"_a = 0,
        "sfmoe_grouped_activation (amax: [G] float32 for the group amax, or None).");
  m.def("grouped_activation_quantized", &grouped_activation_quantized, "input"_a, "input_dtype"_a,
        "group_offsets"_a, "group_rows"_a, "kind"_a, "limit"_a, "alpha"_a, "output"_a,
        "config"_a.none(), "stream"_a = 0,
        "sfmoe_grouped_activation into a quantized output; `output` is a dict of "
        "sfmoe_grouped_tensor fields.");
  m.def("grouped_activation_backward", &grouped_activation_backward, "input"_a, "input_dtype"_a,
        "group_offsets"_a, "group_rows"_a, "d_output"_a, "d_output_dtype"_a, "kind"_a, "limit"_a,
        "alpha"_a, "d_input"_a.noconvert(), "d_input_dtype"_a, "stream"_a = 0,
        "sfmoe_grouped_activation_backward.");
}

}  // namespace sfmoe_binding
