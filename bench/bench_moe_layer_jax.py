"""The MoE layer from JAX, forward + backward, BF16, on the GPU: sfmoe.jax.moe_block jitted with
value_and_grad (gate, x and both weights; on MaxText's weight layout, and moe_layer on sfmoe's),
beside sfmoe.torch.MoE on the same shape in the same
process (its eager step and its step replayed as one CUDA graph), and the pure-JAX layer a JAX
user writes (softmax top-k, argsort permute, jax.lax.ragged_dot, SwiGLU, segment-sum combine) where
it fits. Shapes (H, F, E, k, T): Qwen3-30B-A3B and DeepSeek-V3 EP8-local. Median of 20 timed steps
after warm-up (JAX: wall time around block_until_ready; torch: CUDA events). Writes JSON to
$OUT/bench_moe_layer_jax.json when OUT is set.
"""

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from sfmoe.jax import MoEConfig, moe_block, moe_layer

SHAPES = {
    "Qwen3-30B-A3B": (2048, 768, 128, 8, 8192),
    "DeepSeek-V3 EP8-local": (7168, 2048, 32, 8, 4096),
}
PURE_JAX_TOKENS = int(os.environ.get("SFMOE_BENCH_PURE_JAX_TOKENS", "2048"))


def jax_median_ms(fn, *args, runs=20):
    out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def pure_jax_layer(x, gate, wi, wo, k):
    """The plain JAX MoE layer (MaxText's dropless path without its kernels)."""
    T, E = x.shape[0], gate.shape[1]
    logits = jnp.dot(x.astype(jnp.float32), gate)
    p, idx = jax.lax.top_k(jax.nn.softmax(logits, -1), k)
    p = p / p.sum(-1, keepdims=True)
    flat = idx.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=E).astype(jnp.int32)
    xs = x[order // k]
    h = jax.lax.ragged_dot(xs, wi, sizes)
    g, u = jnp.split(h, 2, -1)
    y = jax.lax.ragged_dot(jax.nn.silu(g) * u, wo, sizes)
    w = p.reshape(-1)[order][:, None].astype(y.dtype)
    return jax.ops.segment_sum((y * w).astype(jnp.float32), order // k, num_segments=T).astype(x.dtype)


def main():
    rows = []
    rng = np.random.default_rng(0)
    for name, (H, F, E, k, T) in SHAPES.items():
        config = MoEConfig(H, F, E, k)
        bf = jnp.bfloat16
        x = jnp.asarray(rng.standard_normal((T, H)), bf)
        gate = jnp.asarray(rng.standard_normal((H, E)) * 0.02, jnp.float32)
        wi = jnp.asarray(rng.standard_normal((E, H, 2 * F)) * 0.02, bf)
        wo = jnp.asarray(rng.standard_normal((E, F, H)) * 0.02, bf)
        dy = jnp.asarray(rng.standard_normal((T, H)), bf)

        def loss(x, gate, wi, wo):
            y, aux, _ = moe_block(x, gate, wi, wo, config)
            return (y.astype(jnp.float32) * dy).sum() + aux

        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
        ours = jax_median_ms(step, x, gate, wi, wo)
        row = dict(shape=name, sfmoe_jax_ms=ours)
        # the same step on sfmoe's weight layout (no transposes of MaxText's wi / wo each step)
        w1, w2 = jnp.swapaxes(wi, 1, 2), jnp.swapaxes(wo, 1, 2)

        def layer_loss(x, gate, w1, w2):
            logits = jnp.dot(x.astype(jnp.float32), gate)
            y, _ = moe_layer(x, logits, w1, w2, config)
            return (y.astype(jnp.float32) * dy).sum()

        layer_step = jax.jit(jax.value_and_grad(layer_loss, argnums=(0, 1, 2, 3)))
        row["sfmoe_jax_layer_ms"] = jax_median_ms(layer_step, x, gate, w1, w2)
        del w1, w2

        import torch
        from sfmoe.torch import MoE
        from torch_timing import median_ms

        module = MoE(H, F, E, k, device="cuda")
        xt = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dyt = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)

        def torch_step():
            for p in module.parameters():
                p.grad = None
            xt.grad = None
            module(xt).backward(dyt)

        row["sfmoe_torch_eager_ms"] = median_ms(torch_step)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch_step()
            torch_step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch_step()
        row["sfmoe_torch_graph_ms"] = median_ms(graph.replay)
        row["jax_over_torch_graph"] = ours / row["sfmoe_torch_graph_ms"]
        row["jax_layer_over_torch_eager"] = row["sfmoe_jax_layer_ms"] / row["sfmoe_torch_eager_ms"]
        del module, graph
        torch.cuda.empty_cache()

        if name.startswith("Qwen3"):
            Tp = min(PURE_JAX_TOKENS, T)

            def plain_loss(x, gate, wi, wo):
                return (pure_jax_layer(x, gate, wi, wo, k).astype(jnp.float32) * dy[:Tp]).sum()

            plain = jax.jit(jax.value_and_grad(plain_loss, argnums=(0, 1, 2, 3)))
            try:
                row["pure_jax_tokens"] = Tp
                row["pure_jax_ms"] = jax_median_ms(plain, x[:Tp], gate, wi, wo, runs=5)

                def small_loss(x, gate, wi, wo):
                    y, aux, _ = moe_block(x, gate, wi, wo, config)
                    return (y.astype(jnp.float32) * dy[:Tp]).sum() + aux

                small = jax.jit(jax.value_and_grad(small_loss, argnums=(0, 1, 2, 3)))
                row["sfmoe_jax_ms_at_pure_tokens"] = jax_median_ms(small, x[:Tp], gate, wi, wo)
            except Exception as error:  # (out of memory)
                row["pure_jax_error"] = str(error).splitlines()[0][:200]
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        f"{'shape':24} {'jax block':>10} {'jax layer':>10} {'torch eager':>12} {'torch graph':>12} {'layer/eager':>12}"
    )
    for r in rows:
        print(
            f"{r['shape']:24} {r['sfmoe_jax_ms']:8.2f}ms {r['sfmoe_jax_layer_ms']:8.2f}ms "
            f"{r['sfmoe_torch_eager_ms']:10.2f}ms {r['sfmoe_torch_graph_ms']:10.2f}ms "
            f"{r['jax_layer_over_torch_eager']:11.2f}x"
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_moe_layer_jax.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
