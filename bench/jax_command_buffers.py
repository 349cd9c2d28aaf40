"""Where sfmoe's custom calls run inside a jitted JAX training step on the GPU: the step
(value_and_grad of sfmoe.jax.moe_block, then an optax Adam update) is compiled under each set of
XLA flags in a child process, and the optimized HLO is read for

- the computation each sfmoe custom call sits in (XLA's HLO-level command-buffer scheduling moves
  runs of commands into computations named ``command_buffer*``; newer XLA forms command buffers
  from the thunk sequence instead, which its conversion pass logs, thunk by thunk, and which the
  run below reads),
- anything that would take the host into the step: host callbacks, send/recv, infeed/outfeed,
  copies to host memory;

then the step runs a few times with XLA's command-buffer thunk logging on, and the log lines that
say a command buffer was recorded, updated or launched are counted (the run-time side of the same
question; add ``--nsys`` to also take an Nsight Systems profile, when nsys is installed, and count its
graph launches against its kernel launches).

Usage: python3 bench/jax_command_buffers.py [--tokens T] [--nsys]. Prints one table row per flag
set; writes $OUT/jax_command_buffers.json (and the HLO texts) when OUT is set.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

FLAG_SETS = {
    "default": "",
    "custom calls in graphs of any size": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL "
    "--xla_gpu_graph_min_graph_size=1",
}
HOST_MARKERS = (
    "xla_python_host_callback",
    "xla_python_gpu_callback",
    "xla_ffi_python_gpu_callback",
    "xla_ffi_python_cpu_callback",
    " send(",
    " recv(",
    " infeed(",
    " outfeed(",
    "S(5)",  # host memory space
)


def computations(hlo):
    """The optimized HLO text split into {computation name: body}."""
    out, name, body = {}, None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if m and not line.startswith(" "):
            name, body = m.group(1), []
            continue
        if line.startswith("}") and name is not None:
            out[name] = "\n".join(body)
            name = None
            continue
        if name is not None:
            body.append(line)
    return out


def profile_steps(run_step, jax, steps=3):
    """CUPTI's view (through torch.profiler) of `steps` steps: the kernels that ran (sfmoe's own and
    its CUTLASS kernels, XLA's) and the launch calls it saw (graph launches, kernel launches,
    copies, synchronizations)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            out = run_step()
            jax.block_until_ready(out)
    path = "/tmp/sfmoe_jax_step_trace.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    counts = dict.fromkeys(
        ("graph_launches", "kernel_launch_calls", "memcpy_calls", "sync_calls", "sfmoe_kernels", "xla_kernels"), 0
    )
    for e in events:
        name, cat = e.get("name", ""), e.get("cat", "")
        if cat in ("cuda_runtime", "cuda_driver"):
            if "GraphLaunch" in name:
                counts["graph_launches"] += 1
            elif "LaunchKernel" in name:
                counts["kernel_launch_calls"] += 1
            elif "Memcpy" in name:
                counts["memcpy_calls"] += 1
            elif "Synchronize" in name:
                counts["sync_calls"] += 1
        elif cat == "kernel":
            ours = "sfmoe" in name or "cutlass::" in name  # (sfmoe's CUTLASS kernels too)
            counts["sfmoe_kernels" if ours else "xla_kernels"] += 1
    counts["steps"] = steps
    return counts


