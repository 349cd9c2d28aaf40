"""sfmoe for JAX: the MoE layer as XLA FFI calls under ``jax.custom_vjp`` (docs/jax.md).

:func:`moe_layer` runs the C++ layer (top-k routing, permute, FC1, activation, FC2, weighted
combine; and its backward) on the given logits and sfmoe-layout weights; :func:`moe_block` adds the
router's gate (FP32 logits = x W_g), the load-balancing and z losses, and MaxText's weight layout
(``wi`` [E, H, fc1_cols] with the gate half first, or ``wi_0`` / ``wi_1`` [E, H, F]; ``wo``
[E, F, H]). Both work under ``jax.jit``, ``jax.checkpoint`` and ``jax.eval_shape``: every shape is
static (the layer is planned for the token count), the per-expert counts stay on the device, and
changing the routing never recompiles. The ops a JAX user composes (:func:`router`,
:func:`permute` / :func:`unpermute`, :func:`grouped_gemm` / :func:`grouped_linear`,
:func:`grouped_activation`) are FFI calls as well, differentiable with sfmoe's backward kernels
(``_ops.py``). The handlers run on the CPU backend and on CUDA (command-
buffer compatible: the same device work on every call). ``jax.vmap`` is refused (a batch of MoE
layers is not one layer: reshape the tokens instead).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from .._moe_config import MoEConfig
from ._ops import (
    Permuted,
    grouped_activation,
    grouped_gemm,
    grouped_gemm_quantized,
    grouped_linear,
    permute,
    quantize,
    router,
    unpermute,
)

try:
    from .. import _jax as _handlers
except ImportError as error:  # pragma: no cover (a build without jaxlib at configure time)
    raise ImportError(
        "sfmoe was built without its JAX FFI handlers (jaxlib was not importable when the extension "
        "was configured); install jax and rebuild"
    ) from error

__all__ = [
    "MoEBlock",
    "MoEConfig",
    "Permuted",
    "aux_losses",
    "fill_weight_cache",
    "fuse_wi",
    "grouped_activation",
    "grouped_gemm",
    "grouped_gemm_quantized",
    "grouped_linear",
    "moe_block",
    "moe_block_sfmoe_layout",
    "moe_layer",
    "permute",
    "plan",
    "quantize",
    "router",
    "split_wi",
    "to_maxtext_layout",
    "to_sfmoe_layout",
    "unpermute",
    "update_expert_bias",
]
_FLAX_NAMES = ("MoEBlock", "fuse_wi", "split_wi", "to_maxtext_layout", "to_sfmoe_layout", "update_expert_bias")


def __getattr__(name):
    """The Flax module and its migrations, imported on first use (Flax is optional)."""
    if name in _FLAX_NAMES:
        from . import _flax

        return getattr(_flax, name)
    raise AttributeError(f"module 'sfmoe.jax' has no attribute {name!r}")


_DTYPES = {jnp.dtype(jnp.bfloat16): _C.DTYPE_BF16, jnp.dtype(jnp.float32): _C.DTYPE_FP32}


def _register():
    for name, (host, cuda) in _handlers.handlers().items():
        jax.ffi.register_ffi_target(name, host, platform="cpu")
        try:
            jax.ffi.register_ffi_target(name, cuda, platform="CUDA")
        except Exception:  # (a jaxlib without CUDA)
            pass


_register()

# The attributes the handlers read, as the extension names them (python/src/jax_ffi.cpp).
_INT_FIELDS, _FLOAT_FIELDS = _handlers.attribute_fields()


def _fields(config, tokens, dtype):
    if config.gradient_accumulation_fusion:
        raise ValueError("sfmoe.jax: JAX gradients are functional: gradient_accumulation_fusion must be False")
    if jnp.dtype(dtype) not in _DTYPES:
        raise ValueError(f"sfmoe.jax: tokens must be bfloat16 or float32, got {dtype}")
    code = _DTYPES[jnp.dtype(dtype)]
    fields = config.layer_fields(tokens, code)
    if config.expert_parallel:
        # One rank a call over the EXTERNAL transport: XLA's collectives between the stages.
        ep = config.ep_fields(code)
        fields.update(
            ep_world_size=ep["world_size"],
            ep_receive_capacity=ep["receive_capacity"],
            ep_overflow=ep["overflow"],
            ep_spill_capacity=ep["spill_capacity"],
            ep_pair_capacity=ep["pair_capacity"],
            ep_transport=_C.EP_TRANSPORT_EXTERNAL,
        )
        # SPILL adds its second round's weight gradients to the first's: FP32 buffers the
        # backward starts from zeros (_ep_backward_call)
        fields["accumulate_weight_grads"] = config.ep_overflow == "spill"
    else:
        fields.update(
            ep_world_size=1,
            ep_receive_capacity=-1,
            ep_overflow=0,
            ep_spill_capacity=0,
            ep_pair_capacity=-1,
            ep_transport=0,
        )
    return fields


def _attributes(config, tokens, dtype):
    f = _fields(config, tokens, dtype)
    flat = dict(f, **f["router"])
    flat["top_k"] = f["router"]["top_k"]
    ints = {k: np.int64(int(flat[k])) for k in _INT_FIELDS}
    floats = {k: np.float32(flat[k]) for k in _FLOAT_FIELDS}
    return dict(ints, **floats)


@functools.lru_cache(maxsize=256)
def _plan_of(config, tokens, dtype_name):
    """The C planner's sizes, the largest over the platforms this process has (the buffers are
    XLA's results, shaped before the platform is known)."""
    fields = _fields(config, tokens, jnp.dtype(dtype_name))
    plans = [_C.MoeLayer(fields, _C.MEMORY_HOST, 0).plan()]
    if any(d.platform == "gpu" for d in jax.devices()):
        try:
            plans.append(_C.MoeLayer(fields, _C.MEMORY_CUDA, 0).plan())
        except Exception:  # (a configuration only the host runs, FP32: the device call says why)
            pass
    keys = ("saved_bytes", "workspace_bytes", "forward_workspace_bytes", "weight_cache_bytes")
    sizes = {k: max(p[k] for p in plans) for k in keys}
    # (the backward's order: the device plan's choice where there is one)
    sizes["three_part_backward"] = plans[-1]["three_part_backward"]
    if config.expert_parallel:  # (the collectives' sizes do not depend on the platform)
        sizes["stages"] = _C.MoeLayer(fields, _C.MEMORY_HOST, 0).stages()
    return sizes


