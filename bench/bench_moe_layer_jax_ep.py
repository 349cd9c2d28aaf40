"""The JAX MoE layer with expert parallelism on one GPU, forward + backward, BF16: R loopback ranks
under ``jax.vmap(axis_name="ep")`` (each rank's stages its own FFI calls, XLA's all-gathers and
all-to-alls between them, the ranks one after another on the one device) beside the single-device
``moe_layer`` on the same global batch, both jitted with value_and_grad (x, the logits and both
weights). What it shows is the cost of the staged path on one device (more, smaller launches and
the fixed-capacity blocks moved by XLA), not a multi-GPU rate. Median of 20 timed steps after
warm-up; with ep_pair_factor the blocks hold what a rank sends another at most (2.0 T k / R rows)
and the slots past it are dropped (counted). Writes JSON to $OUT/bench_moe_layer_jax_ep.json when OUT is set.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from bench_moe_layer_jax import jax_median_ms as median_ms  # (bench/ on the path)
from sfmoe.jax import MoEConfig, moe_layer

# (H, F, E, k, T global, R ranks, ep_pair_factor)
SHAPES = {
    "Qwen3-30B-A3B, EP8": (2048, 768, 128, 8, 8192, 8, None),
    "Qwen3-30B-A3B, EP8, pair 2.0": (2048, 768, 128, 8, 8192, 8, 2.0),
    "DeepSeek-V3 EP8-local, EP4": (7168, 2048, 32, 8, 4096, 4, None),
    "DeepSeek-V3 EP8-local, EP4, pair 2.0": (7168, 2048, 32, 8, 4096, 4, 2.0),
}


def step_of(config, axis=None):
    def step(x, logits, w1, w2, dy):
        def loss(x, logits, w1, w2):
            y, _ = moe_layer(x, logits, w1, w2, config, ep_axis=axis)
            return (y.astype(jnp.float32) * dy).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, logits, w1, w2)

    return step


def main():
    rng = np.random.default_rng(0)
    gpu = [d for d in jax.devices() if d.platform == "gpu"][0]
    rows = []
    for name, (H, F, E, k, T, R, pair) in SHAPES.items():
        put = lambda a, dtype: jax.device_put(jnp.asarray(a, dtype), gpu)  # noqa: E731
        x = put(rng.standard_normal((T, H)), jnp.bfloat16)
        logits = put(rng.standard_normal((T, E)), jnp.float32)
        w1 = put(rng.standard_normal((E, 2 * F, H)) / np.sqrt(H), jnp.bfloat16)
        w2 = put(rng.standard_normal((E, H, F)) / np.sqrt(F), jnp.bfloat16)
        dy = put(rng.standard_normal((T, H)), jnp.float32)
        single = median_ms(jax.jit(step_of(MoEConfig(H, F, E, k))), x, logits, w1, w2, dy)
        config = MoEConfig(H, F, E, k, ep_size=R, max_tokens_per_rank=T // R, ep_pair_factor=pair)
        split = lambda a, n: a.reshape(R, n, *a.shape[1:])  # noqa: E731
        ranks = jax.jit(jax.vmap(step_of(config, "ep"), axis_name="ep"))
        args = (split(x, T // R), split(logits, T // R), split(w1, E // R), split(w2, E // R), split(dy, T // R))
        ep = median_ms(ranks, *args)
        _, counts = jax.jit(jax.vmap(lambda *a: moe_layer(*a[:4], config, ep_axis="ep"), axis_name="ep"))(*args)
        dropped = int(np.asarray(counts["dropped_per_expert"]).sum())
        rows.append(dict(shape=name, ranks=R, pair_factor=pair, single_ms=single, ep_vmap_ms=ep, dropped=dropped))
        print(
            f"{name:38s} single {single:7.2f} ms | {R} ranks under vmap {ep:7.2f} ms ({ep / single:.2f}x); "
            f"{dropped} of {T * k} slots dropped",
            flush=True,
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_moe_layer_jax_ep.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
