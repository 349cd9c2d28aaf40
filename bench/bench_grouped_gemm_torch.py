"""sfmoe's grouped GEMM against the peers of ../shared/GPU.md, timed in the same process on the GPU:
the 12 forward cases (DeepSeek-V3 EP8, Qwen3-30B-A3B, Mixtral-8x7B; balanced and Zipf group sizes,
each padded to 16 rows; fc1 and fc2) and the balanced wgrad cases, in TFLOP/s for sfmoe (BF16, FP8
per-tensor E4M3 operands and FP8 blockwise ones -- 1x128 rows x 128x128 weights, the DeepSeek-V3
recipe -- quantized beforehand), `torch._grouped_mm` (BF16),
`torch._scaled_grouped_mm` (FP8 rowwise) and a dense cuBLAS GEMM of the same FLOPs, with the
ratios; wgrad with a BF16 result (as the peers write) and with an FP32 one, fresh or accumulated
into a main-grad buffer; plus the capacity case (the same rows in buffers with 2x spare capacity,
where the work must follow the rows, not the buffer).

sfmoe is timed as REPEAT calls captured in one CUDA graph (device time, as in
bench_moe_ops_torch.py); the peers eagerly, as ../shared/peers/peer_baseline.py measured them.
Each forward case is also timed with every tile configuration forced (SFMOE_GEMM_TILE), BF16 and
FP8, to check
the heuristic's choice (src/cuda/gemm/gemm_heuristics.h). Writes JSON to
$OUT/bench_grouped_gemm_torch.json when OUT is set.
"""
import json
import math
import os

import torch

import sfmoe
from torch_timing import median_ms

REPEAT = 10
TILES = ("coop128", "coop256", "pingpong64")

SHAPES = {  # name: (local experts E, routed rows M, hidden, ffn)
    "DeepSeek-V3 EP8": (32, 4096 * 8, 7168, 2048),
    "Qwen3-30B-A3B": (128, 8192 * 8, 2048, 768),
    "Mixtral-8x7B": (8, 8192 * 2, 4096, 14336),
}


