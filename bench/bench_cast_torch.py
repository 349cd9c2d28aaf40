"""sfmoe_cast against what a PyTorch user writes, timed in the same process on the GPU:
BF16 [65536 x 7168] -> FP8 E4M3 with a given scale, and back. Prints ms, TB/s (bytes read +
written), the share of the copy ceiling measured here (torch copy_), and the ratio to torch.
Writes JSON to $OUT/bench_cast_torch.json when OUT is set."""

import json
import os

import sfmoe
import torch
from torch_timing import copy_ceiling_tbps, median_ms


def main():
    rows, cols = 65536, 7168
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    scale = torch.full((), 64.0, device="cuda", dtype=torch.float32)
    n = x.numel()
    ceiling = copy_ceiling_tbps()

    q = sfmoe.cast(x, "fp8_e4m3", scale=scale)
    reference = (x.float() * scale).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), reference.view(torch.uint8)), "sfmoe and torch disagree"
    cases = [
        (
            "bf16 -> fp8 e4m3, scale in memory",
            lambda: sfmoe.cast(x, "fp8_e4m3", scale=scale),
            lambda: (x.float() * scale).to(torch.float8_e4m3fn),
        ),
        (
            "fp8 e4m3 -> bf16, scale_inv in memory",
            lambda: sfmoe.cast(q, "bf16", scale=scale),
            lambda: (q.float() * scale).to(torch.bfloat16),
        ),
    ]
    results = []
    print(f"copy ceiling (torch copy_, 2 GiB): {ceiling:.2f} TB/s")
    print(
        f"{'op [65536 x 7168]':40s} {'sfmoe ms':>9s} {'TB/s':>6s} {'%ceil':>6s} {'torch ms':>9s} {'TB/s':>6s} {'speedup':>8s}"
    )
    for name, ours, theirs in cases:
        ours_ms, theirs_ms = median_ms(ours), median_ms(theirs)
        tbps = 3 * n / (ours_ms * 1e-3) / 1e12
        torch_tbps = 3 * n / (theirs_ms * 1e-3) / 1e12
        print(
            f"{name:40s} {ours_ms:9.3f} {tbps:6.2f} {100 * tbps / ceiling:5.1f}% {theirs_ms:9.3f} {torch_tbps:6.2f} {theirs_ms / ours_ms:7.2f}x"
        )
        results.append(
            dict(
                op=name,
                sfmoe_ms=ours_ms,
                sfmoe_TBps=tbps,
                torch_ms=theirs_ms,
                torch_TBps=torch_tbps,
                ceiling_TBps=ceiling,
            )
        )
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_cast_torch.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
