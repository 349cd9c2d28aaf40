"""The ops a JAX user composes, as XLA FFI calls (python/src/jax_ops_ffi.cpp; docs/jax.md, "Ops"):
the router, permute / unpermute, the grouped GEMM and the grouped activation, each differentiable
through ``jax.custom_vjp`` with sfmoe's own backward kernels, on unquantized rows (float32,
bfloat16; float16 where the op takes it); grouped quantization and the grouped GEMM on quantized
operands (forward only). Shapes are static (planned from the host-known sizes);
group offsets, counts and row maps stay on the device as int32 arrays (int64 under x64).

Rows past ``group_offsets[-1]`` of a row-shaped result are not written (their contents are
unspecified, as in ``jnp.empty``); every op reads only the rows its offsets name.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .. import _C
from .._activation import ACTIVATIONS, GATED
from .._arrays import container_shape
from .._dtypes import DType, numpy_container
from .._quantize import (
    PLANNED_BUFFERS,
    GroupedQuantizedTensor,
    QuantizeConfig,
    _element_dtype,
    _recipe_scaling,
    _scale_layout,
    plan_quantize,
    tensor_from_plan,
)
from .._router import _SCORES

_FORMS = {"fprop": 0, "dgrad": 1, "wgrad": 2}
# sfmoe's codes of the row dtypes the ops take
_DTYPE_CODES = {
    jnp.dtype(jnp.float32): int(DType.FP32),
    jnp.dtype(jnp.bfloat16): int(DType.BF16),
    jnp.dtype(jnp.float16): int(DType.FP16),
}
_ROWS_DTYPES = tuple(_DTYPE_CODES)


def _call(name, results, *operands, **attributes):
    return jax.ffi.ffi_call(name, results, vmap_method=None)(*operands, **attributes)


def _int64(values):
    """An int32 (or int64) device array as the handlers read INT64: itself under x64, else int32
    pairs in a trailing dimension of 2 (low word, sign word)."""
    values = jnp.asarray(values)
    if values.dtype == jnp.int64:
        return values
    if values.dtype != jnp.int32:
        raise TypeError(f"expected an int32 or int64 array, got {values.dtype}")
    return jnp.stack([values, jnp.where(values < 0, -1, 0).astype(jnp.int32)], axis=-1)


def _int64_result(shape):
    """The result type of an INT64 array: int64 under x64, else int32 pairs."""
    if jax.config.jax_enable_x64:
        return jax.ShapeDtypeStruct(shape, jnp.int64)
    return jax.ShapeDtypeStruct((*shape, 2), jnp.int32)


def _low(values):
    """The INT64 result as the ops return it: int64 under x64, else the int32 low words."""
    return values if values.dtype == jnp.int64 else values[..., 0]


def _rows(x, what):
    x = jnp.asarray(x)
    if x.dtype not in _ROWS_DTYPES:
        raise TypeError(f"{what}: expected float32, bfloat16 or float16 rows, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-D array [rows, cols], got shape {x.shape}")
    return x


def _bytes(n):
    return jax.ShapeDtypeStruct((max(int(n), 16),), jnp.uint8)


# ---- the router ----------------------------------------------------------------------------------


class RouterRules(NamedTuple):
    """The router's options (sfmoe_router_config; docs/router.md), hashable for jit."""

    top_k: int
    score: str = "softmax"
    softmax_after_topk: bool = False
    num_groups: int = 0
    group_topk: int = 0
    group_score_topk: int = 2
    scaling_factor: float = 1.0
    normalize: bool = False

    def attributes(self):
        if self.score not in _SCORES:
            raise ValueError(f"score: expected 'softmax' or 'sigmoid', got {self.score!r}")
        if int(self.top_k) < 1:
            raise ValueError(f"top_k: expected at least 1, got {self.top_k}")
        ints = dict(
            top_k=int(self.top_k),
            score=_SCORES[self.score],
            softmax_after_topk=int(bool(self.softmax_after_topk)),
            num_groups=int(self.num_groups),
            group_topk=int(self.group_topk),
            group_score_topk=int(self.group_score_topk),
            normalize=int(bool(self.normalize)),
        )
        return dict({k: np.int64(v) for k, v in ints.items()}, scaling_factor=np.float32(self.scaling_factor))


