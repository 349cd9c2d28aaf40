"""The router, permute, unpermute and SwiGLU of sfmoe against what a PyTorch user writes, timed in
the same process on the GPU at T = 8192 tokens, E = 256 experts, k = 8, H = 7168 (BF16), and the
DeepSeek-V3 expert width F = 2048 for SwiGLU (rows = T k).

sfmoe's calls are captured in a CUDA graph, 20 calls per graph, and the graph is replayed (device
time: neither the Python binding's per-call overhead nor a graph launch is the kernels'). The torch
peers are timed eagerly, as the project's GPU notes measured them, and graphed the same way where
torch can capture them.

Bandwidth is effective: the bytes an op must read and write once (rows, not indices), over its
time, and as a share of the copy ceiling measured here (torch copy_). Writes JSON to
$OUT/bench_moe_ops_torch.json when OUT is set.
"""

import json
import os

import sfmoe
import torch
import torch.nn.functional as F
from torch_timing import copy_ceiling_tbps, graphed_ms, median_ms

T, E, K, H, FFN = 8192, 256, 8, 7168, 2048
GPU_NOTES_CEILING = 4.17  # TB/s: the copy ceiling in the project's GPU notes (same H200, another run)


REPEAT = 20  # calls per captured graph: a replay's launch cost is spread over them


def time_graphed(fn):
    """Device time of one call: a graph of REPEAT calls, replayed, divided by REPEAT."""
    return graphed_ms(fn, REPEAT)


def time_ours(fn):
    """Graph replay; eager (marked) if the capture fails."""
    try:
        return time_graphed(fn), ""
    except Exception as error:  # noqa: BLE001
        print(f"  (capture failed: {error}; timed eagerly)")
        return median_ms(fn, runs=25, warmup=5, batch=10), " eager"


def time_torch(fn):
    """(eager ms, graphed ms or None)."""
    eager = median_ms(fn, runs=25, warmup=5, batch=10)
    try:
        graph = time_graphed(fn)
    except Exception:  # noqa: BLE001 -- some torch ops cannot be captured
        graph = None
    return eager, graph


def wanted(section):
    only = os.environ.get("SFMOE_BENCH_ONLY")
    return not only or section in only.split(",")


