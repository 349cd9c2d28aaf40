"""Failures of the C library surface as sfmoe.Error carrying the library's own message and status;
bad arguments caught in Python or in the binding raise ValueError / TypeError; nothing crashes.

Descriptors are built from plain integers (pointers included) and only validated, never used to
touch memory, so bad pointers are safe here."""

import re

import numpy as np
import pytest
import sfmoe
from sfmoe import _C

ALIGNED = 0x10000  # a 16-byte aligned address, never dereferenced
NO_GPU = sfmoe.device_info()["device_count"] == 0


def tensor(**fields):
    """A valid descriptor's fields with `fields` replaced."""
    base = dict(data_ptr=ALIGNED, dtype="fp32", shape=[4, 8])
    base.update(fields)
    return base


def grouped(**fields):
    """A valid FP8 per-tensor grouped descriptor's fields with `fields` replaced."""
    base = dict(
        dtype="fp8_e4m3",
        scaling="tensor",
        num_groups=4,
        row_capacity=256,
        cols=128,
        row_alignment=16,
        group_offsets=0x2000,
        rowwise_data=ALIGNED,
        rowwise_scale_inv=0x3000,
    )
    base.update(fields)
    return base


def cuda_memory_case():
    """CUDA memory: refused for want of a backend or device on a CPU machine; on a GPU machine a
    device ordinal that does not exist is refused instead."""
    if NO_GPU:
        return tensor(memory="cuda"), "SFMOE_ERROR_NO_BACKEND", r"CUDA memory but"
    return (
        tensor(memory="cuda", device=999),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"device 999 does not exist",
    )


TENSOR_CASES = {
    "null descriptor": (
        tensor(null=True),
        "SFMOE_ERROR_NULL_POINTER",
        r"descriptor pointer is NULL",
    ),
    "struct_size mismatch": (
        tensor(struct_size=8),
        "SFMOE_ERROR_STRUCT_SIZE",
        r"struct_size is 8 but this library's sfmoe_tensor has \d+ bytes",
    ),
    "struct_size too large": (
        tensor(struct_size=_C.TENSOR_STRUCT_SIZE + 8),
        "SFMOE_ERROR_STRUCT_SIZE",
        r"struct_size is \d+ but",
    ),
    "bad dtype enum": (
        tensor(dtype=99),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"dtype 99 is not a valid sfmoe_dtype",
    ),
    "negative dtype enum": (
        tensor(dtype=-1),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"dtype -1 is not a valid",
    ),
    "ndim above max": (
        tensor(shape=[1, 1, 1, 1, 1]),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"ndim 5 is outside \[0, 4\]",
    ),
    "ndim negative": (tensor(ndim=-1), "SFMOE_ERROR_INVALID_ARGUMENT", r"ndim -1 is outside"),
    "negative dim": (
        tensor(shape=[4, -3]),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"shape\[1\] = -3 is negative",
    ),
    "element count overflow": (
        tensor(shape=[2**40, 2**40]),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"overflows int64",
    ),
    "null data with elements": (
        tensor(data_ptr=0),
        "SFMOE_ERROR_NULL_POINTER",
        r"data is NULL but the tensor has 32 elements",
    ),
    "misaligned data": (
        tensor(data_ptr=0x1001),
        "SFMOE_ERROR_MISALIGNED",
        r"data 0x1001 is not 16-byte aligned",
    ),
    "fp4 odd innermost dim": (
        tensor(dtype="fp4_e2m1", shape=[4, 3]),
        "SFMOE_ERROR_SHAPE_MISMATCH",
        r"innermost dimension must be even \(got 3\)",
    ),
    "bad memory enum": (
        tensor(memory=7),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"memory 7 is not a valid sfmoe_memory",
    ),
    "cuda memory": cuda_memory_case(),
}

