"""The main command's demo (tools/train_demo.py) for a few steps: it trains (the loss falls), and
writes its plot, table and JSON."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed; the demo needs it")
pytest.importorskip("matplotlib", reason="matplotlib is not installed; the demo's plot needs it")
pytest.importorskip("tqdm", reason="tqdm is not installed; the demo's progress bar needs it")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_demo_trains_and_writes_its_outputs(tmp_path):
    demo = os.path.join(ROOT, "tools", "train_demo.py")
    run = subprocess.run(
        [sys.executable, demo, "--steps", "40", "--out", str(tmp_path), "--device", "cpu", "--recipes", "bf16,nvfp4"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    for name in ("loss.png", "results.md", "results.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["recipe"] for r in results] == ["bf16", "nvfp4"]
    for r in results:
        first, last = r["losses"][0][1], r["losses"][-1][1]
        assert last < 0.75 * first, f"{r['recipe']}: loss {first:.3f} -> {last:.3f}"
        assert r["final_loss"] < 0.75 * first, f"{r['recipe']}: held-out loss {r['final_loss']:.3f}"
        assert sum(r["first_block_tokens_per_expert"]) > 0
