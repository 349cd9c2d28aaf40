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