def plan(config, tokens, dtype=jnp.bfloat16):
    """The layer's buffer sizes for `tokens` tokens of `dtype` (bytes): saved state, workspaces, the
    weight cache (:func:`fill_weight_cache`; 0 under bf16); with expert parallelism also
    ``stages``: the collectives between the forward's and the backward's stages, lists of
    (all_to_all, bytes)."""
    return dict(_plan_of(config, int(tokens), jnp.dtype(dtype).name))


# The token count of the layer a weight cache is filled by: the cache's layout does not depend on
# it (sfmoe_moe_layer_fill_weight_cache), so one layer serves every step's token count.
_CACHE_TOKENS = 128


def fill_weight_cache(w1, w2, config):
    """Gradient accumulation under a quantized recipe (fp8 per-tensor, fp8 blockwise, mxfp8,
    nvfp4): w1's and w2's quantized copies, every one the layer's GEMMs read (forward and
    backward), as a uint8 array to pass as ``weight_cache`` to :func:`moe_layer` (or the blocks)
    on every micro-batch while the weights stay unchanged -- those calls then quantize no weight,
    with the bits of calls without it. Fill it again once the optimizer has changed the weights.
    w1 and w2 as the layer reads them (the tokens' dtype). Under bf16 nothing is quantized: an
    empty array. Not differentiable (the weights' gradients flow through the layer's own use of
    w1 and w2)."""
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config: expected an sfmoe MoEConfig, got {type(config).__name__}")
    if w1.dtype != w2.dtype:
        raise ValueError(f"sfmoe.jax: w1 and w2 must share the tokens' dtype, got {w1.dtype} and {w2.dtype}")
    size = _plan_of(config, _CACHE_TOKENS, w1.dtype.name)["weight_cache_bytes"]
    if size == 0:
        return jnp.zeros((0,), jnp.uint8)
    # (under jax.vmap over an expert axis, each rank's call fills its own cache from its weights)
    call = jax.ffi.ffi_call(
        "sfmoe_moe_fill_weight_cache", jax.ShapeDtypeStruct((size,), jnp.uint8), vmap_method="sequential"
    )
    w1, w2 = jax.lax.stop_gradient(w1), jax.lax.stop_gradient(w2)
    return call(w1, w2, **_attributes(config, _CACHE_TOKENS, w1.dtype))


