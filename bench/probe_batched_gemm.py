"""What one descriptor per operand could gain for the grouped GEMM, bounded with cuBLAS: the balanced
forward cases of bench_grouped_gemm_torch.py (every group the same size, a multiple of 128 rows) are
also batched GEMMs, so `torch.bmm` (cuBLAS's batched kernels: one descriptor per operand, no
per-group pointers) is timed next to `torch._grouped_mm` and a dense cuBLAS GEMM of the same FLOPs,
in the same process; then the batched wgrad dW_g = dY_g^T X_g. TFLOP/s = 2 M N K / time.
docs/KERNEL_NOTES.md (grouped GEMM) records what it measured."""

import torch
from torch_timing import median_ms

SHAPES = {  # name: (local experts E, routed rows M, hidden, ffn), as in bench_grouped_gemm_torch.py
    "DeepSeek-V3 EP8": (32, 4096 * 8, 7168, 2048),
    "Qwen3-30B-A3B": (128, 8192 * 8, 2048, 768),
    "Mixtral-8x7B": (8, 8192 * 2, 4096, 14336),
}


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def main():
    dev = torch.device("cuda")
    print(f"{'case':28s} {'grouped_mm':>10s} {'bmm':>6s} {'dense':>6s}  (TFLOP/s, BF16, normal inputs)")
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        per_group = rows // experts
        for stage, (k, n) in {"fc1": (hidden, 2 * ffn), "fc2": (ffn, hidden)}.items():
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
            offsets = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * per_group
            w_t = w.transpose(-2, -1)
            flops = 2.0 * rows * n * k
            grouped = median_ms(lambda: torch._grouped_mm(x, w_t, offs=offsets))
            batched = median_ms(lambda: torch.bmm(x.view(experts, per_group, k), w_t))
            a = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            dense = median_ms(lambda: a @ b)
            print(
                f"{name + ' ' + stage:28s} {tflops(flops, grouped):10.0f} {tflops(flops, batched):6.0f} "
                f"{tflops(flops, dense):6.0f}"
            )
            del x, w, a, b
            torch.cuda.empty_cache()
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        per_group, k, n = rows // experts, hidden, 2 * ffn
        d_y = torch.randn(experts, per_group, n, device=dev, dtype=torch.bfloat16)
        x = torch.randn(experts, per_group, k, device=dev, dtype=torch.bfloat16)
        batched = median_ms(lambda: torch.bmm(d_y.transpose(1, 2), x))
        print(f"{name + ' wgrad fc1':28s} {'':10s} {tflops(2.0 * rows * n * k, batched):6.0f}")
        del d_y, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