GROUPED_CASES = {
    "null descriptor": (
        grouped(null=True),
        "SFMOE_ERROR_NULL_POINTER",
        r"descriptor pointer is NULL",
    ),
    "struct_size mismatch": (
        grouped(struct_size=4),
        "SFMOE_ERROR_STRUCT_SIZE",
        r"struct_size is 4 but this library's sfmoe_grouped_tensor has \d+ bytes",
    ),
    "bad dtype enum": (
        grouped(dtype=12),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"dtype 12 is not a valid",
    ),
    "bad scaling enum": (
        grouped(scaling=17),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"scaling 17 is not a valid sfmoe_scaling",
    ),
    "bad scale_layout enum": (
        grouped(scale_layout=5),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"scale_layout 5 is not a valid",
    ),
    "dtype/scaling mismatch": (
        grouped(dtype="fp32"),
        "SFMOE_ERROR_DTYPE_MISMATCH",
        r"scaling 'tensor' cannot hold dtype 'fp32'",
    ),
    "num_groups 0": (
        grouped(num_groups=0),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"num_groups is 0; it must be >= 1",
    ),
    "negative row_capacity": (
        grouped(row_capacity=-1),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"row_capacity is -1",
    ),
    "cols 0": (grouped(cols=0), "SFMOE_ERROR_INVALID_ARGUMENT", r"cols is 0; it must be >= 1"),
    "row_alignment not a power of two": (
        grouped(row_alignment=3),
        "SFMOE_ERROR_INVALID_ARGUMENT",
        r"row_alignment is 3; it must be a power of two",
    ),
    "cols not a multiple of the block": (
        grouped(scaling="mx_1x32", cols=48),
        "SFMOE_ERROR_SHAPE_MISMATCH",
        r"cols = 48 is not a multiple of the mx_1x32 block width 32",
    ),
    "uniform groups over capacity": (
        grouped(uniform_group_rows=128, group_offsets=0),
        "SFMOE_ERROR_SHAPE_MISMATCH",
        r"4 groups of uniform_group_rows = 128 exceed row_capacity 256",
    ),
    "missing group_offsets": (
        grouped(group_offsets=0),
        "SFMOE_ERROR_NULL_POINTER",
        r"group_offsets is NULL and uniform_group_rows is 0",
    ),
    "misaligned group_offsets": (
        grouped(group_offsets=0x2004),
        "SFMOE_ERROR_MISALIGNED",
        r"group_offsets 0x2004 is not 8-byte aligned",
    ),
    "no data at all": (
        grouped(rowwise_data=0),
        "SFMOE_ERROR_NULL_POINTER",
        r"neither rowwise_data nor columnwise_data is set",
    ),
    "missing scale_inv": (
        grouped(rowwise_scale_inv=0),
        "SFMOE_ERROR_NULL_POINTER",
        r"scaling 'tensor' needs rowwise_scale_inv",
    ),
    "missing columnwise scale_inv": (
        grouped(columnwise_data=ALIGNED),
        "SFMOE_ERROR_NULL_POINTER",
        r"needs columnwise_scale_inv",
    ),
    "scale_inv without scaling": (
        grouped(dtype="bf16", scaling="none"),
        "SFMOE_ERROR_DTYPE_MISMATCH",
        r"scale_inv pointers are set but scaling is 'none'",
    ),
    "misaligned data": (
        grouped(rowwise_data=ALIGNED + 8),
        "SFMOE_ERROR_MISALIGNED",
        r"rowwise_data 0x10008 is not 16-byte aligned",
    ),
}


def check_error(error_info, status, pattern):
    error = error_info.value
    assert type(error) is sfmoe.Error and isinstance(error, RuntimeError)
    assert error.status == status
    assert error.code == _C.STATUS_CODES[status]
    assert sfmoe.status_name(error.code) == status
    # The exception carries the C library's message exactly as sfmoe_last_error() has it.
    assert str(error) == error.message == sfmoe.last_error()
    assert re.search(pattern, str(error)), str(error)


@pytest.mark.parametrize("case", TENSOR_CASES, ids=list(TENSOR_CASES))
def test_bad_tensor_descriptors(case):
    fields, status, pattern = TENSOR_CASES[case]
    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.validate_tensor(**fields)
    check_error(error_info, status, pattern)
    assert str(error_info.value).startswith("sfmoe_tensor_validate: tensor: ")


@pytest.mark.parametrize("case", GROUPED_CASES, ids=list(GROUPED_CASES))
def test_bad_grouped_descriptors(case):
    fields, status, pattern = GROUPED_CASES[case]
    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.validate_grouped_tensor(**fields)
    check_error(error_info, status, pattern)


