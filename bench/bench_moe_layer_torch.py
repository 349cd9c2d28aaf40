"""The MoE layer, forward + backward, BF16: sfmoe.torch.MoE against the plain-PyTorch layer of the
project's peer figures (the layer a user writes with torch._grouped_mm: softmax top-k, argsort
permute, two grouped GEMMs, SwiGLU, index_add_ combine), timed in the same process on the GPU.

Shapes (H, F, E, k, T): Qwen3-30B-A3B, DeepSeek-V3 EP8-local (32 experts), Mixtral-8x7B, and
Qwen3 at T = 2048 (a short-sequence step). Each step sets the gradients to None first (as
SonicMoE's benchmark does). Figures: eager step time (median of CUDA-event timings), sfmoe's step
replayed as one CUDA graph, the plain layer under torch.compile (SFMOE_BENCH_COMPILE=1), peak
memory of a step (what it allocates above the weights and inputs it starts with), and TFLOP/s of the six GEMMs as a fraction of the GPU notes' BF16 dense ceiling
(742 TFLOP/s). SFMOE_BENCH_RECIPES (comma-separated: tensorwise, blockwise, mxfp8, nvfp4) adds
sfmoe's quantized recipes at each shape, eager, beside the same plain layer;
SFMOE_BENCH_ROUTER_GEMM=fp32 (or bf16x3) the module with that router gate beside the default's
("auto": the tensor-core gate on the GPU). Writes JSON to
$OUT/bench_moe_layer_torch.json when OUT is set.
"""

import json
import os

import torch
from sfmoe.torch import MoE, _moe
from torch_timing import median_ms

SHAPES = {
    "Qwen3-30B-A3B": (2048, 768, 128, 8, 8192),
    "DeepSeek-V3 EP8-local": (7168, 2048, 32, 8, 4096),
    "Mixtral-8x7B": (4096, 14336, 8, 2, 8192),
    "Qwen3-30B-A3B, T 2048": (2048, 768, 128, 8, 2048),
}
CEILING_TFLOPS = 742  # BF16 dense GEMM, ../shared/GPU.md
DEV = torch.device("cuda")


