// The binding of permute / unpermute (include/sfmoe/permute.h).
#include "binding.h"

namespace sfmoe_binding {
namespace {

// ---- permute / unpermute
// ----------------------------------------------------

// Permute's inputs and its outputs other than the rows, which both forms take.
struct PermuteArrays {
  sfmoe_tensor tokens, ids, row_map, kept, dropped, workspace;

  PermuteArrays(nb::ndarray<nb::ro> tokens_array, int32_t dtype, nb::ndarray<nb::ro> topk_ids,
                nb::ndarray<> map, nb::ndarray<> tokens_per_expert,
                nb::ndarray<> dropped_per_expert, nb::ndarray<> workspace_array)
      : tokens(describe_array("tokens", tokens_array, dtype)),
        ids(describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32)),
        row_map(describe_array("row_map", map, SFMOE_DTYPE_INT64)),
        kept(describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64)),
        dropped(describe_array("dropped_per_expert", dropped_per_expert, SFMOE_DTYPE_INT64)),
        workspace(describe_array("workspace", workspace_array, SFMOE_DTYPE_INT32)) {}

  sfmoe_status run(const sfmoe_permute_config& config, const sfmoe_grouped_tensor& permuted,
                   uint64_t stream) const {
    return sfmoe_permute(&tokens, &ids, &config, &permuted, &row_map, &kept, &dropped, &workspace,
                         nullptr, stream_pointer(stream));
  }
};

