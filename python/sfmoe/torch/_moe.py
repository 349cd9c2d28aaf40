"""The MoE layer's torch module and its two custom ops (docs/torch.md)."""

import atexit
import collections
import math
from typing import Optional

import torch
from torch import Tensor

from .. import _C, _arrays
from .._moe_config import MoEConfig
from . import _checkpoint, _gate

_DTYPES = {torch.bfloat16: _C.DTYPE_BF16, torch.float32: _C.DTYPE_FP32}
_TORCH = _arrays._Torch(torch)


# The configurations the custom ops may name (an int key each: custom ops take plain values), and
# the C layers made for them, one per (key, tokens, dtype, device).
_CONFIGS: list = []
_LAYERS = collections.OrderedDict()
# Token counts that vary from call to call make a layer each: the least recently used go beyond
# this many (a layer's plan depends on its configuration alone, so a forward's saved state stays
# valid for a backward that makes its layer again).
_MAX_LAYERS = 64
# NVFP4's rounding offset per (configuration key, device): the backward count, held on the device
# and advanced by an op on the stream, so that a captured graph advances it on every replay (the
# layer reads it when its kernels run: sfmoe_moe_backward_args.rng_offset_device).
_RNG_OFFSETS: dict = {}
_EP_GROUPS: dict = {}  # an expert-parallel configuration's NCCL group (its key's)
# (released before the interpreter tears the extension down)
atexit.register(_LAYERS.clear)
atexit.register(_EP_GROUPS.clear)


def _register(config):
    for key, known in enumerate(_CONFIGS):
        if known == config:
            return key
    _CONFIGS.append(config)
    return len(_CONFIGS) - 1


def _layer(key, tokens, dtype, device):
    c = _CONFIGS[key]
    if c.expert_parallel:
        if tokens > c.max_tokens_per_rank:
            raise ValueError(
                f"sfmoe: {tokens} tokens on this rank, more than max_tokens_per_rank = {c.max_tokens_per_rank}"
            )
        tokens = c.max_tokens_per_rank  # (one layer for every count: the ranks' group is made for this bound)
    index = (key, tokens, dtype, device.type, device.index)
    if index in _LAYERS:
        _LAYERS.move_to_end(index)
    else:
        fields = c.layer_fields(tokens, _DTYPES[dtype])
        if c.expert_parallel:
            fields.update(ep_world_size=c.ep_size, ep_group=_EP_GROUPS[key])
        memory = _C.MEMORY_CUDA if device.type == "cuda" else _C.MEMORY_HOST
        layer = _C.MoeLayer(fields, memory, device.index or 0)
        _LAYERS[index] = (layer, layer.plan())
        while len(_LAYERS) > _MAX_LAYERS:
            _LAYERS.popitem(last=False)
    return _LAYERS[index]


@torch.compiler.assume_constant_result
def _saved_bytes(key, tokens, dtype, device):
    """The plan's saved bytes: a constant of the traced graph (the C layer is made outside it)."""
    return _layer(key, tokens, dtype, device)[1]["saved_bytes"]


@torch.compiler.assume_constant_result
def _weight_cache_bytes(key, tokens, dtype, device):
    """The plan's weight cache bytes (0 under bf16): a constant of the traced graph."""
    return _layer(key, tokens, dtype, device)[1]["weight_cache_bytes"]


def _arg(t):
    return None if t is None else _TORCH.for_binding(t)


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _logits_dtype(logits):
    return _C.DTYPE_FP32 if logits.dtype == torch.float32 else _C.DTYPE_BF16


