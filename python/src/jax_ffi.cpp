// The MoE layer (include/sfmoe/moe_layer.h) as XLA FFI handlers for JAX (python/sfmoe/jax.py):
// `sfmoe_moe_forward` and `sfmoe_moe_backward` (and their parts, the EXTERNAL transport's stages,
// `sfmoe_moe_fill_weight_cache`), each bound for the host (the CPU backend) and
// for CUDA (the call's stream; command-buffer compatible: every call launches the same device work
// on buffers XLA gives it, no host synchronization, no allocation). The layer's configuration
// arrives as the call's attributes; the sfmoe_moe_layer made for it is kept (per configuration,
// memory and device) for the process's life. Every buffer, the saved state and the workspace
// included, is an operand or a result XLA allocates; the backward writes its FC1 gradient over the
// saved state, which it takes as an operand aliased to a result.
#include "jax_ffi.h"

#include <nanobind/nanobind.h>
#include <stdint.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "jax_ops_ffi.h"
#include "sfmoe/moe_layer.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;
using sfmoe_jax::fail_with;
using sfmoe_jax::Tensors;
using sfmoe_jax::Where;

namespace {

// The configuration's attributes, in one order (the cache key).
const char* const kIntFields[] = {"hidden",
                                  "ffn_hidden",
                                  "num_experts",
                                  "max_tokens",
                                  "top_k",
                                  "score",
                                  "softmax_after_topk",
                                  "num_groups",
                                  "group_topk",
                                  "group_score_topk",
                                  "normalize",
                                  "activation",
                                  "expert_capacity",
                                  "row_alignment",
                                  "dtype",
                                  "recipe",
                                  "seed",
                                  "ep_world_size",
                                  "ep_receive_capacity",
                                  "ep_overflow",
                                  "ep_spill_capacity",
                                  "ep_transport",
                                  "accumulate_weight_grads",
                                  "ep_pair_capacity"};
const char* const kFloatFields[] = {"scaling_factor", "activation_limit", "activation_alpha"};

struct LayerKey {
  std::vector<int64_t> ints;
  std::vector<float> floats;
  int32_t memory, device;
  bool operator<(const LayerKey& o) const {
    return std::tie(ints, floats, memory, device) < std::tie(o.ints, o.floats, o.memory, o.device);
  }
};

struct Layer {
  sfmoe_moe_layer* layer = nullptr;
  sfmoe_moe_layer_plan plan;
  ~Layer() { sfmoe_moe_layer_destroy(layer); }
};

std::mutex g_mutex;
std::map<LayerKey, std::unique_ptr<Layer>>& layers() {
  static auto* made = new std::map<LayerKey, std::unique_ptr<Layer>>();  // (outlives XLA's calls)
  return *made;
}

ffi::ErrorOr<const Layer*> layer_for(const ffi::Dictionary& attrs, sfmoe_memory memory,
                                     int32_t device) {
  LayerKey key{{}, {}, static_cast<int32_t>(memory), device};
  for (const char* name : kIntFields) {
    ffi::ErrorOr<int64_t> v = attrs.get<int64_t>(name);
    if (v.has_error()) return ffi::Unexpected(v.error());
    key.ints.push_back(*v);
  }
  for (const char* name : kFloatFields) {
    ffi::ErrorOr<float> v = attrs.get<float>(name);
    if (v.has_error()) return ffi::Unexpected(v.error());
    key.floats.push_back(*v);
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = layers().find(key);
  if (found != layers().end()) return found->second.get();
  const std::vector<int64_t>& i = key.ints;
  sfmoe_moe_layer_config c = sfmoe_moe_layer_config_init();
  c.hidden = i[0];
  c.ffn_hidden = i[1];
  c.num_experts = i[2];
  c.max_tokens = i[3];
  c.router = sfmoe_router_config_init();
  c.router.top_k = i[4];
  c.router.score = static_cast<sfmoe_router_score>(i[5]);
  c.router.softmax_after_topk = static_cast<int32_t>(i[6]);
  c.router.num_groups = i[7];
  c.router.group_topk = i[8];
  c.router.group_score_topk = i[9];
  c.router.normalize = static_cast<int32_t>(i[10]);
  c.router.scaling_factor = key.floats[0];
  c.activation = static_cast<sfmoe_activation>(i[11]);
  c.activation_limit = key.floats[1];
  c.activation_alpha = key.floats[2];
  c.expert_capacity = i[12];
  c.row_alignment = i[13];
  c.dtype = static_cast<sfmoe_dtype>(i[14]);
  c.recipe = static_cast<sfmoe_moe_recipe>(i[15]);
  c.seed = static_cast<uint64_t>(i[16]);
  c.ep_world_size = static_cast<int32_t>(i[17]);
  c.ep_receive_capacity = i[18];
  c.ep_overflow = static_cast<sfmoe_ep_overflow>(i[19]);
  c.ep_spill_capacity = i[20];
  c.ep_transport = static_cast<sfmoe_ep_transport>(i[21]);
  c.accumulate_weight_grads = static_cast<int32_t>(i[22]);  // (EP SPILL's FP32 sums from zero)
  c.ep_pair_capacity = i[23];
  auto made = std::make_unique<Layer>();
  sfmoe_status status = sfmoe_moe_layer_create(&c, memory, device, &made->layer);
  if (status == SFMOE_SUCCESS) {
    made->plan = sfmoe_moe_layer_plan_init();
    status = sfmoe_moe_layer_get_plan(made->layer, &made->plan);
  }
  if (status != SFMOE_SUCCESS) return ffi::Unexpected(fail_with(status));
  const Layer* kept = made.get();
  layers()[key] = std::move(made);
  return kept;
}

// The forward's arguments from the call's buffers (every output a result).
ffi::ErrorOr<sfmoe_moe_forward_args> forward_args(Tensors& t, const ffi::Dictionary& attrs,
                                                  ffi::AnyBuffer x, ffi::AnyBuffer logits,
                                                  ffi::AnyBuffer expert_bias, ffi::AnyBuffer w1,
                                                  ffi::AnyBuffer w2, ffi::AnyBuffer& y,
                                                  ffi::AnyBuffer& saved, ffi::AnyBuffer& workspace,
                                                  ffi::AnyBuffer& kept, ffi::AnyBuffer& dropped,
                                                  ffi::AnyBuffer& routed) {
  ffi::ErrorOr<int64_t> has_bias = attrs.get<int64_t>("has_expert_bias");
  if (has_bias.has_error()) return ffi::Unexpected(has_bias.error());
  sfmoe_moe_forward_args a = sfmoe_moe_forward_args_init();
  a.x = t.of(x);
  a.logits = t.of(logits);
  a.expert_bias = *has_bias ? t.of(expert_bias) : nullptr;
  a.w1 = t.of(w1);
  a.w2 = t.of(w2);
  a.y = t.of(y);
  a.saved = t.of(saved);
  a.workspace = t.of(workspace);
  a.tokens_per_expert = t.int64(kept);
  a.dropped_per_expert = t.int64(dropped);
  a.routed_per_expert = t.int64(routed);
  a.stream = t.where.stream;
  return a;
}

// The backward's likewise.
sfmoe_moe_backward_args backward_args(Tensors& t, ffi::AnyBuffer x, ffi::AnyBuffer d_y,
                                      ffi::AnyBuffer logits, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                                      ffi::AnyBuffer rng_offset, ffi::AnyBuffer& d_x,
                                      ffi::AnyBuffer& d_logits, ffi::AnyBuffer& d_w1,
                                      ffi::AnyBuffer& d_w2, ffi::AnyBuffer& saved,
                                      ffi::AnyBuffer& workspace) {
  sfmoe_moe_backward_args a = sfmoe_moe_backward_args_init();
  a.x = t.of(x);
  a.d_y = t.of(d_y);
  a.logits = t.of(logits);
  a.w1 = t.of(w1);
  a.w2 = t.of(w2);
  a.saved = t.of(saved);
  a.workspace = t.of(workspace);
  a.d_x = t.of(d_x);
  a.d_logits = t.of(d_logits);
  a.d_w1 = t.of(d_w1);
  a.d_w2 = t.of(d_w2);
  a.rng_offset_device = t.int64(rng_offset);  // (one INT64 as an int32 pair [1, 2])
  a.stream = t.where.stream;
  return a;
}

// A call's weight cache (sfmoe_moe_layer_fill_weight_cache's, made by the
// `sfmoe_moe_fill_weight_cache` handler): a non-empty operand is read as filled (JAX arrays are
// immutable: the fill handler's result, never written by a forward or backward); 0 bytes: none.
void use_weight_cache(Tensors& t, const ffi::AnyBuffer& weight_cache, const sfmoe_tensor** cache,
                      int32_t* filled) {
  if (weight_cache.size_bytes() == 0) return;
  *cache = t.of(weight_cache);
  *filled = 1;
}

ffi::Error forward(const Where& where, ffi::AnyBuffer x, ffi::AnyBuffer logits,
                   ffi::AnyBuffer expert_bias, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                   ffi::AnyBuffer weight_cache, ffi::Dictionary attrs,
                   ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> saved,
                   ffi::Result<ffi::AnyBuffer> workspace, ffi::Result<ffi::AnyBuffer> kept,
                   ffi::Result<ffi::AnyBuffer> dropped, ffi::Result<ffi::AnyBuffer> routed) {
  ffi::ErrorOr<const Layer*> layer = layer_for(attrs, where.memory, where.device);
  if (layer.has_error()) return layer.error();
  Tensors t{where, {}, {}};
  ffi::ErrorOr<sfmoe_moe_forward_args> a = forward_args(
      t, attrs, x, logits, expert_bias, w1, w2, *y, *saved, *workspace, *kept, *dropped, *routed);
  if (a.has_error()) return a.error();
  use_weight_cache(t, weight_cache, &a->weight_cache, &a->weight_cache_filled);
  return sfmoe_jax::checked(sfmoe_moe_layer_forward((*layer)->layer, &*a));
}

// The backward part an optional `part` attribute names (sfmoe_moe_backward_part; the whole
// backward without it). A part's unused results are 0-byte placeholders.
sfmoe_moe_backward_part part_of(const ffi::Dictionary& attrs) {
  ffi::ErrorOr<int64_t> part = attrs.get<int64_t>("part");
  return part.has_error() ? SFMOE_MOE_BACKWARD_ALL : static_cast<sfmoe_moe_backward_part>(*part);
}

// The backward whole, or its first part (FC2, or FC2_DGRAD): the workspace a result.
ffi::Error backward(const Where& where, ffi::AnyBuffer x, ffi::AnyBuffer d_y, ffi::AnyBuffer logits,
                    ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                    ffi::AnyBuffer /*saved: aliased to saved_after*/, ffi::AnyBuffer rng_offset,
                    ffi::AnyBuffer weight_cache, ffi::Dictionary attrs,
                    ffi::Result<ffi::AnyBuffer> d_x, ffi::Result<ffi::AnyBuffer> d_logits,
                    ffi::Result<ffi::AnyBuffer> d_w1, ffi::Result<ffi::AnyBuffer> d_w2,
                    ffi::Result<ffi::AnyBuffer> saved_after,
                    ffi::Result<ffi::AnyBuffer> workspace) {
  ffi::ErrorOr<const Layer*> layer = layer_for(attrs, where.memory, where.device);
  if (layer.has_error()) return layer.error();
  Tensors t{where, {}, {}};
  sfmoe_moe_backward_args a = backward_args(t, x, d_y, logits, w1, w2, rng_offset, *d_x, *d_logits,
                                            *d_w1, *d_w2, *saved_after, *workspace);
  a.part = part_of(attrs);
  use_weight_cache(t, weight_cache, &a.weight_cache, &a.weight_cache_filled);
  return sfmoe_jax::checked(sfmoe_moe_layer_backward((*layer)->layer, &a));
}

// A later part of the backward (FC1, FC2_WGRAD): the workspace the first part left, an operand
// aliased to its result as the saved state is (FC2_WGRAD reads no saved state: a 0-byte one).
ffi::Error backward_part(const Where& where, ffi::AnyBuffer x, ffi::AnyBuffer d_y,
                         ffi::AnyBuffer logits, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                         ffi::AnyBuffer saved,
                         ffi::AnyBuffer /*workspace: aliased to workspace_after*/,
                         ffi::AnyBuffer rng_offset, ffi::AnyBuffer weight_cache,
                         ffi::Dictionary attrs, ffi::Result<ffi::AnyBuffer> d_x,
                         ffi::Result<ffi::AnyBuffer> d_logits, ffi::Result<ffi::AnyBuffer> d_w1,
                         ffi::Result<ffi::AnyBuffer> d_w2, ffi::Result<ffi::AnyBuffer> saved_after,
                         ffi::Result<ffi::AnyBuffer> workspace_after) {
  // (the same call as the first part's: only where the workspace comes from differs)
  return backward(where, x, d_y, logits, w1, w2, saved, rng_offset, weight_cache, attrs, d_x,
                  d_logits, d_w1, d_w2, saved_after, workspace_after);
}

// The weight cache of the layer the attributes name, filled from w1 and w2 (a result: every
// copy the forward's and the backward's GEMMs read; its layout does not depend on max_tokens).
ffi::Error fill_weight_cache(const Where& where, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                             ffi::Dictionary attrs, ffi::Result<ffi::AnyBuffer> weight_cache) {
  ffi::ErrorOr<const Layer*> layer = layer_for(attrs, where.memory, where.device);
  if (layer.has_error()) return layer.error();
  Tensors t{where, {}, {}};
  return sfmoe_jax::checked(sfmoe_moe_layer_fill_weight_cache(
      (*layer)->layer, t.of(w1), t.of(w2), t.of(*weight_cache), nullptr, where.stream));
}

// The EXTERNAL transport's stages (include/sfmoe/moe_layer.h): stage `stage` of the forward or
// backward on this rank (`rank` [1] INT32, axis_index of the expert axis), `received` what the
// previous stage's collective delivered (a 0-byte array at stage 0), `sent` written with what this
// stage's collective sends (0 bytes at the last stage). Every output is carried from stage to
// stage: from stage 1 on, the previous stage's outputs arrive as operands aliased to the results
// (at stage 0 the operands are 0-byte placeholders and the results fresh).
sfmoe_moe_stage stage_of(Tensors& t, const ffi::Dictionary& attrs, ffi::AnyBuffer rank,
                         ffi::AnyBuffer received, ffi::AnyBuffer& sent, int64_t* index) {
  ffi::ErrorOr<int64_t> stage = attrs.get<int64_t>("stage");
  ffi::ErrorOr<int64_t> has_received = attrs.get<int64_t>("has_received");
  ffi::ErrorOr<int64_t> has_sent = attrs.get<int64_t>("has_sent");
  *index = stage.has_error() ? -1 : *stage;  // (-1: refused by the layer, which says why)
  sfmoe_moe_stage st = sfmoe_moe_stage_init();
  st.index = static_cast<int32_t>(*index);
  st.rank = t.of(rank);
  st.received = !has_received.has_error() && *has_received ? t.of(received) : nullptr;
  st.sent = !has_sent.has_error() && *has_sent ? t.of(sent) : nullptr;
  return st;
}

ffi::Error forward_stage(const Where& where, ffi::AnyBuffer x, ffi::AnyBuffer logits,
                         ffi::AnyBuffer expert_bias, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                         ffi::AnyBuffer rank, ffi::AnyBuffer weight_cache, ffi::AnyBuffer received,
                         ffi::RemainingArgs, ffi::Dictionary attrs, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> saved, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::Result<ffi::AnyBuffer> kept, ffi::Result<ffi::AnyBuffer> dropped,
                         ffi::Result<ffi::AnyBuffer> routed, ffi::Result<ffi::AnyBuffer> sent) {
  ffi::ErrorOr<const Layer*> layer = layer_for(attrs, where.memory, where.device);
  if (layer.has_error()) return layer.error();
  Tensors t{where, {}, {}};
  ffi::ErrorOr<sfmoe_moe_forward_args> a = forward_args(
      t, attrs, x, logits, expert_bias, w1, w2, *y, *saved, *workspace, *kept, *dropped, *routed);
  if (a.has_error()) return a.error();
  use_weight_cache(t, weight_cache, &a->weight_cache, &a->weight_cache_filled);
  int64_t index = 0;
  const sfmoe_moe_stage st = stage_of(t, attrs, rank, received, *sent, &index);
  return sfmoe_jax::checked(sfmoe_moe_layer_forward_stage((*layer)->layer, &*a, &st));
}

ffi::Error backward_stage(const Where& where, ffi::AnyBuffer x, ffi::AnyBuffer d_y,
                          ffi::AnyBuffer logits, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                          ffi::AnyBuffer rng_offset, ffi::AnyBuffer rank,
                          ffi::AnyBuffer weight_cache, ffi::AnyBuffer received, ffi::RemainingArgs,
                          ffi::Dictionary attrs, ffi::Result<ffi::AnyBuffer> d_x,
                          ffi::Result<ffi::AnyBuffer> d_logits, ffi::Result<ffi::AnyBuffer> d_w1,
                          ffi::Result<ffi::AnyBuffer> d_w2, ffi::Result<ffi::AnyBuffer> saved,
                          ffi::Result<ffi::AnyBuffer> workspace, ffi::Result<ffi::AnyBuffer> sent) {
  ffi::ErrorOr<const Layer*> layer = layer_for(attrs, where.memory, where.device);
  if (layer.has_error()) return layer.error();
  Tensors t{where, {}, {}};
  sfmoe_moe_backward_args a = backward_args(t, x, d_y, logits, w1, w2, rng_offset, *d_x, *d_logits,
                                            *d_w1, *d_w2, *saved, *workspace);
  use_weight_cache(t, weight_cache, &a.weight_cache, &a.weight_cache_filled);
  int64_t index = 0;
  const sfmoe_moe_stage st = stage_of(t, attrs, rank, received, *sent, &index);
  return sfmoe_jax::checked(sfmoe_moe_layer_backward_stage((*layer)->layer, &a, &st));
}

}  // namespace

SFMOE_JAX_HANDLERS(SfmoeMoeForward, forward,
                   .Arg<ffi::AnyBuffer>()      // x
                       .Arg<ffi::AnyBuffer>()  // logits
                       .Arg<ffi::AnyBuffer>()  // expert bias
                       .Arg<ffi::AnyBuffer>()  // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Arg<ffi::AnyBuffer>()  // weight cache (0 bytes: none)
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>()    // y
                       .Ret<ffi::AnyBuffer>()    // saved
                       .Ret<ffi::AnyBuffer>()    // workspace
                       .Ret<ffi::AnyBuffer>()    // tokens per expert
                       .Ret<ffi::AnyBuffer>()    // dropped per expert
                       .Ret<ffi::AnyBuffer>());  // routed per expert
SFMOE_JAX_HANDLERS(SfmoeMoeBackward, backward,
                   .Arg<ffi::AnyBuffer>()      // x
                       .Arg<ffi::AnyBuffer>()  // d y
                       .Arg<ffi::AnyBuffer>()  // logits
                       .Arg<ffi::AnyBuffer>()  // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Arg<ffi::AnyBuffer>()  // saved (aliased to the saved result)
                       .Arg<ffi::AnyBuffer>()  // rng offset
                       .Arg<ffi::AnyBuffer>()  // weight cache (0 bytes: none)
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>()    // d x
                       .Ret<ffi::AnyBuffer>()    // d logits
                       .Ret<ffi::AnyBuffer>()    // d w1
                       .Ret<ffi::AnyBuffer>()    // d w2
                       .Ret<ffi::AnyBuffer>()    // saved
                       .Ret<ffi::AnyBuffer>());  // workspace

SFMOE_JAX_HANDLERS(SfmoeMoeBackwardPart, backward_part,
                   .Arg<ffi::AnyBuffer>()      // x
                       .Arg<ffi::AnyBuffer>()  // d y
                       .Arg<ffi::AnyBuffer>()  // logits
                       .Arg<ffi::AnyBuffer>()  // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Arg<ffi::AnyBuffer>()  // saved (aliased to the saved result)
                       .Arg<ffi::AnyBuffer>()  // workspace (aliased to the workspace result)
                       .Arg<ffi::AnyBuffer>()  // rng offset
                       .Arg<ffi::AnyBuffer>()  // weight cache (0 bytes: none)
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>()    // d x
                       .Ret<ffi::AnyBuffer>()    // d logits
                       .Ret<ffi::AnyBuffer>()    // d w1
                       .Ret<ffi::AnyBuffer>()    // d w2
                       .Ret<ffi::AnyBuffer>()    // saved
                       .Ret<ffi::AnyBuffer>());  // workspace

SFMOE_JAX_HANDLERS(SfmoeMoeFillWeightCache, fill_weight_cache,
                   .Arg<ffi::AnyBuffer>()      // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>());  // weight cache

SFMOE_JAX_HANDLERS(SfmoeMoeForwardStage, forward_stage,
                   .Arg<ffi::AnyBuffer>()      // x
                       .Arg<ffi::AnyBuffer>()  // logits
                       .Arg<ffi::AnyBuffer>()  // expert bias
                       .Arg<ffi::AnyBuffer>()  // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Arg<ffi::AnyBuffer>()  // rank
                       .Arg<ffi::AnyBuffer>()  // weight cache (0 bytes: none)
                       .Arg<ffi::AnyBuffer>()  // received
                       .RemainingArgs()        // the previous stage's results (aliased)
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>()    // y
                       .Ret<ffi::AnyBuffer>()    // saved
                       .Ret<ffi::AnyBuffer>()    // workspace
                       .Ret<ffi::AnyBuffer>()    // tokens per expert
                       .Ret<ffi::AnyBuffer>()    // dropped per expert
                       .Ret<ffi::AnyBuffer>()    // routed per expert
                       .Ret<ffi::AnyBuffer>());  // sent
SFMOE_JAX_HANDLERS(SfmoeMoeBackwardStage, backward_stage,
                   .Arg<ffi::AnyBuffer>()      // x
                       .Arg<ffi::AnyBuffer>()  // d y
                       .Arg<ffi::AnyBuffer>()  // logits
                       .Arg<ffi::AnyBuffer>()  // w1
                       .Arg<ffi::AnyBuffer>()  // w2
                       .Arg<ffi::AnyBuffer>()  // rng offset
                       .Arg<ffi::AnyBuffer>()  // rank
                       .Arg<ffi::AnyBuffer>()  // weight cache (0 bytes: none)
                       .Arg<ffi::AnyBuffer>()  // received
                       .RemainingArgs()        // the previous stage's results (aliased)
                       .Attrs<ffi::Dictionary>()
                       .Ret<ffi::AnyBuffer>()    // d x
                       .Ret<ffi::AnyBuffer>()    // d logits
                       .Ret<ffi::AnyBuffer>()    // d w1
                       .Ret<ffi::AnyBuffer>()    // d w2
                       .Ret<ffi::AnyBuffer>()    // saved
                       .Ret<ffi::AnyBuffer>()    // workspace
                       .Ret<ffi::AnyBuffer>());  // sent

namespace {

template <class Handler>
nb::capsule capsule_of(Handler* handler) {
  return nb::capsule(reinterpret_cast<void*>(handler));
}

}  // namespace

NB_MODULE(_jax, m) {
  m.doc() = "XLA FFI handlers of the sfmoe MoE layer (python/sfmoe/jax.py registers them).";
  m.def("handlers", [] {
    nb::dict d;
    d["sfmoe_moe_forward"] =
        nb::make_tuple(capsule_of(SfmoeMoeForwardHost), capsule_of(SfmoeMoeForwardCuda));
    d["sfmoe_moe_backward"] =
        nb::make_tuple(capsule_of(SfmoeMoeBackwardHost), capsule_of(SfmoeMoeBackwardCuda));
    d["sfmoe_moe_backward_part"] =
        nb::make_tuple(capsule_of(SfmoeMoeBackwardPartHost), capsule_of(SfmoeMoeBackwardPartCuda));
    d["sfmoe_moe_fill_weight_cache"] = nb::make_tuple(capsule_of(SfmoeMoeFillWeightCacheHost),
                                                      capsule_of(SfmoeMoeFillWeightCacheCuda));
    d["sfmoe_moe_forward_stage"] =
        nb::make_tuple(capsule_of(SfmoeMoeForwardStageHost), capsule_of(SfmoeMoeForwardStageCuda));
    d["sfmoe_moe_backward_stage"] = nb::make_tuple(capsule_of(SfmoeMoeBackwardStageHost),
                                                   capsule_of(SfmoeMoeBackwardStageCuda));
    for (const sfmoe_jax::HandlerPair& op : sfmoe_jax::op_handlers())
      d[op.name] = nb::make_tuple(nb::capsule(op.host), nb::capsule(op.cuda));
    return d;
  });
  m.def("attribute_fields", [] {
    nb::list ints, floats;
    for (const char* name : kIntFields) ints.append(name);
    for (const char* name : kFloatFields) floats.append(name);
    return nb::make_tuple(nb::tuple(ints), nb::tuple(floats));
  });
}