def main():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ceiling = copy_ceiling_tbps(dev)
    print(f"copy ceiling (torch copy_, 2 GiB): {ceiling:.2f} TB/s")
    results = []

    def report(name, ours, torch_times, nbytes=None):
        ours_ms, how = ours
        eager, graph = torch_times
        row = dict(op=name, sfmoe_ms=ours_ms, torch_eager_ms=eager, torch_graph_ms=graph)
        line = f"{name + how:44s} {ours_ms * 1e3:9.1f} us"
        if nbytes is not None:
            tbps = nbytes / (ours_ms * 1e-3) / 1e12
            row.update(sfmoe_TBps=tbps, ceiling_fraction=tbps / ceiling)
            line += f" {tbps:5.2f} TB/s {100 * tbps / ceiling:5.1f}% ({100 * tbps / GPU_NOTES_CEILING:5.1f}% of 4.17)"
        else:
            line += " " * 36
        line += f" | torch {eager * 1e3:8.1f} us ({eager / ours_ms:5.1f}x)"
        if graph is not None:
            line += f", graphed {graph * 1e3:8.1f} us ({graph / ours_ms:5.1f}x)"
        print(line)
        results.append(row)

    print(f"{'op':44s} {'sfmoe':>12s} {'eff. bandwidth':>19s} | plain PyTorch in this process (ratio)")

    # ---- router ------------------------------------------------------------------------------
    logits = torch.randn(T, E, device=dev, dtype=torch.float32)
    bias = 0.01 * torch.randn(E, device=dev, dtype=torch.float32)

    def torch_sigmoid_topk():
        s = torch.sigmoid(logits)
        v, i = torch.topk(s, K, dim=-1)
        return v / v.sum(-1, keepdim=True), i

    def torch_softmax_topk():
        s = torch.softmax(logits, dim=-1)
        v, i = torch.topk(s, K, dim=-1)
        return v, i, torch.bincount(i.flatten(), minlength=E)

    def torch_deepseek():
        s = torch.sigmoid(logits)
        q = s + bias
        group_scores = q.view(T, 8, E // 8).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(4, dim=-1).indices, 1.0)
        q = q.masked_fill(keep.repeat_interleave(E // 8, dim=1) == 0, float("-inf"))
        i = q.topk(K, dim=-1).indices
        v = s.gather(1, i)
        return 2.5 * v / v.sum(-1, keepdim=True), i, torch.bincount(i.flatten(), minlength=E)

    router_cases = [
        ("router: sigmoid, top-8, normalize", dict(score="sigmoid", normalize=True), None, torch_sigmoid_topk),
        ("router: softmax, top-8, counts", dict(), None, torch_softmax_topk),
        (
            "router: DeepSeek-V3 (bias, 8 groups, keep 4)",
            dict(score="sigmoid", normalize=True, num_groups=8, group_topk=4, scaling_factor=2.5),
            bias,
            torch_deepseek,
        ),
    ]
    for name, kwargs, b, peer in router_cases if wanted("router") else []:
        fn = lambda: sfmoe.router(logits, K, expert_bias=b, **kwargs)  # noqa: E731
        fn()
        peer_times = time_torch(peer)
        report(name, time_ours(fn), peer_times)

    routed = sfmoe.router(logits, K, score="sigmoid", normalize=True)
    ids, probs = routed.topk_ids, routed.probs

    # ---- permute -----------------------------------------------------------------------------
    tokens = torch.randn(T, H, device=dev, dtype=torch.bfloat16)

    def torch_permute():
        order = torch.argsort(ids.reshape(-1), stable=True)
        return tokens.index_select(0, order // K), order

    torch_permute_times = time_torch(torch_permute) if wanted("permute") else None
    if wanted("permute"):
        # What a write-heavy op can reach: filling the permuted rows' bytes (torch zero_), no reads.
        sink = torch.empty(T * K, H, device=dev, dtype=torch.bfloat16)
        fill_ms = time_graphed(sink.zero_)
        print(
            f"write-only bandwidth (zero_ of [T k, H] bf16): {T * K * H * 2 / (fill_ms * 1e-3) / 1e12:.2f} TB/s"
            f" ({fill_ms * 1e3:.1f} us)"
        )
        del sink
    for alignment in (1, 16, 128) if wanted("permute") else ():
        fn = lambda: sfmoe.permute(tokens, ids, E, alignment=alignment)  # noqa: E731
        out = fn()
        rows_written = int(out.group_offsets[-1])  # kept rows and zero padding: all written
        nbytes = T * H * 2 + rows_written * H * 2
        report(f"permute, alignment {alignment}", time_ours(fn), torch_permute_times, nbytes)

    # ---- permute with the fused MXFP8 quantization, against permute then quantize ------------
    def torch_permute_mxfp8():
        rows, _ = torch_permute()
        b = rows.view(-1, 32).float()
        amax = b.abs().amax(-1, keepdim=True).clamp(min=1e-30)
        e = torch.floor(torch.log2(amax)) - 8
        return (b * torch.exp2(-e)).clamp(-448, 448).to(torch.float8_e4m3fn), (e + 127).to(torch.uint8)

    torch_mx_times = time_torch(torch_permute_mxfp8) if wanted("permute") else None
    for alignment in (32, 128) if wanted("permute") else ():
        fused = lambda: sfmoe.permute(
            tokens,
            ids,
            E,
            alignment=alignment,
            quantize="mxfp8",  # noqa: E731
            scale_layout="swizzled",
        )

        def separate():
            p = sfmoe.permute(tokens, ids, E, alignment=alignment)
            return sfmoe.quantize(
                p.rows, "mxfp8", group_offsets=p.group_offsets, row_alignment=alignment, scale_layout="swizzled"
            )

        out = fused()
        rows_written = int(out.group_offsets[-1])
        nbytes = T * H * 2 + rows_written * H * (1 + 1 / 32)
        fused_time = time_ours(fused)
        separate_time = time_ours(separate)
        report(f"permute + MXFP8 fused, alignment {alignment}", fused_time, torch_mx_times, nbytes)
        report(f"permute, then quantize (sfmoe), alignment {alignment}", separate_time, torch_mx_times)
        print(f"  fused / separate: {fused_time[0] / separate_time[0]:.2f}")
        results[-1]["fused_over_separate"] = fused_time[0] / separate_time[0]

    # ---- permute then FP8 per-tensor current scaling: the amax from permute (one read of the
    # rows by the quantization) against the quantization's own amax pass (two reads) -----------
    def torch_permute_fp8_tensor():
        rows, order = torch_permute()
        expert = ids.reshape(-1)[order].long()
        amax = torch.zeros(E, device=dev).scatter_reduce(0, expert, rows.float().abs().amax(-1), "amax")
        scale = 448.0 / amax.clamp(min=1e-30)
        return (rows.float() * scale[expert, None]).clamp(-448, 448).to(torch.float8_e4m3fn), 1.0 / scale

    if wanted("permute"):
        torch_fp8_times = time_torch(torch_permute_fp8_tensor)

        def with_amax():
            p = sfmoe.permute(tokens, ids, E, alignment=16, amax=True)
            return sfmoe.quantize(
                p.rows, "fp8_tensor", group_offsets=p.group_offsets, row_alignment=16, group_amax=p.amax
            )

        def without_amax():
            p = sfmoe.permute(tokens, ids, E, alignment=16)
            return sfmoe.quantize(p.rows, "fp8_tensor", group_offsets=p.group_offsets, row_alignment=16)

        permute_only = time_ours(lambda: sfmoe.permute(tokens, ids, E, alignment=16))
        permute_amax = time_ours(lambda: sfmoe.permute(tokens, ids, E, alignment=16, amax=True))
        report("permute, alignment 16, with the expert amax", permute_amax, torch_permute_times)
        print(
            f"  the amax costs {1e3 * (permute_amax[0] - permute_only[0]):.1f} us over permute alone "
            f"({1e3 * permute_only[0]:.1f} us)"
        )
        one_read, two_reads = time_ours(with_amax), time_ours(without_amax)
        report("permute + amax, then FP8 tensor given amax", one_read, torch_fp8_times)
        report("permute, then FP8 tensor (amax pass)", two_reads, torch_fp8_times)
        print(f"  one read / two reads: {one_read[0] / two_reads[0]:.2f}")
        results[-1]["one_read_over_two"] = one_read[0] / two_reads[0]

    # ---- unpermute ---------------------------------------------------------------------------
    permuted = sfmoe.permute(tokens, ids, E, alignment=16)
    torch_rows, order = torch_permute()

    def torch_unpermute():
        o = torch.zeros(T, H, device=dev, dtype=torch.float32)
        o.index_add_(0, order // K, torch_rows.float() * probs.reshape(-1)[order, None])
        return o.to(torch.bfloat16)

    if wanted("unpermute"):
        fn = lambda: sfmoe.unpermute(permuted.rows, permuted, probs)  # noqa: E731
        fn()
        report(
            "unpermute (prob-weighted combine)", time_ours(fn), time_torch(torch_unpermute), T * K * H * 2 + T * H * 2
        )

        d_out = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        fn = lambda: sfmoe.unpermute_backward(d_out, permuted.rows, permuted, probs)  # noqa: E731
        fn()
        kept_rows = int(permuted.group_offsets[-1])
        report(
            "unpermute backward (d rows fp32, d probs)",
            time_ours(fn),
            (float("nan"), None),
            T * H * 2 + T * K * H * 2 + kept_rows * H * 4,
        )
        fn = lambda: sfmoe.unpermute_backward(
            d_out,
            permuted.rows,
            permuted,
            probs,  # noqa: E731
            out_dtype="bf16",
        )
        fn()
        report(
            "unpermute backward (d rows bf16, d probs)",
            time_ours(fn),
            (float("nan"), None),
            T * H * 2 + T * K * H * 2 + kept_rows * H * 2,
        )
    del torch_rows, permuted

    # ---- SwiGLU on the FC1 output, rows = T k (+ alignment padding) ----------------------------
    if wanted("swiglu"):
        time_swiglu(dev, ids, report)

    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "bench_moe_ops_torch.json"), "w") as f:
            json.dump(dict(ceiling_TBps=ceiling, results=results), f, indent=1)


def time_swiglu(dev, ids, report):
    sizes = torch.bincount(ids.flatten(), minlength=E)
    padded = (sizes + 15) // 16 * 16
    offsets = torch.zeros(E + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(padded, 0)
    rows = int(offsets[-1])
    h = torch.randn(rows, 2 * FFN, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(rows, FFN, device=dev, dtype=torch.bfloat16)

    def torch_swiglu_fwd_bwd():
        x = h.detach().requires_grad_(True)
        g, u = x.chunk(2, dim=-1)
        y = F.silu(g) * u
        y.backward(dy)
        return y, x.grad

    def ours_fwd_bwd():
        y = sfmoe.grouped_activation(h, offsets, sizes, "swiglu")
        dx = sfmoe.grouped_activation_backward(h, dy, offsets, sizes, "swiglu", out_dtype="bf16")
        return y, dx

    ours_fwd_bwd()
    fwd_bytes = rows * (2 * FFN + FFN) * 2
    bwd_bytes = rows * (2 * FFN + FFN + 2 * FFN) * 2
    fn = lambda: sfmoe.grouped_activation(h, offsets, sizes, "swiglu")  # noqa: E731
    report(
        "SwiGLU forward [T k, 2 x 2048] bf16",
        time_ours(fn),
        time_torch(lambda: F.silu(h[:, :FFN]) * h[:, FFN:]),
        fwd_bytes,
    )
    report(
        "SwiGLU forward + backward", time_ours(ours_fwd_bwd), time_torch(torch_swiglu_fwd_bwd), fwd_bytes + bwd_bytes
    )

    # The forward with its output quantized on the fly, against the forward then sfmoe.quantize
    # (bytes: the input read once, codes and scales written once; NVFP4 reads the input twice).
    no_peer = (float("nan"), None)
    for recipe, code_bytes, layout in (("mxfp8", 1 + 1 / 32, "swizzled"), ("nvfp4", 0.5 + 1 / 16, "swizzled")):
        fused = lambda: sfmoe.grouped_activation(
            h,
            offsets,
            sizes,
            "swiglu",
            quantize=recipe,  # noqa: E731
            scale_layout=layout,
        )

        def separate():
            y = sfmoe.grouped_activation(h, offsets, sizes, "swiglu")
            return sfmoe.quantize(y, recipe, group_offsets=offsets, row_alignment=1, scale_layout=layout)

        fused()
        separate()
        fused_time, separate_time = time_ours(fused), time_ours(separate)
        report(f"SwiGLU forward + {recipe} fused", fused_time, no_peer, rows * (2 * FFN * 2 + FFN * code_bytes))
        report(f"SwiGLU forward, then quantize {recipe} (sfmoe)", separate_time, no_peer)
        print(f"  fused / separate: {fused_time[0] / separate_time[0]:.2f}")
        if recipe == "nvfp4":
            # The forward returns its group amax; the quantization takes it (group_amax) and reads
            # the activations once.
            def separate_given_amax():
                y, amax = sfmoe.grouped_activation(h, offsets, sizes, "swiglu", return_amax=True)
                return sfmoe.quantize(
                    y, recipe, group_offsets=offsets, row_alignment=1, scale_layout=layout, group_amax=amax
                )

            separate_given_amax()
            given_time = time_ours(separate_given_amax)
            report(f"SwiGLU fwd + amax, then {recipe} given it", given_time, no_peer)
            print(f"  fused / separate with the given amax: {fused_time[0] / given_time[0]:.2f}")


if __name__ == "__main__":
    main()