def _cache_operand(weight_cache):
    """The handlers' weight-cache operand: the cache, or 0 bytes for none."""
    return jnp.zeros((0,), jnp.uint8) if weight_cache is None else weight_cache


def _counts(n):
    # INT64 counts as int32 pairs (JAX without x64 has no int64 arrays; the handler writes INT64)
    return jax.ShapeDtypeStruct((n, 2), jnp.int32)


def _forward_call(x, logits, expert_bias, w1, w2, config, weight_cache=None):
    T = x.shape[0]
    p = _plan_of(config, T, x.dtype.name)
    E = config.num_experts
    results = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct((p["saved_bytes"],), jnp.uint8),
        jax.ShapeDtypeStruct((p["forward_workspace_bytes"],), jnp.uint8),
        _counts(E),
        _counts(E),
        _counts(E),
    )
    bias = jnp.zeros((E,), jnp.float32) if expert_bias is None else expert_bias.astype(jnp.float32)
    call = jax.ffi.ffi_call("sfmoe_moe_forward", results, vmap_method=None)
    y, saved, _, kept, dropped, routed = call(
        x,
        logits.astype(jnp.float32),
        bias,
        w1,
        w2,
        _cache_operand(weight_cache),
        has_expert_bias=np.int64(expert_bias is not None),
        **_attributes(config, T, x.dtype),
    )
    return y, saved, (kept[:, 0], dropped[:, 0], routed[:, 0])


def _expert_axis_size(axis, world):
    size = jax.lax.psum(1, axis)  # (a Python int: the named axis's size)
    if size != world:
        raise ValueError(f"sfmoe.jax: the expert axis {axis!r} has {size} ranks; the config's ep_size is {world}")
    return world


def _collective(sent, all_to_all, pair_bytes, world, axis):
    """XLA's collective between two stages over the expert axis: an all-gather (block q rank q's
    `pair_bytes`) or an all-to-all (block q of what a rank sends goes to rank q; block q of what it
    receives came from rank q)."""
    if not all_to_all:
        return jax.lax.all_gather(sent, axis, tiled=True)
    blocks = sent.reshape(world, pair_bytes)
    return jax.lax.all_to_all(blocks, axis, 0, 0, tiled=True).reshape(-1)


def _staged(name, operands, results, collectives, world, axis, attributes, initial=None):
    """The stages of one sequence on this rank: each an FFI call whose results are carried to the
    next stage as operands aliased to the same results, the collectives between them XLA's.
    `initial` {result index: array}: stage 0's carried operands (the backward's saved state).
    Returns the last stage's results but the sent bytes."""
    received = jnp.zeros((0,), jnp.uint8)
    carried = list((initial or {}).items())
    first = len(operands) + 1
    n = len(collectives)
    for index in range(n + 1):
        all_to_all, pair_bytes = collectives[index] if index < n else (False, 0)
        sent_bytes = pair_bytes * world if all_to_all else pair_bytes
        shapes = (*results, jax.ShapeDtypeStruct((sent_bytes,), jnp.uint8))
        aliases = {first + j: result for j, (result, _) in enumerate(carried)}
        # (under jax.vmap(axis_name=...) each rank's stage is its own call, as in shard_map, where
        # each device makes it; unrolled: on the GPU the rolled loop of "sequential" left the
        # carried results unwritten in our tests, JAX 0.11.2)
        call = jax.ffi.ffi_call(name, shapes, input_output_aliases=aliases, vmap_method="sequential_unrolled")
        *out, sent = call(
            *operands,
            received,
            *(v for _, v in carried),
            stage=np.int64(index),
            has_received=np.int64(index > 0),
            has_sent=np.int64(index < n),
            **attributes,
        )
        carried = list(enumerate(out))
        if index < n:
            received = _collective(sent, all_to_all, pair_bytes, world, axis)
    return tuple(v for _, v in carried)


