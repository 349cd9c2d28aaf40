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


def _grouped_rows(rng, groups=5, alignment=32):
    rows = np.array([3, 0, 40, 17, 1][:groups], np.int64)
    offsets = np.zeros(groups + 1, np.int64)
    offsets[1:] = np.cumsum((rows + alignment - 1) // alignment * alignment)
    return offsets, rows


def test_group_amax_is_the_largest_magnitude_of_the_real_rows(rng):
    offsets, rows = _grouped_rows(rng)
    x = (rng.normal(size=(int(offsets[-1]) + 8, 2 * 96)) * 3).astype(np.float32)
    x[offsets[3], 5] = np.nan  # a NaN in a real row makes its group's amax NaN
    y, amax = sfmoe.grouped_activation(x, offsets, rows, "swiglu", out_dtype="fp32", return_amax=True)
    for g in range(len(rows)):
        real = y[offsets[g] : offsets[g] + rows[g]]
        if rows[g] == 0:
            assert amax[g] == 0.0
        elif np.isnan(real).any():
            assert np.isnan(amax[g])
        else:
            assert amax[g] == np.abs(real).max()


@pytest.mark.parametrize(
    "recipe,layout,cols",
    [
        ("mxfp8", "swizzled", 96),
        ("mxfp8", "compact", 64),
        ("fp8_block_1x128", "compact", 128),
        ("nvfp4", "compact", 64),
        ("nvfp4", "swizzled", 48),
    ],
)
def test_fused_output_quantization_is_the_quantized_fp32_activations(recipe, layout, cols, rng):
    offsets, rows = _grouped_rows(rng)
    capacity = int(offsets[-1]) + 8
    x = (rng.normal(size=(capacity, 2 * cols)) * 3).astype(np.float32)
    q = sfmoe.grouped_activation(x, offsets, rows, "swiglu", quantize=recipe, scale_layout=layout)
    y = sfmoe.grouped_activation(x, offsets, rows, "swiglu", out_dtype="fp32")
    want = sfmoe.quantize(
        y, recipe, group_offsets=offsets, row_alignment=1, out_row_capacity=capacity, scale_layout=layout
    )
    end = int(offsets[-1])
    np.testing.assert_array_equal(q.data[:end].view(np.uint8), want.data[:end].view(np.uint8))
    np.testing.assert_array_equal(
        q.compact_scale_inv()[:end].view(np.uint8), want.compact_scale_inv()[:end].view(np.uint8)
    )
    np.testing.assert_array_equal(q.group_offsets, offsets)
    if recipe == "nvfp4":  # the global scales come from the activations' group amax
        np.testing.assert_array_equal(q.amax.view(np.uint32), want.amax.view(np.uint32))
    with pytest.raises(sfmoe.Error):
        sfmoe.grouped_activation(x, offsets, rows, "swiglu", quantize="fp8_tensor")


def test_fused_tensor_quantization_with_given_scales(rng):
    """fp8_tensor with given per-group scales: the quantized FP32 activations with those scales;
    the tensor's amax is the activations' group amax (also what return_amax gives)."""
    offsets, rows = _grouped_rows(rng)
    capacity, cols = int(offsets[-1]) + 8, 48
    x = (rng.normal(size=(capacity, 2 * cols)) * 3).astype(np.float32)
    scales = np.exp2(rng.uniform(-2, 9, size=len(rows))).astype(np.float32)
    q, amax = sfmoe.grouped_activation(
        x, offsets, rows, "swiglu", quantize="fp8_tensor", tensor_scales=scales, return_amax=True
    )
    y, y_amax = sfmoe.grouped_activation(x, offsets, rows, "swiglu", out_dtype="fp32", return_amax=True)
    want = sfmoe.quantize(
        y, "fp8_tensor", group_offsets=offsets, row_alignment=1, out_row_capacity=capacity, tensor_scales=scales
    )
    end = int(offsets[-1])
    np.testing.assert_array_equal(q.data[:end].view(np.uint8), want.data[:end].view(np.uint8))
    np.testing.assert_array_equal(q.scale_inv, want.scale_inv)
    np.testing.assert_array_equal(q.amax, want.amax)
    np.testing.assert_array_equal(amax, y_amax)
