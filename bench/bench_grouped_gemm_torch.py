"""sfmoe's grouped GEMM against the peers of ../shared/GPU.md, timed in the same process on the GPU:
the 12 forward cases (DeepSeek-V3 EP8, Qwen3-30B-A3B, Mixtral-8x7B; balanced and Zipf group sizes,
each padded to 16 rows; fc1 and fc2) and the balanced wgrad cases, in TFLOP/s for sfmoe (BF16, FP8
per-tensor E4M3 operands and FP8 blockwise ones -- 1x128 rows x 128x128 weights, the DeepSeek-V3
recipe -- quantized beforehand), `torch._grouped_mm` (BF16),
`torch._scaled_grouped_mm` (FP8 rowwise) and a dense cuBLAS GEMM of the same FLOPs, with the
ratios; wgrad with a BF16 result (as the peers write) and with an FP32 one, fresh or accumulated
into a main-grad buffer; plus the capacity case (the same rows in buffers with 2x spare capacity,
where the work must follow the rows, not the buffer); and the balanced cases again with integer
inputs, the fill of the stock CUTLASS figures (SFMOE_BENCH_GEMM=inputs runs only that part;
SFMOE_BENCH_GEMM=quick leaves out the tile sweep and that part, as tools/gpu_check.sh runs it).

sfmoe is timed as REPEAT calls captured in one CUDA graph (device time, as in
bench_moe_ops_torch.py); each peer both eagerly (as ../shared/peers/peer_baseline.py measured
them) and captured like sfmoe, and credited with the faster of the two: the H200 runs these GEMMs
at its power limit, where one kernel's eager figure moves by up to 15% from one measurement to
the next in the same process (docs/KERNEL_NOTES.md). The tile sweep checks the heuristic's choice
(src/cuda/heuristics/gemm_tiles.h): the library reads SFMOE_GEMM_TILE once, when it is loaded, so
the quick benchmark runs again in a child process per tile with that tile forced, and each case's
figure per tile is printed beside the heuristic's. Each case's figures are also printed as fractions of the GPU
notes' dense ceilings. Writes JSON to $OUT/bench_grouped_gemm_torch.json when OUT is set.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import sfmoe
import torch
from torch_timing import graphed_ms, median_ms

REPEAT = 10

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


def device_offsets(sizes, dev):
    """Group offsets [E + 1] (int64, on `dev`) of the group sizes."""
    offsets = torch.zeros(len(sizes) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(sizes, 0)
    return offsets.to(dev)


def ours_ms(fn):
    """sfmoe's device time per call: REPEAT calls in one captured graph (torch_timing)."""
    return graphed_ms(fn, REPEAT, runs=10, warmup=2, batch=2)


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def peer(fn):
    """A peer's time per call: the faster of eager and graphed timing (see above); None when this
    torch lacks the op. (A peer that cannot be captured keeps its eager figure.)"""
    try:
        eager = median_ms(fn, runs=10, warmup=3, batch=3)
    except Exception as error:  # noqa: BLE001 -- a peer this torch lacks
        print(f"  (peer unavailable: {str(error)[:100]})")
        return None
    try:
        return min(eager, graphed_ms(fn, REPEAT, runs=10, warmup=2, batch=2))
    except Exception:  # noqa: BLE001 -- not capturable: the eager figure stands
        torch.cuda.synchronize()
        return eager