def _rank(axis):
    return jax.lax.axis_index(axis).astype(jnp.int32).reshape(1)


def _ep_forward_call(x, logits, expert_bias, w1, w2, config, axis, weight_cache=None):
    T = x.shape[0]
    p = _plan_of(config, T, x.dtype.name)
    E, El = config.num_experts, config.local_experts
    results = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct((p["saved_bytes"],), jnp.uint8),
        jax.ShapeDtypeStruct((p["forward_workspace_bytes"],), jnp.uint8),
        _counts(El),
        _counts(E),
        _counts(E),
    )
    bias = jnp.zeros((E,), jnp.float32) if expert_bias is None else expert_bias.astype(jnp.float32)
    operands = (x, logits.astype(jnp.float32), bias, w1, w2, _rank(axis), _cache_operand(weight_cache))
    world = _expert_axis_size(axis, config.ep_size)
    attributes = dict(has_expert_bias=np.int64(expert_bias is not None), **_attributes(config, T, x.dtype))
    y, saved, _, kept, dropped, routed = _staged(
        "sfmoe_moe_forward_stage", operands, results, p["stages"]["forward"], world, axis, attributes
    )
    return y, saved, (kept[:, 0], dropped[:, 0], routed[:, 0])


def _ep_backward_call(x, d_y, logits, w1, w2, saved, rng_offset, config, axis, weight_cache=None):
    T = x.shape[0]
    p = _plan_of(config, T, x.dtype.name)
    spill = config.ep_overflow == "spill"
    grad_dtype = jnp.float32 if spill else None
    results = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(logits.shape, jnp.float32),
        jax.ShapeDtypeStruct(w1.shape, grad_dtype or w1.dtype),
        jax.ShapeDtypeStruct(w2.shape, grad_dtype or w2.dtype),
        jax.ShapeDtypeStruct(saved.shape, jnp.uint8),
        jax.ShapeDtypeStruct((p["workspace_bytes"],), jnp.uint8),
    )
    operands = (
        x,
        d_y.astype(x.dtype),
        logits.astype(jnp.float32),
        w1,
        w2,
        _offset_pair(rng_offset),
        _rank(axis),
        _cache_operand(weight_cache),
    )
    # (the backward writes over the forward's saved state: stage 0 takes it aliased to result 4;
    # with SPILL the weight gradients are FP32 sums from zero, results 2 and 3)
    initial = {4: saved}
    if spill:
        initial = {2: jnp.zeros(w1.shape, jnp.float32), 3: jnp.zeros(w2.shape, jnp.float32), 4: saved}
    d_x, d_logits, d_w1, d_w2, _, _ = _staged(
        "sfmoe_moe_backward_stage",
        operands,
        results,
        p["stages"]["backward"],
        _expert_axis_size(axis, config.ep_size),
        axis,
        _attributes(config, T, x.dtype),
        initial=initial,
    )
    return d_x, d_logits, d_w1.astype(w1.dtype), d_w2.astype(w2.dtype)


def _offset_pair(rng_offset):
    """NVFP4's rounding offset as the handler reads it: one INT64 held as an int32 pair [1, 2] (JAX
    without x64 has no int64 arrays); rng_offset is a non-negative integer scalar below 2**32 (a
    step counter), traced or not."""
    if rng_offset is None:
        return jnp.zeros((1, 2), jnp.int32)
    low = jax.lax.bitcast_convert_type(jnp.asarray(rng_offset).astype(jnp.uint32), jnp.int32)
    return jnp.stack([low, jnp.zeros_like(low)]).reshape(1, 2)


def _three_part_backward(config, tokens, dtype_name):
    """Whether the backward runs in three calls (the C planner's choice, docs/moe_layer.md,
    "Backward in parts"): FC2's dgrad, the FC1 part, FC2's wgrad, so that XLA can give the saved
    state's buffer back before d w2 is made."""
    return _plan_of(config, tokens, dtype_name)["three_part_backward"]


