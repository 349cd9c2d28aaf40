"""Permute / unpermute (docs/permute.md): token rows to expert-sorted, padded rows and back, on host
arrays (the CPU reference) or CUDA tensors (the device kernels, same bits)."""

import dataclasses

from . import _C, _arrays, _quantize
from ._dtypes import DType, as_dtype

_ROW_DTYPES = (DType.FP32, DType.BF16, DType.FP16)


@dataclasses.dataclass
class PermuteOutput:
    """What :func:`permute` returns. rows: [row_capacity, H], expert e's block at
    group_offsets[e] (padded to `alignment` with zero rows); row_map [T, k] int64: each slot's row,
    or -1 where the capacity dropped it; tokens_per_expert / dropped_per_expert [E] int64; amax
    [E] float32 (with ``amax=True``): each expert's amax of its kept rows, else None."""

    rows: object
    group_offsets: object
    row_map: object
    tokens_per_expert: object
    dropped_per_expert: object
    alignment: int
    amax: object = None


def _rows_input(x, what):
    return _arrays.checked_input(x, what, _ROW_DTYPES, ndim=2)


def permute(
    tokens,
    topk_ids,
    num_experts,
    *,
    alignment=1,
    expert_capacity=0,
    quantize=None,
    fmt="e4m3",
    scale_layout="compact",
    power_of_two_scales=False,
    tensor_scales=None,
    amax=False,
):
    """Sorts token rows by expert (docs/permute.md).

    tokens: [T, H] float32 / bfloat16 / float16. topk_ids: [T, k] int32 (the router's) or int64
    (torch.topk's), each token naming an expert at most once. alignment: 1, 8, 16, 32, 64 or 128 rows per block step.
    expert_capacity: > 0 keeps at most that many tokens per expert (the lowest token indices).
    quantize: None, or "mxfp8" / "fp8_block_1x128" / "fp8_tensor" for the fused quantization of
    the rows (the same bytes as :func:`sfmoe.quantize` of the permuted rows with these offsets),
    with fmt, scale_layout ("swizzled": mxfp8), power_of_two_scales (fp8_block_1x128) and
    tensor_scales (fp8_tensor, required: each expert's given scale, float32 [num_experts]) as
    there; rows is then a :class:`sfmoe.GroupedQuantizedTensor` (rowwise copy only).
    amax: also return each expert's amax of its kept rows (float32 [num_experts], NaN
    propagating, 0 for an expert without rows), folded from the rows as they move: pass it to
    :func:`sfmoe.quantize` as ``group_amax`` to quantize the rows with current scaling in one read.
    Unquantized rows only (the fused quantizations return their own amax where they have one).
    Returns a :class:`PermuteOutput`; its row capacity is the worst case the sizes allow.
    """
    adapter, x, dtype = _rows_input(tokens, "tokens")
    t_count, hidden = adapter.shape(x)
    ids_adapter, ids = _arrays.adapt(topk_ids, "topk_ids")
    ids_shape = ids_adapter.shape(ids)
    if len(ids_shape) != 2 or ids_shape[0] != t_count:
        raise ValueError(f"topk_ids: expected [{t_count}, k], got shape {ids_shape}")
    k = ids_shape[1]
    experts, alignment, capacity = int(num_experts), int(alignment), int(expert_capacity)
    if amax and quantize is not None:
        raise ValueError("permute: amax=True is for unquantized rows (quantize=None)")
    rows_format = _quantize.fused_rows_format(quantize, fmt, scale_layout, hidden, dtype)
    plan = _C.plan_permute(
        dict(
            num_tokens=t_count,
            topk=k,
            num_experts=experts,
            hidden=hidden,
            row_alignment=alignment,
            expert_capacity=capacity,
            group_amax=bool(amax),
            **rows_format,
        )
    )
    offsets = _arrays.empty_planned(adapter, plan["permuted"]["buffers"]["group_offsets"], x, "group_offsets")
    row_map = _arrays.empty_planned(adapter, plan["row_map"], x, "row_map")
    kept = _arrays.empty_planned(adapter, plan["tokens_per_expert"], x, "tokens_per_expert")
    dropped = _arrays.empty_planned(adapter, plan["dropped_per_expert"], x, "dropped_per_expert")
    # The device ranks tokens in chunks through a workspace (the host ignores it).
    workspace = _arrays.empty_planned(adapter, plan["workspace"], x, "workspace")
    bind = adapter.for_binding
    ids_bound = _arrays.expert_ids(topk_ids, "topk_ids")
    if quantize is not None:
        rows = _quantize.quantized_rows(
            adapter, x, quantize, power_of_two_scales, plan["permuted"], offsets, tensor_scales
        )
        with adapter.device_context(x):
            _C.permute_quantized(
                bind(x),
                int(dtype),
                ids_bound,
                capacity,
                rows._descriptor(adapter),
                rows.config._fields(),
                bind(row_map),
                bind(kept),
                bind(dropped),
                bind(workspace),
                adapter.stream(x),
            )
        return PermuteOutput(rows, offsets, row_map, kept, dropped, alignment)
    buffers = plan["permuted"]["buffers"]
    rows = _arrays.empty_planned(adapter, buffers["rowwise_data"], x, "rows")
    group_amax = _arrays.empty_planned(adapter, buffers["amax"], x, "amax")
    _C.permute(
        bind(x),
        int(dtype),
        ids_bound,
        capacity,
        bind(rows),
        experts,
        alignment,
        bind(offsets),
        bind(row_map),
        bind(kept),
        bind(dropped),
        bind(workspace),
        None if group_amax is None else bind(group_amax),
        adapter.stream(x),
    )
    return PermuteOutput(rows, offsets, row_map, kept, dropped, alignment, group_amax)


