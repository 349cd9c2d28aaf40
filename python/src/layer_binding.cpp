// The binding of the MoE layer (include/sfmoe/moe_layer.h): a Python object owning one
// sfmoe_moe_layer, its plan as a dict, and its two calls over caller-allocated arrays; and the
// NCCL expert-parallel group (include/sfmoe/ep.h) such a layer can run over.
#include <string.h>

#include "binding.h"
#include "sfmoe/ep.h"
#include "sfmoe/moe_layer.h"

namespace sfmoe_binding {
namespace {

// Plain byte buffers (saved state, workspace) are described with a one-byte dtype.
constexpr int32_t kByteDtype = SFMOE_DTYPE_FP8_E4M3;

sfmoe_moe_layer_config layer_config(const nb::dict& d) {
  sfmoe_moe_layer_config c = sfmoe_moe_layer_config_init();
  c.hidden = nb::cast<int64_t>(d["hidden"]);
  c.ffn_hidden = nb::cast<int64_t>(d["ffn_hidden"]);
  c.num_experts = nb::cast<int64_t>(d["num_experts"]);
  c.max_tokens = nb::cast<int64_t>(d["max_tokens"]);
  c.router = router_config(nb::cast<nb::dict>(d["router"]));
  store_enum(&c.activation, nb::cast<int32_t>(d["activation"]));
  c.activation_limit = static_cast<float>(nb::cast<double>(d["activation_limit"]));
  c.activation_alpha = static_cast<float>(nb::cast<double>(d["activation_alpha"]));
  c.expert_capacity = nb::cast<int64_t>(d["expert_capacity"]);
  c.row_alignment = nb::cast<int64_t>(d["row_alignment"]);
  store_enum(&c.dtype, nb::cast<int32_t>(d["dtype"]));
  store_enum(&c.recipe, nb::cast<int32_t>(d["recipe"]));
  c.accumulate_weight_grads = nb::cast<bool>(d["accumulate_weight_grads"]) ? 1 : 0;
  if (d.contains("seed")) c.seed = nb::cast<uint64_t>(d["seed"]);
  // Expert parallelism without a group (the loopback, or EXTERNAL stages), when given.
  if (d.contains("ep_transport")) {
    c.ep_world_size = nb::cast<int32_t>(d["ep_world_size"]);
    c.ep_receive_capacity = nb::cast<int64_t>(d["ep_receive_capacity"]);
    store_enum(&c.ep_overflow, nb::cast<int32_t>(d["ep_overflow"]));
    c.ep_spill_capacity = nb::cast<int64_t>(d["ep_spill_capacity"]);
    store_enum(&c.ep_transport, nb::cast<int32_t>(d["ep_transport"]));
    if (d.contains("ep_pair_capacity"))
      c.ep_pair_capacity = nb::cast<int64_t>(d["ep_pair_capacity"]);
  }
  return c;
}

// A sequence's collectives as [(all_to_all, bytes), ...].
nb::list collectives_of(const sfmoe_moe_stages& s) {
  nb::list out;
  for (int32_t i = 0; i < s.collectives; ++i) {
    out.append(nb::make_tuple(s.collective[i].kind == SFMOE_EP_COLLECTIVE_ALL_TO_ALL,
                              s.collective[i].bytes));
  }
  return out;
}

// One rank's NCCL group, from a dict of the sfmoe_ep_config fields and the ranks' shared id.
class EpGroup {
 public:
  EpGroup(const nb::dict& d, nb::bytes unique_id, int32_t device) {
    if (unique_id.size() != SFMOE_EP_NCCL_UNIQUE_ID_BYTES) {
      throw nb::value_error("unique_id: expected the 128 bytes of ep_nccl_unique_id()");
    }
    memcpy(id_, unique_id.c_str(), sizeof(id_));
    sfmoe_ep_config c = sfmoe_ep_config_init();
    c.transport = SFMOE_EP_TRANSPORT_NCCL;
    c.world_size = nb::cast<int32_t>(d["world_size"]);
    c.rank = nb::cast<int32_t>(d["rank"]);
    c.experts_per_rank = nb::cast<int64_t>(d["experts_per_rank"]);
    c.max_tokens_per_rank = nb::cast<int64_t>(d["max_tokens_per_rank"]);
    c.top_k = nb::cast<int64_t>(d["top_k"]);
    c.hidden = nb::cast<int64_t>(d["hidden"]);
    store_enum(&c.payload, nb::cast<int32_t>(d["payload"]));
    c.row_alignment = nb::cast<int64_t>(d["row_alignment"]);
    c.receive_capacity = nb::cast<int64_t>(d["receive_capacity"]);
    store_enum(&c.overflow, nb::cast<int32_t>(d["overflow"]));
    c.spill_capacity = nb::cast<int64_t>(d["spill_capacity"]);
    if (d.contains("pair_capacity")) c.pair_capacity = nb::cast<int64_t>(d["pair_capacity"]);
    c.nccl_unique_id = id_;
    // (blocks until every rank has made its group: set-up, outside any step)
    call_released([&] { return sfmoe_ep_group_create(&c, SFMOE_MEMORY_CUDA, device, &group_); });
    plan_ = sfmoe_ep_plan_init();
    check(sfmoe_ep_group_get_plan(group_, &plan_));
  }
  ~EpGroup() { sfmoe_ep_group_destroy(group_); }
  EpGroup(const EpGroup&) = delete;
  EpGroup& operator=(const EpGroup&) = delete;

