"""sfmoe.quantize against what a PyTorch user writes, timed in the same process on the GPU.

Input: BF16 [65536 x 7168] in 128 groups of random sizes (multiples of 128, as a padded permute
leaves them). For each recipe, rowwise and rowwise + columnwise (transposed) copies, it prints
ms, TB/s and the share of the copy ceiling measured here (torch copy_), next to the plain-PyTorch
version of the same recipe (per tensor, not per group: torch has no grouped form) and the ratio.

Bytes: the input read once plus the codes and scales written ("TB/s"). The FP8 tensor (current
scaling) and NVFP4 recipes read the input twice (amax pass, then the cast); "moved TB/s" counts
that second read. FP8 tensor with given scales (delayed scaling) reads it once and still returns
the amax; with a given amax (group_amax), FP8 tensor and NVFP4 read it once. Writes JSON to $OUT/bench_quantize_torch.json when OUT is set.
"""

import json
import os

import sfmoe
import torch
from torch_timing import copy_ceiling_tbps, median_ms

ROWS, COLS, GROUPS = 65536, 7168, 128
FP8_MAX = 448.0


# ---- what a PyTorch user writes (the project's GPU notes time the first two the same way) ----
def torch_fp8_tensor(x):
    a = x.abs().amax()
    s = FP8_MAX / a
    return (x.float() * s).to(torch.float8_e4m3fn), 1.0 / s


def torch_fp8_given(x, scale=64.0):
    """Delayed scaling: the scale is known; the amax is still taken (for the amax history)."""
    return (x.float() * scale).to(torch.float8_e4m3fn), x.abs().amax()


def torch_fp8_given_amax(x, amax=8.0):
    """Current scaling from an amax known in advance (e.g. from the producing op): one cast."""
    s = FP8_MAX / amax
    return (x.float() * s).to(torch.float8_e4m3fn), 1.0 / s


def torch_fp8_1x128(x):
    b = x.view(-1, 128).float()
    a = b.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    s = FP8_MAX / a
    return (b * s).to(torch.float8_e4m3fn), 1.0 / s


def torch_fp8_128x128(x):
    r, c = x.shape
    b = x.view(r // 128, 128, c // 128, 128).float()
    a = b.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-30)
    s = FP8_MAX / a
    q = (b * s).to(torch.float8_e4m3fn).view(r, c)
    return q, q.t().contiguous(), 1.0 / s


def torch_mxfp8(x):
    b = x.view(-1, 32).float()
    a = b.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    e = torch.floor(torch.log2(a)) - 8
    return (b * torch.exp2(-e)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), (e + 127).to(torch.uint8)


def with_transpose(fn):
    """Rowwise and columnwise copies the PyTorch way: quantize x and x transposed."""
    return lambda x: (fn(x), fn(x.t().contiguous()))


