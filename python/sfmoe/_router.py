"""The MoE router (docs/router.md): top-k ids, probabilities, tokens per expert, losses, and the
backward, on host arrays (the CPU reference) or CUDA tensors (the device kernels, same bits)."""

import dataclasses

from . import _C, _arrays
from ._dtypes import DType

_SCORES = {"softmax": 0, "sigmoid": 1}


@dataclasses.dataclass
class RouterOutput:
    """What :func:`router` returns: topk_ids [T, k] int32 (best first), probs [T, k] float32,
    tokens_per_expert [E] int64, and the losses as one-element float32 arrays (None when their
    coefficient is 0). `config` is what :func:`router_backward` needs to repeat the rules."""

    topk_ids: object
    probs: object
    tokens_per_expert: object
    aux_loss: object
    z_loss: object
    config: dict


def _config(options):
    """The sfmoe_router_config fields of the router's keyword options, checked and typed."""
    score = options["score"]
    if score not in _SCORES:
        raise ValueError(f"score: expected 'softmax' or 'sigmoid', got {score!r}")
    kinds = dict(
        top_k=int,
        softmax_after_topk=bool,
        num_groups=int,
        group_topk=int,
        group_score_topk=int,
        scaling_factor=float,
        normalize=bool,
        aux_loss_coeff=float,
        z_loss_coeff=float,
    )
    return dict(score=_SCORES[score], **{name: kind(options[name]) for name, kind in kinds.items()})


def _logits(logits):
    adapter, x, dtype = _arrays.checked_input(logits, "logits", (DType.FP32, DType.BF16), ndim=2)
    return adapter, x, dtype, adapter.shape(x)


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
    """Routes each token to `top_k` experts (docs/router.md).

    logits: [T, E] float32 or bfloat16. score: "softmax" or "sigmoid". softmax_after_topk: select
    on the logits, then a softmax over the k selected. num_groups / group_topk / group_score_topk:
    group-limited routing (DeepSeek-V3: 8 groups, 4 kept, score = sum of the best 2).
    expert_bias: [E] float32 added to the scores for the selection only. normalize: divide the k
    probabilities by their sum; scaling_factor multiplies them. aux_loss_coeff / z_loss_coeff:
    the Switch/GShard load-balancing loss and the z-loss (0: not computed).
    Returns a :class:`RouterOutput`.
    """
    adapter, x, dtype, (tokens, experts) = _logits(logits)
    config = _config(
        dict(
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
    )
    # (a top_k below 1 is the library's to refuse, with its message: the outputs' shapes must not
    # fail before it can)
    k = max(config["top_k"], 1)
    ids = adapter.empty((tokens, k), DType.INT32, x)
    probs = adapter.empty((tokens, k), DType.FP32, x)
    counts = adapter.empty((experts,), DType.INT64, x)
    aux = adapter.empty((1,), DType.FP32, x) if config["aux_loss_coeff"] else None
    z = adapter.empty((1,), DType.FP32, x) if config["z_loss_coeff"] else None
    bias = None
    if expert_bias is not None:
        bias = _arrays.bound_input(expert_bias, "expert_bias", DType.FP32)

    def bind(array):
        return None if array is None else adapter.for_binding(array)

    # The device sums the losses' per-block partials in a workspace (the host ignores it).
    workspace = None
    if aux is not None or z is not None:
        workspace = _arrays.empty_bytes(adapter, _C.router_workspace_bytes(tokens, experts), DType.FP32, x)
    _C.router_forward(
        bind(x),
        int(dtype),
        bias,
        config,
        bind(ids),
        bind(probs),
        bind(counts),
        bind(aux),
        bind(z),
        bind(workspace),
        adapter.stream(x),
    )
    return RouterOutput(ids, probs, counts, aux, z, config)


def router_backward(logits, routed, d_probs=None, d_aux_loss=1.0, d_z_loss=1.0):
    """d logits [T, E] float32 from the forward's `logits` and :class:`RouterOutput`, the gradient
    of the probabilities (d_probs [T, k] float32, or None) and of the losses (numbers; a loss
    whose coefficient is 0 contributes nothing)."""
    adapter, x, dtype, (tokens, experts) = _logits(logits)
    d_logits = adapter.empty((tokens, experts), DType.FP32, x)
    dp = None
    if d_probs is not None:
        dp = _arrays.bound_input(d_probs, "d_probs", DType.FP32)

    def bind(array):
        return adapter.for_binding(array)

    _C.router_backward(
        bind(x),
        int(dtype),
        bind(routed.topk_ids),
        bind(routed.tokens_per_expert),
        routed.config,
        dp,
        float(d_aux_loss),
        float(d_z_loss),
        bind(d_logits),
        adapter.stream(x),
    )
    return d_logits