  const sfmoe_ep_group* get() const { return group_; }
  nb::dict plan() const {
    nb::dict d;
    d["receive_capacity"] = plan_.receive_capacity;
    d["receive_rows"] = plan_.receive_rows;
    d["rounds"] = plan_.rounds;
    d["pair_rows"] = plan_.pair_rows;
    d["staging_bytes"] = plan_.staging_bytes;
    return d;
  }

 private:
  uint8_t id_[SFMOE_EP_NCCL_UNIQUE_ID_BYTES];
  sfmoe_ep_group* group_ = nullptr;
  sfmoe_ep_plan plan_;
};

nb::bytes ep_nccl_unique_id() {
  uint8_t id[SFMOE_EP_NCCL_UNIQUE_ID_BYTES];
  check(sfmoe_ep_nccl_unique_id(id));
  return nb::bytes(reinterpret_cast<const char*>(id), sizeof(id));
}

class MoeLayer {
 public:
  MoeLayer(const nb::dict& config, int32_t memory, int32_t device) {
    config_ = layer_config(config);
    if (config.contains("ep_group") && !config["ep_group"].is_none()) {
      group_ = nb::borrow<nb::object>(config["ep_group"]);  // (kept alive as long as the layer)
      config_.ep_group = nb::cast<const EpGroup&>(group_).get();
      config_.ep_world_size = nb::cast<int32_t>(config["ep_world_size"]);
    }
    check(sfmoe_moe_layer_create(&config_, to_enum<sfmoe_memory>(memory), device, &layer_));
    plan_ = sfmoe_moe_layer_plan_init();
    check(sfmoe_moe_layer_get_plan(layer_, &plan_));
  }
  ~MoeLayer() { sfmoe_moe_layer_destroy(layer_); }
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  nb::dict plan() const {
    nb::dict d;
    d["saved_bytes"] = plan_.saved_bytes;
    d["workspace_bytes"] = plan_.workspace_bytes;
    d["forward_workspace_bytes"] = plan_.forward_workspace_bytes;
    d["fc1_backward_workspace_bytes"] = plan_.fc1_backward_workspace_bytes;
    d["row_capacity"] = plan_.row_capacity;
    d["fc1_cols"] = plan_.fc1_cols;
    d["emulated"] = plan_.emulated != 0;
    d["local_experts"] = plan_.local_experts;
    d["backward_peak_bytes_two_parts"] = plan_.backward_peak_bytes_two_parts;
    d["backward_peak_bytes_three_parts"] = plan_.backward_peak_bytes_three_parts;
    d["three_part_backward"] = plan_.three_part_backward != 0;
    d["weight_cache_bytes"] = plan_.weight_cache_bytes;
    return d;
  }

  // An EXTERNAL layer's collectives: {"forward": [...], "backward": [...]} (the whole backward).
  nb::dict stages() const {
    sfmoe_moe_stages forward = sfmoe_moe_stages_init(), backward = sfmoe_moe_stages_init();
    check(sfmoe_moe_layer_get_forward_stages(layer_, &forward));
    check(sfmoe_moe_layer_get_backward_stages(layer_, SFMOE_MOE_BACKWARD_ALL, &backward));
    nb::dict d;
    d["forward"] = collectives_of(forward);
    d["backward"] = collectives_of(backward);
    return d;
  }

