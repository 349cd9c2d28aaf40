"""The library's numerics (sfmoe.numerics, i.e. include/sfmoe/numerics/ run on the host) against
independent references written from the format definitions, exhaustively where the input space
allows it (all 65536 BF16 bit patterns), and against ml_dtypes where it defines the same thing."""

import math

import numerics_reference as ref
import numpy as np
import pytest
from sfmoe import numerics

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes cross-checks need ml_dtypes")

ALL_BF16 = ref.all_bf16_as_f32()

ENCODERS = [
    ("e4m3", numerics.f32_to_e4m3, ref.E4M3, "float8_e4m3fn", 448.0),
    ("e5m2", numerics.f32_to_e5m2, ref.E5M2, "float8_e5m2", 57344.0),
    ("e2m1", numerics.f32_to_e2m1, ref.E2M1, "float4_e2m1fn", 6.0),
]


def special_f32():
    bits = [
        0x00000000,
        0x80000000,  # +-0
        0x00000001,
        0x80000001,
        0x007FFFFF,
        0x00400000,  # FP32 subnormals
        0x00800000,
        0x7F7FFFFF,
        0xFF7FFFFF,  # min normal, +-FLT_MAX
        0x7F800000,
        0xFF800000,  # +-Inf
        0x7FC00000,
        0xFFC00000,
        0x7F800001,
        0xFFFFFFFF,  # NaNs, signalling and negative
    ]
    return ref.f32_from_bits(bits)


def random_f32(rng, n):
    return rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def around_grid(fmt, rng):
    """Each representable value and its neighbours half a step away and slightly off (ties and
    near-ties of the rounding), both signs."""
    v = fmt.values[fmt.values <= ref.FLT_MAX].astype(np.float32)  # not the IEEE formats' Inf
    up = np.nextafter(v, np.float32(np.inf))
    down = np.nextafter(v, np.float32(0))
    mid = (fmt.values[:-1] + fmt.values[1:]) / 2
    mid = mid[mid <= ref.FLT_MAX].astype(np.float32)
    x = np.concatenate([v, up, down, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))])
    return np.concatenate([x, -x]).astype(np.float32)