def test_valid_descriptors_pass():
    sfmoe.validate_tensor(**tensor())
    sfmoe.validate_tensor(**tensor(data_ptr=0, shape=[0, 8]))  # no elements: NULL is fine
    sfmoe.validate_tensor(ALIGNED, sfmoe.DType.FP4_E2M1, [2, 6])
    sfmoe.validate_tensor(ALIGNED, "fp32", [])  # a scalar
    sfmoe.validate_grouped_tensor(**grouped())
    sfmoe.validate_grouped_tensor(**grouped(uniform_group_rows=64, group_offsets=0))
    sfmoe.validate_grouped_tensor(**grouped(dtype="fp4_e2m1", scaling="nv_1x16", rowwise_scale_inv=0x3001))


def test_descriptor_names_appear_in_messages():
    with pytest.raises(sfmoe.Error, match=r"^sfmoe_tensor_validate: weights: "):
        sfmoe.validate_tensor(0x1001, "fp32", [4], name="weights")
    with pytest.raises(sfmoe.Error, match=r"^sfmoe_grouped_tensor_validate: fc1 input: "):
        sfmoe.validate_grouped_tensor(**grouped(num_groups=0, name="fc1 input"))


CAST_CASES = {
    "element-count mismatch": (
        lambda x: sfmoe.cast(x, "e4m3", out=np.zeros(31, np.uint8)),
        "SFMOE_ERROR_SHAPE_MISMATCH",
        r"^sfmoe_cast: input has 32 elements but output has 31$",
    ),
    "integer input": (
        lambda x: sfmoe.cast(np.zeros(32, np.int32), "fp32"),
        "SFMOE_ERROR_DTYPE_MISMATCH",
        r"input dtype 'int32' is not a floating-point dtype",
    ),
    "integer output": (
        lambda x: sfmoe.cast(x, "int32"),
        "SFMOE_ERROR_DTYPE_MISMATCH",
        r"output dtype 'int32' is not a floating-point dtype",
    ),
    "e8m0 output": (
        lambda x: sfmoe.cast(x, "e8m0"),
        "SFMOE_ERROR_DTYPE_MISMATCH",
        r"output dtype 'e8m0' is not",
    ),
    "misaligned output": (
        lambda x: sfmoe.cast(x, "e4m3", out=np.zeros(48, np.uint8)[1:33]),
        "SFMOE_ERROR_MISALIGNED",
        r"^sfmoe_cast: output: data 0x[0-9a-f]+ is not 16-byte aligned$",
    ),
}


@pytest.mark.parametrize("case", CAST_CASES, ids=list(CAST_CASES))
def test_bad_cast_arguments(case):
    call, status, pattern = CAST_CASES[case]
    x = np.ones(32, np.float32)
    with pytest.raises(sfmoe.Error) as error_info:
        call(x)
    check_error(error_info, status, pattern)


def test_cuda_memory_mismatch_is_refused_by_the_binding():
    # A device-side scale next to host data would be dereferenced on the host: refused before the
    # library is called. (A scale array in host memory is the host path's normal case.)
    x = np.ones(16, np.float32)
    out = np.zeros(16, np.uint8)
    _C.cast(x, _C.DTYPE_FP32, out, _C.DTYPE_FP8_E4M3, 1.0, 0, np.array([2.0], np.float32))
    assert np.array_equal(out, sfmoe.numerics.f32_to_e4m3(x * 2))


