"""sfmoe.quantize / dequantize / grouped_amax / swizzle_scales on NumPy arrays (the CPU backend):
the fields' shapes and dtypes, the padded group offsets, codes and scales against the vectorized
numerics, the round trip within the format's bound, padding rows, and argument errors. Inputs are
fresh random values each run (see conftest.py), with empty and odd-sized groups."""

import numpy as np
import pytest
import sfmoe
from sfmoe import numerics

ml_dtypes = pytest.importorskip("ml_dtypes", reason="the NumPy FP8/BF16 views need ml_dtypes")

# Large values overflow FP16 on purpose (the library's FP16 outputs are compared with NumPy's).
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

RECIPES = list(sfmoe.RECIPES)
COPIES = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}
BLOCK = {
    "fp8_tensor": 0,
    "fp8_block_1x128": 128,
    "fp8_block_128x128": 128,
    "mxfp8": 32,
    "nvfp4": 16,
    "nvfp4_2d": 16,
}
TWO_D = ("fp8_block_128x128", "nvfp4_2d")
NVFP4 = ("nvfp4", "nvfp4_2d")
IN_DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
FP8_MAX = {sfmoe.DType.FP8_E4M3: 448.0, sfmoe.DType.FP8_E5M2: 57344.0}
ENCODE = {sfmoe.DType.FP8_E4M3: numerics.f32_to_e4m3, sfmoe.DType.FP8_E5M2: numerics.f32_to_e5m2}
# The round trip's bound, per element, relative to the amax of the element's block.
BOUND = {"fp8": 2.0**-3, "nvfp4": 2.0**-1}
COLS = 256


def codes_of(array):
    return None if array is None else array.view(f"u{array.dtype.itemsize}")


def random_groups(rng, num_groups, max_rows=70):
    """Group sizes with empty groups, single rows and odd sizes, and their offsets."""
    sizes = rng.integers(0, max_rows, num_groups)
    sizes[rng.integers(num_groups)] = 0
    sizes[rng.integers(num_groups)] = 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def random_input(rng, rows, cols, offsets, in_dtype, binades):
    """Values with a random sign, magnitudes over `binades` binades and a scale per group (so
    groups differ in range), a few exact zeros; returns (x in in_dtype, x as float32)."""
    magnitude = np.exp2(rng.uniform(-binades, 0, (rows, cols)))
    x = np.where(rng.random((rows, cols)) < 0.5, -magnitude, magnitude)
    for g in range(len(offsets) - 1):
        x[offsets[g] : offsets[g + 1]] *= np.exp2(rng.integers(-20, 20))
    x[rng.random((rows, cols)) < 0.01] = 0.0
    x = x.astype(np.float32).astype(IN_DTYPES[in_dtype])
    return x, x.astype(np.float32)


def padded_offsets(offsets, alignment):
    sizes = np.diff(offsets)
    padded = -(-sizes // alignment) * alignment
    return np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)


def padded_matrix(x32, offsets, out_offsets, rows):
    """The output matrix [rows, cols] of the padding rule: group g's rows at out_offsets[g],
    zeros elsewhere; and the group of each row below out_offsets[-1]."""
    out = np.zeros((rows, x32.shape[1]), np.float32)
    group_of_row = np.zeros(out_offsets[-1], np.int64)
    for g in range(len(offsets) - 1):
        n = offsets[g + 1] - offsets[g]
        out[out_offsets[g] : out_offsets[g] + n] = x32[offsets[g] : offsets[g + 1]]
        group_of_row[out_offsets[g] : out_offsets[g + 1]] = g
    return out, group_of_row


def group_amax(matrix, out_offsets):
    return np.array(
        [np.max(np.abs(matrix[a:b]), initial=0.0) for a, b in zip(out_offsets[:-1], out_offsets[1:])],
        np.float32,
    )