def _backward_in_three_parts(x, d_y, logits, w1, w2, saved, rng_offset, config, weight_cache=None):
    T = x.shape[0]
    p = _plan_of(config, T, x.dtype.name)
    none = lambda dtype: jax.ShapeDtypeStruct((0,), dtype)  # noqa: E731 (a part's unused result)
    workspace = jax.ShapeDtypeStruct((p["workspace_bytes"],), jnp.uint8)
    state = jax.ShapeDtypeStruct(saved.shape, jnp.uint8)
    operands = (x, d_y.astype(x.dtype), logits.astype(jnp.float32), w1, w2)
    offset = _offset_pair(rng_offset)
    cache = _cache_operand(weight_cache)
    attributes = _attributes(config, T, x.dtype)
    f32 = jnp.float32
    # FC2_DGRAD (3): d FC1 rows and d probs into the saved state, the weighted activations and the
    # routing into the workspace (a result here); then FC1 (2) and FC2_WGRAD (4) on that workspace
    # (an operand aliased to their result), FC2_WGRAD without the saved state.
    first = jax.ffi.ffi_call(
        "sfmoe_moe_backward",
        (none(x.dtype), none(f32), none(w1.dtype), none(w2.dtype), state, workspace),
        input_output_aliases={5: 4},
        vmap_method=None,
    )
    *_, saved, ws = first(*operands, saved, offset, cache, part=np.int64(3), **attributes)
    fc1 = jax.ffi.ffi_call(
        "sfmoe_moe_backward_part",
        (
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct(logits.shape, f32),
            jax.ShapeDtypeStruct(w1.shape, w1.dtype),
            none(w2.dtype),
            state,
            workspace,
        ),
        input_output_aliases={5: 4, 6: 5},
        vmap_method=None,
    )
    d_x, d_logits, d_w1, _, _, ws = fc1(*operands, saved, ws, offset, cache, part=np.int64(2), **attributes)
    wgrad = jax.ffi.ffi_call(
        "sfmoe_moe_backward_part",
        (
            none(x.dtype),
            none(f32),
            none(w1.dtype),
            jax.ShapeDtypeStruct(w2.shape, w2.dtype),
            none(jnp.uint8),
            workspace,
        ),
        input_output_aliases={5: 4, 6: 5},
        vmap_method=None,
    )
    _, _, _, d_w2, _, _ = wgrad(
        *operands, jnp.zeros((0,), jnp.uint8), ws, offset, cache, part=np.int64(4), **attributes
    )
    return d_x, d_logits, d_w1, d_w2


def _backward_call(x, d_y, logits, w1, w2, saved, rng_offset, config, weight_cache=None):
    T = x.shape[0]
    if _three_part_backward(config, T, x.dtype.name):
        return _backward_in_three_parts(x, d_y, logits, w1, w2, saved, rng_offset, config, weight_cache)
    p = _plan_of(config, T, x.dtype.name)
    results = (
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        jax.ShapeDtypeStruct(logits.shape, jnp.float32),
        jax.ShapeDtypeStruct(w1.shape, w1.dtype),
        jax.ShapeDtypeStruct(w2.shape, w2.dtype),
        jax.ShapeDtypeStruct(saved.shape, jnp.uint8),
        jax.ShapeDtypeStruct((p["workspace_bytes"],), jnp.uint8),
    )
    # (the backward writes its FC1 gradient over the saved state: operand 5 is result 4)
    call = jax.ffi.ffi_call("sfmoe_moe_backward", results, input_output_aliases={5: 4}, vmap_method=None)
    d_x, d_logits, d_w1, d_w2, _, _ = call(
        x,
        d_y.astype(x.dtype),
        logits.astype(jnp.float32),
        w1,
        w2,
        saved,
        _offset_pair(rng_offset),
        _cache_operand(weight_cache),
        **_attributes(config, T, x.dtype),
    )
    return d_x, d_logits, d_w1, d_w2


def _forward_of(x, logits, expert_bias, w1, w2, weight_cache, config, axis):
    if axis is None:
        return _forward_call(x, logits, expert_bias, w1, w2, config, weight_cache)
    return _ep_forward_call(x, logits, expert_bias, w1, w2, config, axis, weight_cache)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8))
def _layer(x, logits, expert_bias, w1, w2, rng_offset, weight_cache, config, axis):
    y, _, counts = _forward_of(x, logits, expert_bias, w1, w2, weight_cache, config, axis)
    return y, counts


