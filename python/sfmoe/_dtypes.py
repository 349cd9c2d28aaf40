"""sfmoe's dtypes, scaling modes and memory spaces, and how NumPy / PyTorch dtypes map onto them.

The values are the C API's enum values, read from the extension (so they cannot drift from the
headers it was compiled with).
"""

import enum

import numpy as np

from . import _C

try:
    import ml_dtypes
except ImportError:  # optional: without it, narrow host outputs are raw unsigned codes
    ml_dtypes = None


class DType(enum.IntEnum):
    """An sfmoe element type (``sfmoe_dtype``)."""

    FP32 = _C.DTYPE_FP32
    BF16 = _C.DTYPE_BF16
    FP16 = _C.DTYPE_FP16
    FP8_E4M3 = _C.DTYPE_FP8_E4M3
    FP8_E5M2 = _C.DTYPE_FP8_E5M2
    FP4_E2M1 = _C.DTYPE_FP4_E2M1  # two per byte, element 2i in the low nibble
    E8M0 = _C.DTYPE_E8M0
    INT32 = _C.DTYPE_INT32
    INT64 = _C.DTYPE_INT64

    @property
    def bits(self):
        """Bits per element (4 for FP4 E2M1)."""
        return _C.dtype_bits(int(self))

    @property
    def c_name(self):
        """The C library's name, e.g. ``"fp8_e4m3"``."""
        return _C.dtype_name(int(self))


class Scaling(enum.IntEnum):
    """A quantization scaling mode (``sfmoe_scaling``)."""

    NONE = _C.SCALING_NONE
    TENSOR = _C.SCALING_TENSOR
    BLOCK_1X128 = _C.SCALING_BLOCK_1X128
    BLOCK_128X128 = _C.SCALING_BLOCK_128X128
    MX_1X32 = _C.SCALING_MX_1X32
    NV_1X16 = _C.SCALING_NV_1X16
    NV_16X16 = _C.SCALING_NV_16X16

    @property
    def c_name(self):
        return _C.scaling_name(int(self))


class ScaleLayout(enum.IntEnum):
    COMPACT = _C.SCALE_LAYOUT_COMPACT
    SWIZZLED = _C.SCALE_LAYOUT_SWIZZLED
    # fp8_block_1x128: the columnwise copy's scales stored transposed, [R / 128, C] (as the
    # grouped GEMM's blockwise wgrad reads them); the rowwise copy's compact.
    COLUMNWISE_TRANSPOSED = _C.SCALE_LAYOUT_COLUMNWISE_TRANSPOSED


class Memory(enum.IntEnum):
    """Where a tensor lives (``sfmoe_memory``); it selects the backend."""

    HOST = _C.MEMORY_HOST
    CUDA = _C.MEMORY_CUDA


FLOAT_DTYPES = frozenset({DType.FP32, DType.BF16, DType.FP16, DType.FP8_E4M3, DType.FP8_E5M2, DType.FP4_E2M1})

_NAME_ALIASES = {
    "fp32": DType.FP32,
    "float32": DType.FP32,
    "float": DType.FP32,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "fp16": DType.FP16,
    "float16": DType.FP16,
    "half": DType.FP16,
    "fp8_e4m3": DType.FP8_E4M3,
    "e4m3": DType.FP8_E4M3,
    "float8_e4m3fn": DType.FP8_E4M3,
    "fp8_e5m2": DType.FP8_E5M2,
    "e5m2": DType.FP8_E5M2,
    "float8_e5m2": DType.FP8_E5M2,
    "fp4_e2m1": DType.FP4_E2M1,
    "e2m1": DType.FP4_E2M1,
    "fp4": DType.FP4_E2M1,
    "float4_e2m1fn_x2": DType.FP4_E2M1,
    "e8m0": DType.E8M0,
    "float8_e8m0fnu": DType.E8M0,
    "int32": DType.INT32,
    "int64": DType.INT64,
}

# Framework dtype names (NumPy / ml_dtypes / PyTorch) that are themselves an sfmoe dtype.
_FRAMEWORK_NAMES = {
    "float32": DType.FP32,
    "bfloat16": DType.BF16,
    "float16": DType.FP16,
    "float8_e4m3fn": DType.FP8_E4M3,
    "float8_e5m2": DType.FP8_E5M2,
    "float4_e2m1fn_x2": DType.FP4_E2M1,  # PyTorch's packed FP4
    "float8_e8m0fnu": DType.E8M0,
    "int32": DType.INT32,
    "int64": DType.INT64,
}