def group_offsets(device):
    g = torch.Generator().manual_seed(7)
    sizes = 128 * (2 + torch.randint(0, 5, (GROUPS,), generator=g))
    sizes = (sizes.double() * ROWS / sizes.sum()).long() // 128 * 128
    sizes[-1] += ROWS - sizes.sum()
    offsets = torch.zeros(GROUPS + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(sizes, 0)
    return offsets.to(device)


def main():
    dev = torch.device("cuda")
    x = torch.randn(ROWS, COLS, device=dev, dtype=torch.bfloat16)
    offsets = group_offsets(dev)
    ceiling = copy_ceiling_tbps(dev)

    n = ROWS * COLS
    given = torch.full((GROUPS,), 64.0, device=dev, dtype=torch.float32)  # |x| * 64 stays below 448
    bound = torch.full((GROUPS,), 8.0, device=dev, dtype=torch.float32)  # a given amax above |x|
    # name, sfmoe.quantize arguments, torch peer, (code bytes per element, scale bytes per element),
    # copies, extra input reads
    cases = [
        ("fp8 tensor (amax + cast)", dict(recipe="fp8_tensor"), torch_fp8_tensor, (1, 0), 1, 1),
        (
            "fp8 tensor, +columnwise",
            dict(recipe="fp8_tensor", columnwise=True),
            with_transpose(torch_fp8_tensor),
            (1, 0),
            2,
            1,
        ),
        ("fp8 tensor, given scales", dict(recipe="fp8_tensor", tensor_scales=given), torch_fp8_given, (1, 0), 1, 0),
        (
            "fp8 tensor, given, +columnwise",
            dict(recipe="fp8_tensor", columnwise=True, tensor_scales=given),
            with_transpose(torch_fp8_given),
            (1, 0),
            2,
            0,
        ),
        ("fp8 tensor, given amax", dict(recipe="fp8_tensor", group_amax=bound), torch_fp8_given_amax, (1, 0), 1, 0),
        (
            "fp8 tensor, given amax, +col",
            dict(recipe="fp8_tensor", columnwise=True, group_amax=bound),
            with_transpose(torch_fp8_given_amax),
            (1, 0),
            2,
            0,
        ),
        ("fp8 block 1x128", dict(recipe="fp8_block_1x128"), torch_fp8_1x128, (1, 4 / 128), 1, 0),
        (
            "fp8 block 1x128, +columnwise",
            dict(recipe="fp8_block_1x128", columnwise=True),
            with_transpose(torch_fp8_1x128),
            (1, 4 / 128),
            2,
            0,
        ),
        (
            "fp8 block 128x128, +columnwise",
            dict(recipe="fp8_block_128x128", columnwise=True),
            torch_fp8_128x128,
            (1, 4 / 16384),
            2,
            0,
        ),
        ("mxfp8 1x32", dict(recipe="mxfp8"), torch_mxfp8, (1, 1 / 32), 1, 0),
        ("mxfp8, +columnwise", dict(recipe="mxfp8", columnwise=True), with_transpose(torch_mxfp8), (1, 1 / 32), 2, 0),
        (
            "mxfp8, +columnwise, swizzled",
            dict(recipe="mxfp8", columnwise=True, scale_layout="swizzled"),
            with_transpose(torch_mxfp8),
            (1, 1 / 32),
            2,
            0,
        ),
        ("nvfp4 1x16", dict(recipe="nvfp4"), None, (0.5, 1 / 16), 1, 1),
        ("nvfp4, +columnwise", dict(recipe="nvfp4", columnwise=True), None, (0.5, 1 / 16), 2, 1),
        (
            "nvfp4, +columnwise with RHT",
            dict(recipe="nvfp4", columnwise=True, hadamard=True),
            None,
            (0.5, 1 / 16),
            2,
            1,
        ),
        ("nvfp4, given amax", dict(recipe="nvfp4", group_amax=bound), None, (0.5, 1 / 16), 1, 0),
        (
            "nvfp4, given amax, +columnwise",
            dict(recipe="nvfp4", columnwise=True, group_amax=bound),
            None,
            (0.5, 1 / 16),
            2,
            0,
        ),
    ]
    print(f"copy ceiling (torch copy_, 2 GiB): {ceiling:.2f} TB/s")
    print(f"grouped quantize [{ROWS} x {COLS}] bf16, {GROUPS} groups; torch: the same recipe by torch ops")
    head = f"{'recipe':32s} {'sfmoe ms':>9s} {'TB/s':>6s} {'%ceil':>6s} {'moved':>6s} {'torch ms':>9s} {'TB/s':>6s} {'speedup':>8s}"
    print(head)
    results = []
    for name, kwargs, peer, (code_bytes, scale_bytes), copies, extra_reads in cases:

        def ours():
            return sfmoe.quantize(x, group_offsets=offsets, row_alignment=128, **kwargs)

        ours()  # one checked call (raises on any error) before timing
        ours_ms = median_ms(ours, runs=15, warmup=3, batch=5)
        written = copies * n * (code_bytes + scale_bytes)
        tbps = (2 * n + written) / (ours_ms * 1e-3) / 1e12
        moved = (2 * n * (1 + extra_reads) + written) / (ours_ms * 1e-3) / 1e12
        row = dict(recipe=name, sfmoe_ms=ours_ms, sfmoe_TBps=tbps, moved_TBps=moved, ceiling_TBps=ceiling)
        line = f"{name:32s} {ours_ms:9.3f} {tbps:6.2f} {100 * tbps / ceiling:5.1f}% {moved:6.2f}"
        if peer is not None:
            torch_ms = median_ms(lambda: peer(x), runs=15, warmup=3, batch=5)
            torch_tbps = (2 * n + written) / (torch_ms * 1e-3) / 1e12
            row.update(torch_ms=torch_ms, torch_TBps=torch_tbps, speedup=torch_ms / ours_ms)
            line += f" {torch_ms:9.3f} {torch_tbps:6.2f} {torch_ms / ours_ms:7.2f}x"
        else:
            line += f" {'(no torch FP4 cast)':>26s}"
        print(line)
        results.append(row)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_quantize_torch.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