def _layer_fwd(x, logits, expert_bias, w1, w2, rng_offset, weight_cache, config, axis):
    y, saved, counts = _forward_of(x, logits, expert_bias, w1, w2, weight_cache, config, axis)
    return (y, counts), (x, logits, expert_bias, w1, w2, saved, rng_offset, weight_cache)


def _layer_bwd(config, axis, residuals, cotangents):
    x, logits, expert_bias, w1, w2, saved, rng_offset, weight_cache = residuals
    d_y = cotangents[0]
    if axis is None:
        d_x, d_logits, d_w1, d_w2 = _backward_call(x, d_y, logits, w1, w2, saved, rng_offset, config, weight_cache)
    else:
        d_x, d_logits, d_w1, d_w2 = _ep_backward_call(
            x, d_y, logits, w1, w2, saved, rng_offset, config, axis, weight_cache
        )
    d_bias = None if expert_bias is None else jnp.zeros_like(expert_bias)  # (selection only)
    return d_x, d_logits.astype(logits.dtype), d_bias, d_w1, d_w2, None, None


_layer.defvjp(_layer_fwd, _layer_bwd)


def moe_layer(x, logits, w1, w2, config, expert_bias=None, rng_offset=None, ep_axis=None, weight_cache=None):
    """The layer on tokens x [T, H] (bfloat16 or float32) with the router's logits [T, E], sfmoe's
    weights w1 [E, fc1_cols, H] (gate rows, then up rows, for gated activations) and w2 [E, H, F];
    expert_bias [E] steers the selection only. Returns (y [T, H], counts): counts holds
    ``tokens_per_expert``, ``dropped_per_expert`` and ``routed_per_expert`` ([E] int32, on the
    device). Differentiable in x, logits, w1 and w2. rng_offset (nvfp4): the stream of the
    gradients' stochastic rounding, an integer scalar in [0, 2**32) that the caller advances each
    step (e.g. the optimizer's step count, a traced array: a new value never recompiles); None is
    stream 0 on every step.

    Expert parallelism (config.ep_size ranks, max_tokens_per_rank set; docs/jax.md): inside
    ``jax.shard_map`` (or ``jax.vmap`` with an axis name) over the expert mesh axis `ep_axis`,
    each rank calls this on its own tokens with its local experts' weights ([E / ep_size, ...]);
    XLA's all-gathers and all-to-alls over `ep_axis` move the routing and the rows between the
    layer's stages, whose receive capacity and overflow policy are the config's. Counts are then
    the rank's: ``tokens_per_expert`` [E / ep_size] (rows its experts kept),
    ``dropped_per_expert`` [E] (its rows dropped) and ``routed_per_expert`` [E].

    weight_cache: :func:`fill_weight_cache`'s array for these w1 and w2 (gradient accumulation
    under a quantized recipe: the micro-batches of one optimizer step share it, and neither the
    forward nor the backward quantizes a weight); None quantizes them on every call. The caller
    promises that w1 and w2 are the weights the cache was filled from. With expert parallelism
    each rank passes the cache filled from its own local experts' weights (fill_weight_cache
    called inside the same shard_map or vmap)."""
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config: expected an sfmoe MoEConfig, got {type(config).__name__}")
    if rng_offset is not None and jnp.ndim(rng_offset) != 0:
        raise ValueError(f"rng_offset: expected an integer scalar, got shape {jnp.shape(rng_offset)}")
    if jnp.ndim(x) != 2 or x.shape[1] != config.hidden_size:
        raise ValueError(f"sfmoe.jax: x must be [T, {config.hidden_size}] (hidden_size), got {list(jnp.shape(x))}")
    if config.expert_parallel and ep_axis is None:
        raise ValueError(
            "sfmoe.jax: an expert-parallel config (ep_size, max_tokens_per_rank) runs inside shard_map over the "
            "expert mesh axis: pass its name as ep_axis"
        )
    if not config.expert_parallel and ep_axis is not None:
        raise ValueError("sfmoe.jax: ep_axis is for an expert-parallel config (set ep_size and max_tokens_per_rank)")
    if config.expert_parallel and x.shape[0] > config.max_tokens_per_rank:
        raise ValueError(
            f"sfmoe.jax: {x.shape[0]} tokens on this rank exceed max_tokens_per_rank ({config.max_tokens_per_rank})"
        )
    if weight_cache is not None:
        need = _plan_of(config, x.shape[0], x.dtype.name)["weight_cache_bytes"]
        if jnp.ndim(weight_cache) != 1 or weight_cache.dtype != jnp.uint8 or weight_cache.shape[0] < need:
            raise ValueError(
                f"sfmoe.jax: weight_cache must be fill_weight_cache's uint8 array of {need} bytes for this config "
                f"and {x.dtype} tokens, got {weight_cache.dtype} {list(jnp.shape(weight_cache))}"
            )
        weight_cache = jax.lax.stop_gradient(weight_cache) if need > 0 else None
    y, (kept, dropped, routed) = _layer(x, logits, expert_bias, w1, w2, rng_offset, weight_cache, config, ep_axis)
    return y, dict(tokens_per_expert=kept, dropped_per_expert=dropped, routed_per_expert=routed)


