"""The MoE module's router gate, logits = x W_r^T in FP32 (docs/torch.md, "The router gate").

The router's weight is FP32 and its logits are FP32 (Megatron's `--moe-router-dtype fp32`): a
top-k over 128 experts picks between logits closer together than BF16 can tell apart. The layer's
tokens x are BF16 on the GPU, and an FP32 GEMM there runs on the CUDA cores (FFMA), about a tenth
of the tensor cores' rate: at Qwen3-30B-A3B's shape the gate's three GEMMs and the FP32 copies of
x took 0.45 ms of a 4.8 ms training step (an H100). So the gate can run its GEMMs on the tensor
cores without giving up FP32 (MoE(router_gemm="bf16x3"), and "auto", the default, on the GPU
where the GEMMs are large; "fp32" is torch's FP32 GEMM): each FP32 operand is written as a sum
of three BF16 terms, t = t0 + t1 + t2 (t0 = bf16(t), t1 = bf16(t - t0), t2 = bf16(t - t0 - t1):
24 significant bits, as FP32 has), and a product with a BF16 operand is exact in FP32, so

    logits = x w0^T + x w1^T + x w2^T   (one GEMM against the three terms side by side)
    d W_r  = g0^T x + g1^T x + g2^T x   (g = d logits; one wgrad GEMM, the terms side by side)
    d x    = g0 w0 + g1 w0 + g0 w1      (one GEMM over K = 3 E; the dropped term products lie
                                         below 2^-16 of each product, d x is rounded to BF16)

accumulated in FP32 by sfmoe's grouped GEMM (one group). The logits and d W_r differ from an
FP32 GEMM's only by the order of the FP32 additions (and for weights below about 2^-100, whose
last terms underflow BF16's range, by at most 2^-133 each). FP32 tokens (the CPU backend's FP32
modules) and a hidden size that is no multiple of 8 (the BF16 GEMM's TMA alignment) keep torch's
FP32 GEMM.
"""

import torch
from torch import Tensor

from .. import _gemm

_TERMS = 3  # BF16 terms of an FP32 operand (8 significant bits each)
ROUTER_GEMMS = ("auto", "fp32", "bf16x3")  # sfmoe.torch.MoE(router_gemm=...)


def _width(experts: int) -> int:
    """A block's width: E rounded up to 8, so that each block starts 16-byte aligned."""
    return (experts + 7) // 8 * 8


def _term_blocks(t: Tensor, count: int, width: int, dim: int) -> Tensor:
    """t (FP32, 2-D, E long along `dim`) as `count` BF16 terms, largest first, one after the other
    along `dim` in blocks of `width` (zeros after each term's E), contiguous. Each term is the
    residual t - (t0 + ...) rounded to BF16; the residuals are exact in FP32. (Two kernels a term:
    a rounding copy into its block and a subtraction, so that the eager gate adds few launches.)"""
    shape = list(t.shape)
    experts = shape[dim]
    shape[dim] = count * width
    # (zeros only where blocks have padding after their E)
    make = t.new_zeros if width != experts else t.new_empty
    out = make(shape, dtype=torch.bfloat16)
    rest = t
    for i in range(count):
        term = out.narrow(dim, i * width, experts)
        term.copy_(rest)  # round to nearest even, as Tensor.to(bfloat16)
        if i + 1 < count:
            rest = torch.sub(rest, term)  # (promoted to FP32: exact)
    return out


def _sum_blocks(out: Tensor, experts: int, width: int, dim: int) -> Tensor:
    """The sum of out's _TERMS blocks along `dim` (each block's first E), the small ones first."""
    block = [out.narrow(dim, i * width, experts) for i in range(_TERMS)]
    return (block[0] + (block[1] + block[2])).contiguous()


def _one_group(rows: int, device) -> Tensor:
    """Group offsets [0, rows] on the device, made by kernels (capturable in a CUDA graph)."""
    offsets = torch.zeros(2, dtype=torch.int64, device=device)
    offsets[1:].fill_(rows)  # (a fill kernel; an item assignment may copy a host scalar)
    return offsets


@torch.library.custom_op("sfmoe::router_gate", mutates_args=())
def router_gate(x: Tensor, weight: Tensor) -> Tensor:
    """x BF16 [T, H], weight FP32 [E, H] -> logits FP32 [T, E] (the three-term form above)."""
    experts, width = weight.shape[0], _width(weight.shape[0])
    if x.shape[0] == 0:
        return x.new_zeros(0, experts, dtype=torch.float32)
    terms = _term_blocks(weight.detach(), _TERMS, width, 0)  # [3 width, H]
    out = torch.empty(x.shape[0], _TERMS * width, dtype=torch.float32, device=x.device)
    _gemm.grouped_gemm("fprop", x.detach().contiguous(), terms[None], _one_group(x.shape[0], x.device), out=out)
    return _sum_blocks(out, experts, width, 1)


