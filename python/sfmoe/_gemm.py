"""Grouped GEMM, the three training forms (docs/grouped_gemm.md): on host memory (NumPy arrays, CPU
torch tensors) with plain or quantized operands, and on CUDA tensors (Hopper) with BF16, FP8
per-tensor or FP8 blockwise operands."""

from . import _C, _arrays
from ._dtypes import DType, as_dtype
from ._quantize import GroupedQuantizedTensor

_FORMS = {"fprop": 0, "dgrad": 1, "wgrad": 2}
_OPERAND_DTYPES = (DType.FP32, DType.BF16, DType.FP16)


def _plain(adapter, array, dtype, *, rows, cols, groups, uniform_rows=0, offsets=None):
    """The descriptor dict of unquantized rows: grouped by `offsets` (a callable returning a fresh
    binding of the offsets: a DLPack capsule can be consumed once only), or uniform groups."""
    return {
        "dtype": int(dtype),
        "scaling": 0,
        "num_groups": groups,
        "row_capacity": rows,
        "cols": cols,
        "row_alignment": 1,
        "uniform_group_rows": uniform_rows,
        "group_offsets": None if offsets is None else offsets(),
        "rowwise_data": adapter.for_binding(array),
    }


def _operand(x, what, *, weights, groups, offsets):
    """(descriptor dict, adapter, an array of it, rows, cols, carries the Hadamard transform) of
    an operand: a GroupedQuantizedTensor, or an array ([rows, cols], or [G, N, K] weights)."""
    if isinstance(x, GroupedQuantizedTensor):
        like = x.data if x.data is not None else x.columnwise_data
        adapter, _ = _arrays.adapt(like, what)
        return x._descriptor(adapter), adapter, like, x.rows, x.cols, bool(x.config.hadamard)
    adapter, array, dtype = _arrays.checked_input(x, what, _OPERAND_DTYPES, ndim=3 if weights else 2)
    shape = adapter.shape(array)
    if weights:  # [groups, N, K]
        d = _plain(
            adapter, array, dtype, rows=shape[0] * shape[1], cols=shape[2], groups=shape[0], uniform_rows=shape[1]
        )
        return d, adapter, array, shape[0] * shape[1], shape[2], False
    if offsets is None:
        raise ValueError(f"{what}: group_offsets are needed for unquantized rows")
    d = _plain(adapter, array, dtype, rows=shape[0], cols=shape[1], groups=groups, offsets=offsets)
    return d, adapter, array, shape[0], shape[1], False


