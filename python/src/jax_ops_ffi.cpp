// The ops a JAX user composes, as XLA FFI handlers (python/sfmoe/jax/_ops.py): the router and its
// backward, permute, unpermute and its backward, the three grouped GEMM forms, the grouped
// activation and its backward, on unquantized rows; grouped quantization and the grouped GEMM on
// quantized operands. Each is bound for the host and for CUDA
// (jax_ffi.h). Every buffer is an operand or a result XLA allocates; INT64 arrays (offsets,
// counts, row maps) arrive as INT64 or, without x64, as int32 pairs (jax_ffi.h). The sizes of the
// results and workspaces come from the C planning functions, called by the Python side.
#include "jax_ops_ffi.h"

#include <stdint.h>

#include <string>
#include <vector>

#include "jax_ffi.h"
#include "sfmoe/activation.h"
#include "sfmoe/grouped_gemm.h"
#include "sfmoe/permute.h"
#include "sfmoe/quantize.h"
#include "sfmoe/router.h"

namespace sfmoe_jax {
namespace {

using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

ffi::ErrorOr<int64_t> int_attr(const ffi::Dictionary& attrs, const char* name) {
  return attrs.get<int64_t>(name);
}

#define SFMOE_JAX_INT(var, attrs, name)                   \
  ffi::ErrorOr<int64_t> var##_or = int_attr(attrs, name); \
  if (var##_or.has_error()) return var##_or.error();      \
  const int64_t var = *var##_or

ffi::ErrorOr<sfmoe_router_config> router_config(const ffi::Dictionary& attrs) {
  sfmoe_router_config c = sfmoe_router_config_init();
  const char* names[] = {"top_k",      "score",      "softmax_after_topk",
                         "num_groups", "group_topk", "group_score_topk",
                         "normalize"};
  int64_t v[7];
  for (int i = 0; i < 7; ++i) {
    ffi::ErrorOr<int64_t> got = int_attr(attrs, names[i]);
    if (got.has_error()) return ffi::Unexpected(got.error());
    v[i] = *got;
  }
  ffi::ErrorOr<float> scaling = attrs.get<float>("scaling_factor");
  if (scaling.has_error()) return ffi::Unexpected(scaling.error());
  c.top_k = v[0];
  c.score = static_cast<sfmoe_router_score>(v[1]);
  c.softmax_after_topk = static_cast<int32_t>(v[2]);
  c.num_groups = v[3];
  c.group_topk = v[4];
  c.group_score_topk = v[5];
  c.normalize = static_cast<int32_t>(v[6]);
  c.scaling_factor = *scaling;
  return c;  // (no losses: JAX takes them from the logits, sfmoe.jax.aux_losses)
}

ffi::Error router_forward(const Where& w, Buffer logits, Buffer expert_bias, ffi::Dictionary attrs,
                          Out topk_ids, Out probs, Out tokens_per_expert) {
  ffi::ErrorOr<sfmoe_router_config> c = router_config(attrs);
  if (c.has_error()) return c.error();
  SFMOE_JAX_INT(has_bias, attrs, "has_expert_bias");
  Tensors t{w, {}, {}};
  return checked(sfmoe_router_forward(t.of(logits), has_bias ? t.of(expert_bias) : nullptr, &*c,
                                      t.of(*topk_ids), t.of(*probs), t.int64(*tokens_per_expert),
                                      nullptr, nullptr, nullptr, w.stream));
}

ffi::Error router_backward(const Where& w, Buffer logits, Buffer topk_ids, Buffer tokens_per_expert,
                           Buffer d_probs, ffi::Dictionary attrs, Out d_logits) {
  ffi::ErrorOr<sfmoe_router_config> c = router_config(attrs);
  if (c.has_error()) return c.error();
  Tensors t{w, {}, {}};
  return checked(sfmoe_router_backward(t.of(logits), t.of(topk_ids), t.int64(tokens_per_expert),
                                       &*c, t.of(d_probs), 0.0f, 0.0f, t.of(*d_logits), nullptr,
                                       w.stream));
}

ffi::Error permute(const Where& w, Buffer tokens, Buffer topk_ids, ffi::Dictionary attrs, Out rows,
                   Out group_offsets, Out row_map, Out tokens_per_expert, Out dropped_per_expert,
                   Out workspace) {
  SFMOE_JAX_INT(experts, attrs, "num_experts");
  SFMOE_JAX_INT(alignment, attrs, "row_alignment");
  SFMOE_JAX_INT(capacity, attrs, "expert_capacity");
  const auto dims = rows->dimensions();
  if (dims.size() != 2) return refuse("permute: rows must be 2-D");
  Tensors t{w, {}, {}};
  sfmoe_permute_config c = sfmoe_permute_config_init();
  c.expert_capacity = capacity;
  const sfmoe_grouped_tensor* permuted =
      t.rows(*rows, experts, dims[0], dims[1], &*group_offsets, 0, alignment);
  return checked(sfmoe_permute(t.of(tokens), t.of(topk_ids), &c, permuted, t.int64(*row_map),
                               t.int64(*tokens_per_expert), t.int64(*dropped_per_expert),
                               t.of(*workspace), nullptr, w.stream));
}

// Rows [row_capacity, cols] grouped by `offsets` (INT64 [G + 1]).
const sfmoe_grouped_tensor* rows_of(Tensors& t, const Buffer& data, const Buffer& offsets) {
  const auto dims = data.dimensions();
  return t.rows(data, Tensors::int64_count(offsets) - 1, dims.size() > 0 ? dims[0] : 0,
                dims.size() > 1 ? dims[1] : 0, &offsets);
}

ffi::Error unpermute(const Where& w, Buffer rows, Buffer group_offsets, Buffer row_map,
                     Buffer probs, ffi::Dictionary attrs, Out out) {
  SFMOE_JAX_INT(has_probs, attrs, "has_probs");
  Tensors t{w, {}, {}};
  return checked(sfmoe_unpermute(rows_of(t, rows, group_offsets), t.int64(row_map),
                                 has_probs ? t.of(probs) : nullptr, t.of(*out), nullptr, w.stream));
}

ffi::Error unpermute_backward(const Where& w, Buffer d_out, Buffer rows, Buffer group_offsets,
                              Buffer row_map, Buffer probs, Buffer group_rows, Out d_rows,
                              Out d_probs) {
  Tensors t{w, {}, {}};
  return checked(sfmoe_unpermute_backward(
      t.of(d_out), rows_of(t, rows, group_offsets), t.int64(row_map), t.of(probs),
      t.int64(group_rows), rows_of(t, *d_rows, group_offsets), t.of(*d_probs), nullptr, w.stream));
}

// A weight [G, N, K] as G uniform groups of N rows.
const sfmoe_grouped_tensor* weight_of(Tensors& t, const Buffer& data) {
  const auto d = data.dimensions();
  if (d.size() != 3) return nullptr;
  return t.rows(data, d[0], d[0] * d[1], d[2], nullptr, d[1]);
}

ffi::Error grouped_gemm(const Where& w, Buffer a, Buffer b, Buffer group_offsets,
                        ffi::Dictionary attrs, Out out, Out workspace) {
  SFMOE_JAX_INT(form, attrs, "form");
  Tensors t{w, {}, {}};
  const sfmoe_grouped_tensor* lhs = rows_of(t, a, group_offsets);
  const sfmoe_grouped_tensor* rhs =
      form == SFMOE_GEMM_WGRAD ? rows_of(t, b, group_offsets) : weight_of(t, b);
  const sfmoe_grouped_tensor* result =
      form == SFMOE_GEMM_WGRAD ? weight_of(t, *out) : rows_of(t, *out, group_offsets);
  if (rhs == nullptr || result == nullptr) return refuse("grouped_gemm: weights must be [G, N, K]");
  sfmoe_grouped_gemm_config c = sfmoe_grouped_gemm_config_init();
  c.form = static_cast<sfmoe_gemm_form>(form);
  return checked(sfmoe_grouped_gemm(lhs, rhs, &c, result, t.of(*workspace), nullptr, w.stream));
}

// ---- quantized grouped tensors
// ------------------------------------------------------------------- A quantized tensor travels as
// seven arrays, in sfmoe.GroupedQuantizedTensor's order: the rowwise data, the columnwise data,
// their scales, the amax, the columnwise amax, the group offsets (INT64 as JAX holds it); an absent
// one is a 0-byte array. Its host fields are attributes.
constexpr int kQuantizedArrays = 7;
const char* const kQuantizedFields[] = {"dtype",         "scaling",           "scale_layout",
                                        "num_groups",    "row_capacity",      "cols",
                                        "row_alignment", "uniform_group_rows"};

ffi::Error quantized_of(const Where& w, const ffi::Dictionary& attrs, const std::string& prefix,
                        void* const* arrays, sfmoe_grouped_tensor* out) {
  int64_t v[8];
  for (int i = 0; i < 8; ++i) {
    ffi::ErrorOr<int64_t> got = attrs.get<int64_t>(prefix + kQuantizedFields[i]);
    if (got.has_error()) return got.error();
    v[i] = *got;
  }
  sfmoe_grouped_tensor g = sfmoe_grouped_tensor_init();
  g.memory = w.memory;
  g.device = w.device;
  g.dtype = static_cast<sfmoe_dtype>(v[0]);
  g.scaling = static_cast<sfmoe_scaling>(v[1]);
  g.scale_layout = static_cast<sfmoe_scale_layout>(v[2]);
  g.num_groups = v[3];
  g.row_capacity = v[4];
  g.cols = v[5];
  g.row_alignment = v[6];
  g.uniform_group_rows = v[7];
  g.rowwise_data = arrays[0];
  g.columnwise_data = arrays[1];
  g.rowwise_scale_inv = arrays[2];
  g.columnwise_scale_inv = arrays[3];
  g.amax = static_cast<float*>(arrays[4]);
  g.columnwise_amax = static_cast<float*>(arrays[5]);
  g.group_offsets = static_cast<int64_t*>(arrays[6]);
  *out = g;
  return ffi::Error::Success();
}

template <class B>
void* present(B& b) {
  return b.size_bytes() > 0 ? b.untyped_data() : nullptr;
}

// Grouped quantization of rows x [rows, cols] (groups by `offsets`, or uniform_group_rows) into
// the seven result arrays, laid out by the C planner for the request in the attributes.
ffi::Error grouped_quantize(const Where& w, Buffer x, Buffer offsets, ffi::Dictionary attrs,
                            Out data, Out columnwise_data, Out scales, Out columnwise_scales,
                            Out amax, Out columnwise_amax, Out out_offsets) {
  SFMOE_JAX_INT(uniform, attrs, "uniform_group_rows");
  SFMOE_JAX_INT(power_of_two, attrs, "power_of_two_scales");
  void* arrays[kQuantizedArrays] = {
      present(*data), present(*columnwise_data), present(*scales),     present(*columnwise_scales),
      present(*amax), present(*columnwise_amax), present(*out_offsets)};
  sfmoe_grouped_tensor output;
  ffi::Error made = quantized_of(w, attrs, "", arrays, &output);
  if (made.failure()) return made;
  const auto dims = x.dimensions();
  if (dims.size() != 2) return refuse("quantize: x must be 2-D [rows, cols]");
  Tensors t{w, {}, {}};
  const sfmoe_grouped_tensor* input =
      uniform > 0 ? t.rows(x, output.num_groups, dims[0], dims[1], nullptr, uniform)
                  : t.rows(x, output.num_groups, dims[0], dims[1], &offsets);
  sfmoe_quantize_config c = sfmoe_quantize_config_init();
  c.power_of_two_scales = static_cast<int32_t>(power_of_two);
  return checked(sfmoe_grouped_quantize(input, &output, &c, nullptr, w.stream));
}

// The grouped GEMM on two quantized operands (attributes a_* and b_*: their host fields).
ffi::Error grouped_gemm_quantized(const Where& w, ffi::RemainingArgs operands,
                                  ffi::Dictionary attrs, Out out, Out workspace) {
  SFMOE_JAX_INT(form, attrs, "form");
  SFMOE_JAX_INT(fast, attrs, "fast_accumulation");
  SFMOE_JAX_INT(hadamard, attrs, "hadamard_columnwise");
  if (operands.size() != 2 * kQuantizedArrays + 1) {
    return refuse("grouped_gemm: expected the 7 arrays of each quantized operand and the offsets");
  }
  void* arrays[2 * kQuantizedArrays];
  for (int i = 0; i < 2 * kQuantizedArrays; ++i) {
    ffi::ErrorOr<Buffer> b = operands.get<Buffer>(i);
    if (b.has_error()) return b.error();
    arrays[i] = present(*b);
  }
  ffi::ErrorOr<Buffer> offsets = operands.get<Buffer>(2 * kQuantizedArrays);
  if (offsets.has_error()) return offsets.error();
  sfmoe_grouped_tensor a, b;
  ffi::Error made = quantized_of(w, attrs, "a_", arrays, &a);
  if (made.failure()) return made;
  made = quantized_of(w, attrs, "b_", arrays + kQuantizedArrays, &b);
  if (made.failure()) return made;
  Tensors t{w, {}, {}};
  const sfmoe_grouped_tensor* result =
      form == SFMOE_GEMM_WGRAD ? weight_of(t, *out) : rows_of(t, *out, *offsets);
  if (result == nullptr) return refuse("grouped_gemm: weights must be [G, N, K]");
  sfmoe_grouped_gemm_config c = sfmoe_grouped_gemm_config_init();
  c.form = static_cast<sfmoe_gemm_form>(form);
  c.fp8_fast_accumulation = static_cast<int32_t>(fast);
  c.hadamard_columnwise = static_cast<int32_t>(hadamard);
  return checked(sfmoe_grouped_gemm(&a, &b, &c, result, t.of(*workspace), nullptr, w.stream));
}

ffi::ErrorOr<sfmoe_activation_config> activation_config(const ffi::Dictionary& attrs) {
  sfmoe_activation_config c = sfmoe_activation_config_init();
  ffi::ErrorOr<int64_t> kind = int_attr(attrs, "kind");
  if (kind.has_error()) return ffi::Unexpected(kind.error());
  ffi::ErrorOr<float> limit = attrs.get<float>("limit");
  if (limit.has_error()) return ffi::Unexpected(limit.error());
  ffi::ErrorOr<float> alpha = attrs.get<float>("alpha");
  if (alpha.has_error()) return ffi::Unexpected(alpha.error());
  c.kind = static_cast<sfmoe_activation>(*kind);
  c.limit = *limit;
  c.alpha = *alpha;
  return c;
}

ffi::Error activation(const Where& w, Buffer x, Buffer group_offsets, Buffer group_rows,
                      ffi::Dictionary attrs, Out out) {
  ffi::ErrorOr<sfmoe_activation_config> c = activation_config(attrs);
  if (c.has_error()) return c.error();
  Tensors t{w, {}, {}};
  return checked(sfmoe_grouped_activation(rows_of(t, x, group_offsets), t.int64(group_rows), &*c,
                                          rows_of(t, *out, group_offsets), nullptr, w.stream));
}

ffi::Error activation_backward(const Where& w, Buffer x, Buffer d_out, Buffer group_offsets,
                               Buffer group_rows, ffi::Dictionary attrs, Out d_x) {
  ffi::ErrorOr<sfmoe_activation_config> c = activation_config(attrs);
  if (c.has_error()) return c.error();
  Tensors t{w, {}, {}};
  return checked(sfmoe_grouped_activation_backward(
      rows_of(t, x, group_offsets), t.int64(group_rows), rows_of(t, d_out, group_offsets), &*c,
      rows_of(t, *d_x, group_offsets), nullptr, w.stream));
}

}  // namespace
}  // namespace sfmoe_jax

// (the bindings below name the handlers' argument types)
using sfmoe_jax::Buffer;
using Attributes = xla::ffi::Dictionary;

SFMOE_JAX_HANDLERS(
    SfmoeRouterForward, sfmoe_jax::router_forward,
    .Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>().Ret<Buffer>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(
    SfmoeRouterBackward, sfmoe_jax::router_backward,
    .Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(SfmoePermute, sfmoe_jax::permute,
                   .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Attrs<Attributes>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>());
SFMOE_JAX_HANDLERS(
    SfmoeUnpermute, sfmoe_jax::unpermute,
    .Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(SfmoeUnpermuteBackward, sfmoe_jax::unpermute_backward,
                   .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>());
SFMOE_JAX_HANDLERS(
    SfmoeGroupedGemm, sfmoe_jax::grouped_gemm,
    .Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(SfmoeGroupedQuantize, sfmoe_jax::grouped_quantize,
                   .Arg<Buffer>()
                       .Arg<Buffer>()
                       .Attrs<Attributes>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>()
                       .Ret<Buffer>());
SFMOE_JAX_HANDLERS(SfmoeGroupedGemmQuantized, sfmoe_jax::grouped_gemm_quantized,
                   .RemainingArgs().Attrs<Attributes>().Ret<Buffer>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(SfmoeActivation, sfmoe_jax::activation,
                   .Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>());
SFMOE_JAX_HANDLERS(
    SfmoeActivationBackward, sfmoe_jax::activation_backward,
    .Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Arg<Buffer>().Attrs<Attributes>().Ret<Buffer>());

namespace sfmoe_jax {

std::vector<HandlerPair> op_handlers() {
  auto pair = [](const char* name, XLA_FFI_Handler* host, XLA_FFI_Handler* cuda) {
    return HandlerPair{name, reinterpret_cast<void*>(host), reinterpret_cast<void*>(cuda)};
  };
  return {
      pair("sfmoe_router_forward", SfmoeRouterForwardHost, SfmoeRouterForwardCuda),
      pair("sfmoe_router_backward", SfmoeRouterBackwardHost, SfmoeRouterBackwardCuda),
      pair("sfmoe_permute", SfmoePermuteHost, SfmoePermuteCuda),
      pair("sfmoe_unpermute", SfmoeUnpermuteHost, SfmoeUnpermuteCuda),
      pair("sfmoe_unpermute_backward", SfmoeUnpermuteBackwardHost, SfmoeUnpermuteBackwardCuda),
      pair("sfmoe_grouped_gemm", SfmoeGroupedGemmHost, SfmoeGroupedGemmCuda),
      pair("sfmoe_grouped_quantize", SfmoeGroupedQuantizeHost, SfmoeGroupedQuantizeCuda),
      pair("sfmoe_grouped_gemm_quantized", SfmoeGroupedGemmQuantizedHost,
           SfmoeGroupedGemmQuantizedCuda),
      pair("sfmoe_activation", SfmoeActivationHost, SfmoeActivationCuda),
      pair("sfmoe_activation_backward", SfmoeActivationBackwardHost, SfmoeActivationBackwardCuda)};
}

}  // namespace sfmoe_jax
