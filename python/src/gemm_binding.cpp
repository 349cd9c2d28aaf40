// The binding of the grouped GEMM (include/sfmoe/grouped_gemm.h).
#include "binding.h"

namespace sfmoe_binding {
namespace {

// ---- grouped GEMM -------------------------------------------------------------------------------

// The operands and the output as dicts of sfmoe_grouped_tensor fields (see grouped_quantize): the
// Python layer describes plain arrays and quantized tensors alike.
// a_row_index (int32 [a's row_capacity], or None): A's rows gathered from a's data, which holds
// a_source_rows rows.
void grouped_gemm(int32_t form, nb::dict a, nb::dict b, nb::dict out, bool accumulate,
                  bool hadamard, nb::object workspace, uint64_t stream, bool fast_accumulation,
                  nb::object a_row_index, int64_t a_source_rows) {
  const char* function = "grouped_gemm";
  std::vector<nb::ndarray<nb::ro>> keep_inputs;
  std::vector<nb::ndarray<>> keep_output;
  Placement placement;
  sfmoe_grouped_tensor ga = describe_grouped(function, "a", a, &keep_inputs, &placement);
  sfmoe_grouped_tensor gb = describe_grouped(function, "b", b, &keep_inputs, &placement);
  sfmoe_grouped_tensor go = describe_grouped(function, "out", out, &keep_output, &placement);
  place(&ga, placement);
  place(&gb, placement);
  place(&go, placement);
  const OptionalArray<nb::ndarray<>> t_workspace("workspace", workspace, SFMOE_DTYPE_INT64);
  sfmoe_grouped_gemm_config config = sfmoe_grouped_gemm_config_init();
  config.form = to_enum<sfmoe_gemm_form>(form);
  config.accumulate = accumulate ? 1 : 0;
  config.hadamard_columnwise = hadamard ? 1 : 0;
  config.fp8_fast_accumulation = fast_accumulation ? 1 : 0;
  const OptionalArray<nb::ndarray<nb::ro>> t_index("a_row_index", a_row_index, SFMOE_DTYPE_INT32);
  if (t_index.given) {  // a's data holds the source rows; A has as many rows as the index
    config.a_row_index = static_cast<const int32_t*>(t_index.tensor.data);
    config.a_source_rows = a_source_rows;
    ga.row_capacity = t_index.tensor.shape[0];
  }
  call_released([&] {
    return sfmoe_grouped_gemm(&ga, &gb, &config, &go, t_workspace.get(), nullptr,
                              stream_pointer(stream));
  });
}

}  // namespace

void register_gemm(nb::module_& m) {
  m.def("grouped_gemm", &grouped_gemm, "form"_a, "a"_a, "b"_a, "out"_a, "accumulate"_a = false,
        "hadamard"_a = false, "workspace"_a = nb::none(), "stream"_a = 0,
        "fast_accumulation"_a = false, "a_row_index"_a = nb::none(), "a_source_rows"_a = 0,
        "sfmoe_grouped_gemm; a, b and out are dicts of sfmoe_grouped_tensor fields as for\n"
        "grouped_quantize; workspace: grouped_gemm_workspace_bytes(...) bytes (device only).");
}

}  // namespace sfmoe_binding
