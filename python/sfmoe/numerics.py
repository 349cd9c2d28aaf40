"""sfmoe's numerics over NumPy arrays: the very functions the CPU and CUDA backends run
(include/sfmoe/numerics/), element by element, for tests and for inspecting what a recipe does.

Narrow results are raw codes: E4M3 / E5M2 / E2M1 / E8M0 as uint8 (E2M1 one code per byte, in the
low nibble), BF16 / FP16 as uint16. Inputs are converted to float32 only where that is exact;
anything else is refused rather than rounded twice. :func:`pack_fp4` / :func:`unpack_fp4` convert
between one E2M1 code per byte and the packed layout of sfmoe's FP4 tensors (two per byte,
element 2i in the low nibble).
"""

import numpy as np

from . import _C

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0

__all__ = [
    "E4M3_MAX",
    "E5M2_MAX",
    "E2M1_MAX",
    "f32_to_e4m3",
    "f32_to_e5m2",
    "f32_to_e2m1",
    "f32_to_bf16",
    "f32_to_fp16",
    "f32_to_e8m0",
    "e4m3_to_f32",
    "e5m2_to_f32",
    "e2m1_to_f32",
    "bf16_to_f32",
    "fp16_to_f32",
    "e8m0_to_f32",
    "fp8_scale_from_amax",
    "scale_inverse",
    "mx_scale_from_amax",
    "mx_multiplier",
    "nvfp4_global_encode_scale",
    "nvfp4_block_scale",
    "nvfp4_block_multiplier",
    "philox_random_bits",
    "f32_to_e2m1_stochastic",
    "hadamard16_transform",
    "pack_fp4",
    "unpack_fp4",
]


def _as_f32(x, what):
    a = np.asarray(x)
    if a.dtype != np.float32:
        if a.dtype.kind not in "biuf" and a.dtype.num < 256:
            raise TypeError(f"{what}: expected real numbers, got {a.dtype}")
        converted = a.astype(np.float32)
        back = converted.astype(a.dtype)
        exact = np.all(back == a) if a.dtype.kind in "biu" else np.array_equal(back, a, equal_nan=True)
        if not exact:
            raise ValueError(f"{what}: {a.dtype} values that float32 cannot hold exactly; convert explicitly")
        a = converted
    return np.ascontiguousarray(a).reshape(a.shape)


def _as_codes(x, code_type, what):
    a = np.asarray(x)
    target = np.dtype(code_type)
    if a.dtype == target:
        return np.ascontiguousarray(a).reshape(a.shape)
    if a.dtype.num >= 256 and a.dtype.itemsize == target.itemsize:  # ml_dtypes: the bits as codes
        return np.ascontiguousarray(a).reshape(a.shape).view(target)
    if a.dtype.kind in "iu":
        info = np.iinfo(target)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise ValueError(f"{what}: codes must lie in [{info.min}, {info.max}]")
        return a.astype(target)
    raise TypeError(f"{what}: expected {target} codes, got {a.dtype}")


def _map(function, x, out_type, *parameters):
    """out[i] = function(x[i], *parameters), by the extension's element map `function`."""
    out = np.empty(x.shape, out_type)
    function(x, out, *parameters)
    return out


def _f32_scalar(value):
    """A scalar parameter as the float32 the C function takes, handed over as a Python float."""
    return float(np.float32(value))


def f32_to_e4m3(x):
    """E4M3 codes (uint8) of x: round to nearest even, saturate to +-448, NaN -> 0x7F."""
    return _map(_C.f32_to_e4m3, _as_f32(x, "x"), np.uint8)


def f32_to_e5m2(x):
    """E5M2 codes (uint8) of x: round to nearest even, saturate to +-57344, NaN -> 0x7F."""
    return _map(_C.f32_to_e5m2, _as_f32(x, "x"), np.uint8)


def f32_to_e2m1(x):
    """E2M1 codes of x, one per byte (uint8 in 0..15): nearest even, saturate to +-6, NaN -> 0x7."""
    return _map(_C.f32_to_e2m1, _as_f32(x, "x"), np.uint8)


def f32_to_bf16(x):
    """BF16 bits (uint16) of x: round to nearest even, IEEE overflow to Inf, NaN -> 0x7FFF."""
    return _map(_C.f32_to_bf16, _as_f32(x, "x"), np.uint16)


def f32_to_fp16(x):
    """FP16 bits (uint16) of x: round to nearest even, IEEE overflow to Inf, NaN -> 0x7FFF."""
    return _map(_C.f32_to_fp16, _as_f32(x, "x"), np.uint16)


def f32_to_e8m0(x):
    """E8M0 codes (uint8) of |x| rounded up to a power of two (NaN 255, Inf 254, 0 -> 0)."""
    return _map(_C.f32_to_e8m0, _as_f32(x, "x"), np.uint8)


def e4m3_to_f32(codes):
    return _map(_C.e4m3_to_f32, _as_codes(codes, np.uint8, "codes"), np.float32)


def e5m2_to_f32(codes):
    return _map(_C.e5m2_to_f32, _as_codes(codes, np.uint8, "codes"), np.float32)


def e2m1_to_f32(codes):
    """Values of E2M1 codes held one per byte (the high nibble is ignored)."""
    return _map(_C.e2m1_to_f32, _as_codes(codes, np.uint8, "codes"), np.float32)


