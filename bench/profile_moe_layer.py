"""Where a training step of sfmoe.torch.MoE spends its device time: the step (forward + backward,
BF16 unless SFMOE_PROFILE_RECIPE names another; the router gate SFMOE_PROFILE_ROUTER_GEMM) run under torch.profiler, its kernels summed by
name per step, longest first, with the share of the step's kernel time. Shapes as in
bench_moe_layer_torch.py (SFMOE_BENCH_SHAPES picks some by name; Qwen3-30B-A3B by default).
The grouped GEMMs' lines carry their TFLOP/s where the kernel name tells the GEMM apart (it
does not always: the forms share kernels), so the table is read beside the per-call benchmarks.
"""

import os
from collections import defaultdict

import torch
from bench_moe_layer_torch import DEV, SHAPES, step_of
from sfmoe.torch import MoE
from torch.profiler import ProfilerActivity, profile

STEPS = 5


def profile_shape(name, H, F, E, k, T, recipe):
    x = torch.randn(T, H, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(T, H, device=DEV, dtype=torch.bfloat16)
    gemm = os.environ.get("SFMOE_PROFILE_ROUTER_GEMM", "auto")  # the router gate's (docs/torch.md)
    module = MoE(H, F, E, k, device=DEV, pre_softmax=True, recipe=recipe, router_gemm=gemm)
    step = step_of(module, x, dy)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_kernel[event.name]
            entry[0] += event.device_time_total / STEPS
            entry[1] += 1
    total = sum(us for us, _ in per_kernel.values())
    print(f"\n{name} ({recipe}): kernel time {total / 1e3:.3f} ms a step ({len(per_kernel)} kernels)")
    print(f"{'us/step':>9s} {'share':>6s} {'calls':>5s}  kernel")
    for kernel, (us, calls) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"{us:9.1f} {us / total:6.1%} {calls // STEPS:5d}  {kernel[:110]}")
    del module, step, x, dy
    torch.cuda.empty_cache()


def main():
    only = os.environ.get("SFMOE_BENCH_SHAPES", "Qwen3-30B-A3B").split(",")
    recipe = os.environ.get("SFMOE_PROFILE_RECIPE", "bf16")
    for name, shape in SHAPES.items():
        if name in only:
            profile_shape(name, *shape, recipe)


if __name__ == "__main__":
    main()
