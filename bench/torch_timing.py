"""Timing helpers shared by the Python benchmarks (CUDA events through torch)."""

import torch


def median_ms(fn, runs=25, warmup=5, batch=10):
    """Median over `runs` of the mean time of `batch` back-to-back calls between two events: the
    batch keeps the stream busy, so Python's per-call overhead overlaps device work instead of
    being counted as idle time (a single call per event pair would add the launch gap). One
    untimed call goes first, so that the device is still busy with it when the start event is
    recorded: otherwise the first timed call's host work (tens of microseconds for a wrapper that
    validates its arguments) would be counted as device time."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # the lead call (untimed)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / batch)
    times.sort()
    return times[len(times) // 2]


def graphed_ms(fn, repeat, runs=15, warmup=3, batch=3):
    """Device time of one call of fn: `repeat` calls captured in one CUDA graph (after a warm-up
    on a side stream, as torch asks), the replay timed by median_ms, divided by `repeat` so that
    a replay's launch cost is spread over the calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            fn()
    return median_ms(graph.replay, runs=runs, warmup=warmup, batch=batch) / repeat


def copy_ceiling_tbps(device="cuda"):
    """Device-to-device copy rate of torch copy_ over 2 GiB (bytes read + written), in TB/s: the
    ceiling every memory-bound figure is compared with, measured in the caller's process."""
    big = torch.empty(2 * 1024**3 // 2, device=device, dtype=torch.bfloat16).normal_()
    big_out = torch.empty_like(big)
    copy_ms = median_ms(lambda: big_out.copy_(big))
    ceiling = 2 * big.numel() * 2 / (copy_ms * 1e-3) / 1e12
    del big, big_out
    torch.cuda.empty_cache()
    return ceiling
