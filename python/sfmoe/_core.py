"""The functional ops: cast, FP8 per-tensor quantize / dequantize (and the dispatch of dequantize to
grouped tensors), descriptor validation, and the library's build and device information."""

import dataclasses
import math
import numbers

import numpy as np

from . import _C, _arrays, _quantize
from ._dtypes import DType, Memory, ScaleLayout, Scaling, as_dtype, as_enum

FP8_MAX = {DType.FP8_E4M3: 448.0, DType.FP8_E5M2: 57344.0}


# ---- library information -------------------------------------------------------------------------


def build_info():
    """How the library was built: version, CUDA backend, CUDA version, architectures, compiler."""
    return _C.build_info()


def device_info():
    """The CUDA devices the library sees (device_count is 0 without a GPU or a CUDA backend)."""
    return _C.device_info()


def status_name(status):
    """The name of a C API status code, e.g. 3 -> 'SFMOE_ERROR_MISALIGNED'."""
    return _C.status_name(int(status))


def last_error():
    """The message of the last failed C API call on this thread ('' if none)."""
    return _C.last_error()


# ---- cast ----------------------------------------------------------------------------------------


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _run_cast(adapter, x, in_dtype, out, out_dtype, scale, what="scale"):
    """One sfmoe_cast call. `scale` is a number or a one-element float32 array next to the data
    (read by the library at run time: a scale computed on the device needs no host round trip)."""
    scale_value, scale_array = 1.0, None
    if _is_number(scale):
        scale_value = float(np.float32(scale))  # the library multiplies by an FP32 scale
    else:
        scale_adapter, s = _arrays.adapt(scale, what)
        if scale_adapter is not adapter:
            raise TypeError(f"{what}: must be a number or the same kind of array as the data")
        scale_array = adapter.for_binding(adapter.as_scale(s, x, what))
    x_arg, out_arg = x, out
    if max(len(adapter.shape(x)), len(adapter.shape(out))) > _C.MAX_DIMS:
        # Elementwise: any number of dimensions reduces to one (both arrays are contiguous).
        x_arg, out_arg = adapter.flatten(x), adapter.flatten(out)
    with adapter.device_context(x):
        _C.cast(
            adapter.for_binding(x_arg),
            int(in_dtype),
            adapter.for_binding(out_arg),
            int(out_dtype),
            scale_value,
            adapter.stream(x),
            scale_array,
        )


def _prepare_output(adapter, x, logical, out, out_dtype):
    shape = _arrays.container_shape(logical, out_dtype, "dtype") if out is None else None
    return _arrays.output_array(adapter, out, shape, out_dtype, x, "the input")


def cast(x, dtype, scale=1.0, out=None, *, input_dtype=None):
    """Converts `x` to `dtype`: ``out = encode(decode(x) * scale)``, one FP32 multiply, round to
    nearest even, FP8 / FP4 saturating (see docs/python.md).

    x: a NumPy array, torch.Tensor (CPU or CUDA) or CuPy array. Its sfmoe dtype is its own element
       type (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, ...); arrays of raw codes
       (uint8, uint16) need `input_dtype`. FP4 E2M1 is packed two per byte in uint8 arrays.
    dtype: the output dtype (a DType, a name such as "fp8_e4m3", or a framework dtype).
    scale: a number, or a one-element float32 array / tensor on the data's device.
    out: an optional output array of the same kind as `x` (any shape with the right count).
    Returns the output, on the same device as `x`; CUDA work runs on the current stream.
    """
    adapter, x = _arrays.adapt(x, "x")
    in_dtype = _arrays.resolve_dtype(adapter, x, input_dtype, "x", raw_codes_option="input_dtype")
    out_dtype = as_dtype(dtype, "dtype")
    x = adapter.prepare_input(x)
    logical = _arrays.logical_shape(adapter.shape(x), in_dtype, "x")
    out = _prepare_output(adapter, x, logical, out, out_dtype)
    _run_cast(adapter, x, in_dtype, out, out_dtype, scale)
    return out


# ---- FP8 per-tensor quantization -----------------------------------------------------------------


@dataclasses.dataclass
class QuantizedTensor:
    """Quantized data with what it takes to decode it: ``x ~= decode(data) * scale_inv``.

    data: FP8 codes (ml_dtypes float8 / torch.float8_* when available, else uint8).
    scale_inv: a 0-d float32 array / tensor on the data's device (1 / the quantization scale).
    dtype: the sfmoe dtype of `data`.
    recipe: "fp8_tensor" (one scale for the whole tensor).
    """

    data: object
    scale_inv: object
    dtype: DType
    recipe: str = "fp8_tensor"

    @property
    def shape(self):
        return tuple(self.data.shape)

    def dequantize(self, out_dtype=DType.FP32, *, out=None):
        return dequantize(self, out_dtype, out=out)


def _fp8_dtype(fmt):
    if isinstance(fmt, str) and fmt.lower() in ("e4m3", "fp8_e4m3", "float8_e4m3fn"):
        return DType.FP8_E4M3
    if isinstance(fmt, str) and fmt.lower() in ("e5m2", "fp8_e5m2", "float8_e5m2"):
        return DType.FP8_E5M2
    if isinstance(fmt, DType) and fmt in FP8_MAX:
        return fmt
    raise ValueError(f"fmt: expected 'e4m3' or 'e5m2', got {fmt!r}")


