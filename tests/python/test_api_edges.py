"""The Python API's edges as a new user meets them: int64 expert ids (torch.topk's) accepted, Python
lists for offsets accepted on host data everywhere (and refused beside device data with one
message), sfmoe's own message for a bad top_k, errors that name both arguments of a mismatch,
and dtype refusals that suggest only options the function has."""

import numpy as np
import pytest
import sfmoe


def test_int64_expert_ids_are_accepted_and_out_of_range_ones_refused():
    rng = np.random.default_rng()
    x = rng.standard_normal((9, 16)).astype(np.float32)
    ids = np.stack([rng.permutation(5)[:2] for _ in range(9)])
    a = sfmoe.permute(x, ids.astype(np.int64), 5)
    b = sfmoe.permute(x, ids.astype(np.int32), 5)
    assert np.array_equal(a.rows, b.rows) and np.array_equal(a.row_map, b.row_map)
    wrapped = ids.astype(np.int64)
    wrapped[3, 1] = 2**32 + 1  # would wrap to expert 1 as int32
    with pytest.raises(sfmoe.Error, match="topk_ids"):
        sfmoe.permute(x, wrapped, 5)


def test_python_lists_of_offsets_work_wherever_offsets_are_taken_on_the_host():
    rng = np.random.default_rng()
    x = rng.standard_normal((64, 32)).astype(np.float32)
    offsets, rows = [0, 32, 64], [30, 17]
    assert np.array_equal(
        sfmoe.grouped_activation(x, offsets, rows),
        sfmoe.grouped_activation(x, np.array(offsets), np.array(rows)),
    )
    w = rng.standard_normal((2, 8, 32)).astype(np.float32)
    assert np.array_equal(
        sfmoe.grouped_gemm("fprop", x, w, offsets), sfmoe.grouped_gemm("fprop", x, w, np.array(offsets))
    )
    q = sfmoe.quantize(x, "mxfp8", group_offsets=offsets)
    assert q.rows == 64
    with pytest.raises(TypeError, match="expected integers"):
        sfmoe.grouped_activation(x, [0, 32.5, 64], rows)


def test_a_bad_top_k_gets_sfmoes_own_message():
    logits = np.zeros((4, 6), np.float32)
    for k in (-1, 0, 7):
        with pytest.raises(sfmoe.Error, match="top_k"):
            sfmoe.router(logits, k)


def test_an_activation_backward_mismatch_names_both_arrays():
    x = np.zeros((16, 32), np.float32)
    d_out = np.zeros((16, 5), np.float32)
    with pytest.raises(sfmoe.Error, match="d_output has 5 cols, so input must have 10"):
        sfmoe.grouped_activation_backward(x, d_out, [0, 16], [16])


def test_float64_refusals_suggest_only_options_the_function_has():
    x = np.zeros((8, 16))
    with pytest.raises(TypeError) as refused:
        sfmoe.permute(x, np.zeros((8, 1), np.int32), 4)
    assert "input_dtype" not in str(refused.value) and "expected fp32 or bf16 or fp16" in str(refused.value)
    with pytest.raises(TypeError, match="int32 or int64 expert ids"):
        sfmoe.permute(np.zeros((8, 16), np.float32), np.zeros((8, 1), np.int16), 4)
    with pytest.raises(TypeError, match="input_dtype"):
        sfmoe.cast(x, "bf16")
