"""The Flax module of the JAX block, and the migrations of its parameter tree (docs/jax.md).

Parameter tree (MaxText's names and shapes, so a MaxText checkpoint's ``RoutedMoE`` subtree loads
as it is): ``gate/kernel`` [H, E] (FP32), then either ``wi_0`` and ``wi_1`` [E, H, F] (split, the
default) or ``wi`` [E, H, fc1_cols] (fused: the gate half, then the up half), and ``wo`` [E, F, H].
With ``expert_bias=True`` the bias [E] lives in the ``moe`` collection (it is not trained by the
optimizer: DeepSeek-V3's balancing rule moves it). :func:`fuse_wi` and :func:`split_wi` turn any
pytree holding such subtrees (the parameters, an optax state whose moments mirror them, an Orbax
restore of either) from one layout to the other, bit for bit both ways.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from .._moe_config import MoEConfig
from . import moe_block


class MoEBlock(nn.Module):
    """A MoE FFN: x [..., H] -> (y like x, aux_loss, counts). ``fused_wi`` picks the FC1 layout;
    the experts' weights are kept in ``param_dtype`` and run in x's dtype (bfloat16 or float32).
    ``rng_offset`` (nvfp4): the gradients' rounding stream, advanced by the caller each step."""

    config: MoEConfig
    fused_wi: bool = False
    param_dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))

    @nn.compact
    def __call__(self, x, rng_offset=None):
        c = self.config
        H, F, E = c.hidden_size, c.ffn_hidden_size, c.num_experts
        gate = self.param("gate", lambda key: {"kernel": nn.initializers.lecun_normal()(key, (H, E), jnp.float32)})
        if self.fused_wi:
            wi = self.param("wi", self.kernel_init, (E, H, c.fc1_cols), self.param_dtype)
        else:
            halves = c.fc1_cols // F
            wi = tuple(self.param(f"wi_{i}", self.kernel_init, (E, H, F), self.param_dtype) for i in range(halves))
            wi = wi if halves > 1 else wi[0]
        wo = self.param("wo", self.kernel_init, (E, F, H), self.param_dtype)
        bias = None
        if c.expert_bias:
            bias = self.variable("moe", "expert_bias", lambda: jnp.zeros((E,), jnp.float32)).value
        if isinstance(wi, tuple):
            wi = tuple(w.astype(x.dtype) for w in wi)
        else:
            wi = wi.astype(x.dtype)
        return moe_block(x, gate["kernel"], wi, wo.astype(x.dtype), c, expert_bias=bias, rng_offset=rng_offset)


def _convert(tree, node):
    """`node` applied to every mapping of the pytree (dicts and Flax's FrozenDict; tuples, lists and
    named tuples such as optax's states walked through; other leaves as they are)."""
    if isinstance(tree, Mapping):
        converted = {k: _convert(v, node) for k, v in node(dict(tree)).items()}
        return converted if isinstance(tree, dict) else type(tree)(converted)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_convert(v, node) for v in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_convert(v, node) for v in tree)
    return tree


def fuse_wi(tree):
    """Every ``wi_0`` / ``wi_1`` pair of the pytree as one ``wi`` (concatenated on the last axis:
    the gate half, then the up half)."""

    def node(d):
        if "wi_0" in d and "wi_1" in d and not isinstance(d["wi_0"], dict):
            d = dict(d)
            d["wi"] = jnp.concatenate([d.pop("wi_0"), d.pop("wi_1")], axis=-1)
        return d

    return _convert(tree, node)


def split_wi(tree):
    """Every ``wi`` of the pytree as the pair ``wi_0`` / ``wi_1`` (its last axis halved)."""

    def node(d):
        if "wi" in d and not isinstance(d["wi"], dict) and hasattr(d["wi"], "shape"):
            d = dict(d)
            wi = d.pop("wi")
            half = wi.shape[-1] // 2
            d["wi_0"], d["wi_1"] = wi[..., :half], wi[..., half:]
        return d

    return _convert(tree, node)


def update_expert_bias(moe_variables, tokens_per_expert, rate):
    """DeepSeek-V3's aux-loss-free balancing step on the ``moe`` collection: each expert's bias
    moves by `rate` toward the mean load of `tokens_per_expert` (the counts a step returned)."""
    counts = tokens_per_expert.astype(jnp.float32)
    bias = moe_variables["expert_bias"]
    return dict(moe_variables, expert_bias=bias + rate * jnp.sign(counts.mean() - counts))


__all__ = ["MoEBlock", "fuse_wi", "split_wi", "update_expert_bias"]
