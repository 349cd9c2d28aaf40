"""The Flax module of the JAX block, and the migrations of its parameter tree (docs/jax.md).

Parameter tree (MaxText's names and shapes, so a MaxText checkpoint's ``RoutedMoE`` subtree loads
as it is): ``gate/kernel`` [H, E] (FP32), then either ``wi_0`` and ``wi_1`` [E, H, F] (split, the
default) or ``wi`` [E, H, fc1_cols] (fused: the gate half, then the up half), and ``wo`` [E, F, H].
With ``expert_bias=True`` the bias [E] lives in the ``moe`` collection (it is not trained by the
optimizer: DeepSeek-V3's balancing rule moves it). :func:`fuse_wi` and :func:`split_wi` turn any
pytree holding such subtrees (the parameters, an optax state whose moments mirror them, an Orbax
restore of either) from one layout to the other, bit for bit both ways.

``layout="sfmoe"`` holds the experts in the layer's own layout instead, ``w1`` [E, fc1_cols, H]
(gate rows, then up rows) and ``wo`` replaced by ``w2`` [E, H, F], so that no step transposes the
weights (and their gradients) on the way in and out; :func:`to_sfmoe_layout` and
:func:`to_maxtext_layout` move a pytree (parameters, optimizer state, a restore) between the two.
"""

from collections.abc import Mapping
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from .._moe_config import MoEConfig
from . import moe_block, moe_block_sfmoe_layout


class MoEBlock(nn.Module):
    """A MoE FFN: x [..., H] -> (y like x, aux_loss, counts). ``fused_wi`` picks the FC1 layout;
    the experts' weights are kept in ``param_dtype`` and run in x's dtype (bfloat16 or float32).
    ``rng_offset`` (nvfp4): the gradients' rounding stream, advanced by the caller each step.
    ``ep_axis``: an expert-parallel config's expert mesh axis (the module applied inside
    ``shard_map``; docs/jax.md, "Expert parallelism"): the experts' weights are then this rank's
    ``num_experts / ep_size`` (the gate and the expert bias stay global). ``weight_cache``:
    gradient accumulation under a quantized recipe, :func:`sfmoe.jax.fill_weight_cache` of the
    block's weights in sfmoe's layout and x's dtype (docs/jax.md, "Weight cache")."""

    config: MoEConfig
    fused_wi: bool = False
    layout: str = "maxtext"  # or "sfmoe": w1 [E, fc1_cols, H] and w2 [E, H, F], no transposes
    param_dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    ep_axis: Optional[str] = None

    @nn.compact
    def __call__(self, x, rng_offset=None, weight_cache=None):
        c = self.config
        H, F, E = c.hidden_size, c.ffn_hidden_size, c.num_experts
        El = c.local_experts if self.ep_axis is not None else E  # (the experts' weights this rank holds)
        gate = self.param("gate", lambda key: {"kernel": nn.initializers.lecun_normal()(key, (H, E), jnp.float32)})
        if self.layout not in ("maxtext", "sfmoe"):
            raise ValueError(f"layout: expected 'maxtext' or 'sfmoe', got {self.layout!r}")
        bias = None
        if c.expert_bias:
            bias = self.variable("moe", "expert_bias", lambda: jnp.zeros((E,), jnp.float32)).value
        ep = dict(ep_axis=self.ep_axis, weight_cache=weight_cache)
        if self.layout == "sfmoe":
            # (initialized as the fused MaxText layout's wi and wo would be, transposed)
            w1 = self.param(
                "w1", lambda key: jnp.swapaxes(self.kernel_init(key, (El, H, c.fc1_cols), self.param_dtype), 1, 2)
            )
            w2 = self.param("w2", lambda key: jnp.swapaxes(self.kernel_init(key, (El, F, H), self.param_dtype), 1, 2))
            return moe_block_sfmoe_layout(x, gate["kernel"], w1, w2, c, expert_bias=bias, rng_offset=rng_offset, **ep)
        if self.fused_wi:
            wi = self.param("wi", self.kernel_init, (El, H, c.fc1_cols), self.param_dtype)
        else:
            halves = c.fc1_cols // F
            wi = tuple(self.param(f"wi_{i}", self.kernel_init, (El, H, F), self.param_dtype) for i in range(halves))
            wi = wi if halves > 1 else wi[0]
        wo = self.param("wo", self.kernel_init, (El, F, H), self.param_dtype)
        if isinstance(wi, tuple):
            wi = tuple(w.astype(x.dtype) for w in wi)
        else:
            wi = wi.astype(x.dtype)
        return moe_block(x, gate["kernel"], wi, wo.astype(x.dtype), c, expert_bias=bias, rng_offset=rng_offset, **ep)


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


def to_sfmoe_layout(tree):
    """Every MaxText expert subtree of the pytree (``wi`` or ``wi_0`` / ``wi_1``, and ``wo``) in
    MoEBlock(layout="sfmoe")'s names and shapes: ``w1`` [E, fc1_cols, H], ``w2`` [E, H, F]. Exact
    (transposes and a concatenation); a leading layer axis (nn.scan) is kept."""

    def node(d):
        if "wo" not in d or isinstance(d["wo"], dict) or not hasattr(d["wo"], "shape"):
            return d
        d = dict(fuse_wi(d)) if "wi_0" in d else dict(d)
        if "wi" not in d:
            return d
        d["w1"] = jnp.swapaxes(d.pop("wi"), -1, -2)
        d["w2"] = jnp.swapaxes(d.pop("wo"), -1, -2)
        return d

    return _convert(tree, node)


def to_maxtext_layout(tree, fused_wi=False):
    """The inverse of :func:`to_sfmoe_layout`: ``w1`` / ``w2`` back to ``wi_0`` / ``wi_1`` (or
    ``wi`` with fused_wi) and ``wo``. A gated FC1 splits in halves; a plain one becomes ``wi_0``
    alone (or ``wi``)."""

    def node(d):
        if "w1" not in d or "w2" not in d or isinstance(d["w1"], dict) or not hasattr(d["w1"], "shape"):
            return d
        d = dict(d)
        wi = jnp.swapaxes(d.pop("w1"), -1, -2)
        d["wo"] = jnp.swapaxes(d.pop("w2"), -1, -2)
        F = d["wo"].shape[-2]
        if fused_wi:
            d["wi"] = wi
        elif wi.shape[-1] == 2 * F:
            d["wi_0"], d["wi_1"] = wi[..., :F], wi[..., F:]
        else:
            d["wi_0"] = wi
        return d

    return _convert(tree, node)


def update_expert_bias(moe_variables, tokens_per_expert, rate):
    """DeepSeek-V3's aux-loss-free balancing step on the ``moe`` collection: each expert's bias
    moves by `rate` toward the mean load of `tokens_per_expert` (the counts a step returned)."""
    counts = tokens_per_expert.astype(jnp.float32)
    bias = moe_variables["expert_bias"]
    return dict(moe_variables, expert_bias=bias + rate * jnp.sign(counts.mean() - counts))


__all__ = ["MoEBlock", "fuse_wi", "split_wi", "to_maxtext_layout", "to_sfmoe_layout", "update_expert_bias"]