# saved_bytes (the C planner's, passed by the module) puts the saved state's size into the traced
# graph as a constant, so that a compiled graph cached on disk by an earlier build with another
# plan is not reused.
@torch.library.custom_op("sfmoe::moe_layer_forward", mutates_args=())
def moe_layer_forward(
    x: Tensor,
    logits: Tensor,
    expert_bias: Optional[Tensor],
    w1: Tensor,
    w2: Tensor,
    key: int,
    saved_bytes: int,
    weight_cache: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """y, the saved state, and the experts' kept, dropped and routed token counts. weight_cache:
    the weights' quantized copies (moe_layer_fill_weight_cache), read instead of quantizing the
    weights; empty for none."""
    layer, plan = _layer(key, x.shape[0], x.dtype, x.device)
    if plan["saved_bytes"] != saved_bytes:
        raise RuntimeError(f"sfmoe: the layer's saved state is {plan['saved_bytes']} bytes, not {saved_bytes}")
    c = _CONFIGS[key]
    y = torch.empty_like(x)
    saved = torch.empty(plan["saved_bytes"], dtype=torch.uint8, device=x.device)
    workspace = torch.empty(plan["forward_workspace_bytes"], dtype=torch.uint8, device=x.device)
    kept = torch.empty(c.local_experts, dtype=torch.int64, device=x.device)
    dropped, routed = (torch.empty(c.num_experts, dtype=torch.int64, device=x.device) for _ in range(2))
    layer.forward(
        _arg(x),
        _arg(logits),
        _logits_dtype(logits),
        _arg(expert_bias),
        _arg(w1),
        _arg(w2),
        _arg(y),
        _arg(saved),
        _arg(workspace),
        None,
        None,
        _arg(kept),
        _arg(dropped),
        _arg(routed),
        None,
        _stream(x),
        _cache_arg(weight_cache),
        weight_cache.numel() > 0,
    )
    return y, saved, kept, dropped, routed


@torch.library.custom_op("sfmoe::moe_layer_fill_weight_cache", mutates_args=("weight_cache",))
def moe_layer_fill_weight_cache(w1: Tensor, w2: Tensor, weight_cache: Tensor, key: int, tokens: int) -> None:
    """The weights' quantized copies, every one the layer's GEMMs read, into `weight_cache`
    (sfmoe_moe_layer_fill_weight_cache), by the layer of a step of `tokens` (the copies do not
    depend on them). Outside autograd: the copies carry no gradient."""
    layer, _ = _layer(key, tokens, w1.dtype, w1.device)
    layer.fill_weight_cache(_arg(w1), _arg(w2), _arg(weight_cache), None, _stream(w1))


@moe_layer_fill_weight_cache.register_fake
def _(w1, w2, weight_cache, key, tokens):
    return None


def _cache_arg(weight_cache):
    """The weight cache as the layer takes it: None for the empty tensor that stands for none (a
    mutated argument is a tensor: torch.compile takes no None there)."""
    return _arg(weight_cache) if weight_cache.numel() else None


@moe_layer_forward.register_fake
def _(x, logits, expert_bias, w1, w2, key, saved_bytes, weight_cache):
    c = _CONFIGS[key]
    counts = [x.new_empty(n, dtype=torch.int64) for n in (c.local_experts, c.num_experts, c.num_experts)]
    return (x.new_empty(x.shape), x.new_empty(saved_bytes, dtype=torch.uint8), *counts)


# The layer's backward runs as two ops, its FC2 part then its FC1 part (sfmoe_moe_backward_part),
# so that d w1 and the FC1 part's smaller workspace are allocated after the FC2 part's workspace
# is free, as autograd frees a plain layer's activations during its backward; or as three, FC2's
# dgrad, the FC1 part, then FC2's wgrad (d y gathered again), so that d w2 is allocated after the
# saved state (FC1's rows, [R, fc1_cols]) is free: _three_part_backward chooses.
_FC2, _FC1, _FC2_DGRAD, _FC2_WGRAD = 1, 2, 3, 4


@torch.compiler.assume_constant_result
def _three_part_backward(key, tokens, dtype, device):
    """Whether the backward runs in three parts: the C planner's choice (sfmoe_moe_layer_plan's
    three_part_backward: where that lowers the backward's peak, new gradients included, by more
    than the d y rows it gathers again; never with main gradients or expert parallelism)."""
    return _layer(key, tokens, dtype, device)[1]["three_part_backward"]


def _backward_part(
    part,
    key,
    tokens,
    like,
    saved,
    *,
    workspace=None,
    x=None,
    d_y=None,
    logits=None,
    w1=None,
    w2=None,
    weight_cache=None,
    **outputs,
):
    """One part of the layer's backward into the given outputs (d_x, d_logits, d_w1 / d_w2: in the
    weights' dtype, or FP32 main gradients added to, as the layer was made), on `workspace` (the
    three-part backward's, shared by its parts) or a new one of the part's size; the dgrad GEMMs'
    weight copies read from `weight_cache` where one is given (non-empty)."""
    layer, plan = _layer(key, tokens, like.dtype, like.device)
    if workspace is None:
        size = plan["fc1_backward_workspace_bytes"] if part == _FC1 else plan["workspace_bytes"]
        workspace = torch.empty(size, dtype=torch.uint8, device=like.device)
    offset = None
    if _CONFIGS[key].recipe == "nvfp4":  # the rounding stream advances each backward, on the device
        offset = _rng_offset(key, like.device)
        if part in (_FC2, _FC2_DGRAD):  # (each backward's first part)
            offset.add_(1)
    layer.backward(
        _arg(x),
        _arg(d_y),
        _arg(logits),
        _logits_dtype(logits) if logits is not None else _C.DTYPE_FP32,
        _arg(w1),
        _arg(w2),
        _arg(saved),
        _arg(workspace),
        0.0,
        0.0,
        _arg(outputs.get("d_x")),
        _arg(outputs.get("d_logits")),
        _arg(outputs.get("d_w1")),
        _arg(outputs.get("d_w2")),
        0,
        part,
        None,
        _stream(like),
        _arg(offset),
        _cache_arg(weight_cache) if weight_cache is not None else None,
        weight_cache is not None and weight_cache.numel() > 0,
    )


def _rng_offset(key, device):
    """The device counter of NVFP4's rounding offset for `key` on `device` (made at first use)."""
    counter = _RNG_OFFSETS.get((key, device))
    if counter is None:
        counter = torch.zeros(1, dtype=torch.int64, device=device)
        _RNG_OFFSETS[(key, device)] = counter
    return counter


def _fc1_part(key, x, logits, w1, saved, d_w1, weight_cache, workspace=None):
    """The FC1 part into d_w1 (written, or an FP32 main gradient added to): d x and d logits."""
    d_x = torch.empty_like(x)
    d_logits = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    _backward_part(
        _FC1,
        key,
        x.shape[0],
        x,
        saved,
        workspace=workspace,
        x=x,
        logits=logits,
        w1=w1,
        weight_cache=weight_cache,
        d_x=d_x,
        d_logits=d_logits,
        d_w1=d_w1,
    )
    return d_x, d_logits


# The FC2 part writes d FC1 rows and d probs into `saved` (declared, so autograd's version check
# refuses a second backward through the same forward, as with retain_graph=True, instead of
# reading a gradient where FC1's output was); the FC1 part reads them.
@torch.library.custom_op("sfmoe::moe_layer_backward_fc2", mutates_args=("saved",))
def moe_layer_backward_fc2(d_y: Tensor, w2: Tensor, saved: Tensor, key: int, weight_cache: Tensor) -> Tensor:
    """d w2 of the forward that left `saved` (and d FC1 rows, d probs into `saved`)."""
    d_w2 = torch.empty_like(w2)
    _backward_part(_FC2, key, d_y.shape[0], d_y, saved, d_y=d_y, w2=w2, weight_cache=weight_cache, d_w2=d_w2)
    return d_w2


@torch.library.custom_op("sfmoe::moe_layer_backward_fc1", mutates_args=())
def moe_layer_backward_fc1(
    x: Tensor, logits: Tensor, w1: Tensor, saved: Tensor, key: int, weight_cache: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """d x, d logits and d w1, after the FC2 part ran on `saved`."""
    d_w1 = torch.empty_like(w1)
    return (*_fc1_part(key, x, logits, w1, saved, d_w1, weight_cache), d_w1)


@torch.library.custom_op("sfmoe::moe_layer_backward_fc2_main_grad", mutates_args=("saved", "main_grad2"))
def moe_layer_backward_fc2_main_grad(
    d_y: Tensor, w2: Tensor, saved: Tensor, main_grad2: Tensor, key: int, weight_cache: Tensor
) -> None:
    """The FC2 part with d w2 added to the FP32 main gradient."""
    _backward_part(
        _FC2,
        key,
        d_y.shape[0],
        d_y,
        saved,
        d_y=d_y,
        w2=w2,
        weight_cache=weight_cache,
        d_w2=main_grad2,
    )


@torch.library.custom_op("sfmoe::moe_layer_backward_fc1_main_grad", mutates_args=("main_grad1",))
def moe_layer_backward_fc1_main_grad(
    x: Tensor,
    logits: Tensor,
    w1: Tensor,
    saved: Tensor,
    main_grad1: Tensor,
    key: int,
    weight_cache: Tensor,
) -> tuple[Tensor, Tensor]:
    """The FC1 part with d w1 added to the FP32 main gradient: d x and d logits."""
    return _fc1_part(key, x, logits, w1, saved, main_grad1, weight_cache)


# The three-part backward (_three_part_backward): FC2's dgrad writes d FC1 rows and d probs into
# `saved` and the weighted activations and a copy of the routing into `workspace`; the FC1 part
# runs on the same workspace (its prefix); FC2's wgrad reads only the workspace and d y.
@torch.library.custom_op("sfmoe::moe_layer_backward3_fc2_dgrad", mutates_args=("saved", "workspace"))
def moe_layer_backward3_fc2_dgrad(
    d_y: Tensor, w2: Tensor, saved: Tensor, workspace: Tensor, key: int, weight_cache: Tensor
) -> None:
    """The three-part backward's first part (FC2's dgrad and the activation's backward)."""
    _backward_part(
        _FC2_DGRAD,
        key,
        d_y.shape[0],
        d_y,
        saved,
        workspace=workspace,
        d_y=d_y,
        w2=w2,
        weight_cache=weight_cache,
    )


@torch.library.custom_op("sfmoe::moe_layer_backward3_fc1", mutates_args=("workspace",))
def moe_layer_backward3_fc1(
    x: Tensor,
    logits: Tensor,
    w1: Tensor,
    saved: Tensor,
    workspace: Tensor,
    key: int,
    weight_cache: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Its second: d x, d logits and d w1 (the FC1 part on the first part's workspace)."""
    d_w1 = torch.empty_like(w1)
    return (*_fc1_part(key, x, logits, w1, saved, d_w1, weight_cache, workspace), d_w1)


@torch.library.custom_op("sfmoe::moe_layer_backward3_fc2_wgrad", mutates_args=("workspace",))
def moe_layer_backward3_fc2_wgrad(d_y: Tensor, w2: Tensor, workspace: Tensor, key: int) -> Tensor:
    """Its third: d w2 (w2 gives its shape and dtype only; the saved state is not read)."""
    d_w2 = torch.empty_like(w2)
    _backward_part(_FC2_WGRAD, key, d_y.shape[0], d_y, None, workspace=workspace, d_y=d_y, d_w2=d_w2)
    return d_w2


@moe_layer_backward_fc2.register_fake
def _(d_y, w2, saved, key, weight_cache):
    return w2.new_empty(w2.shape)


@moe_layer_backward_fc1.register_fake
def _(x, logits, w1, saved, key, weight_cache):
    return x.new_empty(x.shape), logits.new_empty(logits.shape, dtype=torch.float32), w1.new_empty(w1.shape)


@moe_layer_backward_fc2_main_grad.register_fake
def _(d_y, w2, saved, main_grad2, key, weight_cache):
    return None


@moe_layer_backward_fc1_main_grad.register_fake
def _(x, logits, w1, saved, main_grad1, key, weight_cache):
    return x.new_empty(x.shape), logits.new_empty(logits.shape, dtype=torch.float32)


@moe_layer_backward3_fc2_dgrad.register_fake
def _(d_y, w2, saved, workspace, key, weight_cache):
    return None


@moe_layer_backward3_fc1.register_fake
def _(x, logits, w1, saved, workspace, key, weight_cache):
    return x.new_empty(x.shape), logits.new_empty(logits.shape, dtype=torch.float32), w1.new_empty(w1.shape)


@moe_layer_backward3_fc2_wgrad.register_fake
def _(d_y, w2, workspace, key):
    return w2.new_empty(w2.shape)


def _setup_context(ctx, inputs, output):
    x, logits, expert_bias, w1, w2, key, _, weight_cache = inputs
    _, saved, kept, dropped, routed = output
    # (the backward reads its dgrad copies from the same cache; not saved for backward: it is the
    # module's, not an activation)
    ctx.weight_cache = weight_cache
    # (the saved state through save_for_backward: saved-tensor hooks, such as non-reentrant
    # activation checkpointing and save_on_cpu, see it as they see any activation)
    ctx.save_for_backward(x, logits, w1, w2, saved)
    ctx.key = key
    # (taken from the weights themselves: the tensors saved for the backward need not be them)
    ctx.main_grads = (main_grad_of(w1), main_grad_of(w2)) if _CONFIGS[key].gradient_accumulation_fusion else None
    ctx.mark_non_differentiable(saved, kept, dropped, routed)
    # (else autograd hands the backward a zero-filled gradient for each of those outputs: the
    # saved state's size in zeros, written at the start of every backward)
    ctx.set_materialize_grads(False)


def _backward(ctx, d_y, d_saved, d_kept, d_dropped, d_routed):
    x, logits, w1, w2, saved = ctx.saved_tensors
    cache = ctx.weight_cache
    d_y = torch.zeros_like(x) if d_y is None else d_y.contiguous()
    if _CONFIGS[ctx.key].gradient_accumulation_fusion:
        main1, main2 = ctx.main_grads
        moe_layer_backward_fc2_main_grad(d_y, w2, saved, main2, ctx.key, cache)
        d_x, d_logits = moe_layer_backward_fc1_main_grad(x, logits, w1, saved, main1, ctx.key, cache)
        return d_x, d_logits.to(logits.dtype), None, None, None, None, None, None
    # (eager only: a compiled backward's buffers are the compiled graph's to plan, and the early
    # release below is not something it traces; there two parts)
    if not torch.compiler.is_compiling() and _three_part_backward(ctx.key, x.shape[0], x.dtype, x.device):
        plan = _layer(ctx.key, x.shape[0], x.dtype, x.device)[1]
        workspace = torch.empty(plan["workspace_bytes"], dtype=torch.uint8, device=x.device)
        moe_layer_backward3_fc2_dgrad(d_y, w2, saved, workspace, ctx.key, cache)
        d_x, d_logits, d_w1 = moe_layer_backward3_fc1(x, logits, w1, saved, workspace, ctx.key, cache)
        # The saved state's last reader has run: its memory goes back before d w2 is allocated
        # (autograd still holds the tensor until this backward returns; a second backward through
        # the same forward stops at the version check first, as the parts above wrote into it).
        saved.untyped_storage().resize_(0)
        d_w2 = moe_layer_backward3_fc2_wgrad(d_y, w2, workspace, ctx.key)
        return d_x, d_logits.to(logits.dtype), None, d_w1, d_w2, None, None, None
    d_w2 = moe_layer_backward_fc2(d_y, w2, saved, ctx.key, cache)
    d_x, d_logits, d_w1 = moe_layer_backward_fc1(x, logits, w1, saved, ctx.key, cache)
    return d_x, d_logits.to(logits.dtype), None, d_w1, d_w2, None, None, None


def main_grad_of(weight):
    """The weight's FP32 main gradient (Megatron's `param.main_grad`), made at zero when absent."""
    grad = getattr(weight, "main_grad", None)
    if grad is None:
        grad = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        weight.main_grad = grad
    return grad


moe_layer_forward.register_autograd(_backward, setup_context=_setup_context)


def _make_ep_group(key, config, ep_group, dtype, device):
    """This rank's NCCL group for the configuration `key`, made once: rank 0 of `ep_group` makes
    the NCCL id and torch.distributed hands it to the others (host communication at set-up only);
    every rank's module construction takes part."""
    if key in _EP_GROUPS:
        return
    import torch.distributed as dist

    if device is None or device.type != "cuda":
        raise ValueError("expert parallelism runs on CUDA devices: pass device='cuda:N'")
    index = device.index if device.index is not None else torch.cuda.current_device()
    box = [_C.ep_nccl_unique_id() if dist.get_rank(ep_group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(ep_group, 0), group=ep_group)
    _EP_GROUPS[key] = _C.EpGroup(config.ep_fields(_DTYPES[dtype]), box[0], index)


class _AttachAuxLoss(torch.autograd.Function):
    """Returns y unchanged; in the backward gives the auxiliary loss the gradient 1, so that the
    loss reaches the router without the caller adding it (Megatron's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, y, aux_loss):
        ctx.save_for_backward(aux_loss)
        return y

    @staticmethod
    def backward(ctx, d_y):
        (aux_loss,) = ctx.saved_tensors
        return d_y, torch.ones_like(aux_loss)


class MoE(torch.nn.Module):
    """A MoE FFN: router gate (FP32) -> the sfmoe layer (top-k, permute, FC1, activation, FC2,
    weighted combine). Input [..., hidden_size] of a floating-point dtype, computed in the
    weights' `dtype` and returned in the input's shape and dtype.

    Parameters (the state-dict layout, docs/torch.md): ``router.weight`` [E, H] FP32,
    ``experts.weight1`` [E, fc1_cols, H] (gate rows then up rows for gated activations),
    ``experts.weight2`` [E, H, F], in `dtype` (bfloat16, or float32 on the CPU).

    Expert parallelism: ``ep_group`` (a torch.distributed process group, one rank a GPU) and
    ``max_tokens_per_rank`` (every rank's bound on a forward's tokens): each rank holds the
    experts [r E_l, (r + 1) E_l) (E_l = E / group size: the weights are [E_l, ...]) and its own
    tokens; the layer moves rows between the ranks over NCCL on the current stream, sync-free and
    capturable in one CUDA graph (docs/ep.md). Every rank constructs its module at the same time
    (the NCCL communicator is made then) and runs its steps in the same order.
    ``ep_capacity_factor``, ``ep_overflow`` ("drop", "trap", "spill") and ``ep_spill_factor``
    bound what a rank receives (MoEConfig).
    ``router_gemm``: how the gate's FP32 GEMMs run, "fp32" (torch's FP32 GEMM), "bf16x3" (the
    FP32 operands as three BF16 terms on the tensor cores, FP32-close; docs/torch.md) or "auto"
    (default: "bf16x3" on the GPU from T H E = 2^30 up, "fp32" elsewhere).
    Buffers: ``expert_bias`` [E] (with ``expert_bias=True``), and after each forward
    ``tokens_per_expert`` / ``dropped_per_expert`` (device tensors, readable without a sync by a
    non-blocking copy). The auxiliary losses are attached to the output's gradient; their last
    value is in ``aux_loss`` (detached).
    """

    def __init__(
        self,
        hidden_size,
        ffn_hidden_size,
        num_experts,
        topk,
        *,
        dtype=torch.bfloat16,
        device=None,
        ep_group=None,
        router_gemm="auto",
        **options,
    ):
        super().__init__()
        if router_gemm not in _gate.ROUTER_GEMMS:
            raise ValueError(f"router_gemm: expected one of {_gate.ROUTER_GEMMS}, got {router_gemm!r}")
        self.router_gemm = router_gemm
        if ep_group is not None:
            import torch.distributed as dist

            options.update(ep_size=dist.get_world_size(ep_group), ep_rank=dist.get_rank(ep_group))
        self.config = MoEConfig(hidden_size, ffn_hidden_size, num_experts, topk, **options)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype: expected torch.bfloat16 or torch.float32, got {dtype}")
        self._key = _register(self.config)
        c = self.config
        if c.expert_parallel:
            if ep_group is None:
                raise ValueError("max_tokens_per_rank is for expert parallelism: pass the ep_group too")
            _make_ep_group(self._key, c, ep_group, dtype, torch.device(device) if device is not None else None)
        self.router = torch.nn.Linear(hidden_size, num_experts, bias=False, device=device, dtype=torch.float32)
        self.experts = torch.nn.Module()
        # (with an ep_group: this rank's experts, [ep_rank E_l, (ep_rank + 1) E_l))
        self.experts.weight1 = torch.nn.Parameter(
            torch.empty(c.local_experts, c.fc1_cols, hidden_size, device=device, dtype=dtype)
        )
        self.experts.weight2 = torch.nn.Parameter(
            torch.empty(c.local_experts, hidden_size, ffn_hidden_size, device=device, dtype=dtype)
        )
        if c.shared_expert_ffn_hidden_size:
            S = c.shared_expert_ffn_hidden_size
            self.shared_expert = torch.nn.Module()
            for name, (rows, cols) in (
                ("gate_proj", (S, hidden_size)),
                ("up_proj", (S, hidden_size)),
                ("down_proj", (hidden_size, S)),
            ):
                setattr(self.shared_expert, name, torch.nn.Linear(cols, rows, bias=False, device=device, dtype=dtype))
            self.shared_expert_gate = (
                torch.nn.Linear(hidden_size, 1, bias=False, device=device, dtype=dtype)
                if c.shared_expert_gate
                else None
            )
        else:
            self.shared_expert = None
            self.shared_expert_gate = None
        if c.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(num_experts, device=device, dtype=torch.float32))
            self.register_buffer(
                "local_tokens_per_expert", torch.zeros(num_experts, device=device, dtype=torch.int64), persistent=False
            )
        else:
            self.expert_bias = None
        self.tokens_per_expert = None
        self.dropped_per_expert = None
        self.aux_loss = None
        self._weight_cache = None  # the quantized weights between micro-batches (forward)
        self.reset_parameters()
        # A state dict in another layout (Hugging Face, Mixtral, Megatron, TE) loads through
        # load_state_dict too: converted to sfmoe's keys first.
        self._register_load_state_dict_pre_hook(self._convert_foreign_layout, with_module=False)

    _OWN_KEYS = ("router.weight", "experts.weight1", "experts.weight2")

    def _shard_only(self, layout):
        if self.config.expert_parallel and layout != "sfmoe":
            c = self.config
            first = c.ep_rank * c.local_experts
            raise NotImplementedError(
                f"this rank holds experts [{first}, {first + c.local_experts}) of {c.num_experts}: layouts other "
                "than sfmoe's convert a whole checkpoint (convert it on one process, then give each rank its slice)"
            )

    def _convert_foreign_layout(self, state, prefix, *args):
        self.drop_weight_cache()  # (the weights are about to change)
        if all(prefix + k in state for k in self._OWN_KEYS) and state[prefix + "experts.weight1"].dim() == 3:
            return
        try:
            layout = _checkpoint.detect_layout(state, prefix)
        except ValueError:
            return  # load_state_dict reports the missing keys
        self._shard_only(layout)
        converted = _checkpoint.to_sfmoe(state, self.config, layout, prefix, self.expert_bias is not None)
        for key in _checkpoint.owned_keys(state, layout, prefix):
            del state[key]
        state.update({prefix + k: v for k, v in converted.items()})

    def checkpoint(self, layout="sfmoe"):
        """The module's parameters (and expert bias) in `layout` (see sfmoe.torch._checkpoint)."""
        own = {k: v.detach() for k, v in self.state_dict().items()}
        self._shard_only(layout)
        if self.config.expert_parallel:
            return own
        return _checkpoint.from_sfmoe(own, self.config, layout)

    def save_checkpoint(self, path, layout="sfmoe"):
        """Writes checkpoint(layout) as a safetensors file."""
        _checkpoint.write_safetensors(self.checkpoint(layout), path)

    def load_checkpoint(self, source, layout="auto", prefix=""):
        """Loads a state dict or a safetensors file in any known layout (keys under `prefix`); a
        file is read as safetensors only, never unpickled. Shapes are checked before anything is
        copied."""
        if not isinstance(source, dict):
            path = str(source)
            if not path.endswith(".safetensors"):
                raise ValueError(f"{path}: only safetensors files are read (no pickled checkpoints)")
            source = _checkpoint.read_safetensors(path)
        layout = _checkpoint.detect_layout(source, prefix) if layout == "auto" else layout
        self._shard_only(layout)
        if self.config.expert_parallel:
            self.load_state_dict({k[len(prefix) :]: v for k, v in source.items() if k.startswith(prefix)}, strict=True)
            return
        converted = _checkpoint.to_sfmoe(source, self.config, layout, prefix, self.expert_bias is not None)
        owned = set(_checkpoint.owned_keys(source, layout, prefix))
        # The keys the layout does not own (a shared expert's) load under their own names.
        converted.update({k[len(prefix) :]: v for k, v in source.items() if k.startswith(prefix) and k not in owned})
        self.load_state_dict(converted, strict=True)

    def load_optimizer_state(self, optimizer, named_state, layout="auto", prefix=""):
        """Moves an optimizer's per-parameter state from a checkpoint in another layout onto this
        module's parameters: `named_state` maps parameter names (as in that layout) to their state
        dicts (Adam's exp_avg, exp_avg_sq, step); each tensor field is converted as its parameter
        is, the scalar fields are taken from the first parameter."""
        layout = _checkpoint.detect_layout(named_state, prefix) if layout == "auto" else layout
        self._shard_only(layout)
        first = next(iter(named_state.values()))
        params = dict(self.named_parameters())
        fields = [k for k, v in first.items() if torch.is_tensor(v) and v.dim() > 0]
        converted = {
            f: _checkpoint.to_sfmoe({k: v[f] for k, v in named_state.items()}, self.config, layout, prefix)
            for f in fields
        }
        for name in self._OWN_KEYS:
            # (scalar tensors copied per parameter: optimizers step them in place)
            state = {k: v.clone() if torch.is_tensor(v) else v for k, v in first.items() if k not in fields}
            state.update({f: converted[f][name].to(params[name].device).clone() for f in fields})
            optimizer.state[params[name]] = state

    def reset_parameters(self):
        """Each weight uniform in +-1 / sqrt(fan_in), as torch.nn.Linear initializes."""
        self.drop_weight_cache()  # (new weights)
        with torch.no_grad():
            for w in (self.router.weight, self.experts.weight1, self.experts.weight2):
                bound = 1.0 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)

    def forward(self, x, is_first_microbatch=None):
        """y = the layer on x. is_first_microbatch (TransformerEngine's argument, for gradient
        accumulation under a quantized recipe): None quantizes the weights in every step; True
        quantizes them into the module's weight cache (made at the first use, held until
        drop_weight_cache()), False reads the copies the last True step made there -- the caller
        promises that the weights have not changed since (no optimizer step between). The same
        values either way."""
        shape = x.shape
        c = self.config
        if x.dim() == 0 or shape[-1] != c.hidden_size:
            raise ValueError(f"sfmoe.torch.MoE: x must be [..., {c.hidden_size}] (hidden_size), got {list(shape)}")
        if x.device != self.experts.weight1.device:
            raise ValueError(
                f"sfmoe.torch.MoE: x is on {x.device}, the module's weights on {self.experts.weight1.device}"
            )
        if not x.is_floating_point():
            raise TypeError(f"sfmoe.torch.MoE: x must be a floating-point tensor, got {x.dtype}")
        in_dtype = x.dtype
        x = x.reshape(-1, c.hidden_size).to(self.experts.weight1.dtype).contiguous()
        logits = _gate.router_logits(x, self.router.weight, self.router_gemm)
        saved_bytes = _saved_bytes(self._key, x.shape[0], x.dtype, x.device)
        cache = self._weight_cache_for(is_first_microbatch, x)
        y, _, kept, dropped, routed = moe_layer_forward(
            x,
            logits,
            self.expert_bias,
            self.experts.weight1,
            self.experts.weight2,
            self._key,
            saved_bytes,
            cache,
        )
        self.tokens_per_expert, self.dropped_per_expert = kept, dropped
        if c.log_expert_load:
            self._queue_expert_load(kept, dropped)
        if self.expert_bias is not None and self.training:
            with torch.no_grad():
                self.local_tokens_per_expert += routed
        if self.shared_expert is not None:
            e = self.shared_expert
            shared = e.down_proj(torch.nn.functional.silu(e.gate_proj(x)) * e.up_proj(x))
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            y = y + shared
        aux = self._aux_losses(logits, routed)
        if aux is not None:
            self.aux_loss = aux.detach()
            if torch.is_grad_enabled():
                y = _AttachAuxLoss.apply(y, aux)
        return y.reshape(shape).to(in_dtype)

    def _weight_cache_for(self, is_first_microbatch, x):
        """The weight cache a step hands the layer, filled (an empty tensor: none)."""
        if is_first_microbatch not in (None, True, False):
            raise TypeError(f"is_first_microbatch: expected None, True or False, got {is_first_microbatch!r}")
        size = 0 if is_first_microbatch is None else _weight_cache_bytes(self._key, x.shape[0], x.dtype, x.device)
        if size == 0:  # (bf16 quantizes no weight)
            return torch.empty(0, dtype=torch.uint8, device=x.device)
        cache = self._weight_cache
        fits = cache is not None and cache.numel() == size and cache.device == x.device
        if is_first_microbatch:
            if not fits:
                cache = torch.empty(size, dtype=torch.uint8, device=x.device)
                self._weight_cache = cache
            w1, w2 = self.experts.weight1.detach(), self.experts.weight2.detach()
            moe_layer_fill_weight_cache(w1, w2, cache, self._key, x.shape[0])
        elif not fits:
            raise ValueError(
                "sfmoe.torch.MoE: is_first_microbatch=False reads the weight cache that a step with "
                "is_first_microbatch=True fills: none was made (or it was dropped) since"
            )
        return cache

    def drop_weight_cache(self):
        """Frees the weight cache (is_first_microbatch); the next True step makes it again."""
        self._weight_cache = None

    def _aux_losses(self, logits, routed):
        """The Switch/GShard load-balancing loss and the z-loss (docs/router.md) from the logits,
        with torch ops: their gradients reach the gate through autograd."""
        c = self.config
        tokens = logits.shape[0]
        if tokens == 0 or (c.aux_loss_coeff == 0 and c.z_loss_coeff == 0):
            return None
        total = logits.new_zeros(())
        if c.aux_loss_coeff > 0:
            if c.score_function == "sigmoid":
                scores = torch.sigmoid(logits)
                scores = scores / scores.sum(-1, keepdim=True)
            else:
                scores = torch.softmax(logits, -1)
            factor = c.aux_loss_coeff * c.num_experts / (c.topk * tokens * tokens)
            total = total + factor * (routed.to(scores.dtype) * scores.sum(0)).sum()
        if c.z_loss_coeff > 0:
            total = total + c.z_loss_coeff / tokens * torch.logsumexp(logits, -1).square().sum()
        return total

    @torch.no_grad()
    def _queue_expert_load(self, kept, dropped):
        if not hasattr(self, "_load_buffers"):
            pinned = kept.is_cuda
            # (kept counts are the local experts' with an ep_group, dropped ones every expert's)
            self._load_buffers = [
                [torch.zeros(t.shape, dtype=torch.int64, pin_memory=pinned) for t in (kept, dropped)] for _ in range(2)
            ]
            self._load_events = [None, None]
            self._load_turn = 0
            self._load_count = 0
        turn = self._load_turn
        self._load_buffers[turn][0].copy_(kept, non_blocking=True)
        self._load_buffers[turn][1].copy_(dropped, non_blocking=True)
        if kept.is_cuda:
            event = torch.cuda.Event()
            event.record()
            self._load_events[turn] = event
        self._load_turn = 1 - turn
        self._load_count += 1

    def expert_load(self):
        """(tokens_per_expert, dropped_per_expert) of the forward before the last one, as host
        tensors, with log_expert_load=True: the copy was queued a step ago, so reading it does not
        wait for the device (None before two forwards)."""
        if getattr(self, "_load_count", 0) < 2:
            return None
        older = self._load_turn  # the buffer the next forward will overwrite: the older one
        event = self._load_events[older]
        if event is not None:
            event.synchronize()  # (complete a step ago in a running training loop)
        kept, dropped = self._load_buffers[older]
        return kept.clone(), dropped.clone()

    @torch.no_grad()
    def update_expert_bias(self):
        """The aux-loss-free balancing step (DeepSeek-V3): each expert's bias moves by
        bias_update_rate toward the mean load, from the routed counts since the last call; on the
        device, no sync. Call it after the optimizer step."""
        if self.expert_bias is None:
            return
        counts = self.local_tokens_per_expert.float()
        self.expert_bias += self.config.bias_update_rate * torch.sign(counts.mean() - counts)
        self.local_tokens_per_expert.zero_()
