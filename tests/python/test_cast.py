"""sfmoe.cast / quantize_fp8 / dequantize on NumPy arrays (the CPU backend), bit for bit against
the vectorized numerics, on fresh random inputs each run plus special values."""

import numpy as np
import pytest
import sfmoe
from sfmoe import numerics

ml_dtypes = pytest.importorskip("ml_dtypes", reason="the NumPy FP8/BF16 views need ml_dtypes")

# Special values overflow on purpose (Inf inputs, FP16 conversions of large values).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

SHAPES = [(0,), (1,), (31,), (33,), (993,), (8192,), (3, 5, 8), (2, 3, 4, 6), (2, 2, 2, 3, 4)]
FP8 = {"e4m3": sfmoe.DType.FP8_E4M3, "e5m2": sfmoe.DType.FP8_E5M2}
ENCODE = {
    sfmoe.DType.FP8_E4M3: numerics.f32_to_e4m3,
    sfmoe.DType.FP8_E5M2: numerics.f32_to_e5m2,
    sfmoe.DType.BF16: numerics.f32_to_bf16,
    sfmoe.DType.FP16: numerics.f32_to_fp16,
}
DECODE = {
    sfmoe.DType.FP8_E4M3: numerics.e4m3_to_f32,
    sfmoe.DType.FP8_E5M2: numerics.e5m2_to_f32,
    sfmoe.DType.BF16: numerics.bf16_to_f32,
    sfmoe.DType.FP16: numerics.fp16_to_f32,
}
# (mantissa bits, smallest subnormal) of the FP8 formats
FP8_GRID = {sfmoe.DType.FP8_E4M3: (3, 2.0**-9), sfmoe.DType.FP8_E5M2: (2, 2.0**-16)}

SPECIALS = np.array(
    [
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.17e-38,
        448.0,
        -448.0,
        464.0,
        57344.0,
        61440.0,
        1e38,
        -1e38,
        np.inf,
        -np.inf,
        np.nan,
        1.0625,
        1.1875,
        -2.125,
        0.001953125,
        0.0009765625,
        3e-5,
    ],
    np.float32,
)


def random_values(rng, shape, with_specials=True):
    """Normal values over many binades, with special values spliced in at random places."""
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    if with_specials and n:
        where = rng.choice(n, size=min(n, SPECIALS.size), replace=False)
        x[where] = SPECIALS[: where.size]
    return x.reshape(shape)


def codes_of(array):
    """The raw codes of a NumPy array whatever its element type (ml_dtypes or unsigned)."""
    return array.view(f"u{array.dtype.itemsize}")


def bits_equal(a, b):
    return np.array_equal(codes_of(np.asarray(a)), codes_of(np.asarray(b)))


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_quantize_with_given_scale_is_bit_exact(fmt, shape, rng):
    dtype = FP8[fmt]
    x = random_values(rng, shape)
    scale = np.float32(rng.uniform(0.01, 100))
    q = sfmoe.quantize_fp8(x, float(scale), fmt)
    assert q.dtype == dtype and q.recipe == "fp8_tensor"
    assert q.data.shape == x.shape
    assert q.data.dtype == np.dtype(getattr(ml_dtypes, {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt]))
    assert q.data.ctypes.data % 16 == 0
    assert bits_equal(q.data, ENCODE[dtype](x * scale))
    assert q.scale_inv.dtype == np.float32 and q.scale_inv.shape == ()
    assert q.scale_inv == np.float32(1.0) / scale
    out = sfmoe.dequantize(q)
    assert out.dtype == np.float32 and out.shape == x.shape
    assert np.array_equal(out, DECODE[dtype](q.data) * q.scale_inv, equal_nan=True)


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_error_is_at_most_half_an_fp8_ulp(fmt, shape, power_of_two, rng):
    dtype = FP8[fmt]
    x = random_values(rng, shape, with_specials=False)
    x.reshape(-1)[: min(x.size, 4)] = [0.0, -0.0, 1e-30, -3.5][: min(x.size, 4)]
    q = sfmoe.quantize_fp8(x, fmt=fmt, power_of_two=power_of_two)
    amax = np.float32(np.max(np.abs(x))) if x.size else np.float32(0)
    scale = numerics.fp8_scale_from_amax(amax, sfmoe.FP8_MAX[dtype], power_of_two)[()]
    assert q.scale_inv == np.float32(1.0) / scale
    assert bits_equal(q.data, ENCODE[dtype](x * scale))
    y = sfmoe.dequantize(q)
    mantissa_bits, smallest_subnormal = FP8_GRID[dtype]
    # Half an FP8 ulp of the scaled value, relative (normal range) or absolute (subnormal range),
    # plus the FP32 roundings of x * scale and q * scale_inv.
    bound = np.maximum(np.abs(x) * 2.0 ** -(mantissa_bits + 1), smallest_subnormal / 2 / scale)
    bound = bound * (1 + 2.0**-20) + np.abs(x) * 2.0**-20
    error = np.abs(y.astype(np.float64) - x.astype(np.float64))
    assert np.all(error <= bound), f"worst excess {np.max(error - bound)}"
    assert np.array_equal(np.signbit(y), np.signbit(x))