# The tiles each recipe compiles (src/cuda/heuristics/gemm_tiles.h), swept per case; the result
# key of each recipe in a case's row.
RECIPE_TILES = {
    "bf16": (
        "coop128",
        "coop256",
        "pingpong64",
        "coop256x128",
        "pingpong128",
        "contig256",
        "contig192",
        "contig128",
        "contig256c2",
        "contig192c2",
    ),
    "fp8": ("coop128", "coop256", "pingpong64"),
    "fp8 fast": ("coop128", "coop256", "coop256x128", "pingpong128"),
    "fp8 block": ("coop128", "blockwise128", "blockwise128c2"),
}
RECIPE_KEY = {
    "bf16": "sfmoe",
    "fp8": "sfmoe_fp8",
    "fp8 fast": "sfmoe_fp8_fast",
    "fp8 block": "sfmoe_fp8_blockwise",
}
# SFMOE_BENCH_SWEEP=bf16,fp8 limits the tile sweep to those recipes (default: all; none when quick).
QUICK = os.environ.get("SFMOE_BENCH_GEMM") == "quick"
SWEPT = [] if QUICK else [r.strip() for r in os.environ.get("SFMOE_BENCH_SWEEP", ",".join(RECIPE_TILES)).split(",")]
SHORT = {
    "coop128": "c128",
    "coop256": "c256",
    "pingpong64": "p64",
    "coop256x128": "c256x128",
    "pingpong128": "p128",
    "contig256": "own256",
    "contig192": "own192",
    "contig128": "own128",
    "contig256c2": "own256c2",
    "contig192c2": "own192c2",
    "blockwise128": "ownbw128",
    "blockwise128c2": "ownbw128c2",
}
# Stock CUTLASS 4.2 grouped FP8 (fast accumulation), balanced cases: ../shared/GPU.md, another run.
CUTLASS_FP8 = {
    ("Qwen3-30B-A3B", "fc1"): 1179,
    ("Qwen3-30B-A3B", "fc2"): 886,
    ("DeepSeek-V3 EP8", "fc1"): 1428,
    ("DeepSeek-V3 EP8", "fc2"): 1345,
    ("Mixtral-8x7B", "fc1"): 1441,
    ("Mixtral-8x7B", "fc2"): 1507,
}


# The dense GEMM ceilings of ../shared/GPU.md (8192^3 on this H200, another run), TFLOP/s.
DENSE_CEILING = {"bf16": 742, "fp8": 1302}


def print_ceiling_fractions(rows):
    """Each forward case's figures as a fraction of the GPU notes' dense ceiling of its operand type."""
    columns = (
        ("sfmoe", "bf16", "bf16"),
        ("sfmoe_fp8", "fp8", "fp8"),
        ("sfmoe_fp8_fast", "fp8 fast", "fp8"),
        ("sfmoe_fp8_blockwise", "fp8 block", "fp8"),
    )
    print(
        f"\nfraction of the GPU notes' dense ceilings (BF16 {DENSE_CEILING['bf16']}, FP8 {DENSE_CEILING['fp8']} "
        "TFLOP/s, 8192^3, another run)"
    )
    for row in rows:
        print(
            f"{row['case']:30s} "
            + "  ".join(f"{label} {row[key] / DENSE_CEILING[kind]:6.1%}" for key, label, kind in columns)
        )


def tile_sweep(results):
    """Each case's figure with every tile its recipe compiles forced, from one child process per
    tile (the quick benchmark with SFMOE_GEMM_TILE set), beside the heuristic's (results)."""
    tiles = sorted({t for recipe in SWEPT for t in RECIPE_TILES.get(recipe, ())})
    per_tile = {}
    for tile in tiles:
        with tempfile.TemporaryDirectory() as out:
            env = dict(os.environ, SFMOE_GEMM_TILE=tile, SFMOE_BENCH_GEMM="quick", OUT=out)
            child = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
            if child.returncode != 0:
                print(f"  (tile {tile}: the child failed: {child.stderr.strip()[-200:]})")
                continue
            with open(os.path.join(out, "bench_grouped_gemm_torch.json")) as f:
                per_tile[tile] = {row["case"]: row for row in json.load(f)}
    print("\ntile sweep (TFLOP/s, one child process per forced tile; [heuristic] is this process's figure)")
    for row in results:
        if "M" not in row:
            continue
        parts = []
        for recipe in SWEPT:
            key = RECIPE_KEY.get(recipe)
            if key is None or key not in row or (row["case"].startswith("wgrad") and recipe != "bf16"):
                continue
            figures = [
                f"{SHORT[t]} {per_tile[t][row['case']][key]:.0f}"
                for t in RECIPE_TILES[recipe]
                if t in per_tile and row["case"] in per_tile[t]
            ]
            parts.append(f"{recipe} [{row[key]:.0f}] " + " ".join(figures))
        print(f"{row['case']:30s} " + " | ".join(parts))