def aux_losses(logits, routed, config):
    """The Switch/GShard load-balancing loss and the z-loss from the FP32 logits, as the torch
    module computes them (docs/torch.md, "Losses and counts"); 0.0 when both coefficients are 0."""
    tokens = logits.shape[0]
    total = jnp.zeros((), jnp.float32)
    if tokens == 0:
        return total
    if config.aux_loss_coeff > 0:
        if config.score_function == "sigmoid":
            scores = jax.nn.sigmoid(logits)
            scores = scores / scores.sum(-1, keepdims=True)
        else:
            scores = jax.nn.softmax(logits, -1)
        factor = config.aux_loss_coeff * config.num_experts / (config.topk * tokens * tokens)
        total = total + factor * (jax.lax.stop_gradient(routed).astype(jnp.float32) * scores.sum(0)).sum()
    if config.z_loss_coeff > 0:
        total = total + config.z_loss_coeff / tokens * jnp.square(jax.nn.logsumexp(logits, -1)).sum()
    return total


def sfmoe_weights(wi, wo):
    """MaxText's expert weights in sfmoe's layout: ``wi`` [E, H, fc1_cols] (or the pair
    ``(wi_0, wi_1)`` of [E, H, F]) and ``wo`` [E, F, H] -> (w1 [E, fc1_cols, H], w2 [E, H, F])."""
    if isinstance(wi, (tuple, list)):
        wi = jnp.concatenate(wi, axis=-1)
    return jnp.swapaxes(wi, 1, 2), jnp.swapaxes(wo, 1, 2)


def moe_block(x, gate_kernel, wi, wo, config, expert_bias=None, rng_offset=None, ep_axis=None, weight_cache=None):
    """A MoE FFN on x [..., H]: logits = x W_g in FP32 (gate_kernel [H, E]), the layer on MaxText's
    weights (sfmoe_weights), the losses. Returns (y like x, aux_loss, counts). rng_offset: as
    :func:`moe_layer`'s (nvfp4's rounding stream, advanced by the caller each step); ep_axis: the
    expert mesh axis of an expert-parallel config (:func:`moe_layer`; wi and wo the rank's local
    experts, the losses over the rank's tokens); weight_cache: :func:`moe_layer`'s, filled from
    ``sfmoe_weights(wi, wo)`` in the tokens' dtype."""
    w1, w2 = sfmoe_weights(wi, wo)
    return moe_block_sfmoe_layout(x, gate_kernel, w1, w2, config, expert_bias, rng_offset, ep_axis, weight_cache)


def moe_block_sfmoe_layout(
    x, gate_kernel, w1, w2, config, expert_bias=None, rng_offset=None, ep_axis=None, weight_cache=None
):
    """:func:`moe_block` on sfmoe's weights, w1 [E, fc1_cols, H] and w2 [E, H, F] (no transposes):
    what MoEBlock(layout="sfmoe") runs."""
    shape = x.shape
    tokens = x.reshape(-1, shape[-1])
    logits = jnp.dot(tokens.astype(jnp.float32), gate_kernel.astype(jnp.float32))
    y, counts = moe_layer(
        tokens,
        logits,
        w1.astype(tokens.dtype),
        w2.astype(tokens.dtype),
        config,
        expert_bias,
        rng_offset,
        ep_axis,
        weight_cache,
    )
    return y.reshape(shape), aux_losses(logits, counts["routed_per_expert"], config), counts