def unpermute(rows, permuted, probs=None, *, out_dtype=None):
    """Combines expert rows back into token rows: out[t] = sum_i probs[t, i] rows[row_map[t, i]]
    (FP32 sums in slot order, deterministic). rows: [row_capacity, H'] laid out like
    `permuted.rows` (e.g. the FC2 output). probs: [T, k] float32, or None for weight 1 (permute's
    backward). out_dtype: the output dtype (default: the rows' dtype)."""
    adapter, r, dtype = _rows_input(rows, "rows")
    row_map = permuted.row_map
    t_count, _ = adapter.shape(row_map)
    out_type = dtype if out_dtype is None else as_dtype(out_dtype, "out_dtype")
    out = adapter.empty((t_count, adapter.shape(r)[1]), out_type, r)
    p = None if probs is None else _arrays.bound_input(probs, "probs", DType.FP32)
    bind = adapter.for_binding
    _C.unpermute(
        bind(r), int(dtype), bind(permuted.group_offsets), bind(row_map), p, bind(out), int(out_type), adapter.stream(r)
    )
    return out


def unpermute_backward(d_out, rows, permuted, probs, *, out_dtype=None):
    """(d_rows, d_probs) of :func:`unpermute`: d_rows [row_capacity, H'] in out_dtype (float32,
    bfloat16 or float16; default float32: each value is rounded once from its FP32 product), each
    group's padding rows zero, rows beyond the groups (like permute's) not written; d_probs [T, k]
    float32."""
    adapter, d, d_dtype = _rows_input(d_out, "d_out")
    _, r, r_dtype = _rows_input(rows, "rows")
    t_count = adapter.shape(d)[0]
    k = adapter.shape(permuted.row_map)[1]
    rows_type = DType.FP32 if out_dtype is None else as_dtype(out_dtype, "out_dtype")
    if rows_type not in _ROW_DTYPES:
        raise ValueError(f"out_dtype must be float32, bfloat16 or float16, not {out_dtype!r}")
    d_rows = adapter.empty(adapter.shape(r), rows_type, r)
    d_probs = adapter.empty((t_count, k), DType.FP32, r)
    bind = adapter.for_binding
    _C.unpermute_backward(
        bind(d),
        int(d_dtype),
        bind(r),
        int(r_dtype),
        bind(permuted.group_offsets),
        bind(permuted.row_map),
        _arrays.bound_input(probs, "probs", DType.FP32),
        bind(permuted.tokens_per_expert),
        bind(d_rows),
        int(rows_type),
        bind(d_probs),
        adapter.stream(d),
    )
    return d_rows, d_probs