@pytest.mark.parametrize("name, encode, fmt, ml_name, fmt_max", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_encode_all_bf16_patterns_match_reference(name, encode, fmt, ml_name, fmt_max):
    got = encode(ALL_BF16).astype(np.int64)
    want = fmt.encode(ALL_BF16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{name}: {bad.size} mismatches, first: bf16 bits {hex(bad[0])} = {ALL_BF16[bad[0]]!r} "
        f"-> {hex(got[bad[0]])}, expected {hex(want[bad[0]])}"
    )


@pytest.mark.parametrize("name, encode, fmt, ml_name, fmt_max", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_encode_random_and_grid_f32_match_reference(name, encode, fmt, ml_name, fmt_max, rng):
    x = np.concatenate(
        [
            random_f32(rng, 200_000),
            around_grid(fmt, rng),
            special_f32(),
            rng.uniform(-2 * fmt_max, 2 * fmt_max, 100_000).astype(np.float32),
        ]
    )
    got = encode(x).astype(np.int64)
    want = fmt.encode(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{name}: {x[bad[:5]]} -> {got[bad[:5]]}, expected {want[bad[:5]]}"


@pytest.mark.parametrize("name, encode, fmt, ml_name, fmt_max", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_encode_special_values(name, encode, fmt, ml_name, fmt_max):
    sign = fmt.sign_bit
    max_code = fmt.max_code
    nan_code = fmt.nan_code
    negative_nan = ref.f32_from_bits([0xFFC00000])[0]
    cases = [
        (0.0, 0),
        (-0.0, sign),  # the sign of zero is kept
        (math.inf, max_code),
        (-math.inf, sign | max_code),  # saturation
        (1e30, max_code),
        (-1e30, sign | max_code),
        (fmt_max, max_code),
        (-fmt_max, sign | max_code),
        (math.nan, nan_code),
        (negative_nan, nan_code),  # canonical NaN (E2M1: +6), any sign
        (-1e-30, sign),  # underflow keeps the sign
    ]
    x = np.array([value for value, _ in cases], np.float32)
    got = encode(x)
    assert [int(c) for c in got] == [code for _, code in cases]
    # The canonical NaN codes stated in DESIGN.md section 4.
    assert int(encode(np.array([np.nan], np.float32))[0]) == {"e4m3": 0x7F, "e5m2": 0x7F, "e2m1": 0x7}[name]


@pytest.mark.parametrize("name, encode, fmt, ml_name, fmt_max", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_encode_ties_to_even(name, encode, fmt, ml_name, fmt_max):
    # Midpoints between neighbouring values go to the neighbour with the even code.
    lo, hi = fmt.values[1 : fmt.max_code], fmt.values[2 : fmt.max_code + 1]
    mids = ((lo + hi) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (lo + hi) / 2)  # exactly representable midpoints
    got = encode(mids).astype(np.int64)
    codes = np.arange(1, fmt.max_code)
    assert np.array_equal(got, np.where(codes % 2 == 0, codes, codes + 1))


@pytest.mark.parametrize("name, encode, fmt, ml_name, fmt_max", ENCODERS, ids=[e[0] for e in ENCODERS])
def test_encode_matches_ml_dtypes_in_range(name, encode, fmt, ml_name, fmt_max, rng):
    if not hasattr(ml_dtypes, ml_name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {ml_name}")
    ml_type = getattr(ml_dtypes, ml_name)
    x = np.concatenate([ALL_BF16, random_f32(rng, 100_000), around_grid(fmt, rng)])
    # ml_dtypes turns overflow into NaN / Inf instead of saturating: compare in-range values only.
    x = x[np.isfinite(x) & (np.abs(x) <= fmt_max)]
    got = encode(x)
    want = x.astype(ml_type).view(np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{name}: {x[bad[:5]]} -> {got[bad[:5]]}, ml_dtypes {want[bad[:5]]}"


@pytest.mark.parametrize(
    "name, decode, fmt, ml_name",
    [
        ("e4m3", numerics.e4m3_to_f32, ref.E4M3, "float8_e4m3fn"),
        ("e5m2", numerics.e5m2_to_f32, ref.E5M2, "float8_e5m2"),
    ],
    ids=["e4m3", "e5m2"],
)
def test_decode_every_fp8_code(name, decode, fmt, ml_name):
    codes = np.arange(256, dtype=np.uint8)
    got = decode(codes)
    want = np.array([fmt.decode(int(c)) for c in codes], np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].astype(np.float64), want[finite])
    assert np.array_equal(np.signbit(got[finite]), np.signbit(want[finite]))
    assert np.array_equal(got, codes.view(getattr(ml_dtypes, ml_name)).astype(np.float32), equal_nan=True)


def test_decode_every_e2m1_code_ignores_high_nibble():
    codes = np.arange(256, dtype=np.uint8)
    got = numerics.e2m1_to_f32(codes)
    want = np.array([ref.E2M1.decode(int(c) & 0xF) for c in codes], np.float64)
    assert np.array_equal(got.astype(np.float64), want)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    assert list(got[:8]) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_bf16_encode_and_decode(rng):
    x = np.concatenate([random_f32(rng, 300_000), special_f32(), around_grid(ref.BF16, rng)[::7]])
    got = numerics.f32_to_bf16(x).astype(np.int64)
    want = ref.BF16.encode(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{x[bad[:5]]} -> {got[bad[:5]]}, expected {want[bad[:5]]}"
    finite = ~np.isnan(x)
    assert np.array_equal(got[finite], x[finite].astype(ml_dtypes.bfloat16).view(np.uint16))
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(numerics.bf16_to_f32(codes).view(np.uint32), codes.astype(np.uint32) << 16)
    assert np.array_equal(
        numerics.bf16_to_f32(codes.view(ml_dtypes.bfloat16)).view(np.uint32),
        codes.astype(np.uint32) << 16,
    )


def test_fp16_encode_and_decode(rng):
    x = np.concatenate([random_f32(rng, 300_000), special_f32(), around_grid(ref.FP16, rng)])
    got = numerics.f32_to_fp16(x).astype(np.int64)
    want = ref.FP16.encode(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{x[bad[:5]]} -> {got[bad[:5]]}, expected {want[bad[:5]]}"
    finite = ~np.isnan(x)
    with np.errstate(over="ignore"):
        assert np.array_equal(got[finite], x[finite].astype(np.float16).view(np.uint16))
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    assert np.array_equal(numerics.fp16_to_f32(codes), codes.view(np.float16).astype(np.float32), equal_nan=True)


def test_e8m0_encode_all_bf16_and_random(rng):
    x = np.concatenate(
        [
            ALL_BF16,
            random_f32(rng, 100_000),
            special_f32(),
            ref.f32_from_bits([0x00400000, 0x00400001, 0x7F000000, 0x7F000001]),
        ]
    )
    got = numerics.f32_to_e8m0(x).astype(np.int64)
    want = ref.e8m0_encode(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{x[bad[:5]]} -> {got[bad[:5]]}, expected {want[bad[:5]]}"
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        codes = np.arange(255, dtype=np.uint8)
        assert np.array_equal(numerics.e8m0_to_f32(codes), codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32))
    decoded = numerics.e8m0_to_f32(np.arange(256, dtype=np.uint8))
    assert decoded[0] == np.float32(2.0**-127) and decoded[127] == 1.0 and np.isnan(decoded[255])


def test_fp8_scale_from_amax(rng):
    with np.errstate(over="ignore"):  # the widest draws overflow to Inf on purpose
        wide = rng.lognormal(0, 20, 20_000).astype(np.float32)
    amax = np.concatenate(
        [
            wide,
            special_f32(),
            np.array([0, 1e-40, 448, 1, 3, 1e38], np.float32),
        ]
    )
    for fp8_max in (448.0, 57344.0):
        for power_of_two in (False, True):
            got = numerics.fp8_scale_from_amax(amax, fp8_max, power_of_two)
            want = np.array([ref.fp8_scale_from_amax(a, fp8_max, power_of_two) for a in amax], np.float32)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
                fp8_max,
                power_of_two,
            )
    # The rules of DESIGN.md section 4, spelled out.
    s = numerics.fp8_scale_from_amax(np.array([0, np.inf, np.nan, 1e-45], np.float32), 448.0)
    assert list(s[:3]) == [1.0, 1.0, 1.0] and s[3] == np.finfo(np.float32).max
    assert numerics.scale_inverse(np.float32(4.0))[()] == np.float32(0.25)


def test_mx_scale_from_amax(rng):
    amax = np.concatenate([ALL_BF16[~np.signbit(ALL_BF16)], random_f32(rng, 50_000)])
    amax = np.abs(amax)
    for fp8_max in (448.0, 57344.0):
        got = numerics.mx_scale_from_amax(amax, fp8_max).astype(np.int64)
        with np.errstate(over="ignore", invalid="ignore"):
            product = amax * (np.float32(1.0) / np.float32(fp8_max))
        assert np.array_equal(got, ref.e8m0_encode(product))
    e = np.arange(256, dtype=np.uint8)
    multiplier = numerics.mx_multiplier(e)
    assert np.array_equal(multiplier[:255].view(np.uint32), (254 - e[:255].astype(np.uint32)) << 23)
    assert np.isnan(multiplier[255])


def test_nvfp4_scales(rng):
    amax = np.concatenate(
        [
            rng.lognormal(0, 10, 5_000).astype(np.float32),
            np.array([0, np.inf, np.nan, 1e-45, 2688, 1e38], np.float32),
        ]
    )
    got = numerics.nvfp4_global_encode_scale(amax)
    want = np.array([ref.nvfp4_global_encode_scale(a) for a in amax], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))

    block_amax = rng.lognormal(0, 4, 5_000).astype(np.float32)
    for s_enc in (np.float32(1.0), np.float32(2688.0 / 37.5), got[0]):
        codes = numerics.nvfp4_block_scale(block_amax, s_enc)
        factor = s_enc * (np.float32(1.0) / np.float32(6.0))
        assert np.array_equal(codes.astype(np.int64), ref.E4M3.encode(block_amax * factor))
        multiplier = numerics.nvfp4_block_multiplier(codes, s_enc)
        with np.errstate(divide="ignore", over="ignore"):
            decode = numerics.e4m3_to_f32(codes) * (np.float32(1.0) / s_enc)
            want_m = np.float32(1.0) / decode
        want_m = np.where(
            np.isnan(want_m) | (want_m > np.finfo(np.float32).max), np.finfo(np.float32).max, want_m
        ).astype(np.float32)
        assert np.array_equal(multiplier.view(np.uint32), want_m.view(np.uint32))


def test_philox_known_answers_and_reference(rng):
    # Random123's known-answer vectors for Philox4x32-10 check the reference itself.
    assert ref.philox4x32_10((0, 0, 0, 0), (0, 0)) == (
        0x6627E8D5,
        0xE169C58D,
        0xBC57AC4C,
        0x9B00DBD8,
    )
    assert ref.philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == (
        0x408F276D,
        0x41C83B0E,
        0xA20BC7C6,
        0x6D5451FD,
    )
    assert ref.philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == (
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    )
    assert list(numerics.philox_random_bits(0, 0, np.arange(4))) == [
        0x6627E8D5,
        0xE169C58D,
        0xBC57AC4C,
        0x9B00DBD8,
    ]
    for seed, offset in [
        (0, 0),
        (1, 2),
        (2**64 - 1, 2**64 - 1),
        (int(rng.integers(0, 2**63)), int(rng.integers(0, 2**63))),
    ]:
        index = np.concatenate(
            [
                np.arange(9, dtype=np.uint64),
                rng.integers(0, 2**63, 200, dtype=np.uint64),
                np.array([2**64 - 1, 2**32, 2**34 + 3], np.uint64),
            ]
        )
        got = numerics.philox_random_bits(seed, offset, index)
        want = [ref.philox_random_bits(seed, offset, int(i)) for i in index]
        assert list(got) == want, (seed, offset)


def test_e2m1_stochastic_rounding(rng):
    x = np.concatenate(
        [
            rng.uniform(-7, 7, 3000).astype(np.float32),
            special_f32(),
            np.array([0.25, -0.25, 0.75, 2.5, 5.0, 5.999, 6.0, -6.5], np.float32),
        ]
    )
    bits = rng.integers(0, 2**32, x.size, dtype=np.uint64).astype(np.uint32)
    bits[:8] = [0, 1, 2**31, 2**32 - 1, 2**31 - 1, 7, 2**30, 3 * 2**30]
    got = numerics.f32_to_e2m1_stochastic(x, bits)
    want = [ref.e2m1_stochastic(float(v), int(b)) for v, b in zip(x, bits)]
    assert list(got) == want
    # Unbiased: the mean of many stochastic roundings of one value approaches the value.
    for value in (0.3, 1.2, 2.75, -4.9):
        n = 20_000
        codes = numerics.f32_to_e2m1_stochastic(
            np.full(n, value, np.float32), numerics.philox_random_bits(7, 0, np.arange(n))
        )
        assert abs(numerics.e2m1_to_f32(codes).mean() - np.float32(value)) < 0.02


def test_hadamard16(rng):
    x = rng.standard_normal(16 * 64).astype(np.float32)
    got = numerics.hadamard16_transform(x)
    want = ref.hadamard16(x)
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))
    # H/4 is orthonormal and symmetric, so the inverse of y = H D x / 4 is x = D H y / 4, which
    # the transform itself computes as D * transform(D * y).
    signs = np.tile(ref.HADAMARD_SIGNS, 64).astype(np.float32)
    back = signs * numerics.hadamard16_transform(signs * got)
    assert np.max(np.abs(back - x)) <= 1e-5
    with pytest.raises(ValueError):
        numerics.hadamard16_transform(np.zeros(17, np.float32))


def test_fp4_packing():
    codes = np.arange(16, dtype=np.uint8).reshape(2, 8)
    packed = numerics.pack_fp4(codes)
    assert packed.shape == (2, 4)
    assert packed[0, 0] == 0x10 and packed[1, 3] == 0xFE  # element 2i in the low nibble
    assert np.array_equal(numerics.unpack_fp4(packed), codes)
    with pytest.raises(ValueError):
        numerics.pack_fp4(np.zeros(3, np.uint8))


def test_inputs_are_converted_only_when_exact():
    assert numerics.f32_to_e4m3([1.0, 2.0]).tolist() == [0x38, 0x40]
    assert numerics.f32_to_e4m3(np.float64(0.5)).shape == ()
    with pytest.raises(ValueError, match="float32 cannot hold exactly"):
        numerics.f32_to_e4m3(np.array([0.1], np.float64))
    with pytest.raises(ValueError):
        numerics.e4m3_to_f32(np.array([256]))
    with pytest.raises(TypeError):
        numerics.bf16_to_f32(np.zeros(2, np.float16))
    with pytest.raises(TypeError):
        numerics.philox_random_bits(0, 0, np.zeros(2, np.float32))
