"""The functional ops with autograd (docs/torch.md, "Functional ops"): router, permute, unpermute
and the grouped activation as ``torch.library`` custom ops whose backward is registered, so that a
tensor that requires grad keeps its graph through them. The plain functional API
(``sfmoe.router``, ``sfmoe.permute``, ...) records no autograd and refuses such tensors."""

from typing import Optional

import torch
from torch import Tensor

from .. import _C, _activation, _permute, _router


def _d(t):
    return None if t is None else t.detach()


# ---- router ---------------------------------------------------------------------------------


# The router's options, as the custom ops take them (plain values, in this order).
_ROUTER_FIELDS = (
    "top_k",
    "score",
    "softmax_after_topk",
    "num_groups",
    "group_topk",
    "group_score_topk",
    "scaling_factor",
    "normalize",
    "aux_loss_coeff",
    "z_loss_coeff",
)


def _router_options(options):
    return dict(zip(_ROUTER_FIELDS, options))


@torch.library.custom_op("sfmoe::router", mutates_args=())
def _router_op(
    logits: Tensor,
    expert_bias: Optional[Tensor],
    top_k: int,
    score: str,
    softmax_after_topk: bool,
    num_groups: int,
    group_topk: int,
    group_score_topk: int,
    scaling_factor: float,
    normalize: bool,
    aux_loss_coeff: float,
    z_loss_coeff: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """probs [T, k], topk_ids [T, k] int32, tokens_per_expert [E] int64, aux and z losses ([1],
    zero where their coefficient is)."""
    options = dict(
        top_k=top_k,
        score=score,
        softmax_after_topk=softmax_after_topk,
        num_groups=num_groups,
        group_topk=group_topk,
        group_score_topk=group_score_topk,
        scaling_factor=scaling_factor,
        normalize=normalize,
        aux_loss_coeff=aux_loss_coeff,
        z_loss_coeff=z_loss_coeff,
    )
    r = _router.router(_d(logits), expert_bias=_d(expert_bias), **options)

    def loss(value):
        return torch.zeros(1, dtype=torch.float32, device=logits.device) if value is None else value

    return r.probs, r.topk_ids, r.tokens_per_expert, loss(r.aux_loss), loss(r.z_loss)


@_router_op.register_fake
def _(logits, expert_bias, top_k, *options):
    k = top_k
    t, e = logits.shape
    loss = logits.new_empty(1, dtype=torch.float32)
    return (
        logits.new_empty(t, k, dtype=torch.float32),
        logits.new_empty(t, k, dtype=torch.int32),
        logits.new_empty(e, dtype=torch.int64),
        loss,
        loss.new_empty(1),
    )


@torch.library.custom_op("sfmoe::router_backward", mutates_args=())
def _router_backward_op(
    logits: Tensor,
    topk_ids: Tensor,
    counts: Tensor,
    d_probs: Optional[Tensor],
    d_aux: float,
    d_z: float,
    top_k: int,
    score: str,
    softmax_after_topk: bool,
    num_groups: int,
    group_topk: int,
    group_score_topk: int,
    scaling_factor: float,
    normalize: bool,
    aux_loss_coeff: float,
    z_loss_coeff: float,
) -> Tensor:
    """d logits from d probs (or none) and the losses' upstream gradients (host numbers)."""
    options = _router_options(
        (top_k, score, softmax_after_topk, num_groups, group_topk, group_score_topk)
        + (scaling_factor, normalize, aux_loss_coeff, z_loss_coeff)
    )
    routed = _router.RouterOutput(topk_ids, None, counts, None, None, _router._config(options))
    return _router.router_backward(_d(logits), routed, _d(d_probs), d_aux, d_z)


@_router_backward_op.register_fake
def _(logits, *rest):
    return logits.new_empty(logits.shape, dtype=torch.float32)


def _router_setup(ctx, inputs, output):
    logits = inputs[0]
    _, ids, counts, _, _ = output
    ctx.save_for_backward(logits, ids, counts)
    ctx.options = tuple(inputs[2:])
    ctx.mark_non_differentiable(ids, counts)
    ctx.set_materialize_grads(False)


def _router_backward(ctx, d_probs, d_ids, d_counts, d_aux, d_z):
    logits, ids, counts = ctx.saved_tensors
    o = _router_options(ctx.options)
    # d logits is linear in the losses' upstream gradients, which live on the device here: each
    # loss's gradient at 1, scaled by its upstream tensor (no host read of a device value).
    dp = None if d_probs is None else d_probs.float().contiguous()
    d_logits = _router_backward_op(logits, ids, counts, dp, 0.0, 0.0, *ctx.options)
    if d_aux is not None and o["aux_loss_coeff"]:
        unit = _router_backward_op(logits, ids, counts, None, 1.0, 0.0, *ctx.options)
        d_logits = d_logits + d_aux.float() * unit
    if d_z is not None and o["z_loss_coeff"]:
        unit = _router_backward_op(logits, ids, counts, None, 0.0, 1.0, *ctx.options)
        d_logits = d_logits + d_z.float() * unit
    return (d_logits.to(logits.dtype),) + (None,) * (1 + len(_ROUTER_FIELDS))


_router_op.register_autograd(_router_backward, setup_context=_router_setup)


def router(
    logits,
    top_k,
    *,
    score="softmax",
    softmax_after_topk=False,
    num_groups=0,
    group_topk=0,
    group_score_topk=2,
    scaling_factor=1.0,
    normalize=False,
    expert_bias=None,
    aux_loss_coeff=0.0,
    z_loss_coeff=0.0,
):
    """:func:`sfmoe.router` with autograd: returns (probs, topk_ids, tokens_per_expert, aux_loss,
        z_loss); d logits flows from the probabilities and the two losses (0-d tensors, zero where
        their coefficient is 0). The losses' upstream gradients scale their unit gradients on the
    device in the backward (no host read)."""
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"score: expected 'softmax' or 'sigmoid', got {score!r}")
    probs, ids, counts, aux, z = _router_op(
        logits.contiguous(),
        expert_bias,
        int(top_k),
        score,
        bool(softmax_after_topk),
        int(num_groups),
        int(group_topk),
        int(group_score_topk),
        float(scaling_factor),
        bool(normalize),
        float(aux_loss_coeff),
        float(z_loss_coeff),
    )
    return probs, ids, counts, aux[0], z[0]