def bf16_to_f32(codes):
    return _map(_C.bf16_to_f32, _as_codes(codes, np.uint16, "codes"), np.float32)


def fp16_to_f32(codes):
    return _map(_C.fp16_to_f32, _as_codes(codes, np.uint16, "codes"), np.float32)


def e8m0_to_f32(codes):
    """2^(e - 127); code 0 is 2^-127, code 255 NaN."""
    return _map(_C.e8m0_to_f32, _as_codes(codes, np.uint8, "codes"), np.float32)


def fp8_scale_from_amax(amax, fp8_max=E4M3_MAX, power_of_two=False):
    """FP8 per-tensor / blockwise scale: fp8_max / amax (FP32, RN); amax 0, Inf or NaN -> 1; an
    infinite quotient -> FLT_MAX; power_of_two clears the mantissa."""
    a = _as_f32(amax, "amax")
    return _map(_C.fp8_scale_from_amax, a, np.float32, _f32_scalar(fp8_max), bool(power_of_two))


def scale_inverse(scale):
    """1 / scale (FP32, RN): what is stored next to FP8 data."""
    return _map(_C.scale_inverse, _as_f32(scale, "scale"), np.float32)


def mx_scale_from_amax(amax, fp8_max=E4M3_MAX):
    """MXFP8 E8M0 block scale codes: to_e8m0(amax * (1 / fp8_max)), rounding up."""
    a = _as_f32(amax, "amax")
    return _map(_C.mx_scale_from_amax, a, np.uint8, _f32_scalar(fp8_max))


def mx_multiplier(codes):
    """MXFP8 element multipliers 2^(127 - e) (FP32 bits (254 - e) << 23)."""
    return _map(_C.mx_multiplier, _as_codes(codes, np.uint8, "codes"), np.float32)


def nvfp4_global_encode_scale(global_amax):
    """S_enc = min(448 * 6 / amax, FLT_MAX); 1 when amax is 0 or S_enc is 0."""
    return _map(_C.nvfp4_global_encode_scale, _as_f32(global_amax, "global_amax"), np.float32)


def nvfp4_block_scale(block_amax, global_encode_scale):
    """E4M3 codes of the NVFP4 block scales e4m3(block_amax * (S_enc / 6))."""
    a = _as_f32(block_amax, "block_amax")
    return _map(_C.nvfp4_block_scale, a, np.uint8, _f32_scalar(global_encode_scale))


def nvfp4_block_multiplier(block_scale_codes, global_encode_scale):
    """NVFP4 element multipliers min(1 / (float(s_b) * (1 / S_enc)), FLT_MAX)."""
    c = _as_codes(block_scale_codes, np.uint8, "block_scale_codes")
    return _map(_C.nvfp4_block_multiplier, c, np.float32, _f32_scalar(global_encode_scale))


def _uint64(value, what):
    value = int(value)
    if not 0 <= value < 2**64:
        raise ValueError(f"{what}: must lie in [0, 2**64)")
    return value


def philox_random_bits(seed, offset, index):
    """The 32 random bits (uint32) of elements `index` of the Philox4x32-10 stream
    (seed, offset)."""
    i = np.asarray(index)
    if i.dtype.kind not in "iu":
        raise TypeError(f"index: expected integers, got {i.dtype}")
    if i.size and i.min() < 0:
        raise ValueError("index: must be non-negative")
    i = np.ascontiguousarray(i.astype(np.uint64)).reshape(i.shape)
    out = np.empty(i.shape, np.uint32)
    _C.philox_random_bits(_uint64(seed, "seed"), _uint64(offset, "offset"), i, out)
    return out


def f32_to_e2m1_stochastic(x, random_bits):
    """E2M1 codes (uint8) of x, rounded up with probability equal to the fraction of the way to
    the next magnitude (using random_bits, uint32, one per element)."""
    a = _as_f32(x, "x")
    bits = _as_codes(random_bits, np.uint32, "random_bits")
    if bits.shape != a.shape:
        raise ValueError(f"random_bits: shape {bits.shape} differs from x's {a.shape}")
    out = np.empty(a.shape, np.uint8)
    _C.f32_to_e2m1_stochastic(a, bits, out)
    return out


def hadamard16_transform(x):
    """The 16-point random Hadamard transform of each consecutive block of 16 values of x."""
    a = _as_f32(x, "x")
    if a.size % 16:
        raise ValueError(f"x: the size must be a multiple of 16 (got {a.size})")
    return _map(_C.hadamard16_transform, a, np.float32)


def pack_fp4(codes):
    """One E2M1 code per byte [..., 2n] -> packed bytes [..., n] (element 2i in the low nibble)."""
    c = _as_codes(codes, np.uint8, "codes")
    if c.ndim == 0 or c.shape[-1] % 2:
        raise ValueError(f"codes: the innermost dimension must be even (got shape {c.shape})")
    return ((c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)).astype(np.uint8)


def unpack_fp4(packed):
    """Packed FP4 bytes [..., n] -> one E2M1 code per byte [..., 2n]."""
    p = _as_codes(packed, np.uint8, "packed")
    if p.ndim == 0:
        raise ValueError("packed: needs at least one dimension")
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out