def _router_call(logits, expert_bias, rules):
    tokens, experts = logits.shape
    k = int(rules.top_k)
    results = (
        jax.ShapeDtypeStruct((tokens, k), jnp.int32),
        jax.ShapeDtypeStruct((tokens, k), jnp.float32),
        _int64_result((experts,)),
    )
    bias = jnp.zeros((experts,), jnp.float32) if expert_bias is None else expert_bias.astype(jnp.float32)
    return _call(
        "sfmoe_router_forward",
        results,
        logits,
        bias,
        has_expert_bias=np.int64(expert_bias is not None),
        **rules.attributes(),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _router(logits, expert_bias, rules):
    ids, probs, kept = _router_call(logits, expert_bias, rules)
    return ids, probs, _low(kept)


def _router_fwd(logits, expert_bias, rules):
    ids, probs, kept = _router_call(logits, expert_bias, rules)
    return (ids, probs, _low(kept)), (logits, ids, kept, expert_bias)


def _router_bwd(rules, residuals, cotangents):
    logits, ids, kept, expert_bias = residuals
    d_probs = cotangents[1]
    (d_logits,) = _call(
        "sfmoe_router_backward",
        (jax.ShapeDtypeStruct(logits.shape, jnp.float32),),
        logits,
        ids,
        kept,
        d_probs.astype(jnp.float32),
        **rules.attributes(),
    )
    d_bias = None if expert_bias is None else jnp.zeros_like(expert_bias)  # (selection only)
    return d_logits.astype(logits.dtype), d_bias


_router.defvjp(_router_fwd, _router_bwd)


def router(logits, top_k, *, expert_bias=None, **options):
    """Top-k routing of logits [T, E] (float32 or bfloat16): (topk_ids [T, k] int32 best first,
    probs [T, k] float32, tokens_per_expert [E]), with sfmoe.router's rules and options (score,
    softmax_after_topk, num_groups, group_topk, group_score_topk, scaling_factor, normalize; the
    losses come from :func:`sfmoe.jax.aux_losses`). Differentiable in logits through probs;
    expert_bias [E] steers the selection only."""
    logits = jnp.asarray(logits)
    if logits.ndim != 2 or logits.dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"logits: expected a float32 or bfloat16 [T, E] array, got {logits.dtype} {logits.shape}")
    return _router(logits, expert_bias, RouterRules(top_k=int(top_k), **options))


# ---- permute and unpermute -----------------------------------------------------------------------


class Permuted(NamedTuple):
    """What :func:`permute` returns: rows [row_capacity, H] grouped by expert (each block padded
    with zero rows to the row alignment), group_offsets [E + 1], row_map [T, k] (each slot's row;
    -1 where the capacity dropped it), tokens_per_expert [E] (rows kept), dropped_per_expert [E]."""

    rows: jax.Array
    group_offsets: jax.Array
    row_map: jax.Array
    tokens_per_expert: jax.Array
    dropped_per_expert: jax.Array


def permute_plan(tokens, top_k, num_experts, hidden, dtype, *, alignment=1, expert_capacity=0):
    """(row_capacity, workspace bytes) of :func:`permute` for these sizes (the C planner's)."""
    plan = _C.plan_permute(
        dict(
            num_tokens=int(tokens),
            topk=int(top_k),
            num_experts=int(num_experts),
            hidden=int(hidden),
            row_alignment=int(alignment),
            expert_capacity=int(expert_capacity),
            dtype=_DTYPE_CODES[jnp.dtype(dtype)],
        )
    )
    workspace = plan["workspace"]
    return plan["permuted"]["buffers"]["rowwise_data"][1][0], 0 if workspace is None else workspace[2]