def block_amax(matrix, block_rows, block_cols):
    """The amax of each element's block, for blocks of block_rows x block_cols aligned at 0."""
    rows, cols = matrix.shape
    tiles = np.abs(matrix).reshape(rows // block_rows, block_rows, cols // block_cols, block_cols)
    amax = tiles.max(axis=(1, 3))
    return np.repeat(np.repeat(amax, block_rows, axis=0), block_cols, axis=1), amax


def copy_blocks(recipe, columnwise):
    """(rows, cols) of a block in the coordinates of the copy."""
    b = BLOCK[recipe]
    return (b, b) if recipe in TWO_D else (1, b)


def quantize_case(rng, recipe, copies, in_dtype="fp32", num_groups=5, **kwargs):
    rowwise, columnwise = COPIES[copies]
    offsets = random_groups(rng, num_groups)
    rows = int(offsets[-1]) + int(rng.integers(0, 3))  # rows beyond the last group are not read
    binades = 4 if recipe in NVFP4 else 12
    x, x32 = random_input(rng, rows, COLS, offsets, in_dtype, binades)
    q = sfmoe.quantize(x, recipe, group_offsets=offsets, rowwise=rowwise, columnwise=columnwise, **kwargs)
    return x, x32, offsets, q


def check_fields(q, recipe, rowwise, columnwise, num_groups, cols=COLS):
    """Shapes and dtypes of every field of a GroupedQuantizedTensor (docs/quantization.md)."""
    R, C, G, B = q.rows, cols, num_groups, BLOCK[recipe]
    fp4 = recipe in NVFP4
    assert q.recipe == recipe and q.cols == C and q.num_groups == G
    assert q.dtype == (sfmoe.DType.FP4_E2M1 if fp4 else sfmoe.DType.FP8_E4M3)
    data_type = np.dtype(np.uint8) if fp4 else np.dtype(ml_dtypes.float8_e4m3fn)
    scale_type = {
        "fp8_tensor": np.float32,
        "fp8_block_1x128": np.float32,
        "fp8_block_128x128": np.float32,
        "mxfp8": ml_dtypes.float8_e8m0fnu,
        "nvfp4": ml_dtypes.float8_e4m3fn,
        "nvfp4_2d": ml_dtypes.float8_e4m3fn,
    }[recipe]

    def scale_shape(rows, cols):
        if recipe == "fp8_tensor":
            return (G,)
        if recipe in TWO_D:
            return (rows // B, cols // B)
        if q.scale_layout == sfmoe.ScaleLayout.SWIZZLED:
            return (sfmoe._C.swizzled_scale_padded_size(rows, cols // B),)
        return (rows, cols // B)

    for present, data, scales, shape, scale_dims in (
        (rowwise, q.data, q.scale_inv, (R, C), scale_shape(R, C)),
        (columnwise, q.columnwise_data, q.columnwise_scale_inv, (C, R), scale_shape(C, R)),
    ):
        if not present:
            assert data is None and scales is None
            continue
        assert data.dtype == data_type and data.ctypes.data % 16 == 0
        assert data.shape == ((shape[0], shape[1] // 2) if fp4 else shape)
        assert scales.dtype == scale_type and scales.shape == scale_dims
    if recipe == "fp8_tensor" or fp4:
        assert q.amax.dtype == np.float32 and q.amax.shape == (G,)
    else:
        assert q.amax is None
    if q.uniform_group_rows:
        assert q.group_offsets is None
    else:
        assert q.group_offsets.dtype == np.int64 and q.group_offsets.shape == (G + 1,)
    if columnwise or recipe in TWO_D:
        assert R % max(B, 1) == 0


def check_round_trip(q, x32, offsets, out_offsets, recipe, source):
    """dequantize(q) within the bound of each element's block, zeros in padding rows and beyond."""
    y = sfmoe.dequantize(q, source=source)
    assert y.shape == (q.rows, q.cols) and y.dtype == np.float32
    end = int(out_offsets[-1])
    assert not np.any(y[end:]), "rows beyond the last group must be left zero"
    xp, _ = padded_matrix(x32, offsets, out_offsets, q.rows)
    columnwise = source == "columnwise" or (source == "auto" and q.data is None)
    if recipe == "fp8_tensor":
        amax = group_amax(xp, out_offsets)
        reference = np.zeros_like(xp)
        for g in range(len(offsets) - 1):
            reference[out_offsets[g] : out_offsets[g + 1]] = amax[g]
    else:
        bh, bw = copy_blocks(recipe, columnwise)
        if columnwise:
            reference = block_amax(xp.T, bh, bw)[0].T
        else:
            reference = block_amax(xp[: -(-end // bh) * bh] if bh > 1 else xp, bh, bw)[0]
            reference = np.pad(reference, ((0, q.rows - reference.shape[0]), (0, 0)))
    bound = BOUND["nvfp4" if recipe in NVFP4 else "fp8"]
    error = np.abs(y[:end].astype(np.float64) - xp[:end])
    limit = bound * reference[:end].astype(np.float64) * (1 + 2.0**-20)
    assert np.all(error <= limit), f"worst excess {np.max(error - limit)} ({source})"
    for g in range(len(offsets) - 1):  # padding rows decode to zero
        n = offsets[g + 1] - offsets[g]
        assert not np.any(y[out_offsets[g] + n : out_offsets[g + 1]])


@pytest.mark.parametrize("in_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("copies", COPIES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_round_trip_within_the_format_bound(recipe, copies, in_dtype, rng):
    rowwise, columnwise = COPIES[copies]
    x, x32, offsets, q = quantize_case(rng, recipe, copies, in_dtype)
    check_fields(q, recipe, rowwise, columnwise, len(offsets) - 1)
    a = sfmoe.min_row_alignment(recipe, columnwise)
    assert q.row_alignment == a
    out_offsets = padded_offsets(offsets, a)
    assert np.array_equal(q.group_offsets, out_offsets)
    # the default capacity is the bound of the C API, rounded up to whole blocks (and even rows)
    capacity = x.shape[0] + (len(offsets) - 1) * (a - 1)
    if (columnwise or recipe in TWO_D) and BLOCK[recipe]:
        capacity = -(-capacity // BLOCK[recipe]) * BLOCK[recipe]
    assert q.rows == capacity + (capacity % 2 if recipe in NVFP4 else 0)
    end = int(out_offsets[-1])
    for g in range(len(offsets) - 1):  # padding rows are quantized as zeros
        first, last = out_offsets[g] + offsets[g + 1] - offsets[g], out_offsets[g + 1]
        if rowwise:
            assert not np.any(codes_of(q.data)[first:last])
        if columnwise and recipe not in NVFP4:
            assert not np.any(codes_of(q.columnwise_data)[:, first:last])
        elif columnwise:
            assert not np.any(numerics.unpack_fp4(q.columnwise_data)[:, first:last])
    if q.amax is not None:
        xp, _ = padded_matrix(x32, offsets, out_offsets, q.rows)
        assert np.array_equal(q.amax, group_amax(xp, out_offsets))
    for source in ["auto"] + [s for s, present in zip(COPIES, (rowwise, columnwise)) if present]:
        check_round_trip(q, x32, offsets, out_offsets, recipe, source)
    assert end <= q.rows


def reference_copy(recipe, dtype, matrix, group_of_row, amax, columnwise, power_of_two=False):
    """Codes and compact scales of one copy from the numerics, for the written region: `matrix`
    is the padded matrix's rows [0, end); the copy is it (rowwise) or its transpose."""
    m = matrix.T if columnwise else matrix
    bh, bw = copy_blocks(recipe, columnwise)
    if recipe == "fp8_tensor":
        scale = numerics.fp8_scale_from_amax(amax, FP8_MAX[dtype], power_of_two)
        row_scale = scale[group_of_row]
        multiplier = row_scale[None, :] if columnwise else row_scale[:, None]
        return ENCODE[dtype](m * multiplier), numerics.scale_inverse(scale)
    element_amax, amax_of_block = block_amax(m, bh, bw)
    if recipe in ("fp8_block_1x128", "fp8_block_128x128"):
        block_scale = numerics.fp8_scale_from_amax(amax_of_block, FP8_MAX[dtype], power_of_two)
        multiplier = np.repeat(np.repeat(block_scale, bh, 0), bw, 1)
        return ENCODE[dtype](m * multiplier), numerics.scale_inverse(block_scale)
    if recipe == "mxfp8":
        e = numerics.mx_scale_from_amax(amax_of_block, FP8_MAX[dtype])
        multiplier = np.repeat(numerics.mx_multiplier(e), bw, 1)
        return ENCODE[dtype](m * multiplier), e
    # NVFP4: the global scale of the group each block lies in
    global_scale = numerics.nvfp4_global_encode_scale(amax)[group_of_row]
    if columnwise:  # block (c, k) lies in the group of padded row k * bw
        block_global = np.broadcast_to(global_scale[::bw][None, :], amax_of_block.shape)
    else:  # block (r, k) (or (r / 16, k)) lies in the group of padded row r
        block_global = np.broadcast_to(global_scale[::bh][:, None], amax_of_block.shape)
    codes = np.empty(amax_of_block.shape, np.uint8)
    multiplier = np.empty(amax_of_block.shape, np.float32)
    for s in np.unique(block_global):
        where = block_global == s
        codes[where] = numerics.nvfp4_block_scale(amax_of_block[where], s)
        multiplier[where] = numerics.nvfp4_block_multiplier(codes[where], s)
    multiplier = np.repeat(np.repeat(multiplier, bh, 0), bw, 1)
    return numerics.pack_fp4(numerics.f32_to_e2m1(m * multiplier)), codes


def written(q, columnwise, end):
    """(codes, compact scales) of one copy in the region the op writes."""
    data = q.columnwise_data if columnwise else q.data
    scales = q.compact_scale_inv(columnwise)
    B = BLOCK[q.recipe]
    fp4 = q.dtype == sfmoe.DType.FP4_E2M1
    if columnwise:
        data = data[:, : end // 2] if fp4 else data[:, :end]
        if q.recipe != "fp8_tensor":
            scales = scales[:, : end // B]
    else:
        data = data[:end]
        if q.recipe in TWO_D:
            scales = scales[: end // B]
        elif q.recipe != "fp8_tensor":
            scales = scales[:end]
    return codes_of(data), codes_of(scales)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("copies", ["rowwise", "columnwise"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_codes_and_scales_match_the_numerics(recipe, copies, fmt, rng):
    if recipe in NVFP4 and fmt == "e5m2":
        pytest.skip("NVFP4 has one element format")
    rowwise, columnwise = COPIES[copies]
    power_of_two = recipe.startswith("fp8") and bool(rng.integers(2))
    x, x32, offsets, q = quantize_case(rng, recipe, copies, fmt=fmt, power_of_two_scales=power_of_two)
    out_offsets = q.group_offsets
    end = int(out_offsets[-1])
    xp, group_of_row = padded_matrix(x32, offsets, out_offsets, q.rows)
    amax = group_amax(xp, out_offsets)
    want_codes, want_scales = reference_copy(recipe, q.dtype, xp[:end], group_of_row, amax, columnwise, power_of_two)
    codes, scales = written(q, columnwise, end)
    assert np.array_equal(codes, codes_of(np.asarray(want_codes)))
    assert np.array_equal(scales, codes_of(np.asarray(want_scales)))


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_swizzled_scales_hold_the_compact_scales(recipe, rng):
    x, x32, offsets, compact = quantize_case(rng, recipe, "both")
    swizzled = sfmoe.quantize(x, recipe, group_offsets=offsets, columnwise=True, scale_layout="swizzled")
    check_fields(swizzled, recipe, True, True, len(offsets) - 1)
    assert swizzled.scale_layout == sfmoe.ScaleLayout.SWIZZLED
    end = int(compact.group_offsets[-1])
    for columnwise in (False, True):
        codes, scales = written(compact, columnwise, end)
        codes_s, scales_s = written(swizzled, columnwise, end)
        assert np.array_equal(codes, codes_s) and np.array_equal(scales, scales_s)
    for source in ("rowwise", "columnwise"):
        assert np.array_equal(sfmoe.dequantize(compact, source=source), sfmoe.dequantize(swizzled, source=source))


@pytest.mark.parametrize("recipe", RECIPES)
def test_uniform_groups(recipe, rng):
    num_groups, group_rows = 3, 128
    rows = num_groups * group_rows
    offsets = np.arange(num_groups + 1, dtype=np.int64) * group_rows
    x, x32 = random_input(rng, rows, COLS, offsets, "fp32", 4 if recipe in NVFP4 else 12)
    q = sfmoe.quantize(x, recipe, uniform_group_rows=group_rows, columnwise=True)
    check_fields(q, recipe, True, True, num_groups)
    assert q.rows == rows and q.uniform_group_rows == group_rows and q.group_offsets is None
    by_offsets = sfmoe.quantize(x, recipe, group_offsets=offsets, columnwise=True)
    for columnwise in (False, True):
        a, b = written(q, columnwise, rows), written(by_offsets, columnwise, rows)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    for source in ("rowwise", "columnwise"):
        check_round_trip(q, x32, offsets, offsets, recipe, source)


def test_row_alignment_and_capacity(rng):
    x, x32, offsets, q = quantize_case(rng, "mxfp8", "rowwise", row_alignment=128)
    out_offsets = padded_offsets(offsets, 128)
    assert q.row_alignment == 128 and np.array_equal(q.group_offsets, out_offsets)
    assert q.rows == x.shape[0] + (len(offsets) - 1) * 127
    check_round_trip(q, x32, offsets, out_offsets, "mxfp8", "auto")
    bigger = sfmoe.quantize(x, "mxfp8", group_offsets=offsets, out_row_capacity=q.rows + 64)
    assert bigger.rows == q.rows + 64 and bigger.data.shape == (q.rows + 64, COLS)
    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.quantize(x, "mxfp8", group_offsets=offsets, row_alignment=16, out_row_capacity=8)
    assert error_info.value.status == "SFMOE_ERROR_SHAPE_MISMATCH"
    assert "cannot hold the padded groups" in str(error_info.value)
    assert str(error_info.value) == sfmoe.last_error()


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_block_1x128"])
def test_default_capacity_of_compact_columnwise_scales_in_whole_sectors(recipe, rng):
    # From 16384 rows on, a columnwise copy with compact scales gets a capacity of whole 1024-row
    # units (its scales are then written a sector at a time); other layouts, rowwise-only
    # requests and smaller inputs keep the smallest bound.
    block = 32 if recipe == "mxfp8" else 128
    offsets = np.array([0, 9000, 9000, 17500])  # an empty group, sizes not multiples of a block
    x, x32 = random_input(rng, 17500, 128, offsets, "bf16", 8)
    bound = -(-(17500 + 3 * (block - 1)) // block) * block
    q = sfmoe.quantize(x, recipe, group_offsets=offsets.tolist(), columnwise=True)
    assert q.rows == -(-bound // 1024) * 1024 and q.rows > bound
    out_offsets = padded_offsets(offsets, block)
    check_round_trip(q, x32, offsets, out_offsets, recipe, "columnwise")
    check_round_trip(q, x32, offsets, out_offsets, recipe, "rowwise")
    other = "swizzled" if recipe == "mxfp8" else "columnwise_transposed"
    assert sfmoe.quantize(x, recipe, group_offsets=offsets.tolist(), columnwise=True, scale_layout=other).rows == bound
    assert sfmoe.quantize(x, recipe, group_offsets=offsets.tolist()).rows == 17500  # rowwise only
    small = sfmoe.quantize(x[:16000], recipe, group_offsets=[0, 9000, 16000], columnwise=True)
    assert small.rows == -(-(16000 + 2 * (block - 1)) // block) * block


def test_one_group_by_default_and_empty_inputs(rng):
    x, x32 = random_input(rng, 37, COLS, np.array([0, 37]), "fp16", 12)
    q = sfmoe.quantize(x, "fp8_block_1x128", columnwise=True)
    # the capacity bound is 37 + 1 * 127 rows, rounded up to whole 128-row blocks
    assert q.num_groups == 1 and np.array_equal(q.group_offsets, [0, 128]) and q.rows == 256
    check_round_trip(q, x32, np.array([0, 37]), q.group_offsets, "fp8_block_1x128", "columnwise")
    # no rows at all, and groups that are all empty: nothing to write, all zeros back
    empty = sfmoe.quantize(np.zeros((0, 64), np.float32), "mxfp8")
    assert empty.rows == 0 and empty.data.shape == (0, 64) and empty.scale_inv.shape == (0, 2)
    assert np.array_equal(empty.group_offsets, [0, 0])
    assert sfmoe.dequantize(empty).shape == (0, 64)
    empty = sfmoe.quantize(np.zeros((0, 64), np.float32), "mxfp8", columnwise=True)
    assert empty.rows == 32 and empty.columnwise_data.shape == (64, 32)  # 0 + 1 * 31, in blocks
    assert np.array_equal(empty.group_offsets, [0, 0])
    assert not np.any(sfmoe.dequantize(empty, source="columnwise"))
    q = sfmoe.quantize(np.ones((6, 32), np.float32), "nvfp4", group_offsets=[0, 0, 0, 0])
    assert np.array_equal(q.group_offsets, [0, 0, 0, 0]) and np.array_equal(q.amax, [0, 0, 0])
    assert not np.any(sfmoe.dequantize(q))


def test_nvfp4_stochastic_rounding_is_reproducible(rng):
    x, x32, offsets, q = quantize_case(rng, "nvfp4", "rowwise", stochastic_rounding=True, seed=1234, offset=7)
    again = sfmoe.quantize(x, "nvfp4", group_offsets=offsets, stochastic_rounding=True, seed=1234, offset=7)
    other = sfmoe.quantize(x, "nvfp4", group_offsets=offsets, stochastic_rounding=True, seed=1234, offset=8)
    assert q.config == sfmoe.QuantizeConfig(stochastic_rounding=True, seed=1234, offset=7)
    out_offsets = q.group_offsets
    end = int(out_offsets[-1])
    assert np.array_equal(q.data[:end], again.data[:end])
    assert not np.array_equal(q.data[:end], other.data[:end])
    check_round_trip(q, x32, offsets, out_offsets, "nvfp4", "auto")
    # element (r, c) rounds with philox_random_bits(seed, 2 * offset, r * cols + c)
    xp, group_of_row = padded_matrix(x32, offsets, out_offsets, q.rows)
    global_scale = numerics.nvfp4_global_encode_scale(group_amax(xp, out_offsets))[group_of_row]
    scales = codes_of(q.scale_inv)[:end]
    multiplier = np.empty(scales.shape, np.float32)
    for s in np.unique(global_scale):
        rows = global_scale == s
        multiplier[rows] = numerics.nvfp4_block_multiplier(scales[rows], s)
    scaled = xp[:end] * np.repeat(multiplier, 16, axis=1)
    bits = numerics.philox_random_bits(1234, 14, np.arange(end * COLS).reshape(end, COLS))
    want = numerics.pack_fp4(numerics.f32_to_e2m1_stochastic(scaled, bits))
    assert np.array_equal(q.data[:end], want)


def test_nvfp4_hadamard_columnwise(rng):
    x, x32, offsets, q = quantize_case(rng, "nvfp4", "both", hadamard=True)
    assert q.config.hadamard and q.columnwise_amax.shape == q.amax.shape
    out_offsets = q.group_offsets
    end = int(out_offsets[-1])
    xp, _ = padded_matrix(x32, offsets, out_offsets, q.rows)
    # columnwise_amax: the amax of the transformed 16-row blocks of each group's columns
    transformed = numerics.hadamard16_transform(np.ascontiguousarray(xp[:end].T))
    want = [np.max(np.abs(transformed[:, a:b]), initial=0.0) for a, b in zip(out_offsets[:-1], out_offsets[1:])]
    assert np.array_equal(q.columnwise_amax, np.array(want, np.float32))
    # the rowwise copy does not take the transform; the columnwise copy decodes back through it
    plain = sfmoe.quantize(x, "nvfp4", group_offsets=offsets, columnwise=True)
    assert np.array_equal(q.data[:end], plain.data[:end])
    assert not np.array_equal(q.columnwise_data[:, : end // 2], plain.columnwise_data[:, : end // 2])
    y = sfmoe.dequantize(q, source="columnwise")
    for a, b in zip(out_offsets[:-1], out_offsets[1:]):
        if b > a:
            norm = np.linalg.norm(xp[a:b])
            assert np.linalg.norm(y[a:b] - xp[a:b]) <= 0.25 * norm
    assert not np.any(y[end:])


@pytest.mark.parametrize("out_dtype", ["bf16", "fp16"])
def test_dequantize_dtypes_and_out(out_dtype, rng):
    x, x32, offsets, q = quantize_case(rng, "fp8_block_1x128", "rowwise")
    y32 = sfmoe.dequantize(q)
    y = sfmoe.dequantize(q, out_dtype)
    assert y.dtype == IN_DTYPES[out_dtype] and y.shape == (q.rows, q.cols)
    assert np.array_equal(y[: q.group_offsets[-1]], y32[: q.group_offsets[-1]].astype(y.dtype))
    out = np.full((q.rows, q.cols), 7.0, np.float32)
    assert q.dequantize(out=out) is out
    end = int(q.group_offsets[-1])
    assert np.array_equal(out[:end], y32[:end]) and np.all(out[end:] == 7.0)  # rows left as they were
    with pytest.raises(ValueError, match="expected shape"):
        sfmoe.dequantize(q, out=np.zeros((q.rows, q.cols + 1), np.float32))
    with pytest.raises(ValueError, match="out_dtype"):
        sfmoe.dequantize(q, "fp8_e4m3")
    with pytest.raises(ValueError, match="no columnwise copy"):
        sfmoe.dequantize(q, source="columnwise")
    with pytest.raises(ValueError, match="source"):
        sfmoe.dequantize(q, source="diagonal")


def test_grouped_amax(rng):
    offsets = random_groups(rng, 6)
    x, x32 = random_input(rng, int(offsets[-1]) + 3, 48, offsets, "bf16", 12)
    amax = sfmoe.grouped_amax(x, offsets)
    assert amax.dtype == np.float32 and amax.shape == (6,)
    assert np.array_equal(amax, group_amax(x32, offsets))
    x32[offsets[2]] = 0.0
    nonempty = int(np.argmax(np.diff(offsets)))
    x32[offsets[nonempty], 5] = np.nan
    amax = sfmoe.grouped_amax(x32, list(offsets))
    assert np.isnan(amax[nonempty]) and np.sum(np.isnan(amax)) == 1
    x = rng.standard_normal((6, 48)).astype(np.float16)
    uniform = sfmoe.grouped_amax(x, uniform_group_rows=2)
    assert np.array_equal(uniform, np.abs(x.astype(np.float32)).reshape(3, -1).max(axis=1))


def swizzled_reference(compact):
    """The swizzled layout written out from the formula of numerics/scale_swizzle.h."""
    rows, scale_cols = compact.shape
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-scale_cols // 4) * 4
    out = np.zeros(padded_rows * padded_cols, np.uint8)
    r, k = np.meshgrid(np.arange(rows), np.arange(scale_cols), indexing="ij")
    tile = (r // 128) * (padded_cols // 4) + k // 4
    out[tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + k % 4] = compact
    return out


@pytest.mark.parametrize("shape", [(1, 1), (31, 3), (129, 5), (300, 8), (0, 4)], ids=str)
def test_swizzle_scales(shape, rng):
    compact = rng.integers(0, 256, shape, dtype=np.uint8)
    e8m0 = compact.view(ml_dtypes.float8_e8m0fnu)
    swizzled = sfmoe.swizzle_scales(e8m0)
    assert swizzled.dtype == ml_dtypes.float8_e8m0fnu
    assert swizzled.shape == (sfmoe._C.swizzled_scale_padded_size(*shape),)
    assert np.array_equal(codes_of(swizzled), swizzled_reference(compact))
    back = sfmoe.unswizzle_scales(swizzled, *shape)
    assert back.shape == shape and np.array_equal(codes_of(back), compact)
    raw = sfmoe.swizzle_scales(compact, dtype="fp8_e4m3")  # raw codes say what they hold
    assert raw.dtype == ml_dtypes.float8_e4m3fn and np.array_equal(codes_of(raw), codes_of(swizzled))
    with pytest.raises(TypeError, match="raw codes"):
        sfmoe.swizzle_scales(compact)
    with pytest.raises(ValueError, match="e8m0 or fp8_e4m3"):
        sfmoe.swizzle_scales(compact.astype(np.float32), dtype="fp32")
    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.unswizzle_scales(swizzled, shape[0] + 128, shape[1])
    assert error_info.value.status == "SFMOE_ERROR_SHAPE_MISMATCH"


def test_status_word_records_faults(rng):
    word = sfmoe.StatusWord("cpu")
    assert word.device == "cpu" and not word.read()
    x = rng.standard_normal((40, 64)).astype(np.float32)
    x[25, 3] = np.nan
    sfmoe.quantize(x, "mxfp8", group_offsets=[0, 20, 40], trap_nan_amax=True, status_word=word)
    word.snapshot()
    report = word.read()
    assert report.flags == sfmoe.Fault.NAN_AMAX and report.first_group == 1 and report.count >= 1
    word.reset()
    sfmoe.quantize(x, "mxfp8", group_offsets=[0, 20, 40], status_word=word)  # no trap asked for
    assert not word.read()
    sfmoe.grouped_amax(x, [0, 30, 20], status_word=word)
    assert word.read().flags == sfmoe.Fault.BAD_GROUP_OFFSETS and word.read().first_group == 1


def test_argument_errors(rng):
    x = rng.standard_normal((40, 64)).astype(np.float32)
    offsets = np.array([0, 10, 40], np.int64)
    cases = [
        (ValueError, "recipe: expected one of", dict(recipe="fp6")),
        (ValueError, "2-D", dict(x=x.reshape(2, 20, 64))),
        (TypeError, "float32, bfloat16 or float16", dict(x=x.astype(ml_dtypes.float8_e4m3fn))),
        (TypeError, "not an sfmoe dtype", dict(x=x.astype(np.float64))),
        (TypeError, "int64 offsets", dict(group_offsets=offsets.astype(np.int32))),
        (ValueError, "num_groups \\+ 1 >= 2", dict(group_offsets=offsets[:1])),
        (ValueError, "not both", dict(uniform_group_rows=20)),
        (ValueError, "do not split", dict(group_offsets=None, uniform_group_rows=30)),
        (ValueError, "nothing to produce", dict(rowwise=False)),
        (ValueError, "fmt", dict(fmt="e3m4")),
        (ValueError, "fp4_e2m1 elements", dict(recipe="nvfp4", fmt="e5m2")),
        (ValueError, "swizzled layout exists", dict(recipe="fp8_tensor", scale_layout="swizzled")),
        (ValueError, "scale_layout", dict(scale_layout="tiled")),
        (ValueError, "power of two", dict(row_alignment=24)),
        (ValueError, "outside", dict(row_alignment=0)),
        (ValueError, "outside", dict(seed=-1)),
        (TypeError, "integer", dict(offset=1.5)),
        (ValueError, "multiple of 128", dict(recipe="fp8_block_1x128")),
        (ValueError, "even row capacity", dict(recipe="nvfp4", out_row_capacity=41)),
        (TypeError, "StatusWord", dict(status_word=object())),
    ]
    for error, pattern, change in cases:
        arguments = dict(x=x, recipe="mxfp8", group_offsets=offsets)
        arguments.update(change)
        with pytest.raises(error, match=pattern):
            sfmoe.quantize(arguments.pop("x"), arguments.pop("recipe"), **arguments)
    library_cases = [
        ("SFMOE_ERROR_UNSUPPORTED", "Hadamard transform applies to nv_1x16", dict(hadamard=True)),
        ("SFMOE_ERROR_UNSUPPORTED", "stochastic rounding", dict(stochastic_rounding=True)),
        ("SFMOE_ERROR_UNSUPPORTED", "power_of_two", dict(power_of_two_scales=True)),
        ("SFMOE_ERROR_SHAPE_MISMATCH", "multiple of 32", dict(columnwise=True, row_alignment=16)),
    ]
    for status, pattern, change in library_cases:
        with pytest.raises(sfmoe.Error, match=pattern) as error_info:
            sfmoe.quantize(x, "mxfp8", group_offsets=offsets, **change)
        assert error_info.value.status == status and str(error_info.value) == sfmoe.last_error()


def test_binding_refuses_arrays_smaller_than_the_descriptor(rng):
    """The grouped descriptor carries no sizes: the binding checks each array against it."""
    from sfmoe import _C

    x = rng.standard_normal((32, 64)).astype(np.float32)
    offsets = np.array([0, 32], np.int64)
    source = dict(
        dtype=int(sfmoe.DType.FP32),
        scaling=0,
        num_groups=1,
        row_capacity=32,
        cols=64,
        group_offsets=offsets,
        rowwise_data=x,
    )
    output = dict(
        dtype=int(sfmoe.DType.FP8_E4M3),
        scaling=int(sfmoe.Scaling.MX_1X32),
        num_groups=1,
        row_capacity=32,
        cols=64,
        group_offsets=np.zeros(2, np.int64),
        rowwise_data=np.zeros((32, 64), np.uint8),
        rowwise_scale_inv=np.zeros((32, 2), np.uint8),
    )
    _C.grouped_quantize(source, output)
    for field, array, pattern in [
        ("rowwise_scale_inv", np.zeros((32, 1), np.uint8), "holds 32 e8m0 elements but .* 64"),
        ("rowwise_data", np.zeros((31, 64), np.uint8), "holds 1984"),
        ("group_offsets", np.zeros(1, np.int64), "holds 1 int64"),
        ("group_offsets", np.zeros(2, np.float64), "int64 array"),
        ("rowwise_data", np.zeros((32, 64), np.float16), "cannot hold fp8_e4m3"),
        ("rowwise_scale_inv", "scales", "expected a writable array"),
    ]:
        with pytest.raises((ValueError, TypeError), match=pattern):
            _C.grouped_quantize(source, dict(output, **{field: array}))
    readonly = np.zeros((32, 64), np.uint8)
    readonly.flags.writeable = False
    with pytest.raises(TypeError, match="writable"):
        _C.grouped_quantize(source, dict(output, rowwise_data=readonly))
    with pytest.raises(TypeError, match="unknown field 'output.colls'"):
        _C.grouped_quantize(source, dict(output, colls=64))
    with pytest.raises(TypeError, match="config.sead"):
        _C.grouped_quantize(source, output, {"sead": 1})
    with pytest.raises(sfmoe.Error, match="num_groups is 0"):  # the library judges the rest
        _C.grouped_quantize(dict(source, num_groups=0), dict(output, num_groups=0))


def test_random_grouped_descriptors_never_crash(rng):
    """Valid quantize / dequantize calls of the binding with one to three fields replaced by
    random, mostly invalid, values: each call passes or raises sfmoe.Error, ValueError or
    TypeError; the binding's size checks keep the library inside the arrays."""
    from sfmoe import _C

    rows, cols = 32, 128
    x = rng.standard_normal((rows, cols)).astype(np.float32)

    def arrays(shape, dtype):
        return [None, np.zeros(shape, dtype), np.zeros(max(shape[0] // 2, 1), dtype)]

    choices = dict(
        num_groups=[-1, 0, 1, 2, 3, 2**62],
        row_capacity=[-1, 0, 16, 31, 32, 33, 64, 2**40],
        cols=[-1, 0, 32, 64, 127, 128, 256],
        row_alignment=[-1, 0, 1, 3, 16, 32, 128],
        uniform_group_rows=[-1, 0, 16, 32],
        dtype=[-1, 0, 3, 4, 5, 99],
        scaling=list(range(-1, 8)),
        scale_layout=[0, 1, 2],
    )
    outcomes = {}
    for _ in range(1500):
        recipe = RECIPES[int(rng.integers(len(RECIPES)))]
        options = dict(columnwise=bool(rng.integers(2)), hadamard=recipe == "nvfp4")
        q = sfmoe.quantize(x, recipe, group_offsets=[0, 10, 32], **options)
        source = dict(
            dtype=int(sfmoe.DType.FP32),
            scaling=0,
            num_groups=2,
            row_capacity=rows,
            cols=cols,
            group_offsets=np.array([0, 10, 32], np.int64),
            rowwise_data=x,
        )
        output = q._descriptor(sfmoe._arrays.NUMPY)
        original = dict(output)
        names = sorted(choices) + sorted(k for k, v in output.items() if v is not None)
        target = [source, output][int(rng.integers(2))]
        for _ in range(int(rng.integers(1, 4))):
            name = names[int(rng.integers(len(names)))]
            if name in choices:
                target[name] = choices[name][int(rng.integers(len(choices[name])))]
            else:
                value = original[name]
                target[name] = arrays(value.shape, value.dtype)[int(rng.integers(3))]
        try:
            if rng.integers(2):
                _C.grouped_quantize(source, output, q.config._fields())
            else:
                result = dict(
                    dtype=0,
                    scaling=0,
                    num_groups=output.get("num_groups", 2),
                    row_capacity=output.get("row_capacity", q.rows),
                    cols=cols,
                    uniform_group_rows=output.get("uniform_group_rows", 0),
                    group_offsets=output.get("group_offsets"),
                    rowwise_data=np.zeros((q.rows, cols), np.float32),
                )
                _C.grouped_dequantize(output, result, int(rng.integers(-1, 4)), q.config._fields())
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except sfmoe.Error as error:
            assert str(error) == sfmoe.last_error()
            outcomes[error.status] = outcomes.get(error.status, 0) + 1
        except (ValueError, TypeError) as error:
            outcomes[type(error).__name__] = outcomes.get(type(error).__name__, 0) + 1
    assert len(outcomes) >= 5, outcomes


def test_given_tensor_scales(rng):
    """fp8_tensor with given per-group scales: codes fp8(x * s_g), scale_inv 1 / s_g, the group
    amax; the config can be reused (dequantize, twice); a wrong number of scales is refused."""
    x = (rng.normal(size=(30, 32)) * 3).astype(np.float32)
    offsets = np.array([0, 10, 10, 30], np.int64)
    scales = np.array([4.0, 0.5, 1e6], np.float32)
    q = sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets, tensor_scales=scales)
    np.testing.assert_array_equal(q.scale_inv, (1.0 / scales.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(q.amax, [np.abs(x[:10]).max(), 0.0, np.abs(x[10:]).max()])
    first = sfmoe.dequantize(q)
    np.testing.assert_array_equal(sfmoe.dequantize(q), first)
    with pytest.raises(ValueError):
        sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets, tensor_scales=scales[:2])
    with pytest.raises(ValueError):
        sfmoe.quantize(x, "mxfp8", group_offsets=offsets, tensor_scales=scales)


@pytest.mark.parametrize("recipe", ["fp8_tensor", "nvfp4", "nvfp4_2d"])
def test_given_group_amax(rng, recipe):
    """A given group amax: equal to the computed one, the same bytes; otherwise the result's amax
    is the given one and (fp8_tensor) scale_inv follows the current-scaling rule from it; the
    recipes without a group amax, a wrong count, tensor_scales alongside and the Hadamard
    columnwise copy are refused."""
    x = (rng.normal(size=(48, 32)) * 3).astype(np.float32)
    x[3, 5] = np.inf
    offsets = np.array([0, 16, 16, 48], np.int64)
    computed = sfmoe.quantize(x, recipe, group_offsets=offsets, columnwise=True)
    given = sfmoe.quantize(
        x, recipe, group_offsets=offsets, columnwise=True, group_amax=np.asarray(computed.amax, np.float32)
    )
    end = int(computed.group_offsets[-1])  # (rows from there on are not written)

    def written(q):
        yield np.asarray(q.data)[:end].view(np.uint8)
        packed = 2 if recipe.startswith("nvfp4") else 1  # FP4 packs pairs of rows
        yield np.asarray(q.columnwise_data).view(np.uint8)[:, : end // packed]
        yield np.asarray(q.dequantize(source="rowwise")).view(np.uint32)
        yield np.asarray(q.dequantize(source="columnwise")).view(np.uint32)
        yield np.asarray(q.amax).view(np.uint32)

    for a, b in zip(written(given), written(computed)):
        np.testing.assert_array_equal(a, b)
    amax = np.array([2.0, 5.0, 0.25], np.float32)
    q = sfmoe.quantize(x, recipe, group_offsets=offsets, group_amax=amax)
    np.testing.assert_array_equal(q.amax, amax)
    if recipe == "fp8_tensor":
        np.testing.assert_array_equal(q.scale_inv, (amax / np.float32(448.0)).astype(np.float32))
    with pytest.raises(ValueError):
        sfmoe.quantize(x, recipe, group_offsets=offsets, group_amax=amax[:2])
    with pytest.raises(ValueError):
        sfmoe.quantize(x, "mxfp8", group_offsets=offsets, group_amax=amax)
    if recipe == "fp8_tensor":
        with pytest.raises(ValueError):
            sfmoe.quantize(x, recipe, group_offsets=offsets, group_amax=amax, tensor_scales=amax)
    if recipe == "nvfp4":
        with pytest.raises(ValueError):
            sfmoe.quantize(x, recipe, group_offsets=offsets, group_amax=amax, hadamard=True, columnwise=True)


def test_columnwise_transposed_scale_layout(rng):
    """fp8_block_1x128 with scale_layout="columnwise_transposed": the same codes and scale values
    as the compact layout, the columnwise scales stored [R / 128, C]; the rowwise ones unchanged.
    Special values and an empty group in the mix."""
    offsets = np.array([0, 300, 300, 557], np.int64)
    x = (rng.standard_normal((557, 384)) * np.exp2(rng.integers(-20, 20, size=(557, 1)))).astype(np.float32)
    x[5, :7] = [0.0, -0.0, np.inf, -np.inf, 1e-40, 3e38, -3e38]
    compact = sfmoe.quantize(x, "fp8_block_1x128", group_offsets=offsets, columnwise=True)
    moved = sfmoe.quantize(
        x, "fp8_block_1x128", group_offsets=offsets, columnwise=True, scale_layout="columnwise_transposed"
    )
    end = int(compact.group_offsets[-1])
    assert moved.rows == compact.rows and moved.scale_inv.shape == (compact.rows * 3,)
    # (rows at and beyond the last offset are not written)
    np.testing.assert_array_equal(moved.data[:end].view(np.uint8), compact.data[:end].view(np.uint8))
    np.testing.assert_array_equal(
        moved.columnwise_data[:, :end].view(np.uint8), compact.columnwise_data[:, :end].view(np.uint8)
    )
    np.testing.assert_array_equal(moved.scale_inv.reshape(compact.rows, 3)[:end], compact.scale_inv[:end])
    blocks = end // 128
    transposed = moved.columnwise_scale_inv.reshape(compact.rows // 128, 384)
    np.testing.assert_array_equal(transposed[:blocks].T, compact.columnwise_scale_inv[:, :blocks])
    np.testing.assert_array_equal(
        moved.compact_scale_inv(columnwise=True)[:, :blocks], compact.columnwise_scale_inv[:, :blocks]
    )
    np.testing.assert_array_equal(moved.dequantize(source="columnwise"), compact.dequantize(source="columnwise"))
    np.testing.assert_array_equal(moved.dequantize(source="rowwise"), compact.dequantize(source="rowwise"))
    with pytest.raises(ValueError, match="fp8_block_1x128 only"):
        sfmoe.quantize(x, "mxfp8", group_offsets=offsets, scale_layout="columnwise_transposed")


@pytest.mark.parametrize("recipe", RECIPES)
def test_flatten_and_unflatten_round_trip(rng, recipe):
    """flatten() gives the arrays present and hashable metadata; unflatten() of copies of those
    arrays is the same tensor (same fields, same dequantized values), for both copies, uniform
    groups and the Hadamard option."""
    variants = [dict(copies="both"), dict(copies="rowwise", power_of_two_scales=recipe.startswith("fp8"))]
    if recipe == "nvfp4":
        variants.append(dict(copies="both", hadamard=True, stochastic_rounding=True, seed=7, offset=3))
    for variant in variants:
        variant = dict(variant)
        copies = variant.pop("copies")
        _, _, _, q = quantize_case(rng, recipe, copies, **variant)
        arrays, metadata = q.flatten()
        hash(metadata)
        assert len(arrays) == len(metadata[0]) and all(a is not None for a in arrays)
        assert ("columnwise_data" in metadata[0]) == (copies == "both")
        back = sfmoe.GroupedQuantizedTensor.unflatten([a.copy() for a in arrays], metadata)
        for name in sfmoe.GroupedQuantizedTensor.ARRAY_FIELDS:
            mine, theirs = getattr(q, name), getattr(back, name)
            assert (mine is None) == (theirs is None), name
            if mine is not None:
                assert np.array_equal(mine.view(np.uint8), theirs.view(np.uint8)), name
        assert back.flatten()[1] == metadata
        assert back.config == q.config or q.config.tensor_scales is not None
        for source in ("rowwise",) + (("columnwise",) if copies == "both" else ()):
            assert np.array_equal(back.dequantize(source=source), q.dequantize(source=source), equal_nan=True)
    w = rng.standard_normal((4 * 128, 128)).astype(np.float32)
    uniform = sfmoe.quantize(w, recipe, uniform_group_rows=128)
    arrays, metadata = uniform.flatten()
    assert "group_offsets" not in metadata[0]
    back = sfmoe.GroupedQuantizedTensor.unflatten(arrays, metadata)
    assert back.uniform_group_rows == 128 and back.group_offsets is None
    assert np.array_equal(back.dequantize(), uniform.dequantize(), equal_nan=True)
    with pytest.raises(ValueError, match="arrays"):
        sfmoe.GroupedQuantizedTensor.unflatten(arrays[:-1], metadata)
