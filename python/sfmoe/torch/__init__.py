"""sfmoe for PyTorch: the MoE layer as an ``nn.Module`` (docs/torch.md).

:class:`MoE` is a Mixtral / Qwen3-MoE / DeepSeek-V3 style MoE FFN whose forward and backward are
``torch.library.custom_op`` calls into the C++ layer (``sfmoe::moe_layer_forward``, then
``sfmoe::moe_layer_backward_fc2`` and ``_fc1``), with fake implementations sized by the C planner,
so that
``torch.compile(fullgraph=True)`` traces it and a training step captures in one CUDA graph. The
router's gate is a linear map in FP32 (logits = x W_r^T); the load-balancing and z losses are
computed from those logits with torch ops, so their gradients reach the gate through autograd
(also under loss scaling) without a device-to-host copy. :func:`router`, :func:`permute`,
:func:`unpermute`, :func:`grouped_activation` and :func:`grouped_linear` are the functional ops
with autograd, for composing a layer by hand.
"""

from ._functional import grouped_activation, permute, router, unpermute
from ._grouped_linear import GroupedLinear, grouped_linear
from ._moe import MoE, MoEConfig

__all__ = [
    "GroupedLinear",
    "MoE",
    "MoEConfig",
    "grouped_activation",
    "grouped_linear",
    "permute",
    "router",
    "unpermute",
]