def _permute_call(x, topk_ids, num_experts, row_alignment, expert_capacity):
    tokens, hidden = x.shape
    k = topk_ids.shape[1]
    capacity, workspace = permute_plan(
        tokens, k, num_experts, hidden, x.dtype, alignment=row_alignment, expert_capacity=expert_capacity
    )
    results = (
        jax.ShapeDtypeStruct((capacity, hidden), x.dtype),
        _int64_result((num_experts + 1,)),
        _int64_result((tokens, k)),
        _int64_result((num_experts,)),
        _int64_result((num_experts,)),
        _bytes(workspace),
    )
    rows, offsets, row_map, kept, dropped, _ = _call(
        "sfmoe_permute",
        results,
        x,
        topk_ids,
        num_experts=np.int64(num_experts),
        row_alignment=np.int64(row_alignment),
        expert_capacity=np.int64(expert_capacity),
    )
    return Permuted(rows, _low(offsets), _low(row_map), _low(kept), _low(dropped))


def _unpermute_call(rows, offsets, row_map, probs, out_dtype):
    tokens = row_map.shape[0]
    has_probs = probs is not None
    if probs is None:
        probs = jnp.zeros((1,), jnp.float32)  # (not read)
    (out,) = _call(
        "sfmoe_unpermute",
        (jax.ShapeDtypeStruct((tokens, rows.shape[1]), out_dtype),),
        rows,
        _int64(offsets),
        _int64(row_map),
        probs.astype(jnp.float32),
        has_probs=np.int64(has_probs),
    )
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _permute(x, topk_ids, num_experts, row_alignment, expert_capacity):
    return _permute_call(x, topk_ids, num_experts, row_alignment, expert_capacity)


def _permute_fwd(x, topk_ids, num_experts, row_alignment, expert_capacity):
    out = _permute_call(x, topk_ids, num_experts, row_alignment, expert_capacity)
    return out, (out.group_offsets, out.row_map, jnp.zeros((0,), x.dtype))


def _permute_bwd(num_experts, row_alignment, expert_capacity, residuals, cotangents):
    offsets, row_map, like = residuals
    # permute's backward: each token's d rows summed over its slots (unpermute without weights)
    d_x = _unpermute_call(cotangents.rows, offsets, row_map, None, like.dtype)
    return d_x, None


_permute.defvjp(_permute_fwd, _permute_bwd)


def permute(x, topk_ids, num_experts, *, alignment=1, expert_capacity=0):
    """Token rows x [T, H] to expert-sorted rows (docs/permute.md): topk_ids [T, k] int32 (each
    token names an expert at most once). Returns :class:`Permuted`. alignment (1, 8, 16, 32,
    64 or 128) pads each expert's block; expert_capacity > 0 keeps each expert's lowest token
    indices up to it. Differentiable in x."""
    x = _rows(x, "x")
    topk_ids = jnp.asarray(topk_ids)
    if topk_ids.ndim != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected [T, k] with T = {x.shape[0]}, got {topk_ids.shape}")
    return _permute(x, topk_ids.astype(jnp.int32), int(num_experts), int(alignment), int(expert_capacity))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _unpermute(rows, probs, offsets, row_map, group_rows, out_dtype):
    return _unpermute_call(rows, offsets, row_map, probs, out_dtype)


def _unpermute_fwd(rows, probs, offsets, row_map, group_rows, out_dtype):
    out = _unpermute_call(rows, offsets, row_map, probs, out_dtype)
    return out, (rows, probs, offsets, row_map, group_rows)


def _unpermute_bwd(out_dtype, residuals, d_out):
    rows, probs, offsets, row_map, group_rows = residuals
    weights = jnp.ones(row_map.shape, jnp.float32) if probs is None else probs
    d_rows, d_probs = _call(
        "sfmoe_unpermute_backward",
        (jax.ShapeDtypeStruct(rows.shape, rows.dtype), jax.ShapeDtypeStruct(row_map.shape, jnp.float32)),
        d_out,
        rows,
        _int64(offsets),
        _int64(row_map),
        weights.astype(jnp.float32),
        _int64(group_rows),
    )
    return d_rows, None if probs is None else d_probs.astype(probs.dtype), None, None, None


_unpermute.defvjp(_unpermute_fwd, _unpermute_bwd)