def input_sensitivity(dev):
    """The balanced forward cases with two fills of the same shapes: normal values, and integers in
    [-2, 2] (the fill of CUTLASS's examples, where the stock figures of the GPU notes come from).
    The tensor cores' power, hence the clock they hold, depends on how many operand bits toggle."""
    print("\ninput fill (balanced cases, TFLOP/s): normal values | integers in [-2, 2]")
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        sizes = group_sizes(experts, rows, "balanced")
        m = int(sizes.sum())
        offsets = device_offsets(sizes, dev)
        for stage, (k, n) in {"fc1": (hidden, 2 * ffn), "fc2": (ffn, hidden)}.items():
            flops = 2.0 * m * n * k
            figures = {}
            for fill in ("normal", "integers"):
                if fill == "normal":
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
                else:
                    x = torch.randint(-2, 3, (m, k), device=dev).to(torch.bfloat16)
                    w = torch.randint(-2, 3, (experts, n, k), device=dev).to(torch.bfloat16)
                y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                qx = sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets)
                qw = sfmoe.quantize(w.reshape(experts * n, k), "fp8_tensor", uniform_group_rows=n)
                figures[fill] = (
                    tflops(flops, ours_ms(lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y))),
                    tflops(flops, ours_ms(lambda: sfmoe.grouped_gemm("fprop", qx, qw, out=y, fast_accumulation=True))),
                )
                del x, w, y, qx, qw
            cutlass = CUTLASS_FP8.get((name, stage))
            print(
                f"{name + ' ' + stage:30s} "
                + " | ".join(f"{fill}: bf16 {b:.0f}, fp8 fast {f:.0f}" for fill, (b, f) in figures.items())
                + f" | stock cutlass fp8 {cutlass}"
            )
            torch.cuda.empty_cache()


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if os.environ.get("SFMOE_BENCH_GEMM") == "inputs":
        input_sensitivity(dev)
        return
    results = []
    print(
        f"{'case':30s} {'bf16':>5s} {'grouped_mm':>10s} {'ratio':>5s} {'dense':>5s} {'ratio':>5s} | "
        f"{'fp8':>5s} {'fp8 fast':>8s} {'rowwise':>7s} {'ratio':>5s} {'cutlass*':>8s} | {'fp8 block':>9s}   (TFLOP/s)"
    )
    ratios = {"bf16 / grouped_mm": [], "fp8 / scaled_grouped_mm": [], "fp8 fast / scaled_grouped_mm": []}
    emulation_rows = []
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        for skew in ("balanced", "zipf"):
            sizes = group_sizes(experts, rows, skew)
            m = int(sizes.sum())
            offsets = device_offsets(sizes, dev)
            ends32 = offsets[1:].to(torch.int32)
            for stage, (k, n) in {"fc1": (hidden, 2 * ffn), "fc2": (ffn, hidden)}.items():
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
                y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                flops = 2.0 * m * n * k
                qx = sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets)
                qw = sfmoe.quantize(w.reshape(experts * n, k), "fp8_tensor", uniform_group_rows=n)
                qxb = sfmoe.quantize(x, "fp8_block_1x128", group_offsets=offsets)
                qwb = sfmoe.quantize(w.reshape(experts * n, k), "fp8_block_128x128", uniform_group_rows=n)
                calls = {
                    "bf16": lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y),
                    "fp8": lambda: sfmoe.grouped_gemm("fprop", qx, qw, out=y),
                    "fp8 fast": lambda: sfmoe.grouped_gemm("fprop", qx, qw, out=y, fast_accumulation=True),
                    "fp8 block": lambda: sfmoe.grouped_gemm("fprop", qxb, qwb, out=y),
                }
                ours = {recipe: tflops(flops, ours_ms(fn)) for recipe, fn in calls.items()}
                # MXFP8 and NVFP4, emulated: both operands decoded into BF16 per call, then BF16.
                emulated = {}
                for recipe, weights in (("mxfp8", "mxfp8"), ("nvfp4", "nvfp4_2d")):
                    qxe = sfmoe.quantize(x, recipe, group_offsets=offsets, row_alignment=16)
                    qwe = sfmoe.quantize(w.reshape(experts * n, k), weights, uniform_group_rows=n)
                    ye = torch.empty(qxe.rows, n, device=dev, dtype=torch.bfloat16)
                    emulated[recipe] = tflops(flops, ours_ms(lambda: sfmoe.grouped_gemm("fprop", qxe, qwe, out=ye)))
                    del qxe, qwe, ye
                emulation_rows.append((f"{name} {skew} {stage}", ours["bf16"], emulated))
                grouped = peer(lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=ends32))
                xd = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                wd = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
                dense = peer(lambda: xd @ wd)
                x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                sa = torch.ones(m, device=dev, dtype=torch.float32)
                sb = torch.ones(experts, n, device=dev, dtype=torch.float32)
                fp8 = peer(
                    lambda: torch._scaled_grouped_mm(
                        x8, w8.transpose(1, 2), sa, sb, offs=ends32, out_dtype=torch.bfloat16
                    )
                )
                row = dict(
                    case=f"{name} {skew} {stage}",
                    M=m,
                    N=n,
                    K=k,
                    sfmoe=ours["bf16"],
                    grouped_mm=grouped and tflops(flops, grouped),
                    dense=dense and tflops(flops, dense),
                    sfmoe_fp8=ours["fp8"],
                    sfmoe_fp8_fast=ours["fp8 fast"],
                    scaled_grouped_mm=fp8 and tflops(flops, fp8),
                    sfmoe_fp8_blockwise=ours["fp8 block"],
                )
                results.append(row)
                if grouped:
                    ratios["bf16 / grouped_mm"].append(row["sfmoe"] / row["grouped_mm"])
                if fp8:
                    ratios["fp8 / scaled_grouped_mm"].append(row["sfmoe_fp8"] / row["scaled_grouped_mm"])
                    ratios["fp8 fast / scaled_grouped_mm"].append(row["sfmoe_fp8_fast"] / row["scaled_grouped_mm"])
                fmt = lambda v: f"{v:.0f}" if v else "-"  # noqa: E731
                ratio = lambda a, b: f"{a / b:.2f}" if b else "-"  # noqa: E731
                cutlass = CUTLASS_FP8.get((name, stage)) if skew == "balanced" else None
                print(
                    f"{row['case']:30s} {row['sfmoe']:5.0f} {fmt(row['grouped_mm']):>10s} "
                    f"{ratio(row['sfmoe'], row['grouped_mm']):>5s} {fmt(row['dense']):>5s} "
                    f"{ratio(row['sfmoe'], row['dense']):>5s} | {row['sfmoe_fp8']:5.0f} {row['sfmoe_fp8_fast']:8.0f} "
                    f"{fmt(row['scaled_grouped_mm']):>7s} {ratio(row['sfmoe_fp8_fast'], row['scaled_grouped_mm']):>5s} "
                    f"{fmt(cutlass):>8s} | {row['sfmoe_fp8_blockwise']:9.0f}"
                )
                del x, w, y, xd, wd, x8, w8, qx, qw, qxb, qwb
                torch.cuda.empty_cache()
    for what, values in ratios.items():
        if values:
            geo = math.exp(sum(math.log(r) for r in values) / len(values))
            print(f"geometric mean {what} over {len(values)} cases: {geo:.2f}x")
    print(
        "* stock CUTLASS 4.2 FP8 grouped GEMM, fast accumulation, balanced (GPU notes, another run). "
        "fp8 block targets: DeepGEMM publishes 1214-1346 at the DeepSeek-V3 shapes (H800); >= 900 on Qwen3"
    )
    print_ceiling_fractions(results)
    print(
        "\nMXFP8 / NVFP4 emulated (operands decoded into BF16 in the workspace per call, then the BF16 kernels;"
        " NVFP4 weights 16x16), fprop TFLOP/s and ratio to sfmoe BF16"
    )
    for case, bf16, emulated in emulation_rows:
        print(
            f"{case:30s} bf16 {bf16:5.0f} | "
            + " | ".join(f"{recipe} {v:5.0f} ({v / bf16:.2f}x)" for recipe, v in emulated.items())
        )
    for recipe in ("mxfp8", "nvfp4"):
        values = [e[recipe] / b for _, b, e in emulation_rows]
        if values:
            geo = math.exp(sum(math.log(r) for r in values) / len(values))
            print(f"geometric mean {recipe} emulated / bf16 over {len(values)} cases: {geo:.2f}x")

    # wgrad, balanced: dW_e [N, K] = dY_e^T X_e.
    print(
        f"\n{'wgrad case (TFLOP/s)':30s} {'bf16 out':>8s} {'fp32 out':>8s} {'fp32 acc':>8s} "
        f"{'grouped_mm':>10s} {'dense':>6s} {'bf16/dense':>10s} {'fp8 block':>9s}"
    )
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        sizes = group_sizes(experts, rows, "balanced")
        m = int(sizes.sum())
        offsets = device_offsets(sizes, dev)
        ends32 = offsets[1:].to(torch.int32)
        k, n = hidden, 2 * ffn
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        dw = torch.zeros(experts, n, k, device=dev, dtype=torch.float32)
        dw16 = torch.empty(experts, n, k, device=dev, dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        ours16 = ours_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw16))
        ours32 = ours_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw))
        ours_acc = ours_ms(lambda: sfmoe.grouped_gemm("wgrad", dy, x, offsets, out=dw, accumulate=True))
        grouped = peer(lambda: torch._grouped_mm(dy.t(), x, offs=ends32))
        dense = peer(lambda: dy.t() @ x)
        # FP8 blockwise: dY and X 1x128 down their rows (columnwise copies, scales transposed).
        qdy = sfmoe.quantize(
            dy,
            "fp8_block_1x128",
            group_offsets=offsets,
            columnwise=True,
            rowwise=False,
            row_alignment=128,
            scale_layout="columnwise_transposed",
        )
        qxc = sfmoe.quantize(
            x,
            "fp8_block_1x128",
            group_offsets=offsets,
            columnwise=True,
            rowwise=False,
            row_alignment=128,
            scale_layout="columnwise_transposed",
        )
        ours_block = ours_ms(lambda: sfmoe.grouped_gemm("wgrad", qdy, qxc, out=dw16))
        row = dict(
            case=f"wgrad {name} fc1",
            M=m,
            N=n,
            K=k,
            sfmoe=tflops(flops, ours16),
            sfmoe_fp32=tflops(flops, ours32),
            sfmoe_fp32_accumulate=tflops(flops, ours_acc),
            sfmoe_fp8_blockwise=tflops(flops, ours_block),
            grouped_mm=grouped and tflops(flops, grouped),
            dense=dense and tflops(flops, dense),
        )
        results.append(row)
        print(
            f"{row['case']:30s} {row['sfmoe']:8.0f} {row['sfmoe_fp32']:8.0f} {row['sfmoe_fp32_accumulate']:8.0f} "
            f"{row['grouped_mm'] or 0:10.0f} {row['dense'] or 0:6.0f} "
            f"{row['sfmoe'] / row['dense'] if row['dense'] else float('nan'):10.2f} "
            f"{row['sfmoe_fp8_blockwise']:9.0f}   ceiling bf16 {row['sfmoe'] / DENSE_CEILING['bf16']:.1%}, "
            f"fp8 block {row['sfmoe_fp8_blockwise'] / DENSE_CEILING['fp8']:.1%}"
        )
        del x, dy, dw, dw16, qdy, qxc
        torch.cuda.empty_cache()

    # Capacity: Qwen3 fc1 balanced rows in buffers of twice the rows.
    experts, rows, hidden, ffn = SHAPES["Qwen3-30B-A3B"]
    sizes = group_sizes(experts, rows, "balanced")
    m = int(sizes.sum())
    offsets = device_offsets(sizes, dev)
    k, n = hidden, 2 * ffn
    w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
    times = {}
    for capacity in (m, 2 * m):
        x = torch.randn(capacity, k, device=dev, dtype=torch.bfloat16)
        y = torch.empty(capacity, n, device=dev, dtype=torch.bfloat16)
        times[capacity] = ours_ms(lambda: sfmoe.grouped_gemm("fprop", x, w, offsets, out=y))
    print(
        f"\ncapacity (Qwen3 fc1, balanced): exact {times[m] * 1e3:.1f} us, 2x spare {times[2 * m] * 1e3:.1f} us, "
        f"ratio {times[2 * m] / times[m]:.3f} (target <= 1.1)"
    )
    results.append(dict(case="capacity", exact_ms=times[m], spare_ms=times[2 * m]))
    if SWEPT:
        tile_sweep(results)
    if not QUICK:
        input_sensitivity(dev)

    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_grouped_gemm_torch.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