class PlainMoE(torch.nn.Module):
    """The plain-PyTorch MoE layer of the peer figures."""

    def __init__(self, H, F, E, k):
        super().__init__()
        self.E, self.k = E, k
        self.router = torch.nn.Parameter(torch.randn(E, H, device=DEV, dtype=torch.bfloat16) * 0.02)
        self.w1 = torch.nn.Parameter(torch.randn(E, H, 2 * F, device=DEV, dtype=torch.bfloat16) * 0.02)
        self.w2 = torch.nn.Parameter(torch.randn(E, F, H, device=DEV, dtype=torch.bfloat16) * 0.02)

    def forward(self, x):
        T = x.shape[0]
        logits = (x @ self.router.t()).float()
        p, idx = torch.topk(torch.softmax(logits, -1), self.k, -1)
        p = p / p.sum(-1, keepdim=True)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=self.E), 0).to(torch.int32)
        xs = x.index_select(0, order // self.k)
        g, u = torch._grouped_mm(xs, self.w1, offs=offs).chunk(2, -1)
        y = torch._grouped_mm(torch.nn.functional.silu(g) * u, self.w2, offs=offs)
        w = p.reshape(-1)[order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros(T, x.shape[1], device=DEV, dtype=torch.float32)
        out.index_add_(0, order // self.k, (y * w).float())
        return out.to(x.dtype)


def step_of(module, x, dy, **forward):
    def step():
        x.grad = None
        module.zero_grad(set_to_none=True)
        module(x, **forward).backward(dy)

    return step


def peak_gib(step):
    """What a step allocates at its peak above what was held before it (the weights, the input,
    the upstream gradient and the previous step's gradients, which the step sets to None first):
    activations, saved state and temporaries alive when the new gradients are."""
    step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - held) / 2**30


def graph_ms(module, x, dy):
    """One step (gradients written, not accumulated) captured once and replayed."""

    def step():
        for p in module.parameters():
            p.grad = None
        x.grad = None
        module(x).backward(dy)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # Gradients allocated inside the capture belong to its pool: set them to None only before it.
    for p in module.parameters():
        p.grad = None
    x.grad = None
    with torch.cuda.graph(graph):
        module(x).backward(dy)
    return median_ms(graph.replay, runs=10, warmup=3, batch=3)


def main():
    torch.manual_seed(0)
    compile_plain = os.environ.get("SFMOE_BENCH_COMPILE") == "1"
    results = []
    print(
        f"{'fwd+bwd, BF16 (ms)':28s} {'plain':>7s} {'compiled':>8s} {'sfmoe':>7s} {'graph':>7s} {'x plain':>7s} "
        f"{'x graph':>7s} {'TFLOP/s':>7s} {'ceil':>5s} {'peak GiB sfmoe / plain':>22s}"
    )
    only = os.environ.get("SFMOE_BENCH_SHAPES")  # a comma-separated subset of SHAPES' names
    recipes = [r for r in os.environ.get("SFMOE_BENCH_RECIPES", "").split(",") if r]
    # SFMOE_BENCH_ROUTER_GEMM=fp32 adds the module with that router gate (docs/torch.md) at each
    # shape, eager and graphed, beside the default's ("auto") figures.
    router_gemms = [g for g in os.environ.get("SFMOE_BENCH_ROUTER_GEMM", "").split(",") if g and g != "auto"]
    for name, (H, F, E, k, T) in SHAPES.items():
        if only and name not in only.split(","):
            continue
        x = torch.randn(T, H, device=DEV, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(T, H, device=DEV, dtype=torch.bfloat16)
        plain = PlainMoE(H, F, E, k)
        plain_step = step_of(plain, x, dy)
        plain_ms = median_ms(plain_step, runs=10, warmup=3, batch=1)
        plain_peak = peak_gib(plain_step)
        compiled_ms = None
        if compile_plain:
            compiled = torch.compile(plain)
            compiled_ms = median_ms(step_of(compiled, x, dy), runs=10, warmup=3, batch=1)
        del plain, plain_step
        if compile_plain:
            del compiled
        torch.cuda.empty_cache()
        ours = MoE(H, F, E, k, device=DEV, pre_softmax=True)
        # (the backward's order the plan chooses: docs/moe_layer.md, "Backward in parts")
        parts = 3 if _moe._three_part_backward(ours._key, T, torch.bfloat16, DEV) else 2
        ours_step = step_of(ours, x, dy)
        ours_ms = median_ms(ours_step, runs=10, warmup=3, batch=1)
        ours_peak = peak_gib(ours_step)
        ours_graph_ms = graph_ms(ours, x, dy)
        flops = 3 * (2 * T * k * H * 2 * F + 2 * T * k * F * H)
        tflops = flops / (ours_ms * 1e-3) / 1e12
        row = dict(
            case=name,
            plain_ms=plain_ms,
            compiled_ms=compiled_ms,
            sfmoe_ms=ours_ms,
            sfmoe_graph_ms=ours_graph_ms,
            plain_peak_gib=plain_peak,
            sfmoe_peak_gib=ours_peak,
            sfmoe_tflops=tflops,
            backward_parts=parts,
        )
        results.append(row)
        fmt = f"{compiled_ms:8.2f}" if compiled_ms else f"{'-':>8s}"
        print(
            f"{name:28s} {plain_ms:7.2f} {fmt} {ours_ms:7.2f} {ours_graph_ms:7.2f} {plain_ms / ours_ms:6.2f}x "
            f"{plain_ms / ours_graph_ms:6.2f}x {tflops:7.0f} {tflops / CEILING_TFLOPS:5.1%} "
            f"{ours_peak:8.2f} / {plain_peak:5.2f} ({ours_peak / plain_peak:.2f}x); backward in {parts} parts",
            flush=True,
        )
        del ours, ours_step
        torch.cuda.empty_cache()
        for recipe in recipes:
            quantized = MoE(H, F, E, k, device=DEV, pre_softmax=True, recipe=recipe)
            step = step_of(quantized, x, dy)
            q_ms = median_ms(step, runs=10, warmup=3, batch=1)
            q_peak = peak_gib(step)
            # A later micro-batch of gradient accumulation: the weights' copies read from the
            # weight cache that a first one filled (docs/torch.md), none quantized again.
            quantized(x, is_first_microbatch=True).backward(dy)
            later_ms = median_ms(step_of(quantized, x, dy, is_first_microbatch=False), runs=10, warmup=3, batch=1)
            results.append(
                dict(
                    case=name,
                    recipe=recipe,
                    plain_ms=plain_ms,
                    sfmoe_ms=q_ms,
                    sfmoe_later_microbatch_ms=later_ms,
                    sfmoe_peak_gib=q_peak,
                )
            )
            print(
                f"{'  ' + recipe:28s} {plain_ms:7.2f} {'-':>8s} {q_ms:7.2f} {'-':>7s} {plain_ms / q_ms:6.2f}x "
                f"{'-':>7s} {flops / (q_ms * 1e-3) / 1e12:7.0f} {'':5s} {q_peak:8.2f} / {plain_peak:5.2f} "
                f"({q_peak / plain_peak:.2f}x); {ours_ms / q_ms:.2f}x bf16; a later micro-batch {later_ms:.2f} ms "
                f"({ours_ms / later_ms:.2f}x bf16)",
                flush=True,
            )
            del quantized, step
            torch.cuda.empty_cache()
        for gemm in router_gemms:
            gated = MoE(H, F, E, k, device=DEV, pre_softmax=True, router_gemm=gemm)
            step = step_of(gated, x, dy)
            g_ms = median_ms(step, runs=10, warmup=3, batch=1)
            g_graph_ms = graph_ms(gated, x, dy)
            results.append(
                dict(case=name, router_gemm=gemm, plain_ms=plain_ms, sfmoe_ms=g_ms, sfmoe_graph_ms=g_graph_ms)
            )
            print(
                f"{'  router_gemm=' + gemm:28s} {plain_ms:7.2f} {'-':>8s} {g_ms:7.2f} {g_graph_ms:7.2f} "
                f"{plain_ms / g_ms:6.2f}x {plain_ms / g_graph_ms:6.2f}x {flops / (g_ms * 1e-3) / 1e12:7.0f}; "
                f"{ours_ms / g_ms:.2f}x the default gate",
                flush=True,
            )
            del gated, step
            torch.cuda.empty_cache()
        del x, dy
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_moe_layer_torch.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
