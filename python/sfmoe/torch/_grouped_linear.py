"""GroupedLinear: one linear map per group of rows, y[rows of g] = x[rows of g] W_g^T, over
sfmoe's grouped GEMM (fprop, dgrad, wgrad), as a custom op with autograd (docs/torch.md)."""

import math

import torch
from torch import Tensor

from .. import _gemm


@torch.library.custom_op("sfmoe::grouped_linear", mutates_args=())
def grouped_linear(x: Tensor, weight: Tensor, group_offsets: Tensor) -> Tensor:
    """x [R, K], weight [G, N, K], group_offsets int64 [G + 1] -> y [R, N] in x's dtype; rows at
    and beyond group_offsets[G] are zero."""
    y = torch.zeros(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    _gemm.grouped_gemm("fprop", x.detach(), weight.detach(), group_offsets, out=y)
    return y


@grouped_linear.register_fake
def _(x, weight, group_offsets):
    return x.new_empty(x.shape[0], weight.shape[1])


@torch.library.custom_op("sfmoe::grouped_linear_backward", mutates_args=())
def grouped_linear_backward(d_y: Tensor, x: Tensor, weight: Tensor, group_offsets: Tensor) -> tuple[Tensor, Tensor]:
    d_x = torch.zeros_like(x)
    d_y, x, weight = d_y.detach(), x.detach(), weight.detach()
    _gemm.grouped_gemm("dgrad", d_y, weight, group_offsets, out=d_x)
    d_w = torch.empty_like(weight)
    _gemm.grouped_gemm("wgrad", d_y, x, group_offsets, out=d_w)
    return d_x, d_w


@grouped_linear_backward.register_fake
def _(d_y, x, weight, group_offsets):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs, output):
    x, weight, group_offsets = inputs
    ctx.save_for_backward(x, weight, group_offsets)


def _backward(ctx, d_y):
    x, weight, group_offsets = ctx.saved_tensors
    d_x, d_w = grouped_linear_backward(d_y.contiguous(), x, weight, group_offsets)
    return d_x, d_w, None


grouped_linear.register_autograd(_backward, setup_context=_setup_context)


class GroupedLinear(torch.nn.Module):
    """`num_groups` linear maps of in_features -> out_features (no bias), weight [G, out, in];
    forward(x, group_offsets) maps group g's rows [offsets[g], offsets[g + 1]) of x [R, in] by
    weight[g]. BF16 on the GPU (BF16 or FP32 on the CPU backend)."""

    def __init__(self, num_groups, in_features, out_features, *, dtype=torch.bfloat16, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num_groups, out_features, in_features, dtype=dtype, device=device))
        with torch.no_grad():
            bound = 1.0 / math.sqrt(in_features)
            self.weight.uniform_(-bound, bound)

    def forward(self, x, group_offsets):
        return grouped_linear(x.to(self.weight.dtype).contiguous(), self.weight, group_offsets)