void permute(nb::ndarray<nb::ro> tokens, int32_t dtype, nb::ndarray<nb::ro> topk_ids,
             int64_t expert_capacity, nb::ndarray<> permuted, int64_t num_experts,
             int64_t alignment, nb::ndarray<> group_offsets, nb::ndarray<> row_map,
             nb::ndarray<> tokens_per_expert, nb::ndarray<> dropped_per_expert,
             nb::ndarray<> workspace, nb::object amax, uint64_t stream) {
  const PermuteArrays arrays(tokens, dtype, topk_ids, row_map, tokens_per_expert,
                             dropped_per_expert, workspace);
  const sfmoe_tensor t_rows = describe_array("permuted", permuted, dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  sfmoe_grouped_tensor g = rows_descriptor(t_rows, num_experts, alignment, t_offsets);
  // Each expert's amax of its kept rows.
  const OptionalArray<nb::ndarray<>> group_amax("amax", amax, SFMOE_DTYPE_FP32);
  if (group_amax.given) {
    if (group_amax.tensor.ndim != 1 || group_amax.tensor.shape[0] != num_experts)
      throw nb::value_error("permute: amax must be float32 [num_experts]");
    g.amax = static_cast<float*>(group_amax.tensor.data);
  }
  sfmoe_permute_config config = sfmoe_permute_config_init();
  config.expert_capacity = expert_capacity;
  call_released([&] { return arrays.run(config, g, stream); });
}

// Permute with the fused quantization: `output` is a dict of the quantized grouped tensor's fields
// (as for grouped_quantize), `config` the quantize options.
void permute_quantized(nb::ndarray<nb::ro> tokens, int32_t dtype, nb::ndarray<nb::ro> topk_ids,
                       int64_t expert_capacity, nb::dict output, nb::object config,
                       nb::ndarray<> row_map, nb::ndarray<> tokens_per_expert,
                       nb::ndarray<> dropped_per_expert, nb::ndarray<> workspace, uint64_t stream) {
  const PermuteArrays arrays(tokens, dtype, topk_ids, row_map, tokens_per_expert,
                             dropped_per_expert, workspace);
  const QuantizedOutput quantized("permute", output, config);
  sfmoe_permute_config c = sfmoe_permute_config_init();
  c.expert_capacity = expert_capacity;
  c.quantize = &quantized.config;
  call_released([&] { return arrays.run(c, quantized.out, stream); });
}

void unpermute(nb::ndarray<nb::ro> rows, int32_t rows_dtype, nb::ndarray<nb::ro> group_offsets,
               nb::ndarray<nb::ro> row_map, nb::object probs, nb::ndarray<> out, int32_t out_dtype,
               uint64_t stream) {
  const sfmoe_tensor t_rows = describe_array("rows", rows, rows_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_out = describe_array("out", out, out_dtype);
  const sfmoe_grouped_tensor g =
      rows_descriptor(t_rows, t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0, 1, t_offsets);
  const OptionalArray<nb::ndarray<nb::ro>> t_probs("probs", probs, SFMOE_DTYPE_FP32);
  call_released([&] {
    return sfmoe_unpermute(&g, &t_map, t_probs.get(), &t_out, nullptr, stream_pointer(stream));
  });
}

void unpermute_backward(nb::ndarray<nb::ro> d_out, int32_t d_out_dtype, nb::ndarray<nb::ro> rows,
                        int32_t rows_dtype, nb::ndarray<nb::ro> group_offsets,
                        nb::ndarray<nb::ro> row_map, nb::ndarray<nb::ro> probs,
                        nb::ndarray<nb::ro> group_rows, nb::ndarray<> d_rows, int32_t d_rows_dtype,
                        nb::ndarray<> d_probs, uint64_t stream) {
  const sfmoe_tensor t_group_rows = describe_array("group_rows", group_rows, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dout = describe_array("d_out", d_out, d_out_dtype);
  const sfmoe_tensor t_rows = describe_array("rows", rows, rows_dtype);
  const sfmoe_tensor t_offsets = describe_array("group_offsets", group_offsets, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_map = describe_array("row_map", row_map, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_probs = describe_array("probs", probs, SFMOE_DTYPE_FP32);
  const sfmoe_tensor t_drows = describe_array("d_rows", d_rows, d_rows_dtype);
  const sfmoe_tensor t_dprobs = describe_array("d_probs", d_probs, SFMOE_DTYPE_FP32);
  const int64_t groups = t_offsets.ndim == 1 ? t_offsets.shape[0] - 1 : 0;
  const sfmoe_grouped_tensor g_rows = rows_descriptor(t_rows, groups, 1, t_offsets);
  const sfmoe_grouped_tensor g_drows = rows_descriptor(t_drows, groups, 1, t_offsets);
  call_released([&] {
    return sfmoe_unpermute_backward(&t_dout, &g_rows, &t_map, &t_probs, &t_group_rows, &g_drows,
                                    &t_dprobs, nullptr, stream_pointer(stream));
  });
}

}  // namespace

void register_permute(nb::module_& m) {
  m.def("permute", &permute, "tokens"_a, "dtype"_a, "topk_ids"_a, "expert_capacity"_a,
        "permuted"_a.noconvert(), "num_experts"_a, "alignment"_a, "group_offsets"_a.noconvert(),
        "row_map"_a.noconvert(), "tokens_per_expert"_a.noconvert(),
        "dropped_per_expert"_a.noconvert(), "workspace"_a.noconvert(), "amax"_a.none(),
        "stream"_a = 0, "sfmoe_permute.");
  m.def("permute_quantized", &permute_quantized, "tokens"_a, "dtype"_a, "topk_ids"_a,
        "expert_capacity"_a, "output"_a, "config"_a.none(), "row_map"_a.noconvert(),
        "tokens_per_expert"_a.noconvert(), "dropped_per_expert"_a.noconvert(),
        "workspace"_a.noconvert(), "stream"_a = 0,
        "sfmoe_permute into quantized rows (the fused quantization); `output` is a dict of "
        "sfmoe_grouped_tensor fields.");
  m.def("unpermute", &unpermute, "rows"_a, "rows_dtype"_a, "group_offsets"_a, "row_map"_a,
        "probs"_a.none(), "out"_a.noconvert(), "out_dtype"_a, "stream"_a = 0, "sfmoe_unpermute.");
  m.def("unpermute_backward", &unpermute_backward, "d_out"_a, "d_out_dtype"_a, "rows"_a,
        "rows_dtype"_a, "group_offsets"_a, "row_map"_a, "probs"_a, "group_rows"_a,
        "d_rows"_a.noconvert(), "d_rows_dtype"_a, "d_probs"_a.noconvert(), "stream"_a = 0,
        "sfmoe_unpermute_backward.");
}

}  // namespace sfmoe_binding