# ---- permute / unpermute --------------------------------------------------------------------


def _permuted(row_map, group_offsets, tokens_per_expert, alignment=1):
    return _permute.PermuteOutput(None, group_offsets, row_map, tokens_per_expert, None, alignment)


@torch.library.custom_op("sfmoe::permute", mutates_args=())
def _permute_op(
    tokens: Tensor, topk_ids: Tensor, num_experts: int, alignment: int, expert_capacity: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """rows, group_offsets, row_map, tokens_per_expert, dropped_per_expert."""
    p = _permute.permute(_d(tokens), _d(topk_ids), num_experts, alignment=alignment, expert_capacity=expert_capacity)
    return p.rows, p.group_offsets, p.row_map, p.tokens_per_expert, p.dropped_per_expert


def _permute_rows(tokens, topk_ids, num_experts, alignment, expert_capacity):
    return _C.plan_permute(
        dict(
            num_tokens=tokens.shape[0],
            topk=topk_ids.shape[1],
            num_experts=num_experts,
            hidden=tokens.shape[1],
            row_alignment=alignment,
            expert_capacity=expert_capacity,
            group_amax=False,
        )
    )["permuted"]["row_capacity"]


@_permute_op.register_fake
def _(tokens, topk_ids, num_experts, alignment, expert_capacity):
    e = num_experts
    i64 = torch.int64
    return (
        tokens.new_empty(_permute_rows(tokens, topk_ids, num_experts, alignment, expert_capacity), tokens.shape[1]),
        tokens.new_empty(e + 1, dtype=i64),
        tokens.new_empty(topk_ids.shape, dtype=i64),
        tokens.new_empty(e, dtype=i64),
        tokens.new_empty(e, dtype=i64),
    )


@torch.library.custom_op("sfmoe::unpermute", mutates_args=())
def _unpermute_op(
    rows: Tensor, row_map: Tensor, group_offsets: Tensor, tokens_per_expert: Tensor, probs: Optional[Tensor]
) -> Tensor:
    permuted = _permuted(_d(row_map), _d(group_offsets), _d(tokens_per_expert))
    return _permute.unpermute(_d(rows), permuted, _d(probs))


@_unpermute_op.register_fake
def _(rows, row_map, group_offsets, tokens_per_expert, probs):
    return rows.new_empty(row_map.shape[0], rows.shape[1])


@torch.library.custom_op("sfmoe::unpermute_backward", mutates_args=())
def _unpermute_backward_op(
    d_out: Tensor, rows: Tensor, row_map: Tensor, group_offsets: Tensor, tokens_per_expert: Tensor, probs: Tensor
) -> tuple[Tensor, Tensor]:
    permuted = _permuted(_d(row_map), _d(group_offsets), _d(tokens_per_expert))
    return _permute.unpermute_backward(_d(d_out), _d(rows), permuted, _d(probs), out_dtype=rows.dtype)


@_unpermute_backward_op.register_fake
def _(d_out, rows, row_map, group_offsets, tokens_per_expert, probs):
    return rows.new_empty(rows.shape), rows.new_empty(row_map.shape, dtype=torch.float32)


def _permute_setup(ctx, inputs, output):
    tokens = inputs[0]
    _, offsets, row_map, kept, dropped = output
    ctx.save_for_backward(offsets, row_map, kept)
    ctx.mark_non_differentiable(offsets, row_map, kept, dropped)
    ctx.set_materialize_grads(False)
    ctx.dtype = tokens.dtype


def _permute_backward(ctx, d_rows, d_offsets, d_row_map, d_kept, d_dropped):
    offsets, row_map, kept = ctx.saved_tensors
    if d_rows is None:
        return None, None, None, None, None
    # Each token's gradient: the sum of its kept slots' rows (permute's backward is unpermute
    # with weight 1).
    d_tokens = _unpermute_op(d_rows.contiguous(), row_map, offsets, kept, None).to(ctx.dtype)
    return d_tokens, None, None, None, None


_permute_op.register_autograd(_permute_backward, setup_context=_permute_setup)


def _unpermute_setup(ctx, inputs, output):
    rows, row_map, offsets, kept, probs = inputs
    ctx.save_for_backward(rows, row_map, offsets, kept, probs)
    ctx.has_probs = probs is not None


def _unpermute_backward(ctx, d_out):
    rows, row_map, offsets, kept, probs = ctx.saved_tensors
    weights = probs if ctx.has_probs else torch.ones(row_map.shape, dtype=torch.float32, device=rows.device)
    d_rows, d_probs = _unpermute_backward_op(d_out.contiguous(), rows, row_map, offsets, kept, weights)
    # The op leaves rows beyond the groups unwritten: zero there (no gradient reaches them).
    beyond = torch.arange(rows.shape[0], device=rows.device)[:, None] >= offsets[-1]
    d_rows = d_rows.masked_fill(beyond, 0)
    return d_rows, None, None, None, d_probs if ctx.has_probs else None


_unpermute_op.register_autograd(_unpermute_backward, setup_context=_unpermute_setup)


def permute(tokens, topk_ids, num_experts, *, alignment=1, expert_capacity=0):
    """:func:`sfmoe.permute` with autograd (unquantized rows): returns (rows, group_offsets,
    row_map, tokens_per_expert, dropped_per_expert); d tokens is each token's kept slots' d rows
    summed."""
    # (an int64 id outside int32 becomes -1, a bad id, not a wrapped plausible one)
    if topk_ids.dtype != torch.int32:
        outside = (topk_ids < -(2**31)) | (topk_ids > 2**31 - 1)
        topk_ids = torch.where(outside, -1, topk_ids)
    ids = topk_ids
    ids = ids.to(torch.int32).contiguous()
    return _permute_op(tokens.contiguous(), ids, int(num_experts), int(alignment), int(expert_capacity))


def unpermute(rows, row_map, group_offsets, tokens_per_expert, probs=None):
    """:func:`sfmoe.unpermute` with autograd, over permute's row_map, group_offsets and
    tokens_per_expert: out[t] = sum_i probs[t, i] rows[row_map[t, i]] (probs None: weight 1);
    gradients for rows (zero in padding rows and beyond the groups) and probs."""
    p = None if probs is None else probs.float().contiguous()
    return _unpermute_op(rows.contiguous(), row_map, group_offsets, tokens_per_expert, p)


# ---- grouped activation -----------------------------------------------------------------------


@torch.library.custom_op("sfmoe::grouped_activation", mutates_args=())
def _activation_op(
    x: Tensor, group_offsets: Tensor, group_rows: Tensor, activation: str, limit: float, alpha: float
) -> Tensor:
    return _activation.grouped_activation(
        _d(x), _d(group_offsets), _d(group_rows), activation, limit=limit, alpha=alpha
    )


@_activation_op.register_fake
def _(x, group_offsets, group_rows, activation, limit, alpha):
    cols = x.shape[1] // 2 if activation in _activation.GATED else x.shape[1]
    return x.new_empty(x.shape[0], cols)


@torch.library.custom_op("sfmoe::grouped_activation_backward", mutates_args=())
def _activation_backward_op(
    x: Tensor, d_out: Tensor, group_offsets: Tensor, group_rows: Tensor, activation: str, limit: float, alpha: float
) -> Tensor:
    return _activation.grouped_activation_backward(
        _d(x), _d(d_out), _d(group_offsets), _d(group_rows), activation, limit=limit, alpha=alpha, out_dtype=x.dtype
    )


@_activation_backward_op.register_fake
def _(x, d_out, group_offsets, group_rows, activation, limit, alpha):
    return x.new_empty(x.shape)


def _activation_setup(ctx, inputs, output):
    x, offsets, rows = inputs[:3]
    ctx.save_for_backward(x, offsets, rows)
    ctx.options = tuple(inputs[3:])


def _activation_backward(ctx, d_out):
    x, offsets, rows = ctx.saved_tensors
    d_x = _activation_backward_op(x, d_out.contiguous(), offsets, rows, *ctx.options)
    return d_x, None, None, None, None, None


_activation_op.register_autograd(_activation_backward, setup_context=_activation_setup)


def grouped_activation(x, group_offsets, group_rows, activation="swiglu", *, limit=7.0, alpha=1.702):
    """:func:`sfmoe.grouped_activation` with autograd (unquantized output in x's dtype)."""
    if activation not in _activation.ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(_activation.ACTIVATIONS)}, got {activation!r}")
    return _activation_op(x.contiguous(), group_offsets, group_rows, activation, float(limit), float(alpha))
