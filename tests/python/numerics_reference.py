"""Independent, slow-but-obvious references for sfmoe's numerics, written from the format
definitions (DESIGN.md section 4), not from the library's code.

A narrow format is its exponent width, mantissa width, bias and special codes. Its positive
finite values are listed by decoding every code; encoding picks the nearest listed value by
comparing against midpoints (exact in float64: every value involved has few significant bits),
ties going to the even code. Saturating formats clamp everything at or beyond the largest finite
value; IEEE formats (BF16, FP16) overflow to Inf, modelled as one more value at 2^(emax+1).
"""

import math
from fractions import Fraction

import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)


class Format:
    def __init__(self, name, exponent_bits, mantissa_bits, bias, max_code, nan_code, ieee):
        self.name = name
        self.exponent_bits = exponent_bits
        self.mantissa_bits = mantissa_bits
        self.bias = bias
        self.max_code = max_code  # largest finite magnitude code
        self.nan_code = nan_code  # what NaN encodes to
        self.ieee = ieee  # True: overflow gives Inf (BF16, FP16); False: saturate (FP8, FP4)
        self.sign_bit = 1 << (exponent_bits + mantissa_bits)
        self.values = np.array([self.magnitude(c) for c in range(max_code + 1)], np.float64)
        assert np.all(np.diff(self.values) > 0)
        if ieee:
            # Round-to-nearest-even with an unbounded exponent, then anything at or past the
            # next power of two is Inf: the Inf code sits where that power of two would be.
            self.values = np.append(self.values, 2.0 ** (2**exponent_bits - 1 - bias))
        self.codes = np.arange(len(self.values), dtype=np.int64)

    def magnitude(self, code):
        """The value of a positive code as a normal/subnormal number (specials not handled)."""
        exponent = code >> self.mantissa_bits
        mantissa = code & ((1 << self.mantissa_bits) - 1)
        if exponent == 0:
            return math.ldexp(mantissa, 1 - self.bias - self.mantissa_bits)
        return math.ldexp((1 << self.mantissa_bits) + mantissa, exponent - self.bias - self.mantissa_bits)

    def decode(self, code):
        """Python float of a code (NaN and Inf per the format)."""
        sign = -1.0 if code & self.sign_bit else 1.0
        magnitude = code & (self.sign_bit - 1)
        all_ones = (1 << self.exponent_bits) - 1
        exponent = magnitude >> self.mantissa_bits
        if self.name == "e4m3" and magnitude == self.sign_bit - 1:
            return math.nan
        if self.name in ("e5m2", "bf16", "fp16") and exponent == all_ones:
            mantissa = magnitude & ((1 << self.mantissa_bits) - 1)
            return math.nan if mantissa else sign * math.inf
        return math.copysign(self.magnitude(magnitude), sign)

    def encode(self, x):
        """Codes (int64) of float64 values x: RN-even, saturating or IEEE overflow, NaN canonical,
        the sign of zero kept."""
        x = as_f64(x)
        a = np.abs(x)
        values = self.values
        top = len(values) - 1
        hi = np.clip(np.searchsorted(values, np.where(np.isnan(a), 0.0, a), side="left"), 0, top)
        lo = np.maximum(hi - 1, 0)
        midpoint = (values[lo] + values[hi]) / 2
        exact = values[hi] == a
        pick_hi = exact | (a > midpoint) | ((a == midpoint) & (self.codes[hi] % 2 == 0))
        code = np.where(pick_hi, self.codes[hi], self.codes[lo])
        code = np.where(a >= values[top], self.codes[top], code)  # saturate / Inf
        code = np.where(np.signbit(x), code | self.sign_bit, code)
        code = np.where(np.isnan(x), self.nan_code, code)
        return code.astype(np.int64)


E4M3 = Format("e4m3", 4, 3, 7, max_code=0x7E, nan_code=0x7F, ieee=False)
E5M2 = Format("e5m2", 5, 2, 15, max_code=0x7B, nan_code=0x7F, ieee=False)
E2M1 = Format("e2m1", 2, 1, 1, max_code=0x7, nan_code=0x7, ieee=False)
BF16 = Format("bf16", 8, 7, 127, max_code=0x7F7F, nan_code=0x7FFF, ieee=True)
FP16 = Format("fp16", 5, 10, 15, max_code=0x7BFF, nan_code=0x7FFF, ieee=True)