  void forward(nb::ndarray<nb::ro> x, nb::ndarray<nb::ro> logits, int32_t logits_dtype,
               nb::object expert_bias, nb::ndarray<nb::ro> w1, nb::ndarray<nb::ro> w2,
               nb::ndarray<> y, nb::ndarray<> saved, nb::ndarray<> workspace, nb::object aux_loss,
               nb::object z_loss, nb::object tokens_per_expert, nb::object dropped_per_expert,
               nb::object routed_per_expert, nb::object status_word, uint64_t stream,
               nb::object weight_cache, bool weight_cache_filled) {
    const int32_t dtype = static_cast<int32_t>(config_.dtype);
    const sfmoe_tensor t_x = describe_array("x", x, dtype);
    const sfmoe_tensor t_logits = describe_array("logits", logits, logits_dtype);
    const sfmoe_tensor t_w1 = describe_array("w1", w1, dtype);
    const sfmoe_tensor t_w2 = describe_array("w2", w2, dtype);
    const sfmoe_tensor t_y = describe_array("y", y, dtype);
    const sfmoe_tensor t_saved = describe_array("saved", saved, kByteDtype);
    const sfmoe_tensor t_ws = describe_array("workspace", workspace, kByteDtype);
    const OptionalArray<nb::ndarray<nb::ro>> t_bias("expert_bias", expert_bias, SFMOE_DTYPE_FP32);
    const OptionalArray<nb::ndarray<>> t_aux("aux_loss", aux_loss, SFMOE_DTYPE_FP32);
    const OptionalArray<nb::ndarray<>> t_z("z_loss", z_loss, SFMOE_DTYPE_FP32);
    const OptionalArray<nb::ndarray<>> t_kept("tokens_per_expert", tokens_per_expert,
                                              SFMOE_DTYPE_INT64);
    const OptionalArray<nb::ndarray<>> t_dropped("dropped_per_expert", dropped_per_expert,
                                                 SFMOE_DTYPE_INT64);
    const OptionalArray<nb::ndarray<>> t_routed("routed_per_expert", routed_per_expert,
                                                SFMOE_DTYPE_INT64);
    const OptionalArray<nb::ndarray<>> t_cache("weight_cache", weight_cache, kByteDtype);
    sfmoe_moe_forward_args a = sfmoe_moe_forward_args_init();
    a.x = &t_x;
    a.logits = &t_logits;
    a.expert_bias = t_bias.get();
    a.w1 = &t_w1;
    a.w2 = &t_w2;
    a.y = &t_y;
    a.saved = &t_saved;
    a.workspace = &t_ws;
    a.aux_loss = t_aux.get();
    a.z_loss = t_z.get();
    a.tokens_per_expert = t_kept.get();
    a.dropped_per_expert = t_dropped.get();
    a.routed_per_expert = t_routed.get();
    a.weight_cache = t_cache.get();
    a.weight_cache_filled = weight_cache_filled ? 1 : 0;
    a.word = word_of(status_word);
    a.stream = stream_pointer(stream);
    call_released([&] { return sfmoe_moe_layer_forward(layer_, &a); });
  }

  void fill_weight_cache(nb::ndarray<nb::ro> w1, nb::ndarray<nb::ro> w2, nb::ndarray<> cache,
                         nb::object status_word, uint64_t stream) {
    const int32_t dtype = static_cast<int32_t>(config_.dtype);
    const sfmoe_tensor t_w1 = describe_array("w1", w1, dtype);
    const sfmoe_tensor t_w2 = describe_array("w2", w2, dtype);
    const sfmoe_tensor t_cache = describe_array("weight_cache", cache, kByteDtype);
    sfmoe_status_word* word = word_of(status_word);
    void* s = stream_pointer(stream);
    call_released(
        [&] { return sfmoe_moe_layer_fill_weight_cache(layer_, &t_w1, &t_w2, &t_cache, word, s); });
  }

  // The backward whole (part 0) or one of its parts (sfmoe_moe_backward_part): the arrays a part
  // does not read may be None.
  void backward(nb::object x, nb::object d_y, nb::object logits, int32_t logits_dtype,
                nb::object w1, nb::object w2, nb::object saved, nb::ndarray<> workspace,
                double d_aux_loss, double d_z_loss, nb::object d_x, nb::object d_logits,
                nb::object d_w1, nb::object d_w2, uint64_t rng_offset, int32_t part,
                nb::object status_word, uint64_t stream, nb::object rng_offset_device,
                nb::object weight_cache, bool weight_cache_filled) {
    using In = OptionalArray<nb::ndarray<nb::ro>>;
    using Out = OptionalArray<nb::ndarray<>>;
    const int32_t dtype = static_cast<int32_t>(config_.dtype);
    const int32_t grads = config_.accumulate_weight_grads ? SFMOE_DTYPE_FP32 : dtype;
    const In t_x("x", x, dtype), t_dy("d_y", d_y, dtype), t_logits("logits", logits, logits_dtype);
    const In t_w1("w1", w1, dtype), t_w2("w2", w2, dtype);
    const Out t_saved("saved", saved, kByteDtype);  // (None for the FC2_WGRAD part)
    const sfmoe_tensor t_ws = describe_array("workspace", workspace, kByteDtype);
    const Out t_dx("d_x", d_x, dtype), t_dlogits("d_logits", d_logits, SFMOE_DTYPE_FP32);
    const Out t_dw1("d_w1", d_w1, grads), t_dw2("d_w2", d_w2, grads);
    const In t_offset("rng_offset_device", rng_offset_device, SFMOE_DTYPE_INT64);
    const Out t_cache("weight_cache", weight_cache, kByteDtype);
    sfmoe_moe_backward_args a = sfmoe_moe_backward_args_init();
    store_enum(&a.part, part);
    a.x = t_x.get();
    a.d_y = t_dy.get();
    a.logits = t_logits.get();
    a.w1 = t_w1.get();
    a.w2 = t_w2.get();
    a.saved = t_saved.get();
    a.workspace = &t_ws;
    a.d_aux_loss = static_cast<float>(d_aux_loss);
    a.d_z_loss = static_cast<float>(d_z_loss);
    a.rng_offset = rng_offset;
    a.rng_offset_device = t_offset.get();
    a.d_x = t_dx.get();
    a.d_logits = t_dlogits.get();
    a.d_w1 = t_dw1.get();
    a.d_w2 = t_dw2.get();
    a.weight_cache = t_cache.get();
    a.weight_cache_filled = weight_cache_filled ? 1 : 0;
    a.word = word_of(status_word);
    a.stream = stream_pointer(stream);
    call_released([&] { return sfmoe_moe_layer_backward(layer_, &a); });
  }

