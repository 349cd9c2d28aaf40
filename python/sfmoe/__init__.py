"""sfmoe: sync-free Mixture-of-Experts training primitives.

Functional ops over arrays — NumPy on the host (the CPU reference backend), torch.Tensor on the
CPU or a CUDA device, CuPy on a CUDA device — on top of the sfmoe C library (libsfmoe.so),
reached through the native extension ``sfmoe._C``. CUDA work is enqueued on the caller's current
stream and never waits for the device. Every failure of the C library raises :class:`Error`
carrying the library's own message and status. See docs/python.md.
"""

from ._errors import Error

try:
    from . import _C
except ImportError as error:  # pragma: no cover - depends on the build
    raise ImportError(
        "sfmoe: the native extension sfmoe._C could not be loaded "
        f"({error}). Build it with CMake (see docs/python.md) and put <build>/python on "
        "PYTHONPATH; libsfmoe.so must be where the extension's rpath points."
    ) from error

from . import numerics
from ._activation import ACTIVATIONS, grouped_activation, grouped_activation_backward
from ._core import (
    FP8_MAX,
    QuantizedTensor,
    build_info,
    cast,
    dequantize,
    device_info,
    last_error,
    quantize_fp8,
    status_name,
    validate_grouped_tensor,
    validate_tensor,
)
from ._dtypes import FLOAT_DTYPES, DType, Memory, ScaleLayout, Scaling, as_dtype
from ._gemm import grouped_gemm
from ._permute import PermuteOutput, permute, unpermute, unpermute_backward
from ._quantize import (
    RECIPES,
    GroupedQuantizedTensor,
    QuantizeConfig,
    grouped_amax,
    min_row_alignment,
    quantize,
    swizzle_scales,
    unswizzle_scales,
)
from ._router import RouterOutput, router, router_backward
from ._status import Fault, FaultReport, StatusWord

__version__ = _C.build_info()["version"]

__all__ = [
    "ACTIVATIONS",
    "DType",
    "Error",
    "FLOAT_DTYPES",
    "FP8_MAX",
    "Fault",
    "FaultReport",
    "GroupedQuantizedTensor",
    "Memory",
    "QuantizeConfig",
    "PermuteOutput",
    "QuantizedTensor",
    "RouterOutput",
    "RECIPES",
    "ScaleLayout",
    "Scaling",
    "StatusWord",
    "as_dtype",
    "build_info",
    "cast",
    "dequantize",
    "device_info",
    "grouped_activation",
    "grouped_activation_backward",
    "grouped_amax",
    "grouped_gemm",
    "last_error",
    "min_row_alignment",
    "numerics",
    "permute",
    "quantize",
    "router",
    "router_backward",
    "quantize_fp8",
    "status_name",
    "swizzle_scales",
    "unpermute",
    "unpermute_backward",
    "unswizzle_scales",
    "validate_grouped_tensor",
    "validate_tensor",
]
