"""BF16 grouped GEMM, fprop and dgrad (and wgrad, SFMOE_BENCH_FORMS_FORMS), per kernel: sfmoe's own contiguous kernels (contig256,
contig192, contig128, and contig256c2 / contig192c2 in 2-CTA clusters multicasting W: one TMA descriptor per operand, a device tile scheduler) beside the CUTLASS ptr-array
tile the heuristic picks, `torch._grouped_mm` and a dense cuBLAS GEMM of the same FLOPs, all timed
in the same process (as bench_grouped_gemm_torch.py times them: sfmoe graphed, each peer the faster
of eager and graphed). The library reads SFMOE_GEMM_TILE once when it loads, so each kernel runs in
a child process of its own, which times the peers again; the table prints each kernel's TFLOP/s
and its ratio to the peers of its own process.

Cases: the three families of the GPU notes (DeepSeek-V3 EP8, Qwen3-30B-A3B, Mixtral-8x7B; balanced
and Zipf groups padded to 16 rows) and three more, balanced only, that no heuristic was tuned on: gpt-oss-120b-like
(H 2880, F 2880, 128 experts, k 4: 256 rows per expert; 2880 is no multiple of 128), Qwen3-235B-A22B
(H 4096, F 1536, 128 experts, k 8) and DeepSeek-V2-Lite (H 2048, F 1408, 64 experts, k 6), 8192
tokens each. Inputs: fresh normal values. Writes $OUT/bench_grouped_gemm_forms.json when OUT is
set. SFMOE_BENCH_FORMS_TILES=default,contig256 limits the kernels, SFMOE_BENCH_FORMS_SHAPES the shapes.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import torch

SHAPES = {  # name: (local experts E, routed rows M, hidden, ffn)
    "DeepSeek-V3 EP8": (32, 4096 * 8, 7168, 2048),
    "Qwen3-30B-A3B": (128, 8192 * 8, 2048, 768),
    "Mixtral-8x7B": (8, 8192 * 2, 4096, 14336),
    "gpt-oss-120b": (128, 8192 * 4, 2880, 2880),
    "Qwen3-235B-A22B": (128, 8192 * 8, 4096, 1536),
    "DeepSeek-V2-Lite": (64, 8192 * 6, 2048, 1408),
}
FAMILIES = ("DeepSeek-V3 EP8", "Qwen3-30B-A3B", "Mixtral-8x7B")  # balanced and Zipf; the others balanced
TILES = os.environ.get("SFMOE_BENCH_FORMS_TILES", "default,contig256,contig256c2,contig192c2").split(",")
# The forms timed (SFMOE_BENCH_FORMS_FORMS, comma-separated): fprop and dgrad by default; wgrad
# (dW_g = dY_g^T X_g into BF16, beside torch._grouped_mm's wgrad and dense dY^T X) on request;
# fprop_gather / dgrad_gather: A's rows gathered from M / 8 token rows (each group's tokens in
# increasing order, as a stable sort by expert leaves them) through a_row_index, beside
# torch's index_select + torch._grouped_mm (the plain layer's pair) -- compare with the plain form's
# row of the same process for what the gather costs or saves in the GEMM itself.
FORMS = os.environ.get("SFMOE_BENCH_FORMS_FORMS", "fprop,dgrad").split(",")
# SFMOE_BENCH_FORMS_SHAPES (comma-separated names of SHAPES) times those shapes only.
ONLY = [s for s in os.environ.get("SFMOE_BENCH_FORMS_SHAPES", "").split(",") if s]


def child():
    """Times every case in this process, with the tile SFMOE_GEMM_TILE forced (or the heuristic's)."""
    import sfmoe
    from bench_grouped_gemm_torch import device_offsets, group_sizes, ours_ms, peer, tflops

    dev = torch.device("cuda")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    rows_out = []
    for name, (experts, rows, hidden, ffn) in SHAPES.items():
        if ONLY and name not in ONLY:
            continue
        for skew in ("balanced", "zipf") if name in FAMILIES else ("balanced",):
            sizes = group_sizes(experts, rows, skew)
            m = int(sizes.sum())
            offsets = device_offsets(sizes, dev)
            ends32 = offsets[1:].to(torch.int32)
            for stage, (k, n) in {"fc1": (hidden, 2 * ffn), "fc2": (ffn, hidden)}.items():
                w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16)
                flops = 2.0 * m * n * k
                for form in FORMS:
                    gather = form.endswith("_gather")
                    index = None
                    if gather:  # each group's token rows, ascending
                        tokens = max(m // 8, 1)
                        group_of_row = torch.repeat_interleave(
                            torch.arange(experts, device=dev), (offsets[1:] - offsets[:-1]).long()
                        )
                        key = group_of_row * tokens + torch.randint(0, tokens, (m,), device=dev)
                        index = (torch.sort(key).values % tokens).to(torch.int32)
                        index_long = index.long()
                        source = torch.randn(
                            tokens, k if form == "fprop_gather" else n, device=dev, dtype=torch.bfloat16
                        )
                    if form == "fprop_gather":
                        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                        grouped = peer(
                            lambda: torch._grouped_mm(
                                source.index_select(0, index_long), w.transpose(1, 2), offs=ends32
                            )
                        )
                    elif form == "dgrad_gather":
                        out = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
                        grouped = peer(lambda: torch._grouped_mm(source.index_select(0, index_long), w, offs=ends32))
                    if gather:
                        a, b = source, w
                        da, db = (
                            torch.randn(m, k, device=dev, dtype=torch.bfloat16),
                            torch.randn(k, n, device=dev, dtype=torch.bfloat16),
                        )
                        plain = form.split("_")[0]
                        ours = ours_ms(
                            lambda: sfmoe.grouped_gemm(plain, source, w, offsets, out=out, a_row_index=index)
                        )
                    elif form == "wgrad":  # dW_g [n, k] = dY_g^T X_g, into BF16; dense: dY^T X
                        a = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                        b = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                        out = torch.empty(experts, n, k, device=dev, dtype=torch.bfloat16)
                        grouped = peer(lambda: torch._grouped_mm(a.t(), b, offs=ends32))
                        da, db = a.t(), b
                    elif form == "fprop":
                        a, b = torch.randn(m, k, device=dev, dtype=torch.bfloat16), w
                        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
                        grouped = peer(lambda: torch._grouped_mm(a, w.transpose(1, 2), offs=ends32))
                        da, db = (
                            torch.randn(m, k, device=dev, dtype=torch.bfloat16),
                            torch.randn(k, n, device=dev, dtype=torch.bfloat16),
                        )
                    else:
                        a, b = torch.randn(m, n, device=dev, dtype=torch.bfloat16), w
                        out = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
                        grouped = peer(lambda: torch._grouped_mm(a, w, offs=ends32))
                        da, db = (
                            torch.randn(m, n, device=dev, dtype=torch.bfloat16),
                            torch.randn(n, k, device=dev, dtype=torch.bfloat16),
                        )
                    if not gather:
                        ours = ours_ms(lambda: sfmoe.grouped_gemm(form, a, b, offsets, out=out))
                    dense = peer(lambda: da @ db)
                    rows_out.append(
                        dict(
                            case=f"{name} {skew} {stage} {form}",
                            ours=tflops(flops, ours),
                            grouped_mm=grouped and tflops(flops, grouped),
                            dense=dense and tflops(flops, dense),
                        )
                    )
                    del a, b, out, da, db, index
                del w
                torch.cuda.empty_cache()
    with open(os.environ["SFMOE_BENCH_FORMS_JSON"], "w") as f:
        json.dump(rows_out, f)


def main():
    per_tile = {}
    for tile in TILES:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rows.json")
            env = dict(os.environ, SFMOE_BENCH_FORMS_CHILD="1", SFMOE_BENCH_FORMS_JSON=path)
            env.pop("SFMOE_GEMM_TILE", None)
            if tile != "default":
                env["SFMOE_GEMM_TILE"] = tile
            run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{tile}: the child failed: {run.stderr.strip()[-400:]}")
                continue
            with open(path) as f:
                per_tile[tile] = {r["case"]: r for r in json.load(f)}
        print(f"{tile}: done", flush=True)
    if not per_tile:
        sys.exit(1)
    cases = list(next(iter(per_tile.values())))
    header = f"{'case (TFLOP/s)':42s}" + "".join(f" {t:>9s} {'/gmm':>5s} {'/dense':>6s}" for t in per_tile)
    print(header)
    geo = {t: [] for t in per_tile}
    for case in cases:
        line = f"{case:42s}"
        for tile, rows in per_tile.items():
            r = rows[case]
            g = r["ours"] / r["grouped_mm"] if r["grouped_mm"] else float("nan")
            d = r["ours"] / r["dense"] if r["dense"] else float("nan")
            geo[tile].append(g)
            line += f" {r['ours']:9.0f} {g:5.2f} {d:6.2f}"
        print(line)
    for tile, values in geo.items():
        values = [v for v in values if v == v]
        if values:
            mean = math.exp(sum(math.log(v) for v in values) / len(values))
            print(f"{tile}: geometric mean over torch._grouped_mm of its process, {len(values)} cases: {mean:.3f}x")
    best = []
    for case in cases:
        best.append(
            max(
                per_tile[t][case]["ours"] / per_tile[t][case]["grouped_mm"]
                for t in per_tile
                if per_tile[t][case]["grouped_mm"]
            )
        )
    print(f"best kernel per case: geometric mean {math.exp(sum(math.log(v) for v in best) / len(best)):.3f}x")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_grouped_gemm_forms.json"), "w") as f:
            json.dump(per_tile, f, indent=1)


if __name__ == "__main__":
    if os.environ.get("SFMOE_BENCH_FORMS_CHILD") == "1":
        child()
    else:
        main()