@pytest.mark.parametrize("out_name", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
@pytest.mark.parametrize("in_name", ["fp32", "bf16", "fp16"])
def test_cast_between_float_dtypes_is_bit_exact(in_name, out_name, rng):
    shape = (7, 66)
    x32 = random_values(rng, shape)
    in_dtype = sfmoe.as_dtype(in_name)
    x = (
        x32
        if in_dtype == sfmoe.DType.FP32
        else x32.astype({sfmoe.DType.BF16: ml_dtypes.bfloat16, sfmoe.DType.FP16: np.float16}[in_dtype])
    )
    scale = np.float32(rng.uniform(0.1, 10))
    y = sfmoe.cast(x, out_name, scale=float(scale))
    decoded = x.astype(np.float32)  # exact for BF16 / FP16
    scaled = decoded * scale
    out_dtype = sfmoe.as_dtype(out_name)
    if out_dtype == sfmoe.DType.FP32:
        assert y.dtype == np.float32 and np.array_equal(y, scaled, equal_nan=True)
    elif out_dtype == sfmoe.DType.FP4_E2M1:
        assert y.dtype == np.uint8 and y.shape == (7, 33)
        assert np.array_equal(y, numerics.pack_fp4(numerics.f32_to_e2m1(scaled)))
    else:
        assert y.shape == shape and bits_equal(y, ENCODE[out_dtype](scaled))


@pytest.mark.parametrize("in_name", ["fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
def test_cast_from_narrow_codes(in_name, rng):
    in_dtype = sfmoe.as_dtype(in_name)
    if in_dtype == sfmoe.DType.FP4_E2M1:
        codes = rng.integers(0, 256, (5, 8), dtype=np.uint8)  # packed: 16 elements per row
        decoded = numerics.e2m1_to_f32(numerics.unpack_fp4(codes))
    else:
        codes = rng.integers(0, 256, (5, 8), dtype=np.uint8)
        decoded = DECODE[in_dtype](codes)
    scale = np.float32(rng.uniform(0.1, 10))
    y = sfmoe.cast(codes, "fp32", scale=float(scale), input_dtype=in_name)
    assert y.shape == decoded.shape
    assert np.array_equal(y, decoded * scale, equal_nan=True)
    if in_dtype != sfmoe.DType.FP4_E2M1:  # ml_dtypes views carry their own dtype
        ml = codes.view(ml_dtypes.float8_e4m3fn if in_name == "fp8_e4m3" else ml_dtypes.float8_e5m2)
        assert np.array_equal(sfmoe.cast(ml, "fp32", scale=float(scale)), y, equal_nan=True)


def test_scale_given_as_an_array(rng):
    x = random_values(rng, (64,))
    by_number = sfmoe.cast(x, "e4m3", scale=3.0)
    by_array = sfmoe.cast(x, "e4m3", scale=np.array(3.0, np.float32))
    assert bits_equal(by_number, by_array)
    q = sfmoe.quantize_fp8(x, np.array([0.5], np.float32))
    assert bits_equal(q.data, numerics.f32_to_e4m3(x * np.float32(0.5))) and q.scale_inv == 2.0


def test_layouts_are_handled(rng):
    x = random_values(rng, (12, 40))
    want = numerics.f32_to_e5m2(x)
    assert bits_equal(sfmoe.cast(x, "e5m2"), want)
    # a transposed view, a misaligned view, more than four dimensions, a scalar
    assert bits_equal(sfmoe.cast(x.T, "e5m2"), want.T)
    flat = x.reshape(-1)
    assert bits_equal(sfmoe.cast(flat[1:], "e5m2"), want.reshape(-1)[1:])
    assert bits_equal(sfmoe.cast(x.reshape(2, 2, 3, 2, 20), "e5m2"), want.reshape(2, 2, 3, 2, 20))
    assert bits_equal(sfmoe.cast(x[3, 7], "e5m2"), want[3, 7])
    assert sfmoe.cast(np.zeros((0, 4), np.float32), "bf16").shape == (0, 4)


def test_out_argument(rng):
    x = random_values(rng, (4, 16))
    out = np.zeros((4, 16), np.uint8)
    result = sfmoe.cast(x, "e4m3", out=out)
    assert result is out and np.array_equal(out, numerics.f32_to_e4m3(x))
    out = np.zeros(64, ml_dtypes.float8_e4m3fn)  # any shape with the right count
    sfmoe.cast(x, "e4m3", out=out)
    assert np.array_equal(codes_of(out), numerics.f32_to_e4m3(x).reshape(-1))
    with pytest.raises(ValueError, match="read-only"):
        readonly = np.zeros((4, 16), np.uint8)
        readonly.flags.writeable = False
        sfmoe.cast(x, "e4m3", out=readonly)
    with pytest.raises(ValueError, match="C-contiguous"):
        sfmoe.cast(x, "e4m3", out=np.zeros((16, 4), np.uint8).T)
    with pytest.raises(TypeError, match="cannot hold"):
        sfmoe.cast(x, "e4m3", out=np.zeros((4, 16), np.float16))


def test_python_level_argument_errors(rng):
    x = random_values(rng, (4, 6))
    with pytest.raises(ValueError, match="unknown dtype name"):
        sfmoe.cast(x, "fp7")
    with pytest.raises(ValueError, match="not an sfmoe dtype"):
        sfmoe.cast(x, 42)
    with pytest.raises(TypeError, match="raw codes"):
        sfmoe.cast(np.zeros(4, np.uint8), "fp32")
    with pytest.raises(TypeError, match="float64 is not an sfmoe dtype|not an sfmoe dtype"):
        sfmoe.cast(np.zeros(4), "fp32")
    with pytest.raises(TypeError, match="expected a NumPy array"):
        sfmoe.cast([1.0, 2.0], "fp32")
    with pytest.raises(ValueError, match="innermost dimension must be even"):
        sfmoe.cast(np.zeros((2, 3), np.float32), "fp4_e2m1")
    with pytest.raises(ValueError, match="positive finite"):
        sfmoe.quantize_fp8(x, 0.0)
    with pytest.raises(ValueError, match="fmt"):
        sfmoe.quantize_fp8(x, 1.0, fmt="e3m4")
    with pytest.raises(TypeError, match="QuantizedTensor"):
        sfmoe.dequantize(x)


def test_without_ml_dtypes_outputs_are_raw_codes(rng, monkeypatch):
    import sfmoe._dtypes

    monkeypatch.setattr(sfmoe._dtypes, "ml_dtypes", None)
    x = random_values(rng, (8,))
    q = sfmoe.quantize_fp8(x, 2.0)
    assert q.data.dtype == np.uint8
    assert np.array_equal(q.data, numerics.f32_to_e4m3(x * np.float32(2.0)))
    assert sfmoe.cast(x, "bf16").dtype == np.uint16
    assert np.array_equal(sfmoe.dequantize(q), numerics.e4m3_to_f32(q.data) * np.float32(0.5), equal_nan=True)


def test_other_host_dlpack_arrays(rng):
    class HostArray:  # the DLPack protocol and nothing else
        def __init__(self, array):
            self._array = array

        def __dlpack__(self, **kwargs):
            return self._array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self._array.__dlpack_device__()

    x = random_values(rng, (3, 32))
    y = sfmoe.cast(HostArray(x), "e4m3")
    assert isinstance(y, np.ndarray) and bits_equal(y, numerics.f32_to_e4m3(x))


def test_library_information():
    info = sfmoe.build_info()
    assert info["version"] == sfmoe.__version__ == info["binding_header_version"]
    assert isinstance(info["has_cuda_backend"], bool)
    devices = sfmoe.device_info()
    assert devices["device_count"] >= 0
    if not info["has_cuda_backend"]:
        assert devices["device_count"] == 0
    assert sfmoe.DType.FP8_E4M3.c_name == "fp8_e4m3" and sfmoe.DType.FP4_E2M1.bits == 4