def unpermute(rows, permuted, probs=None, *, out_dtype=None):
    """out [T, H] = sum_i probs[t, i] rows[row_map[t, i]] (FP32 in slot order, rounded once to
    out_dtype, default rows'), with `permuted` the :class:`Permuted` that laid the rows out.
    probs [T, k] float32, or None for weight 1. Differentiable in rows and probs."""
    rows = _rows(rows, "rows")
    if not isinstance(permuted, Permuted):
        raise TypeError(f"permuted: expected what sfmoe.jax.permute returned, got {type(permuted).__name__}")
    out_dtype = rows.dtype if out_dtype is None else jnp.dtype(out_dtype)
    return _unpermute(
        rows, probs, permuted.group_offsets, permuted.row_map, permuted.tokens_per_expert, jnp.dtype(out_dtype)
    )


# ---- the grouped GEMM ------------------------------------------------------------------------------


def grouped_gemm(form, a, b, group_offsets, *, out_dtype=None):
    """One grouped GEMM (docs/grouped_gemm.md), not differentiated (:func:`grouped_linear` is):
    "fprop" a = X [R, K], b = W [G, N, K] -> [R, N]; "dgrad" a = dY [R, N], b = W -> [R, K];
    "wgrad" a = dY [R, N], b = X [R, K] -> dW [G, N, K]. group_offsets [G + 1]. FP32 sums; the
    result in out_dtype (default a's dtype)."""
    if form not in _FORMS:
        raise ValueError(f"form: expected 'fprop', 'dgrad' or 'wgrad', got {form!r}")
    a = _rows(a, "a")
    b = jnp.asarray(b)
    groups = jnp.shape(group_offsets)[0] - 1
    out_dtype = a.dtype if out_dtype is None else jnp.dtype(out_dtype)
    if form == "wgrad":
        b = _rows(b, "b")
        shape = (groups, a.shape[1], b.shape[1])
        b_rows = b.shape[0]
    else:
        if b.ndim != 3 or b.shape[0] != groups:
            raise ValueError(f"b: expected weights [G, N, K] with G = {groups}, got {b.shape}")
        shape = (a.shape[0], b.shape[1] if form == "fprop" else b.shape[2])
        b_rows = b.shape[0] * b.shape[1]
    workspace = _C.grouped_gemm_workspace_bytes(groups, 0, a.shape[0], a.shape[1], 0, b_rows, b.shape[-1])
    out, _ = _call(
        "sfmoe_grouped_gemm",
        (jax.ShapeDtypeStruct(shape, out_dtype), _bytes(workspace)),
        a,
        b,
        _int64(group_offsets),
        form=np.int64(_FORMS[form]),
    )
    return out


@jax.custom_vjp
def _grouped_linear(x, w, group_offsets):
    return grouped_gemm("fprop", x, w, group_offsets)


def _grouped_linear_fwd(x, w, group_offsets):
    return grouped_gemm("fprop", x, w, group_offsets), (x, w, group_offsets)


def _grouped_linear_bwd(residuals, d_y):
    x, w, group_offsets = residuals
    d_x = grouped_gemm("dgrad", d_y, w, group_offsets, out_dtype=x.dtype)
    d_w = grouped_gemm("wgrad", d_y, x, group_offsets, out_dtype=w.dtype)
    return d_x, d_w, None


_grouped_linear.defvjp(_grouped_linear_fwd, _grouped_linear_bwd)


def grouped_linear(x, w, group_offsets):
    """y_g = x_g w_g^T for each group's rows (x [R, K], w [G, N, K], group_offsets [G + 1]):
    [R, N] in x's dtype; differentiable in x and w (dgrad and wgrad kernels)."""
    return _grouped_linear(_rows(x, "x"), jnp.asarray(w), group_offsets)


# ---- the grouped activation ------------------------------------------------------------------------


class ActivationRules(NamedTuple):
    kind: str = "swiglu"
    limit: float = 7.0
    alpha: float = 1.702

    def attributes(self):
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {self.kind!r}")
        return dict(kind=np.int64(ACTIVATIONS[self.kind]), limit=np.float32(self.limit), alpha=np.float32(self.alpha))


def _activation_call(x, offsets, group_rows, rules, out_dtype):
    cols = x.shape[1] // 2 if rules.kind in GATED else x.shape[1]
    (out,) = _call(
        "sfmoe_activation",
        (jax.ShapeDtypeStruct((x.shape[0], cols), out_dtype),),
        x,
        _int64(offsets),
        _int64(group_rows),
        **rules.attributes(),
    )
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _activation(x, offsets, group_rows, rules, out_dtype):
    return _activation_call(x, offsets, group_rows, rules, out_dtype)