def child(tokens, out_dir):
    """Runs in the child process (XLA_FLAGS already set): compile, analyse, run, report JSON."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from sfmoe.jax import MoEConfig, moe_block

    H, F, E, k = (2048, 768, 128, 8) if jax.devices()[0].platform == "gpu" else (256, 128, 16, 4)
    config = MoEConfig(H, F, E, k, aux_loss_coeff=1e-2)
    rng = np.random.default_rng(0)
    params = dict(
        gate=jnp.asarray(rng.standard_normal((H, E)) * 0.02, jnp.float32),
        wi=jnp.asarray(rng.standard_normal((E, H, 2 * F)) * 0.02, jnp.bfloat16),
        wo=jnp.asarray(rng.standard_normal((E, F, H)) * 0.02, jnp.bfloat16),
    )
    opt = optax.adam(1e-3)
    state = opt.init(params)

    def loss(p, x, dy):
        y, aux, _ = moe_block(x, p["gate"], p["wi"], p["wo"], config)
        return (y.astype(jnp.float32) * dy).mean() + aux

    def step(p, s, x, dy):
        value, grads = jax.value_and_grad(loss)(p, x, dy)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    jitted = jax.jit(step, donate_argnums=(0, 1))
    x = jnp.asarray(rng.standard_normal((tokens, H)), jnp.bfloat16)
    dy = jnp.asarray(rng.standard_normal((tokens, H)), jnp.bfloat16)
    compiled = jitted.lower(params, state, x, dy).compile()
    hlo = compiled.as_text()
    comps = computations(hlo)
    where = {}
    for comp, body in comps.items():
        for target in re.findall(r'custom_call_target="(sfmoe_[^"]+)"', body):
            where.setdefault(target, []).append(comp)
    report = dict(
        backend=jax.devices()[0].device_kind,
        jax=jax.__version__,
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        sfmoe_calls=where,
        command_buffer_computations=sorted(c for c in comps if c.startswith("command_buffer")),
        host_markers=[m for m in HOST_MARKERS if m in hlo],
    )
    # the instructions' names (XLA names the thunks after them)
    report["sfmoe_instructions"] = re.findall(r'%([\w.\-]+) = [^\n]*custom_call_target="sfmoe_', hlo)
    if out_dir:
        tag = "min1" if "min_graph_size=1" in report["xla_flags"] else "default"
        with open(os.path.join(out_dir, f"step_hlo_{tag}.txt"), "w") as f:
            f.write(hlo)
    losses = []
    for i in range(6):  # new routings each step (new tokens): no recompilation
        x = jnp.asarray(np.random.default_rng(i + 1).standard_normal((tokens, H)), jnp.bfloat16)
        params, state, value = jitted(params, state, x, dy)
        losses.append(float(value))
    report["losses"] = losses
    times = []
    for _ in range(10):
        start = time.perf_counter()
        params, state, value = jitted(params, state, x, dy)
        jax.block_until_ready(value)
        times.append((time.perf_counter() - start) * 1e3)
    report["step_ms"] = statistics.median(times)
    carried = [params, state]  # (donated: each step's outputs feed the next)

    def one_step():
        carried[0], carried[1], value = jitted(carried[0], carried[1], x, dy)
        return value

    report["profile"] = profile_steps(one_step, jax)
    report["compilations"] = jitted._cache_size()
    print("REPORT " + json.dumps(report), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--nsys", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out_dir = os.environ.get("OUT", "")
    if args.child:
        child(args.tokens, out_dir)
        return
    rows = []
    for label, flags in FLAG_SETS.items():
        env = dict(
            os.environ,
            XLA_FLAGS=flags,
            TF_CPP_MIN_LOG_LEVEL="0",
            TF_CPP_VMODULE="command_buffer_thunk=2,command_buffer_conversion_pass=2",
        )
        cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens)]
        profile = None
        if args.nsys and shutil.which("nsys"):
            profile = os.path.join("/tmp", "sfmoe_step_" + ("min1" if "min_graph_size=1" in flags else "default"))
            cmd = ["nsys", "profile", "-t", "cuda", "-o", profile, "--force-overwrite", "true"] + cmd
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        lines = (run.stdout + run.stderr).splitlines()
        report = next((json.loads(line[7:]) for line in lines if line.startswith("REPORT ")), None)
        if report is None:
            print(f"{label}: the child failed (rc {run.returncode})\n" + "\n".join(lines[-30:]))
            continue
        log = [line for line in lines if "command_buffer" in line and not line.startswith("REPORT ")]
        report["label"] = label
        # XLA's thunk-level conversion (command_buffer_conversion_pass) names the thunks each
        # command buffer takes; which of sfmoe's calls are among them
        groups = [line.split("following thunks:", 1)[1] for line in lines if "Creating command buffer thunk" in line]
        thunks = [{t.strip() for t in g.split(",")} for g in groups]
        report["command_buffer_thunks"] = [len(t) for t in thunks]
        report["sfmoe_calls_in_command_buffer_thunks"] = [
            n for n in report["sfmoe_instructions"] if any(n in t for t in thunks)
        ]
        report["command_buffer_log_lines"] = len(log)
        report["command_buffer_log_sample"] = [line for line in log if "sfmoe" in line][:8] + log[:8]
        if profile:  # the CUDA API calls of the whole run: graph launches against kernel launches
            stats = subprocess.run(
                ["nsys", "stats", "-q", "--report", "cuda_api_sum", "--format", "csv", profile + ".nsys-rep"],
                capture_output=True,
                text=True,
                timeout=300,
            ).stdout.splitlines()
            report["nsys_cuda_api"] = [
                line for line in stats if re.search(r"Graph|LaunchKernel|Memcpy|Synchronize", line)
            ][:20]
        rows.append(report)
    print(
        f"{'flags':38} {'sfmoe calls in':40} {'HLO cmd bufs':>12} {'host ops':>9} {'compiles':>8} {'cb log':>7} {'step':>8}"
    )
    for r in rows:
        where = ", ".join(
            f"{t.replace('sfmoe_moe_', '')}: {'/'.join(sorted(set(c)))}" for t, c in r["sfmoe_calls"].items()
        )
        print(
            f"{r['label']:38} {where[:40]:40} {len(r['command_buffer_computations']):12d} "
            f"{len(r['host_markers']):9d} {r['compilations']:8d} {r['command_buffer_log_lines']:7d} {r['step_ms']:6.2f}ms"
        )
        print(
            f"    command buffer thunks (thunks in each): {r['command_buffer_thunks']}; sfmoe calls in them: "
            f"{len(r['sfmoe_calls_in_command_buffer_thunks'])} of {len(r['sfmoe_instructions'])}"
        )
        print("    profile of", json.dumps(r.get("profile")))
        for line in r["command_buffer_log_sample"] + r.get("nsys_cuda_api", []):
            print("   ", line[:200])
    if out_dir:
        with open(os.path.join(out_dir, "jax_command_buffers.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
