"""Grouped activations (docs/activations.md), forward and backward, on host arrays (the CPU
reference) or CUDA tensors (the device kernels, same bits)."""

from . import _C, _arrays, _quantize
from ._dtypes import DType, as_dtype

ACTIVATIONS = {"swiglu": 0, "geglu": 1, "silu": 2, "gelu": 3, "squared_relu": 4, "clamped_swiglu": 5}
GATED = ("swiglu", "geglu", "clamped_swiglu")


def _kind(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def _input(x, what):
    return _arrays.checked_input(x, what, (DType.FP32, DType.BF16, DType.FP16), ndim=2)


def _groups(group_offsets, group_rows, adapter, x):
    return (
        _arrays.index_array(group_offsets, "group_offsets", adapter, x),
        _arrays.index_array(group_rows, "group_rows", adapter, x),
    )


def grouped_activation(
    x,
    group_offsets,
    group_rows,
    activation="swiglu",
    *,
    limit=7.0,
    alpha=1.702,
    out_dtype=None,
    return_amax=False,
    quantize=None,
    fmt="e4m3",
    scale_layout="compact",
    power_of_two_scales=False,
    tensor_scales=None,
):
    """The activation of each group's real rows (docs/activations.md).

    x: [row_capacity, 2F] ([gate | up]) for "swiglu", "geglu" and "clamped_swiglu", [row_capacity,
    F] for "silu", "gelu" and "squared_relu"; float32 / bfloat16 / float16. group_offsets: [G + 1]
    int64 block starts (e.g. PermuteOutput.group_offsets); group_rows: [G] int64 real rows of each
    group (e.g. tokens_per_expert). Padding rows of the output are zeros. limit / alpha: the clamped
    SwiGLU's. Returns [row_capacity, F] in out_dtype (default: x's dtype).

    return_amax: also return each group's amax of the FP32 activations ([G] float32): (out, amax).
    quantize: None, or "mxfp8" / "fp8_block_1x128" / "fp8_tensor" / "nvfp4" to quantize the
    output on the fly (the same bytes as :func:`sfmoe.quantize` of the FP32 activations with these
    offsets), with fmt, scale_layout, power_of_two_scales and tensor_scales (fp8_tensor, required:
    each group's given scale) as there; out is then a :class:`sfmoe.GroupedQuantizedTensor`
    (rowwise copy only; for fp8_tensor and nvfp4 its amax is the activations' group amax; nvfp4
    reads x twice, once for that amax and once for the codes).
    """
    kind = _kind(activation)
    adapter, x, dtype = _input(x, "x")
    rows, cols = adapter.shape(x)
    out_cols = cols // 2 if activation in GATED else cols
    if activation in GATED and cols % 2:
        raise ValueError(f"x: a gated activation needs an even number of columns, got {cols}")
    offsets, counts = _groups(group_offsets, group_rows, adapter, x)
    num_groups = int(len(group_rows))
    out_type = dtype if out_dtype is None else as_dtype(out_dtype, "out_dtype")
    rows_format = _quantize.fused_rows_format(quantize, fmt, scale_layout, out_cols, out_type)
    plan = _C.plan_grouped_activation(
        dict(
            kind=kind,
            num_groups=num_groups,
            row_capacity=rows,
            input_cols=cols,
            group_amax=bool(return_amax),
            **rows_format,
        )
    )
    # The arguments both forms of the call begin with.
    operands = (adapter.for_binding(x), int(dtype), offsets, counts, kind, float(limit), float(alpha))
    if quantize is not None:
        out = _quantize.quantized_rows(adapter, x, quantize, power_of_two_scales, plan, None, tensor_scales)
        amax = out.amax if return_amax else None
        with adapter.device_context(x):
            _C.grouped_activation_quantized(
                *operands, out._descriptor(adapter), out.config._fields(), adapter.stream(x)
            )
        return (out, amax) if return_amax else out
    out = _arrays.empty_planned(adapter, plan["buffers"]["rowwise_data"], x, "out")
    amax = _arrays.empty_planned(adapter, plan["buffers"]["amax"], x, "amax")
    _C.grouped_activation(
        *operands,
        adapter.for_binding(out),
        int(out_type),
        None if amax is None else adapter.for_binding(amax),
        adapter.stream(x),
    )
    return (out, amax) if return_amax else out


def grouped_activation_backward(
    x, d_out, group_offsets, group_rows, activation="swiglu", *, limit=7.0, alpha=1.702, out_dtype=None
):
    """d x (shaped like x; padding rows zero) from the forward's x and d_out, in out_dtype (default
    float32)."""
    kind = _kind(activation)
    adapter, x, dtype = _input(x, "x")
    _, d, d_dtype = _input(d_out, "d_out")
    d_type = DType.FP32 if out_dtype is None else as_dtype(out_dtype, "out_dtype")
    d_x = adapter.empty(adapter.shape(x), d_type, x)
    offsets, counts = _groups(group_offsets, group_rows, adapter, x)
    _C.grouped_activation_backward(
        adapter.for_binding(x),
        int(dtype),
        offsets,
        counts,
        adapter.for_binding(d),
        int(d_dtype),
        kind,
        float(limit),
        float(alpha),
        adapter.for_binding(d_x),
        int(d_type),
        adapter.stream(x),
    )
    return d_x