def group_sizes(experts, rows, skew, align=16, seed=0):
    """The peers' group sizes: balanced, or Zipf weights 1/rank shuffled; each padded to `align`."""
    g = torch.Generator().manual_seed(seed)
    if skew == "balanced":
        w = torch.ones(experts)
    else:
        w = 1.0 / torch.arange(1, experts + 1).float()
        w = w[torch.randperm(experts, generator=g)]
    c = (w / w.sum() * rows).floor().long()
    c[0] += rows - c.sum()
    return ((c + align - 1) // align) * align


def graphed_ms(fn):
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPEAT):
            fn()
    return median_ms(graph.replay, runs=10, warmup=2, batch=2) / REPEAT


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def peer(fn):
    try:
        return median_ms(fn, runs=10, warmup=3, batch=3)
    except Exception as error:  # noqa: BLE001 -- a peer this torch lacks
        print(f"  (peer unavailable: {str(error)[:100]})")
        return None


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    results = []
    print(f"{'case':30s} {'sfmoe':>6s} {'grouped_mm':>10s} {'ratio':>6s} {'dense':>6s} {'ratio':>6s} "
          f"{'sfmoe fp8':>9s} {'fp8 rowwise':>11s} {'ratio':>6s} {'fp8 block':>9s}   (TFLOP/s; tiles bf16 / fp8)")
    ratios_grouped = []
    ratios_fp8 = []
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        for skew in ("balanced", "zipf"):
            sizes = group_sizes(experts, rows, skew)
            m = int(sizes.sum())
            offsets = torch.zeros(experts + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(sizes, 0)
            offsets = offsets.to(dev)
            ends32 = offsets[1:].to(torch.int32)
            for stage, (k, n) in {"fc1": (hidden, 2 * ffn), "fc2": (ffn, hidden)}.items():
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
                y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                flops = 2.0 * m * n * k
                ours = graphed_ms(lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y))
                qx = sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets)
                qw = sfmoe.quantize(w.reshape(experts * n, k), "fp8_tensor", uniform_group_rows=n)
                ours8 = graphed_ms(lambda: sfmoe.grouped_gemm("fprop", qx, qw, out=y))
                qxb = sfmoe.quantize(x, "fp8_block_1x128", group_offsets=offsets)
                qwb = sfmoe.quantize(w.reshape(experts * n, k), "fp8_block_128x128", uniform_group_rows=n)
                ours_block = graphed_ms(lambda: sfmoe.grouped_gemm("fprop", qxb, qwb, out=y))
                per_tile, per_tile8 = {}, {}
                for tile in TILES:
                    os.environ["SFMOE_GEMM_TILE"] = tile
                    per_tile[tile] = tflops(flops, graphed_ms(
                        lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y)))
                    per_tile8[tile] = tflops(flops, graphed_ms(lambda: sfmoe.grouped_gemm("fprop", qx, qw, out=y)))
                del os.environ["SFMOE_GEMM_TILE"]
                grouped = peer(lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=ends32))
                xd = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                wd = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                dense = peer(lambda: xd @ wd)
                x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                sa = torch.ones(m, device=dev, dtype=torch.float32)
                sb = torch.ones(experts, n, device=dev, dtype=torch.float32)
                fp8 = peer(lambda: torch._scaled_grouped_mm(x8, w8.transpose(1, 2), sa, sb, offs=ends32,
                                                            out_dtype=torch.bfloat16))
                row = dict(case=f"{name} {skew} {stage}", M=m, N=n, K=k, sfmoe=tflops(flops, ours),
                           grouped_mm=grouped and tflops(flops, grouped), dense=dense and tflops(flops, dense),
                           sfmoe_fp8=tflops(flops, ours8), scaled_grouped_mm=fp8 and tflops(flops, fp8),
                           sfmoe_fp8_blockwise=tflops(flops, ours_block),
                           tiles=per_tile, tiles_fp8=per_tile8)
                results.append(row)
                if grouped:
                    ratios_grouped.append(row["sfmoe"] / row["grouped_mm"])
                if fp8:
                    ratios_fp8.append(row["sfmoe_fp8"] / row["scaled_grouped_mm"])
                fmt = lambda v: f"{v:.0f}" if v else "-"  # noqa: E731
                ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
                short = {"coop128": "c128", "coop256": "c256", "pingpong64": "p64"}
                print(f"{row['case']:30s} {row['sfmoe']:6.0f} {fmt(row['grouped_mm']):>10s} "
                      f"{ratio(row['sfmoe'], row['grouped_mm']):>6s} {fmt(row['dense']):>6s} "
                      f"{ratio(row['sfmoe'], row['dense']):>6s} {row['sfmoe_fp8']:9.0f} "
                      f"{fmt(row['scaled_grouped_mm']):>11s} {ratio(row['sfmoe_fp8'], row['scaled_grouped_mm']):>6s} "
                      f"{row['sfmoe_fp8_blockwise']:9.0f}   "
                      + " ".join(f"{short[t]} {per_tile[t]:.0f}/{per_tile8[t]:.0f}" for t in TILES))
                del x, w, y, xd, wd, x8, w8, qx, qw, qxb, qwb
                torch.cuda.empty_cache()
    if ratios_grouped:
        geo = math.exp(sum(math.log(r) for r in ratios_grouped) / len(ratios_grouped))
        print(f"geometric mean sfmoe / torch._grouped_mm over {len(ratios_grouped)} cases: {geo:.2f}x")
    if ratios_fp8:
        geo = math.exp(sum(math.log(r) for r in ratios_fp8) / len(ratios_fp8))
        print(f"geometric mean sfmoe fp8 tensor / torch._scaled_grouped_mm over {len(ratios_fp8)} cases: {geo:.2f}x")
    print("fp8 block targets (not run here): DeepGEMM publishes 1214-1346 TFLOP/s at the DeepSeek-V3 shapes "
          "(H800); the issue asks >= 900 on Qwen3")

    # wgrad, balanced: dW_e [N, K] = dY_e^T X_e.
    print(f"\n{'wgrad case (TFLOP/s)':30s} {'bf16 out':>8s} {'fp32 out':>8s} {'fp32 acc':>8s} "
          f"{'grouped_mm':>10s} {'dense':>6s} {'bf16/dense':>10s}")
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        sizes = group_sizes(experts, rows, "balanced")
        m = int(sizes.sum())
        offsets = torch.zeros(experts + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(sizes, 0)
        offsets = offsets.to(dev)
        ends32 = offsets[1:].to(torch.int32)
        k, n = hidden, 2 * ffn
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        dw = torch.zeros(experts, n, k, device=dev, dtype=torch.float32)
        dw16 = torch.empty(experts, n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        ours16 = graphed_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw16))
        ours32 = graphed_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw))
        ours_acc = graphed_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw, accumulate=True))
        grouped = peer(lambda: torch._grouped_mm(dy.t(), x, offs=ends32))
        dense = peer(lambda: dy.t() @ x)
        row = dict(case=f"wgrad {name} fc1", M=m, N=n, K=k, sfmoe=tflops(flops, ours16),
                   sfmoe_fp32=tflops(flops, ours32), sfmoe_fp32_accumulate=tflops(flops, ours_acc),
                   grouped_mm=grouped and tflops(flops, grouped), dense=dense and tflops(flops, dense))
        results.append(row)
        print(f"{row['case']:30s} {row['sfmoe']:8.0f} {row['sfmoe_fp32']:8.0f} {row['sfmoe_fp32_accumulate']:8.0f} "
              f"{row['grouped_mm'] or 0:10.0f} {row['dense'] or 0:6.0f} "
              f"{row['sfmoe'] / row['dense'] if row['dense'] else float('nan'):10.2f}")
        del x, dy, dw, dw16
        torch.cuda.empty_cache()

    # Capacity: Qwen3 fc1 balanced rows in buffers of twice the rows.
    experts, rows, hidden, ffn = SHAPES["Qwen3-30B-A3B"]
    sizes = group_sizes(experts, rows, "balanced")
    m = int(sizes.sum())
    offsets = torch.zeros(experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(sizes, 0)
    offsets = offsets.to(dev)
    k, n = hidden, 2 * ffn
    w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
    times = {}
    for capacity in (m, 2 * m):
        x = torch.randn(capacity, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(capacity, n, device=dev, dtype=torch.bfloat16)
        times[capacity] = graphed_ms(lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y))
    print(f"\ncapacity (Qwen3 fc1, balanced): exact {times[m] * 1e3:.1f} us, 2x spare {times[2 * m] * 1e3:.1f} us, "
          f"ratio {times[2 * m] / times[m]:.3f} (target <= 1.1)")
    results.append(dict(case="capacity", exact_ms=times[m], spare_ms=times[2 * m]))

    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_grouped_gemm_torch.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