def as_f64(x):
    """float64 copy of x (exact for float32 input; signalling NaNs quietly become NaNs)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(x, np.float64)


def all_bf16_as_f32():
    """Every BF16 bit pattern, as the float32 it denotes (65536 values)."""
    return (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)


def f32_from_bits(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def e8m0_encode(x):
    """|x| rounded up to a power of two, as a biased exponent saturating to [0, 254]; NaN 255,
    Inf 254."""
    out = []
    for v in as_f64(x).ravel():
        if math.isnan(v):
            out.append(255)
            continue
        v = abs(v)
        if math.isinf(v):
            out.append(254)
            continue
        if v == 0:
            out.append(0)
            continue
        mantissa, exponent = math.frexp(v)  # v = mantissa * 2^exponent, mantissa in [0.5, 1)
        power = exponent - 1 if mantissa == 0.5 else exponent  # smallest 2^power >= v
        out.append(min(max(power + 127, 0), 254))
    return np.array(out, np.int64).reshape(np.shape(x))


def f32(x):
    return np.float32(x)


def fp8_scale_from_amax(amax, fp8_max, power_of_two):
    amax = f32(amax)
    scale = f32(1.0)
    if amax > 0 and not math.isinf(amax):
        with np.errstate(over="ignore"):
            scale = f32(fp8_max) / amax
        if math.isinf(scale):
            scale = f32(FLT_MAX)
    if power_of_two:
        scale = (np.array([scale], np.float32).view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)[0]
    return f32(scale)


def min_num(a, b):
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return min(a, b)


def nvfp4_global_encode_scale(amax):
    amax = f32(amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        encode = f32(min_num(f32(448.0 * 6.0) / amax, f32(FLT_MAX)))
    if amax == 0 or encode == 0:
        return f32(1.0)
    return encode


# ---- Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) ---------
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
MASK32 = 0xFFFFFFFF


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = PHILOX_M0 * c0
        p1 = PHILOX_M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & MASK32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & MASK32,
        )
        k0 = (k0 + PHILOX_W0) & MASK32
        k1 = (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def philox_random_bits(seed, offset, index):
    """Element `index` of stream (seed, offset): counter (index // 4, offset), key seed, word
    index % 4 (the stream layout include/sfmoe/numerics/random.h states)."""
    block = index >> 2
    counter = (block & MASK32, block >> 32, offset & MASK32, offset >> 32)
    return philox4x32_10(counter, (seed & MASK32, seed >> 32))[index & 3]


def e2m1_stochastic(x, random_bits):
    """Stochastic rounding to E2M1: between neighbours lo <= |x| < hi, round up iff
    random_bits < floor(frac * 2^32) with frac = (|x| - lo) / (hi - lo), computed exactly."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return int(E2M1.encode([x])[0])
    sign = 0x8 if math.copysign(1.0, x) < 0 else 0
    a = Fraction(abs(x))
    magnitudes = [Fraction(v) for v in E2M1.values]
    if a >= magnitudes[-1]:
        return sign | 0x7
    lo_index = max(i for i, v in enumerate(magnitudes) if v <= a)
    lo, hi = magnitudes[lo_index], magnitudes[lo_index + 1]
    threshold = math.floor((a - lo) / (hi - lo) * 2**32)
    return sign | (lo_index + 1 if random_bits < threshold else lo_index)


HADAMARD_SIGNS = np.array([1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1], np.float64)


def hadamard16(x):
    """H16 diag(signs) x / 4 per block of 16, in float64; Sylvester's H16[i][j] is
    (-1)^popcount(i & j)."""
    i = np.arange(16)
    h = np.where(np.vectorize(lambda v: bin(v).count("1") % 2)(i[:, None] & i[None, :]), -1.0, 1.0)
    blocks = np.asarray(x, np.float64).reshape(-1, 16)
    return ((blocks * HADAMARD_SIGNS) @ h.T / 4.0).reshape(np.shape(x))
