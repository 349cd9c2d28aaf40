// The binding of the router (include/sfmoe/router.h).
#include "binding.h"

namespace sfmoe_binding {

sfmoe_router_config router_config(const nb::dict& config) {
  sfmoe_router_config c = sfmoe_router_config_init();
  c.top_k = nb::cast<int64_t>(config["top_k"]);
  c.score = to_enum<sfmoe_router_score>(nb::cast<int32_t>(config["score"]));
  c.softmax_after_topk = nb::cast<bool>(config["softmax_after_topk"]) ? 1 : 0;
  c.num_groups = nb::cast<int64_t>(config["num_groups"]);
  c.group_topk = nb::cast<int64_t>(config["group_topk"]);
  c.group_score_topk = nb::cast<int64_t>(config["group_score_topk"]);
  c.scaling_factor = static_cast<float>(nb::cast<double>(config["scaling_factor"]));
  c.normalize = nb::cast<bool>(config["normalize"]) ? 1 : 0;
  c.aux_loss_coeff = static_cast<float>(nb::cast<double>(config["aux_loss_coeff"]));
  c.z_loss_coeff = static_cast<float>(nb::cast<double>(config["z_loss_coeff"]));
  return c;
}

namespace {

void router_forward(nb::ndarray<nb::ro> logits, int32_t logits_dtype, nb::object expert_bias,
                    nb::dict config, nb::ndarray<> topk_ids, nb::ndarray<> probs,
                    nb::ndarray<> tokens_per_expert, nb::object aux_loss, nb::object z_loss,
                    nb::object workspace, uint64_t stream) {
  const sfmoe_router_config c = router_config(config);
  const sfmoe_tensor t_logits = describe_array("logits", logits, logits_dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_probs = describe_array("probs", probs, SFMOE_DTYPE_FP32);
  const sfmoe_tensor t_counts =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  const OptionalArray<nb::ndarray<>> t_workspace("workspace", workspace, SFMOE_DTYPE_FP32);
  const OptionalArray<nb::ndarray<nb::ro>> t_bias("expert_bias", expert_bias, SFMOE_DTYPE_FP32);
  const OptionalArray<nb::ndarray<>> t_aux("aux_loss", aux_loss, SFMOE_DTYPE_FP32);
  const OptionalArray<nb::ndarray<>> t_z("z_loss", z_loss, SFMOE_DTYPE_FP32);
  call_released([&] {
    return sfmoe_router_forward(&t_logits, t_bias.get(), &c, &t_ids, &t_probs, &t_counts,
                                t_aux.get(), t_z.get(), t_workspace.get(), stream_pointer(stream));
  });
}

void router_backward(nb::ndarray<nb::ro> logits, int32_t logits_dtype, nb::ndarray<nb::ro> topk_ids,
                     nb::ndarray<nb::ro> tokens_per_expert, nb::dict config, nb::object d_probs,
                     double d_aux_loss, double d_z_loss, nb::ndarray<> d_logits, uint64_t stream) {
  const sfmoe_router_config c = router_config(config);
  const sfmoe_tensor t_logits = describe_array("logits", logits, logits_dtype);
  const sfmoe_tensor t_ids = describe_array("topk_ids", topk_ids, SFMOE_DTYPE_INT32);
  const sfmoe_tensor t_counts =
      describe_array("tokens_per_expert", tokens_per_expert, SFMOE_DTYPE_INT64);
  const sfmoe_tensor t_dlogits = describe_array("d_logits", d_logits, SFMOE_DTYPE_FP32);
  const OptionalArray<nb::ndarray<nb::ro>> t_dprobs("d_probs", d_probs, SFMOE_DTYPE_FP32);
  call_released([&] {
    return sfmoe_router_backward(&t_logits, &t_ids, &t_counts, &c, t_dprobs.get(),
                                 static_cast<float>(d_aux_loss), static_cast<float>(d_z_loss),
                                 &t_dlogits, nullptr, stream_pointer(stream));
  });
}

}  // namespace

void register_router(nb::module_& m) {
  m.def("router_forward", &router_forward, "logits"_a, "logits_dtype"_a, "expert_bias"_a.none(),
        "config"_a, "topk_ids"_a.noconvert(), "probs"_a.noconvert(),
        "tokens_per_expert"_a.noconvert(), "aux_loss"_a.none(), "z_loss"_a.none(),
        "workspace"_a.none(), "stream"_a = 0,
        "sfmoe_router_forward; `config` is a dict of the sfmoe_router_config fields.");
  m.def("router_backward", &router_backward, "logits"_a, "logits_dtype"_a, "topk_ids"_a,
        "tokens_per_expert"_a, "config"_a, "d_probs"_a.none(), "d_aux_loss"_a, "d_z_loss"_a,
        "d_logits"_a.noconvert(), "stream"_a = 0, "sfmoe_router_backward.");
}

}  // namespace sfmoe_binding