def grouped_gemm(
    form,
    a,
    b,
    group_offsets=None,
    *,
    out=None,
    out_dtype=None,
    accumulate=False,
    fast_accumulation=False,
    a_row_index=None,
):
    """One grouped GEMM (docs/grouped_gemm.md); group g owns rows [offsets[g], offsets[g + 1]).

    form "fprop": a = X [R, K], b = W [G, N, K] -> Y [R, N];
    form "dgrad": a = dY [R, N], b = W [G, N, K] -> dX [R, K];
    form "wgrad": a = dY [R, N], b = X [R, K] -> dW [G, N, K] (accumulate=True adds into `out`,
    which must then be a float32 [G, N, K] array).
    Operands may be :class:`GroupedQuantizedTensor` (from :func:`sfmoe.quantize`, weights with
    uniform groups): each form reads the copy its Hopper kernel would (fprop rowwise; dgrad W
    columnwise; wgrad both columnwise), which must be present. group_offsets: int64 [G + 1] for
    unquantized rows; by default the quantized row operand's own offsets.
    Rows beyond offsets[G] of a row-shaped result are not written. out_dtype defaults to float32.
    MXFP8 and NVFP4 operands are emulated on CUDA (Hopper has no instruction for their scales):
    the copies each form reads are decoded into BF16 in the workspace, then the BF16 kernels run.
    fast_accumulation: FP8 per-tensor operands on CUDA are summed by the tensor cores over all of K
    (faster, less precise; the default promotes partial sums into FP32 periodically). The host
    reference ignores it.
    a_row_index: fprop and dgrad with unquantized a: int32 [R] on a's device; A's row r is row
    a_row_index[r] of a (then [S, cols], any S), a zero row for an index outside [0, S); the
    offsets and the result describe the R gathered rows (an MoE permutation read straight from the
    tokens; on CUDA BF16 a, b and out).
    """
    if form not in _FORMS:
        raise ValueError(f"form: expected 'fprop', 'dgrad' or 'wgrad', got {form!r}")
    rows_operand = a
    if isinstance(rows_operand, GroupedQuantizedTensor):
        # A quantized a carries its own (padded) offsets, which the library uses.
        if group_offsets is not None and group_offsets is not rows_operand.group_offsets:
            raise ValueError("group_offsets: a quantized a is grouped by its own group_offsets; pass None")
        group_offsets = rows_operand.group_offsets
    offsets = None
    groups = 0
    if group_offsets is not None:
        if isinstance(group_offsets, (list, tuple)):  # (host data only, as everywhere)
            a_adapter, a_array = _arrays.adapt(a.data if isinstance(a, GroupedQuantizedTensor) else a, "a")
            if not a_adapter.is_host(a_array):
                raise TypeError(
                    "group_offsets: pass an int64 array on the data's device (a Python sequence "
                    "would need a copy to the device)"
                )
            group_offsets = _arrays.NUMPY.int64_from_values([int(v) for v in group_offsets], None)
        off_adapter, off, _ = _arrays.checked_input(group_offsets, "group_offsets", (DType.INT64,), ndim=1)
        offsets = lambda: off_adapter.for_binding(off)  # noqa: E731 (one binding per descriptor)
        groups = off_adapter.shape(off)[0] - 1
    a_desc, adapter, like, rows, a_cols, a_hadamard = _operand(a, "a", weights=False, groups=groups, offsets=offsets)
    index, source_rows = None, 0
    if a_row_index is not None:
        if form == "wgrad" or isinstance(a, GroupedQuantizedTensor):
            raise ValueError("a_row_index: gathers unquantized rows of a in fprop and dgrad only")
        index_adapter, index_array, _ = _arrays.checked_input(a_row_index, "a_row_index", (DType.INT32,), ndim=1)
        # (a's descriptor keeps its data's rows; the binding gives it the gathered rows' count)
        source_rows, rows = rows, index_adapter.shape(index_array)[0]
        index = index_adapter.for_binding(index_array)
    b_desc, _, _, _, b_cols, b_hadamard = _operand(b, "b", weights=form != "wgrad", groups=groups, offsets=offsets)
    if form == "fprop":
        n = b_desc["uniform_group_rows"]
        shape, out_cols = (rows, n), n
    elif form == "dgrad":
        shape, out_cols = (rows, b_cols), b_cols
    else:
        n = a_cols
        shape, out_cols = (groups, n, b_cols), b_cols
    if out is None:
        out_type = DType.FP32 if out_dtype is None else as_dtype(out_dtype, "out_dtype")
        out = adapter.zeros(shape, out_type, like)
    else:
        out_type = _arrays.resolve_dtype(adapter, out, None, "out")
        adapter.check_output(out, "out")
    if form == "wgrad":
        out_desc = _plain(adapter, out, out_type, rows=groups * n, cols=out_cols, groups=groups, uniform_rows=n)
    else:
        out_desc = _plain(adapter, out, out_type, rows=rows, cols=out_cols, groups=groups, offsets=offsets)
    # The device reads each group's arguments from a workspace (the host ignores it); MXFP8 and
    # NVFP4 operands are decoded into BF16 there first (emulated on Hopper).
    nbytes = _C.grouped_gemm_workspace_bytes(
        groups,
        a_desc["scaling"],
        a_desc["row_capacity"],
        a_desc["cols"],
        b_desc["scaling"],
        b_desc["row_capacity"],
        b_desc["cols"],
    )
    workspace = _arrays.empty_bytes(adapter, nbytes, DType.INT64, like)
    _C.grouped_gemm(
        _FORMS[form],
        a_desc,
        b_desc,
        out_desc,
        bool(accumulate),
        a_hadamard or b_hadamard,
        None if workspace is None else adapter.for_binding(workspace),
        adapter.stream(like),
        bool(fast_accumulation),
        index,
        source_rows,
    )
    return out