def _activation_fwd(x, offsets, group_rows, rules, out_dtype):
    return _activation_call(x, offsets, group_rows, rules, out_dtype), (x, offsets, group_rows)


def _activation_bwd(rules, out_dtype, residuals, d_out):
    x, offsets, group_rows = residuals
    (d_x,) = _call(
        "sfmoe_activation_backward",
        (jax.ShapeDtypeStruct(x.shape, x.dtype),),
        x,
        d_out,
        _int64(offsets),
        _int64(group_rows),
        **rules.attributes(),
    )
    return d_x, None, None


_activation.defvjp(_activation_fwd, _activation_bwd)


def grouped_activation(x, group_offsets, group_rows, activation="swiglu", *, limit=7.0, alpha=1.702, out_dtype=None):
    """The activation of each group's real rows (docs/activations.md): x [R, 2F] ([gate | up]) for
    the gated kinds, [R, F] otherwise; group_rows [G] real rows of each group (at most its block;
    e.g. Permuted.tokens_per_expert). Padding rows of the result are zeros. Differentiable in x."""
    x = _rows(x, "x")
    if activation in GATED and x.shape[1] % 2:
        raise ValueError(f"x: a gated activation needs an even number of columns, got {x.shape[1]}")
    rules = ActivationRules(activation, float(limit), float(alpha))
    rules.attributes()  # (checks the kind before tracing)
    out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)
    return _activation(x, group_offsets, group_rows, rules, jnp.dtype(out_dtype))


# ---- grouped quantization and the quantized grouped GEMM ------------------------------------------

# sfmoe's GroupedQuantizedTensor as a JAX pytree: its arrays the leaves, the rest static.
jax.tree_util.register_pytree_node(
    GroupedQuantizedTensor,
    lambda q: q.flatten(),
    lambda metadata, arrays: GroupedQuantizedTensor.unflatten(arrays, metadata),
)


def _container(spec):
    """The JAX array type of one planned buffer (dtype, shape in elements, bytes); INT64 as the
    handlers read it (int32 pairs without x64)."""
    dtype, shape, _ = spec
    dtype = DType(dtype)
    if dtype == DType.INT64:
        return _int64_result(tuple(shape))
    return jax.ShapeDtypeStruct(container_shape(shape, dtype, "planned buffer"), numpy_container(dtype))


def _quantized_attributes(q, prefix=""):
    fields = dict(
        dtype=int(q.dtype),
        scaling=int(q.scaling),
        scale_layout=int(q.scale_layout),
        num_groups=q.num_groups,
        row_capacity=q.rows,
        cols=q.cols,
        row_alignment=q.row_alignment,
        uniform_group_rows=q.uniform_group_rows,
    )
    return {prefix + k: np.int64(v) for k, v in fields.items()}


def _quantized_arrays(q):
    """The seven arrays of a quantized tensor in the handlers' order, a 0-byte array for each
    absent one."""
    nothing = jnp.zeros((0,), jnp.uint8)
    return [nothing if getattr(q, name) is None else getattr(q, name) for name in GroupedQuantizedTensor.ARRAY_FIELDS]


