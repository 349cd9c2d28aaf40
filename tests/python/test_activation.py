"""sfmoe.grouped_activation / grouped_activation_backward on NumPy arrays (the CPU backend): every
kind against NumPy in float64 on the real rows, zero padding rows, the backward against central
differences of the NumPy forward, and argument errors. Fresh random inputs each run (see
conftest.py)."""

import numpy as np
import pytest

import sfmoe


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def gelu(v):
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def numpy_activation(kind, x, limit=7.0, alpha=1.702):
    x = x.astype(np.float64)
    if kind in sfmoe._activation.GATED:
        f = x.shape[1] // 2
        g, u = x[:, :f], x[:, f:]
    else:
        g, u = x, None
    if kind == "swiglu":
        return g * sigmoid(g) * u
    if kind == "geglu":
        return gelu(g) * u
    if kind == "silu":
        return g * sigmoid(g)
    if kind == "gelu":
        return gelu(g)
    if kind == "squared_relu":
        return np.maximum(g, 0.0) ** 2
    gc, uc = np.minimum(g, limit), np.clip(u, -limit, limit)
    return gc * sigmoid(alpha * gc) * (uc + 1.0)


GROUP_OFFSETS = np.array([0, 16, 16, 48, 64], np.int64)
GROUP_ROWS = np.array([5, 0, 32, 1], np.int64)
REAL = np.concatenate([np.arange(o, o + n) for o, n in zip(GROUP_OFFSETS[:-1], GROUP_ROWS)])


@pytest.mark.parametrize("kind", sorted(sfmoe.ACTIVATIONS))
def test_forward_and_backward_match_numpy(rng, kind):
    f = 6
    cols = 2 * f if kind in sfmoe._activation.GATED else f
    x = rng.normal(scale=3.0, size=(GROUP_OFFSETS[-1] + 8, cols)).astype(np.float32)
    out = sfmoe.grouped_activation(x, GROUP_OFFSETS, GROUP_ROWS, kind)
    want = numpy_activation(kind, x)
    np.testing.assert_allclose(out[REAL], want[REAL], rtol=2e-5, atol=1e-6)
    padding = np.setdiff1d(np.arange(GROUP_OFFSETS[-1]), REAL)
    assert not out[padding].any(), "padding rows are zero"

    d_out = rng.normal(size=out.shape).astype(np.float32)
    d_x = sfmoe.grouped_activation_backward(x, d_out, GROUP_OFFSETS, GROUP_ROWS, kind)
    assert not d_x[padding].any()
    h = 1e-6
    x64 = x.astype(np.float64)
    for r in REAL[:: max(1, len(REAL) // 6)]:
        for j in range(cols):
            plus, minus = x64.copy(), x64.copy()
            plus[r, j] += h
            minus[r, j] -= h
            fd = ((numpy_activation(kind, plus)[r] - numpy_activation(kind, minus)[r]) @ d_out[r]) / (2 * h)
            assert abs(d_x[r, j] - fd) <= 1e-3 * abs(fd) + 1e-4, (kind, r, j, d_x[r, j], fd)


def test_activation_errors(rng):
    x = rng.normal(size=(64, 12)).astype(np.float32)
    with pytest.raises(ValueError, match="activation"):
        sfmoe.grouped_activation(x, GROUP_OFFSETS, GROUP_ROWS, "relu6")
    with pytest.raises(sfmoe.Error, match="does not fit"):
        sfmoe.grouped_activation(x, GROUP_OFFSETS, np.array([17, 0, 32, 1], np.int64), "silu")
    with pytest.raises(TypeError, match="int64"):
        sfmoe.grouped_activation(x, GROUP_OFFSETS.astype(np.int32), GROUP_ROWS, "silu")
    with pytest.raises(ValueError, match="even"):
        sfmoe.grouped_activation(x[:, :11], GROUP_OFFSETS, GROUP_ROWS, "swiglu")


def test_read_only_offsets_are_accepted(rng):
    x = rng.normal(size=(64, 12)).astype(np.float32)
    offsets, rows = GROUP_OFFSETS.copy(), GROUP_ROWS.copy()
    offsets.setflags(write=False)
    rows.setflags(write=False)
    out = sfmoe.grouped_activation(x, offsets, rows, "swiglu")
    d = sfmoe.grouped_activation_backward(x, np.ones_like(out), offsets, rows, "swiglu")
    assert out.shape == (64, 6) and d.shape == x.shape
