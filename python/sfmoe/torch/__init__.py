"""sfmoe for PyTorch: the MoE layer as an ``nn.Module`` (docs/torch.md).

:class:`MoE` is a Mixtral / Qwen3-MoE / DeepSeek-V3 style MoE FFN whose forward and backward are
each one ``torch.library.custom_op`` call into the C++ layer (``sfmoe::moe_layer_forward``,
``sfmoe::moe_layer_backward``), with fake implementations sized by the C planner, so that
``torch.compile(fullgraph=True)`` traces it and a training step captures in one CUDA graph. The
router's gate is a linear map in FP32 (logits = x W_r^T); the load-balancing and z losses are
computed from those logits with torch ops, so their gradients reach the gate through autograd
(also under loss scaling) without a device-to-host copy.
"""

from ._grouped_linear import GroupedLinear, grouped_linear
from ._moe import MoE, MoEConfig

__all__ = ["GroupedLinear", "MoE", "MoEConfig", "grouped_linear"]