def quantize(
    x,
    recipe,
    *,
    group_offsets=None,
    uniform_group_rows=None,
    rowwise=True,
    columnwise=False,
    fmt="e4m3",
    scale_layout="compact",
    row_alignment=None,
    power_of_two_scales=False,
):
    """Grouped quantization of rows x [rows, cols] (float32, bfloat16, float16) as one FFI call:
    sfmoe.quantize's rules and options (docs/quantization.md; recipes "fp8_tensor",
    "fp8_block_1x128", "fp8_block_128x128", "mxfp8", "nvfp4", "nvfp4_2d"), the groups by
    group_offsets [G + 1] (int32 device array) or uniform_group_rows, else one group of all rows.
    Returns a :class:`sfmoe.GroupedQuantizedTensor` of JAX arrays (a pytree: it passes through
    ``jit``), its group_offsets the padded output offsets (int32 pairs [G + 1, 2] without x64). Not
    differentiated. NVFP4's stochastic rounding and Hadamard copies are the torch frontend's."""
    x = _rows(x, "x")
    scaling = _recipe_scaling(recipe)
    dtype = _element_dtype(scaling, fmt)
    layout = _scale_layout(scale_layout, scaling)
    if not (rowwise or columnwise):
        raise ValueError("rowwise and columnwise are both False: there is nothing to produce")
    rows, cols = x.shape
    if group_offsets is not None and uniform_group_rows is not None:
        raise ValueError("pass group_offsets or uniform_group_rows, not both")
    if group_offsets is not None:
        num_groups, uniform = jnp.shape(group_offsets)[0] - 1, 0
        offsets = _int64(group_offsets)
    else:
        uniform = rows if uniform_group_rows is None else int(uniform_group_rows)
        if uniform < 1 or rows % uniform:
            raise ValueError(f"uniform_group_rows: {uniform} does not divide the {rows} rows")
        num_groups, offsets = rows // uniform, jnp.zeros((0,), jnp.uint8)
    alignment = 0 if row_alignment is None else int(row_alignment)
    plan = plan_quantize(
        dtype, scaling, layout, rowwise, columnwise, False, num_groups, cols, rows, uniform, alignment, 0
    )
    planned = {field: plan["buffers"][name] for field, name in PLANNED_BUFFERS.items()}
    results = tuple(
        jax.ShapeDtypeStruct((0,), jnp.uint8) if planned[name] is None else _container(planned[name])
        for name in GroupedQuantizedTensor.ARRAY_FIELDS
    )
    config = QuantizeConfig(power_of_two_scales=bool(power_of_two_scales))
    q = tensor_from_plan(plan, config, dict.fromkeys(GroupedQuantizedTensor.ARRAY_FIELDS))
    arrays = _call(
        "sfmoe_grouped_quantize",
        results,
        x,
        offsets,
        power_of_two_scales=np.int64(bool(power_of_two_scales)),
        **_quantized_attributes(q),
    )
    present = {n: a for n, a in zip(GroupedQuantizedTensor.ARRAY_FIELDS, arrays) if planned[n] is not None}
    return dataclasses.replace(q, **present)


def grouped_gemm_quantized(form, a, b, *, out_dtype=jnp.float32, fast_accumulation=False):
    """One grouped GEMM on two quantized operands (from :func:`quantize`; weights with uniform
    groups), as sfmoe.grouped_gemm takes them: "fprop" a = X rows, b = W [G, N, K] -> [R, N];
    "dgrad" a = dY rows, b = W -> [R, K]; "wgrad" a = dY, b = X -> dW [G, N, K]. Each form reads
    the copies its kernel reads (fprop rowwise; dgrad W columnwise; wgrad both columnwise), which
    must be present; the groups are a's offsets. FP32 sums; MXFP8 and NVFP4 emulated on Hopper.
    Not differentiated."""
    if form not in _FORMS:
        raise ValueError(f"form: expected 'fprop', 'dgrad' or 'wgrad', got {form!r}")
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, GroupedQuantizedTensor):
            raise TypeError(f"{name}: expected a quantized tensor from sfmoe.jax.quantize, got {type(q).__name__}")
    if a.group_offsets is None:
        raise ValueError("a: the row operand needs group offsets (quantize it with group_offsets)")
    groups = a.num_groups
    if form == "wgrad":
        shape = (groups, a.cols, b.cols)
    elif form == "fprop":
        shape = (a.rows, b.uniform_group_rows)
    else:
        shape = (a.rows, b.cols)
    workspace = _C.grouped_gemm_workspace_bytes(groups, int(a.scaling), a.rows, a.cols, int(b.scaling), b.rows, b.cols)
    out, _ = _call(
        "sfmoe_grouped_gemm_quantized",
        (jax.ShapeDtypeStruct(shape, jnp.dtype(out_dtype)), _bytes(workspace)),
        *_quantized_arrays(a),
        *_quantized_arrays(b),
        a.group_offsets,
        form=np.int64(_FORMS[form]),
        fast_accumulation=np.int64(bool(fast_accumulation)),
        hadamard_columnwise=np.int64(0),
        **_quantized_attributes(a, "a_"),
        **_quantized_attributes(b, "b_"),
    )
    return out
