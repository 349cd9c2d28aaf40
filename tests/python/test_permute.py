"""sfmoe.permute / unpermute / unpermute_backward on NumPy arrays (the CPU backend): rows, offsets,
row map and counts against a NumPy rendering of docs/permute.md (with and without capacity, at
several alignments), the combine and its backward against NumPy sums, BF16 rows moved bit for
bit, and argument errors. Fresh random inputs each run (see conftest.py)."""

import numpy as np
import pytest
import sfmoe


def random_routing(rng, tokens, experts, k):
    return np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int32)


def numpy_permute(x, ids, experts, alignment, capacity):
    tokens, k = ids.shape
    row_map = np.full((tokens, k), -1, np.int64)
    offsets = np.zeros(experts + 1, np.int64)
    kept = np.zeros(experts, np.int64)
    dropped = np.zeros(experts, np.int64)
    blocks = []
    for e in range(experts):
        slots = [(t, i) for t in range(tokens) for i in range(k) if ids[t, i] == e]
        keep = slots[:capacity] if capacity else slots
        kept[e], dropped[e] = len(keep), len(slots) - len(keep)
        padded = -(-len(keep) // alignment) * alignment
        block = np.zeros((padded, x.shape[1]), x.dtype)
        for j, (t, i) in enumerate(keep):
            block[j] = x[t]
            row_map[t, i] = offsets[e] + j
        blocks.append(block)
        offsets[e + 1] = offsets[e] + padded
    return np.concatenate(blocks), offsets, row_map, kept, dropped


@pytest.mark.parametrize("alignment", [1, 8, 128])
@pytest.mark.parametrize("capacity", [0, 5])
def test_permute_matches_numpy(rng, alignment, capacity):
    tokens, experts, k, hidden = 37, 8, 3, 12
    x = rng.normal(size=(tokens, hidden)).astype(np.float32)
    ids = random_routing(rng, tokens, experts, k)
    p = sfmoe.permute(x, ids, experts, alignment=alignment, expert_capacity=capacity)
    rows, offsets, row_map, kept, dropped = numpy_permute(x, ids, experts, alignment, capacity)
    np.testing.assert_array_equal(p.group_offsets, offsets)
    np.testing.assert_array_equal(p.row_map, row_map)
    np.testing.assert_array_equal(p.tokens_per_expert, kept)
    np.testing.assert_array_equal(p.dropped_per_expert, dropped)
    np.testing.assert_array_equal(p.rows[: offsets[-1]], rows)
    assert p.rows.shape[0] >= offsets[-1]


def test_unpermute_and_backward_match_numpy(rng):
    tokens, experts, k, hidden = 29, 6, 2, 10
    x = rng.normal(size=(tokens, hidden)).astype(np.float32)
    ids = random_routing(rng, tokens, experts, k)
    probs = rng.uniform(size=(tokens, k)).astype(np.float32)
    p = sfmoe.permute(x, ids, experts, alignment=8, expert_capacity=6)
    # Stands in for the FC2 output, laid out like the rows (rows beyond the groups are not written
    # by permute: they hold whatever the allocation held, and nothing may read them).
    end = p.group_offsets[-1]
    y = np.full(p.rows.shape, np.nan, np.float32)
    y[:end] = p.rows[:end] * 2.0
    out = sfmoe.unpermute(y, p, probs)
    want = np.zeros((tokens, hidden), np.float64)
    for t in range(tokens):
        for i in range(k):
            if p.row_map[t, i] >= 0:
                want[t] += probs[t, i] * y[p.row_map[t, i]].astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    d_out = rng.normal(size=(tokens, hidden)).astype(np.float32)
    d_rows, d_probs = sfmoe.unpermute_backward(d_out, y, p, probs)
    for t in range(tokens):
        for i in range(k):
            row = p.row_map[t, i]
            if row < 0:
                assert d_probs[t, i] == 0.0
                continue
            np.testing.assert_array_equal(d_rows[row], probs[t, i] * d_out[t])
            np.testing.assert_allclose(d_probs[t, i], d_out[t].astype(np.float64) @ y[row], rtol=1e-5, atol=1e-6)
    # Rows no slot names: the groups' padding rows are zeros (rows beyond the groups are not
    # written).
    named = set(p.row_map[p.row_map >= 0].tolist())
    for row in range(int(p.group_offsets[-1])):
        if row not in named:
            assert not d_rows[row].any()
    # Half-precision d rows are the FP32 ones rounded once.
    d_rows16, d_probs16 = sfmoe.unpermute_backward(d_out, y, p, probs, out_dtype="float16")
    assert d_rows16.dtype == np.float16
    np.testing.assert_array_equal(d_rows16[:end], d_rows[:end].astype(np.float16))
    np.testing.assert_array_equal(d_probs16, d_probs)
    with pytest.raises(ValueError):
        sfmoe.unpermute_backward(d_out, y, p, probs, out_dtype="int8")


def test_bf16_rows_move_bit_for_bit(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    tokens, experts, k = 16, 4, 2
    x = rng.normal(size=(tokens, 8)).astype(ml_dtypes.bfloat16)
    ids = random_routing(rng, tokens, experts, k)
    p = sfmoe.permute(x, ids, experts, alignment=16)
    for t in range(tokens):
        for i in range(k):
            assert p.rows[p.row_map[t, i]].view(np.uint16).tobytes() == x[t].view(np.uint16).tobytes()
    back = sfmoe.unpermute(p.rows, p, None, out_dtype="fp32")
    np.testing.assert_array_equal(back, 2 * x.astype(np.float32))


@pytest.mark.parametrize("capacity", [0, 4])
def test_permute_amax_then_quantize_in_one_read(capacity, rng):
    """amax=True: each expert's amax of its kept rows, which quantize takes as group_amax to give
    the bytes of quantizing the rows with the amax computed from them."""
    tokens, experts, k, hidden = 41, 7, 2, 32
    x = rng.normal(size=(tokens, hidden)).astype(np.float32) * rng.uniform(0.1, 10, size=(tokens, 1)).astype(np.float32)
    ids = random_routing(rng, tokens, experts, k)
    ids[ids == experts - 1] = (ids[ids == experts - 1] + 1) % (experts - 1)  # an expert without rows
    ids[:, 1] = np.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % (experts - 1), ids[:, 1])
    p = sfmoe.permute(x, ids, experts, alignment=8, expert_capacity=capacity, amax=True)
    want = np.zeros(experts, np.float32)
    for t in range(tokens):
        for i in range(k):
            if p.row_map[t, i] >= 0:
                want[ids[t, i]] = max(want[ids[t, i]], np.abs(x[t]).max())
    np.testing.assert_array_equal(p.amax, want)
    assert p.amax[experts - 1] == 0
    given = sfmoe.quantize(p.rows, "fp8_tensor", group_offsets=p.group_offsets, row_alignment=8, group_amax=p.amax)
    computed = sfmoe.quantize(p.rows, "fp8_tensor", group_offsets=p.group_offsets, row_alignment=8)
    end = int(p.group_offsets[-1])  # rows past the groups are not written
    np.testing.assert_array_equal(given.data[:end].view(np.uint8), computed.data[:end].view(np.uint8))
    np.testing.assert_array_equal(given.scale_inv, computed.scale_inv)
    assert p.amax.dtype == np.float32 and sfmoe.permute(x, ids, experts).amax is None
    with pytest.raises(ValueError, match="unquantized"):
        sfmoe.permute(x, ids, experts, alignment=32, quantize="mxfp8", amax=True)


def test_permute_errors(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)
    ids = np.array([[0, 1], [1, 1], [2, 0], [3, 2]], np.int32)
    with pytest.raises(sfmoe.Error, match="twice"):
        sfmoe.permute(x, ids, 4)
    with pytest.raises(sfmoe.Error, match="not an expert"):
        sfmoe.permute(x, np.array([[0, 4]] * 4, np.int32), 4)
    with pytest.raises(sfmoe.Error, match="row_alignment"):
        sfmoe.permute(x, random_routing(rng, 4, 4, 2), 4, alignment=3)
    with pytest.raises(TypeError, match="int32 or int64"):  # int32 or int64 ids, nothing else
        sfmoe.permute(x, random_routing(rng, 4, 4, 2).astype(np.int16), 4)


@pytest.mark.parametrize(
    "recipe,layout,alignment,hidden,pow2",
    [
        ("mxfp8", "compact", 32, 96, False),
        ("mxfp8", "swizzled", 128, 96, False),
        ("fp8_block_1x128", "compact", 16, 256, False),
        ("fp8_block_1x128", "compact", 1, 128, True),
    ],
)
def test_fused_quantization_is_permute_then_quantize(recipe, layout, alignment, hidden, pow2, rng):
    tokens, experts, k = 45, 8, 3
    x = rng.normal(size=(tokens, hidden)).astype(np.float32) * 4.0
    x[3, 5] = np.inf
    x[7, 0] = np.nan
    x[9] = 0.0
    ids = random_routing(rng, tokens, experts, k)
    fused = sfmoe.permute(
        x,
        ids,
        experts,
        alignment=alignment,
        expert_capacity=7,
        quantize=recipe,
        scale_layout=layout,
        power_of_two_scales=pow2,
    )
    plain = sfmoe.permute(x, ids, experts, alignment=alignment, expert_capacity=7)
    q = sfmoe.quantize(
        plain.rows,
        recipe,
        group_offsets=plain.group_offsets,
        row_alignment=alignment,
        out_row_capacity=plain.rows.shape[0] + experts * alignment,
        scale_layout=layout,
        power_of_two_scales=pow2,
    )
    end = int(plain.group_offsets[-1])
    np.testing.assert_array_equal(fused.group_offsets, plain.group_offsets)
    np.testing.assert_array_equal(fused.row_map, plain.row_map)
    np.testing.assert_array_equal(fused.rows.data[:end].view(np.uint8), q.data[:end].view(np.uint8))
    np.testing.assert_array_equal(
        fused.rows.compact_scale_inv()[:end].view(np.uint8), q.compact_scale_inv()[:end].view(np.uint8)
    )
    with pytest.raises(sfmoe.Error):
        sfmoe.permute(x, ids, experts, alignment=alignment, quantize="fp8_tensor")


@pytest.mark.parametrize("fmt,alignment", [("e4m3", 16), ("e5m2", 1)])
def test_fused_tensor_quantization_with_given_scales(fmt, alignment, rng):
    """fp8_tensor with given per-expert scales: each row encoded with its expert's scale, used as
    is; scale_inv its inverse; the amax each expert's group amax."""
    tokens, experts, k, hidden = 45, 8, 3, 40
    x = rng.normal(size=(tokens, hidden)).astype(np.float32) * 4.0
    x[9] = 0.0
    ids = random_routing(rng, tokens, experts, k)
    scales = np.exp2(rng.uniform(-3, 8, size=experts)).astype(np.float32)
    scales[1] = 1e6  # saturates
    fused = sfmoe.permute(x, ids, experts, alignment=alignment, quantize="fp8_tensor", fmt=fmt, tensor_scales=scales)
    plain = sfmoe.permute(x, ids, experts, alignment=alignment)
    end = int(plain.group_offsets[-1])
    np.testing.assert_array_equal(fused.group_offsets, plain.group_offsets)
    np.testing.assert_array_equal(fused.rows.scale_inv, (1.0 / scales.astype(np.float64)).astype(np.float32))
    want = sfmoe.quantize(
        plain.rows,
        "fp8_tensor",
        group_offsets=plain.group_offsets,
        fmt=fmt,
        row_alignment=alignment,
        out_row_capacity=plain.rows.shape[0] + experts * alignment,
        tensor_scales=scales,
    )
    np.testing.assert_array_equal(fused.rows.data[:end].view(np.uint8), want.data[:end].view(np.uint8))
    np.testing.assert_array_equal(fused.rows.amax, want.amax)
    for e in range(experts):
        rows = plain.rows[plain.group_offsets[e] : plain.group_offsets[e + 1]]
        assert fused.rows.amax[e] == (np.abs(rows).max() if rows.size else 0.0)
    with pytest.raises(ValueError):
        sfmoe.permute(x, ids, experts, quantize="mxfp8", tensor_scales=scales)