def _is_torch_dtype(obj):
    cls = type(obj)
    return cls.__module__ == "torch" and cls.__name__ == "dtype"


def framework_dtype_name(obj):
    """'float32', 'bfloat16', 'uint8', ... for a NumPy or PyTorch dtype (or dtype-like)."""
    if _is_torch_dtype(obj):
        return str(obj).split(".", 1)[1]
    return np.dtype(obj).name


def as_dtype(obj, what="dtype"):
    """An sfmoe :class:`DType` from a DType, its integer value, a name ("fp8_e4m3", "e4m3",
    "bf16", ...), or a NumPy / ml_dtypes / PyTorch dtype that is one."""
    if isinstance(obj, DType):
        return obj
    if isinstance(obj, bool):
        raise TypeError(f"{what}: expected an sfmoe dtype, got {obj!r}")
    if isinstance(obj, (int, np.integer)):
        try:
            return DType(int(obj))
        except ValueError:
            raise ValueError(f"{what}: {int(obj)} is not an sfmoe dtype (valid values 0..{len(DType) - 1})") from None
    if isinstance(obj, str):
        try:
            return _NAME_ALIASES[obj.lower()]
        except KeyError:
            raise ValueError(
                f"{what}: unknown dtype name {obj!r} (expected one of {', '.join(sorted(_NAME_ALIASES))})"
            ) from None
    try:
        name = framework_dtype_name(obj)
    except TypeError:
        raise TypeError(f"{what}: cannot interpret {obj!r} as a dtype") from None
    if name in _FRAMEWORK_NAMES:
        return _FRAMEWORK_NAMES[name]
    raise TypeError(
        f"{what}: {name} is not an sfmoe dtype; raw code containers (uint8, uint16, ...) need the "
        "sfmoe dtype they hold spelled out, e.g. 'fp8_e4m3'"
    )


def as_enum(enum_class, obj, what):
    """An enum member from a member, its name (any case) or its value; other integers pass through
    unchanged so that callers can hand the C library deliberately invalid values."""
    if isinstance(obj, enum_class):
        return int(obj)
    if isinstance(obj, str):
        try:
            return int(enum_class[obj.upper()])
        except KeyError:
            names = ", ".join(m.name.lower() for m in enum_class)
            raise ValueError(f"{what}: unknown name {obj!r} (expected one of {names})") from None
    if isinstance(obj, bool) or not isinstance(obj, (int, np.integer)):
        raise TypeError(f"{what}: expected an integer or a name, got {obj!r}")
    return int(obj)


def numpy_container(dtype):
    """The NumPy dtype that holds `dtype` on the host: the ml_dtypes type where one exists and
    ml_dtypes is installed, else the unsigned integer of the same width; FP4 is packed in uint8."""
    dtype = as_dtype(dtype)
    if dtype == DType.FP32:
        return np.dtype(np.float32)
    if dtype == DType.FP16:
        return np.dtype(np.float16)
    if dtype == DType.INT32:
        return np.dtype(np.int32)
    if dtype == DType.INT64:
        return np.dtype(np.int64)
    if dtype == DType.FP4_E2M1:
        return np.dtype(np.uint8)
    ml_name = {
        DType.BF16: "bfloat16",
        DType.FP8_E4M3: "float8_e4m3fn",
        DType.FP8_E5M2: "float8_e5m2",
        DType.E8M0: "float8_e8m0fnu",
    }[dtype]
    if ml_dtypes is not None and hasattr(ml_dtypes, ml_name):
        return np.dtype(getattr(ml_dtypes, ml_name))
    return np.dtype(np.uint16 if dtype.bits == 16 else np.uint8)


def torch_container(dtype, torch):
    """The PyTorch dtype that holds `dtype`; FP4 is packed in torch.uint8."""
    dtype = as_dtype(dtype)
    names = {
        DType.FP32: "float32",
        DType.BF16: "bfloat16",
        DType.FP16: "float16",
        DType.FP8_E4M3: "float8_e4m3fn",
        DType.FP8_E5M2: "float8_e5m2",
        DType.FP4_E2M1: "uint8",
        DType.E8M0: "float8_e8m0fnu",
        DType.INT32: "int32",
        DType.INT64: "int64",
    }
    return getattr(torch, names[dtype], torch.uint8)