@router_gate.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)


@torch.library.custom_op("sfmoe::router_gate_backward", mutates_args=())
def router_gate_backward(d_logits: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """d logits FP32 [T, E] -> (d x BF16 [T, H], d weight FP32 [E, H])."""
    rows, experts, width = x.shape[0], weight.shape[0], _width(weight.shape[0])
    if rows == 0:
        return torch.zeros_like(x), torch.zeros_like(weight)
    offsets = _one_group(rows, x.device)
    g = _term_blocks(d_logits.detach().float(), _TERMS, width, 1)  # [T, 3 width]: g0 | g1 | g2
    w = _term_blocks(weight.detach(), 2, width, 0)  # [2 width, H]: w0; w1
    # d x = [g0 | g1 | g0] [w0; w0; w1]: one GEMM over K = 3 width, rounded to BF16 once.
    d_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # (contiguous, whatever x's strides)
    g_pairs = torch.cat([g.narrow(1, 0, 2 * width), g.narrow(1, 0, width)], 1)
    w_pairs = torch.cat([w.narrow(0, 0, width), w], 0)[None]  # [1, 3 width, H]
    _gemm.grouped_gemm("dgrad", g_pairs, w_pairs, offsets, out=d_x)
    # d W_r = [g0 | g1 | g2]^T x, the three blocks summed.
    d_w = torch.empty(1, _TERMS * width, x.shape[1], dtype=torch.float32, device=x.device)
    _gemm.grouped_gemm("wgrad", g, x.detach().contiguous(), offsets, out=d_w)
    return d_x, _sum_blocks(d_w[0], experts, width, 0)


@router_gate_backward.register_fake
def _(d_logits, x, weight):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, d_logits):
    x, weight = ctx.saved_tensors
    d_x, d_w = router_gate_backward(d_logits.contiguous(), x, weight)
    return (d_x if ctx.needs_input_grad[0] else None), (d_w if ctx.needs_input_grad[1] else None)


router_gate.register_autograd(_backward, setup_context=_setup_context)


class _Fp32Gate(torch.autograd.Function):
    """The logits x W_r^T by torch's FP32 GEMM, saving the tokens as they are (the layer keeps
    them anyway) rather than the FP32 copy autograd would keep through the whole layer; the
    backward widens them again once the layer's backward has freed its buffers."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(x.float(), weight)

    @staticmethod
    def backward(ctx, d_logits):
        x, weight = ctx.saved_tensors
        d_x = (d_logits @ weight).to(x.dtype) if ctx.needs_input_grad[0] else None
        d_weight = d_logits.t() @ x.float() if ctx.needs_input_grad[1] else None
        return d_x, d_weight


# "auto" takes the three-term gate where the FP32 GEMMs' time it saves outweighs its host cost: its
# three grouped-GEMM calls add about 0.45 ms of Python to an eager step (the FP32 gate: about
# 0.08 ms). On an H100, at T H E = 2^31 (Qwen3-30B-A3B, T 8192) it made the eager step 6% faster;
# at 2^29 (the same layer at T 2048) 40% slower eager (the step's kernels take 2 ms) and equal
# graphed; between, at DeepSeek-V3-local (0.9 2^30) and Mixtral-8x7B (2^28), within 1% either way
# (docs/KERNEL_NOTES.md, the layer's table).
_AUTO_MIN_WORK = 1 << 30  # T H E


def router_logits(x: Tensor, weight: Tensor, gemm: str = "auto") -> Tensor:
    """The gate's FP32 logits [T, E] of the layer's tokens x [T, H] and the FP32 weight [E, H]:
    the three-term form where it applies (BF16 tokens, H a multiple of 8) and `gemm` asks for it
    ("bf16x3"; "auto": on the GPU, from T H E = 2^30 up), torch's FP32 GEMM otherwise."""
    work = x.shape[0] * x.shape[1] * weight.shape[0]
    wanted = gemm == "bf16x3" or (gemm == "auto" and x.is_cuda and work >= _AUTO_MIN_WORK)
    if wanted and x.dtype == torch.bfloat16 and x.shape[1] % 8 == 0:
        return router_gate(x, weight)
    return _Fp32Gate.apply(x, weight)
