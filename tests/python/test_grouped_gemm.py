"""sfmoe.grouped_gemm on NumPy arrays (the CPU backend): the three forms against NumPy per group
(exact on integer-valued operands), the wgrad accumulator, and argument errors."""

import numpy as np
import pytest
import sfmoe

OFFSETS = np.array([0, 0, 1, 18, 51, 64], np.int64)  # groups of 0, 1, 17, 33, 13 rows
G, R, N, K = 5, 70, 12, 20  # rows 64..69 lie beyond the groups


def test_three_forms_exact_on_integers(rng):
    x = rng.integers(-4, 5, size=(R, K)).astype(np.float32)
    w = rng.integers(-4, 5, size=(G, N, K)).astype(np.float32)
    dy = rng.integers(-4, 5, size=(R, N)).astype(np.float32)
    y = sfmoe.grouped_gemm("fprop", x, w, OFFSETS)
    dx = sfmoe.grouped_gemm("dgrad", dy, w, OFFSETS)
    dw = sfmoe.grouped_gemm("wgrad", dy, x, OFFSETS)
    for g in range(G):
        rows = slice(OFFSETS[g], OFFSETS[g + 1])
        np.testing.assert_array_equal(y[rows], x[rows] @ w[g].T)
        np.testing.assert_array_equal(dx[rows], dy[rows] @ w[g])
        np.testing.assert_array_equal(dw[g], dy[rows].T @ x[rows])
    assert not y[64:].any() and not dx[64:].any(), "rows beyond the groups are not written (zeros here)"


def test_gathered_rows_equal_the_rows_copied_out(rng):
    source = rng.integers(-4, 5, size=(23, K)).astype(np.float32)
    dy_source = rng.integers(-4, 5, size=(23, N)).astype(np.float32)
    w = rng.integers(-4, 5, size=(G, N, K)).astype(np.float32)
    index = rng.integers(-2, 26, size=R).astype(np.int32)  # repeats, padding (-1, -2), past the source
    kept = (index >= 0) & (index < 23)
    copied = np.where(kept[:, None], source[np.clip(index, 0, 22)], 0).astype(np.float32)
    dy_copied = np.where(kept[:, None], dy_source[np.clip(index, 0, 22)], 0).astype(np.float32)
    y = sfmoe.grouped_gemm("fprop", source, w, OFFSETS, a_row_index=index)
    dx = sfmoe.grouped_gemm("dgrad", dy_source, w, OFFSETS, a_row_index=index)
    assert y.shape == (R, N) and dx.shape == (R, K)
    np.testing.assert_array_equal(y[:64], sfmoe.grouped_gemm("fprop", copied, w, OFFSETS)[:64])
    np.testing.assert_array_equal(dx[:64], sfmoe.grouped_gemm("dgrad", dy_copied, w, OFFSETS)[:64])
    with pytest.raises(ValueError, match="a_row_index"):
        sfmoe.grouped_gemm("wgrad", dy_source, source, OFFSETS, a_row_index=index)
    with pytest.raises(TypeError, match="int32"):
        sfmoe.grouped_gemm("fprop", source, w, OFFSETS, a_row_index=index.astype(np.int64))


def test_wgrad_accumulates(rng):
    x = rng.normal(size=(R, K)).astype(np.float32)
    dy = rng.normal(size=(R, N)).astype(np.float32)
    main_grad = rng.normal(size=(G, N, K)).astype(np.float32)
    fresh = sfmoe.grouped_gemm("wgrad", dy, x, OFFSETS)
    acc = main_grad.copy()
    sfmoe.grouped_gemm("wgrad", dy, x, OFFSETS, out=acc, accumulate=True)
    np.testing.assert_array_equal(acc, main_grad + fresh)
    np.testing.assert_array_equal(acc[0], main_grad[0])  # the empty group leaves its accumulator


def test_grouped_gemm_errors(rng):
    x = rng.normal(size=(R, K)).astype(np.float32)
    w = rng.normal(size=(G, N, K)).astype(np.float32)
    with pytest.raises(ValueError, match="form"):
        sfmoe.grouped_gemm("bprop", x, w, OFFSETS)
    with pytest.raises(sfmoe.Error, match="cols"):
        sfmoe.grouped_gemm("fprop", x[:, :10], w, OFFSETS)
    with pytest.raises(sfmoe.Error, match="accumulate"):
        sfmoe.grouped_gemm("fprop", x, w, OFFSETS, accumulate=True)
    with pytest.raises(TypeError, match="int64"):
        sfmoe.grouped_gemm("fprop", x, w, OFFSETS.astype(np.int32))


def test_quantized_operands_read_their_forms_copy(rng):
    offsets = np.array([0, 128, 128, 256], np.int64)
    groups, rows, n, k = 3, 256, 128, 128
    x = rng.normal(size=(rows, k)).astype(np.float32)
    w = rng.normal(size=(groups * n, k)).astype(np.float32)
    dy = rng.normal(size=(rows, n)).astype(np.float32)
    qx = sfmoe.quantize(x, "fp8_block_1x128", group_offsets=offsets, columnwise=True)
    qw = sfmoe.quantize(w, "fp8_block_1x128", uniform_group_rows=n, columnwise=True)
    qdy = sfmoe.quantize(dy, "fp8_block_1x128", group_offsets=offsets, columnwise=True)
    np.testing.assert_array_equal(qx.group_offsets, offsets)
    x_row, x_col = qx.dequantize(source="rowwise"), qx.dequantize(source="columnwise")
    w_row, w_col = qw.dequantize(source="rowwise"), qw.dequantize(source="columnwise")
    dy_row, dy_col = qdy.dequantize(source="rowwise"), qdy.dequantize(source="columnwise")
    assert not np.array_equal(w_row, w_col), "blockwise copies round differently"

    y = sfmoe.grouped_gemm("fprop", qx, qw)
    dx = sfmoe.grouped_gemm("dgrad", qdy, qw)
    dw = sfmoe.grouped_gemm("wgrad", qdy, qx)
    for g in range(groups):
        r = slice(offsets[g], offsets[g + 1])
        wg = slice(g * n, (g + 1) * n)
        np.testing.assert_allclose(y[r], x_row[r].astype(np.float64) @ w_row[wg].T, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dx[r], dy_row[r].astype(np.float64) @ w_col[wg], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(dw[g], dy_col[r].T.astype(np.float64) @ x_col[r], rtol=1e-4, atol=1e-4)

    rowwise_only = sfmoe.quantize(w, "fp8_block_1x128", uniform_group_rows=n)
    with pytest.raises(sfmoe.Error, match="columnwise copy"):
        sfmoe.grouped_gemm("dgrad", dy, rowwise_only, offsets)


def test_quantized_rows_keep_their_own_offsets(rng):
    """A quantized a is grouped by its own (padded) offsets: other group_offsets are refused, not
    silently ignored."""
    offsets = np.array([0, 128, 128, 256], np.int64)
    x = rng.normal(size=(256, 128)).astype(np.float32)
    w = rng.normal(size=(3 * 128, 128)).astype(np.float32)
    qx = sfmoe.quantize(x, "fp8_block_1x128", group_offsets=offsets)
    qw = sfmoe.quantize(w, "fp8_block_128x128", uniform_group_rows=128)
    same = sfmoe.grouped_gemm("fprop", qx, qw, qx.group_offsets)
    np.testing.assert_array_equal(same, sfmoe.grouped_gemm("fprop", qx, qw))
    with pytest.raises(ValueError, match="its own group_offsets"):
        sfmoe.grouped_gemm("fprop", qx, qw, np.array([0, 64, 128, 256], np.int64))
