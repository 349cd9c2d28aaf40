"""Grouped GEMM, the three training forms (docs/grouped_gemm.md). The library runs it on host
memory with unquantized operands for now (NumPy arrays, CPU torch tensors)."""

from . import _C, _arrays
from ._dtypes import DType, as_dtype

_FORMS = {"fprop": 0, "dgrad": 1, "wgrad": 2}
_OPERAND_DTYPES = (DType.FP32, DType.BF16, DType.FP16)


def _operand(x, what, ndim):
    adapter, x = _arrays.adapt(x, what)
    dtype = _arrays.resolve_dtype(adapter, x, None, what)
    if dtype not in _OPERAND_DTYPES:
        raise TypeError(f"{what}: expected float32, bfloat16 or float16 values, got {dtype.c_name}")
    if len(adapter.shape(x)) != ndim:
        raise ValueError(f"{what}: expected a {ndim}-D array, got shape {adapter.shape(x)}")
    return adapter, adapter.prepare_input(x), dtype


def _offsets(group_offsets):
    adapter, offsets = _arrays.adapt(group_offsets, "group_offsets")
    if _arrays.resolve_dtype(adapter, offsets, None, "group_offsets") != DType.INT64:
        raise TypeError("group_offsets: expected int64 values")
    return adapter.for_binding(adapter.prepare_input(offsets))


def grouped_gemm(form, a, b, group_offsets, *, out=None, out_dtype=None, accumulate=False):
    """One grouped GEMM (docs/grouped_gemm.md); group g owns rows [offsets[g], offsets[g + 1]).

    form "fprop": a = X [R, K], b = W [G, N, K] -> Y [R, N];
    form "dgrad": a = dY [R, N], b = W [G, N, K] -> dX [R, K];
    form "wgrad": a = dY [R, N], b = X [R, K] -> dW [G, N, K] (accumulate=True adds into `out`,
    which must then be a float32 [G, N, K] array).
    Rows beyond offsets[G] of a row-shaped result are not written. out_dtype defaults to float32.
    """
    if form not in _FORMS:
        raise ValueError(f"form: expected 'fprop', 'dgrad' or 'wgrad', got {form!r}")
    adapter, a_arr, a_dtype = _operand(a, "a", 2)
    _, b_arr, b_dtype = _operand(b, "b", 2 if form == "wgrad" else 3)
    offsets = _offsets(group_offsets)
    rows = adapter.shape(a_arr)[0]
    groups = _arrays.adapt(group_offsets, "group_offsets")[0].shape(group_offsets)[0] - 1
    if form == "fprop":
        shape = (rows, adapter.shape(b_arr)[1])
    elif form == "dgrad":
        shape = (rows, adapter.shape(b_arr)[2])
    else:
        shape = (groups, adapter.shape(a_arr)[1], adapter.shape(b_arr)[1])
    if out is None:
        out_type = DType.FP32 if out_dtype is None else as_dtype(out_dtype, "out_dtype")
        out = adapter.zeros(shape, out_type, a_arr)
    else:
        out_type = _arrays.resolve_dtype(adapter, out, None, "out")
        adapter.check_output(out, "out")
    _C.grouped_gemm(_FORMS[form], adapter.for_binding(a_arr), int(a_dtype), adapter.for_binding(b_arr), int(b_dtype),
                    offsets, adapter.for_binding(out), int(out_type), bool(accumulate), adapter.stream(a_arr))
    return out