def test_binding_refuses_what_no_descriptor_expresses():
    x = np.ones((4, 8), np.float32)
    out = np.zeros((4, 8), np.uint8)
    fp32, e4m3, fp4 = _C.DTYPE_FP32, _C.DTYPE_FP8_E4M3, _C.DTYPE_FP4_E2M1
    with pytest.raises(ValueError, match="not C-contiguous"):
        _C.cast(x.T, fp32, out.reshape(8, 4), e4m3)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _C.cast(x, fp32, np.zeros((8, 4), np.uint8).T, e4m3)
    with pytest.raises(ValueError, match="at most 4"):
        _C.cast(x.reshape(1, 1, 1, 4, 8), fp32, out, e4m3)
    with pytest.raises(TypeError, match="cannot hold fp32"):
        _C.cast(x.view(np.uint16), fp32, out, e4m3)
    with pytest.raises(TypeError, match="fp4_e2m1 data is carried in a byte array"):
        _C.cast(x, fp32, x.copy(), fp4)
    with pytest.raises(ValueError, match="at least one dimension"):
        _C.cast(np.ones((), np.float32), fp32, np.zeros((), np.uint8), fp4)
    with pytest.raises(ValueError, match="not an sfmoe dtype"):
        _C.cast(x, 77, out, e4m3)
    with pytest.raises(TypeError, match="scale_device"):
        _C.cast(x, fp32, out, e4m3, 1.0, 0, "two")
    with pytest.raises(ValueError, match="exactly one float32"):
        _C.cast(x, fp32, out, e4m3, 1.0, 0, np.ones(2, np.float32))
    with pytest.raises(TypeError):  # read-only output: refused by the array import
        readonly = np.zeros((4, 8), np.uint8)
        readonly.flags.writeable = False
        _C.cast(x, fp32, readonly, e4m3)
    with pytest.raises(TypeError, match="amax must be an integer that fits uint64"):
        sfmoe.validate_grouped_tensor(**grouped(amax=2**64))
    with pytest.raises(TypeError, match="num_groups must be an integer that fits int64"):
        _C.validate_grouped_tensor(num_groups=1.5)
    with pytest.raises(TypeError, match="unknown field 'colls'"):
        _C.validate_grouped_tensor(colls=4)
    with pytest.raises(TypeError):
        sfmoe.validate_tensor(ALIGNED, "fp32", [4], memory=1.5)
    with pytest.raises(ValueError, match="unknown name"):
        sfmoe.validate_grouped_tensor(**grouped(scaling="mx"))


def test_status_names():
    assert sfmoe.status_name(0) == "SFMOE_SUCCESS"
    assert sfmoe.status_name(3) == "SFMOE_ERROR_MISALIGNED"
    assert sfmoe.status_name(1234) == "SFMOE_ERROR_UNKNOWN_STATUS"
    assert len(_C.STATUS_CODES) == 13


def test_error_is_picklable():
    import pickle

    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.validate_tensor(0x1001, "fp32", [4])
    copy = pickle.loads(pickle.dumps(error_info.value))
    assert (copy.status, copy.code, str(copy)) == (
        error_info.value.status,
        error_info.value.code,
        str(error_info.value),
    )


def test_random_descriptors_never_crash(rng):
    """A valid descriptor with one to three fields replaced by random, mostly invalid, values:
    each call passes or raises sfmoe.Error with the library's message."""
    choices = dict(
        struct_size=[_C.GROUPED_TENSOR_STRUCT_SIZE, 0, 8, 2**63],
        memory=[-2, 0, 1, 2],
        device=[-2, 0, 1, 2],
        dtype=list(range(-2, 11)),
        scaling=list(range(-2, 9)),
        scale_layout=[-1, 0, 1, 2],
        num_groups=[-1, 0, 1, 7, 2**62],
        row_capacity=[-5, 0, 128, 2**62],
        cols=[-1, 0, 3, 16, 32, 128, 2**62],
        row_alignment=[-4, 0, 1, 3, 16, 2**62],
        uniform_group_rows=[-1, 0, 16, 2**40],
        **{
            pointer: [0, 1, 0x1004, ALIGNED, 2**64 - 16]
            for pointer in (
                "group_offsets",
                "rowwise_data",
                "rowwise_scale_inv",
                "columnwise_data",
                "columnwise_scale_inv",
                "amax",
            )
        },
    )
    names = sorted(choices)
    outcomes = {}
    for _ in range(3000):
        fields = grouped()
        for _ in range(int(rng.integers(1, 4))):
            name = names[int(rng.integers(len(names)))]
            fields[name] = choices[name][int(rng.integers(len(choices[name])))]
        try:
            sfmoe.validate_grouped_tensor(**fields)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except sfmoe.Error as error:
            assert str(error) == sfmoe.last_error() and error.status.startswith("SFMOE_ERROR_")
            outcomes[error.status] = outcomes.get(error.status, 0) + 1
    assert len(outcomes) >= 6, outcomes