def quantize_fp8(x, scale=None, fmt="e4m3", *, input_dtype=None, power_of_two=False):
    """FP8 per-tensor quantization: ``data = fp8(x * scale)``, ``scale_inv = 1 / scale``.

    scale: a positive finite number, a one-element float32 array / tensor on x's device, or None
           for current scaling: ``scale = fp8_max / amax(x)`` with the library's rules (amax 0,
           Inf or NaN give 1; an infinite quotient gives FLT_MAX; `power_of_two` rounds the scale
           down to a power of two). For torch tensors amax and the scale are computed on the
           device, without a host round trip.
    fmt: "e4m3" (max 448) or "e5m2" (max 57344).
    """
    dtype = _fp8_dtype(fmt)
    adapter, x = _arrays.adapt(x, "x")
    in_dtype = _arrays.resolve_dtype(adapter, x, input_dtype, "x", raw_codes_option="input_dtype")
    x = adapter.prepare_input(x)
    if scale is None:
        if in_dtype == DType.FP32:
            x_f32 = x
        else:
            x_f32 = cast(x, DType.FP32, input_dtype=in_dtype)
        scale_array = adapter.current_scale(x_f32, FP8_MAX[dtype], bool(power_of_two))
    elif _is_number(scale):
        value = np.float32(scale)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"scale: must be a positive finite number, got {scale!r}")
        scale_array = adapter.scalar_f32(float(value), x)
    else:
        scale_adapter, s = _arrays.adapt(scale, "scale")
        if scale_adapter is not adapter:
            raise TypeError("scale: must be a number or the same kind of array as x")
        scale_array = adapter.as_scale(s, x, "scale")
    logical = _arrays.logical_shape(adapter.shape(x), in_dtype, "x")
    data = adapter.empty(logical, dtype, x)
    _run_cast(adapter, x, in_dtype, data, dtype, scale_array)
    return QuantizedTensor(data, adapter.reciprocal(scale_array), dtype, "fp8_tensor")


def dequantize(q, out_dtype=DType.FP32, source="auto", *, out=None):
    """Decodes a quantized tensor in `out_dtype` (FP32 by default), on q's device.

    q: a :class:`QuantizedTensor` (``decode(q.data) * q.scale_inv``) or a
       :class:`GroupedQuantizedTensor` (see :func:`sfmoe.quantize`): [q.rows, q.cols] values,
       rows [0, q.group_offsets[-1]) written, padding rows as zeros.
    source: grouped tensors only: "auto" (the rowwise copy if present), "rowwise" or
       "columnwise" (transposed back, with the Hadamard transform undone).
    out: an optional output array of the same kind as q's data.
    """
    if isinstance(q, _quantize.GroupedQuantizedTensor):
        return _quantize.dequantize_grouped(q, out_dtype, source, out)
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q: expected a QuantizedTensor or a GroupedQuantizedTensor, got {type(q).__name__}")
    if source != "auto":
        raise ValueError(f"source: a QuantizedTensor has one copy; got source={source!r}")
    if q.recipe != "fp8_tensor":
        raise NotImplementedError(f"dequantize: recipe {q.recipe!r} is not supported yet")
    return cast(q.data, out_dtype, scale=q.scale_inv, out=out, input_dtype=q.dtype)


# ---- descriptor validation (the C API's checks on raw descriptors) -------------------------------


def validate_tensor(
    data_ptr,
    dtype,
    shape,
    memory=Memory.HOST,
    device=0,
    struct_size=None,
    *,
    ndim=None,
    name="tensor",
    null=False,
):
    """Runs sfmoe_tensor_validate on a descriptor built from plain values and raises
    :class:`sfmoe.Error` if the library refuses it. Enum fields accept members, names or any
    integer (invalid ones included, to exercise the library's checks); ndim defaults to
    len(shape) and struct_size to sizeof(sfmoe_tensor); null=True passes a NULL descriptor."""
    if ndim is not None:
        ndim = int(ndim)
    if struct_size is not None:
        struct_size = int(struct_size)
    _C.validate_tensor(
        int(data_ptr),
        as_enum(DType, dtype, "dtype"),
        [int(s) for s in shape],
        as_enum(Memory, memory, "memory"),
        int(device),
        struct_size,
        ndim,
        str(name),
        bool(null),
    )


_GROUPED_ENUMS = {"dtype": DType, "scaling": Scaling, "memory": Memory, "scale_layout": ScaleLayout}


def validate_grouped_tensor(**fields):
    """Runs sfmoe_grouped_tensor_validate on sfmoe_grouped_tensor_init() with `fields` replaced
    and raises :class:`sfmoe.Error` if the library refuses it.

    Fields: struct_size, memory, device, dtype, scaling, scale_layout, num_groups, row_capacity,
    cols, row_alignment, uniform_group_rows, and the pointers (as integers) group_offsets,
    rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv, amax; plus name=... and
    null=True as for :func:`validate_tensor`.
    """
    converted = {}
    for key, value in fields.items():
        if key in _GROUPED_ENUMS:
            converted[key] = as_enum(_GROUPED_ENUMS[key], value, key)
        elif key == "name":
            converted[key] = str(value)
        elif key == "null":
            converted[key] = bool(value)
        else:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{key}: expected an integer, got {value!r}")
            converted[key] = int(value)
    _C.validate_grouped_tensor(**converted)
