"""One BF16 wgrad call (dW_g = dY_g^T X_g into BF16) of a chosen case beside the dense cuBLAS GEMM
of the same FLOPs (dY^T X), each run a few times, for Nsight Compute to profile: run it under
`ncu --launch-skip ... --launch-count 1 -k regex:<kernel>` with the sections wanted (stall
reasons: WarpStateStats; pipe use: ComputeWorkloadAnalysis). SFMOE_GEMM_TILE picks sfmoe's tile
as for the benchmarks; SFMOE_PROBE_CASE "qwen3-fc1" (default), "qwen3-fc2", "dsv3-fc1" or
"dsv3-fc2"; balanced groups."""

import os

import sfmoe
import torch
from bench_grouped_gemm_torch import device_offsets, group_sizes

CASES = {  # experts, rows, n (dW rows), k (dW cols)
    "qwen3-fc1": (128, 8192 * 8, 2 * 768, 2048),
    "qwen3-fc2": (128, 8192 * 8, 2048, 768),
    "dsv3-fc1": (32, 4096 * 8, 2 * 2048, 7168),
    "dsv3-fc2": (32, 4096 * 8, 7168, 2048),
}


def main():
    experts, rows, n, k = CASES[os.environ.get("SFMOE_PROBE_CASE", "qwen3-fc1")]
    dev = torch.device("cuda")
    sizes = group_sizes(experts, rows, "balanced")
    offsets = device_offsets(sizes, dev)
    m = int(sizes.sum())
    d_y = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    out = torch.empty(experts, n, k, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        sfmoe.grouped_gemm("wgrad", d_y, x, offsets, out=out)
    for _ in range(3):
        d_y.t() @ x
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