 private:
  sfmoe_moe_layer_config config_;
  nb::object group_;  // the EpGroup the layer borrows, or None
  sfmoe_moe_layer* layer_ = nullptr;
  sfmoe_moe_layer_plan plan_;
};

}  // namespace

void register_layer(nb::module_& m) {
  nb::class_<EpGroup>(m, "EpGroup",
                      "sfmoe_ep_group over NCCL, one rank of it: created from a dict of the "
                      "sfmoe_ep_config fields and the ranks' shared unique id (every rank creates "
                      "its group at the same time).")
      .def(nb::init<const nb::dict&, nb::bytes, int32_t>(), "config"_a, "unique_id"_a,
           "device"_a = 0)
      .def("plan", &EpGroup::plan, "sfmoe_ep_group_get_plan as a dict.");
  m.def("ep_nccl_unique_id", &ep_nccl_unique_id,
        "sfmoe_ep_nccl_unique_id: a fresh id one rank makes and shares with the others.");
  nb::class_<MoeLayer>(m, "MoeLayer",
                       "sfmoe_moe_layer: created from a dict of the sfmoe_moe_layer_config "
                       "fields for tensors in `memory` on `device`.")
      .def(nb::init<const nb::dict&, int32_t, int32_t>(), "config"_a, "memory"_a, "device"_a = 0)
      .def("stages", &MoeLayer::stages,
           "An EXTERNAL layer's collectives between its stages, forward and backward: lists of "
           "(all_to_all, bytes).")
      .def("plan", &MoeLayer::plan, "sfmoe_moe_layer_get_plan as a dict.")
      .def("forward", &MoeLayer::forward, "x"_a, "logits"_a, "logits_dtype"_a,
           "expert_bias"_a.none(), "w1"_a, "w2"_a, "y"_a.noconvert(), "saved"_a.noconvert(),
           "workspace"_a.noconvert(), "aux_loss"_a.none(), "z_loss"_a.none(),
           "tokens_per_expert"_a.none(), "dropped_per_expert"_a.none(),
           "routed_per_expert"_a.none(), "status_word"_a.none() = nb::none(), "stream"_a = 0,
           "weight_cache"_a.none() = nb::none(), "weight_cache_filled"_a = false,
           "sfmoe_moe_layer_forward.")
      .def("fill_weight_cache", &MoeLayer::fill_weight_cache, "w1"_a, "w2"_a,
           "weight_cache"_a.noconvert(), "status_word"_a.none() = nb::none(), "stream"_a = 0,
           "sfmoe_moe_layer_fill_weight_cache.")
      .def("backward", &MoeLayer::backward, "x"_a.none(), "d_y"_a.none(), "logits"_a.none(),
           "logits_dtype"_a, "w1"_a.none(), "w2"_a.none(), "saved"_a.none(),
           "workspace"_a.noconvert(), "d_aux_loss"_a, "d_z_loss"_a, "d_x"_a.none(),
           "d_logits"_a.none(), "d_w1"_a.none(), "d_w2"_a.none(), "rng_offset"_a = 0, "part"_a = 0,
           "status_word"_a.none() = nb::none(), "stream"_a = 0,
           "rng_offset_device"_a.none() = nb::none(), "weight_cache"_a.none() = nb::none(),
           "weight_cache_filled"_a = false, "sfmoe_moe_layer_backward.");
}

}  // namespace sfmoe_binding
