"""Framework handling: which arrays the package accepts and how they reach the extension.

- NumPy arrays live on the host (the CPU reference backend); outputs are NumPy arrays, 16-byte
  aligned, with ml_dtypes element types for BF16 / FP8 when ml_dtypes is installed.
- torch.Tensor, on the CPU or a CUDA device; outputs are allocated with torch.empty on the input's
  device, and CUDA work is enqueued on torch.cuda.current_stream(device).
- cupy.ndarray (CUDA), on CuPy's current stream; raw unsigned codes for BF16 / FP8 outputs.
- Any other object that speaks DLPack from host memory is viewed through numpy.from_dlpack.

torch and CuPy are imported only when an array of theirs shows up.
"""

import contextlib

import numpy as np

from . import _C
from ._dtypes import _FRAMEWORK_NAMES, DType, as_dtype, numpy_container, torch_container

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

ALIGNMENT = 16  # bytes: every sfmoe tensor's data must be aligned to this
FLT_MAX = float(np.finfo(np.float32).max)

# Integer element types that may carry raw codes of any sfmoe dtype of the same width.
_RAW_CONTAINERS = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}

# DLPack device types (dlpack.h): kDLCPU, kDLCUDAHost.
_DLPACK_HOST_DEVICES = (1, 3)


def aligned_empty(shape, dtype):
    """np.empty whose data is ALIGNMENT-byte aligned (NumPy itself promises less)."""
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in shape)
    count = 1
    for s in shape:
        count *= s
    nbytes = count * dtype.itemsize
    buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    offset = (-buffer.ctypes.data) % ALIGNMENT
    return buffer[offset : offset + nbytes].view(dtype).reshape(shape)


def _check_holds(dtype_name, itemsize, dtype, what):
    """Raise TypeError unless an array of element type `dtype_name` can carry sfmoe `dtype`."""
    if _FRAMEWORK_NAMES.get(dtype_name) == dtype:
        return
    if dtype == DType.FP4_E2M1:
        width_ok = itemsize == 1
    else:
        width_ok = itemsize * 8 == dtype.bits
    if dtype_name in _RAW_CONTAINERS and width_ok:
        return
    if dtype == DType.FP4_E2M1:
        need = "a uint8 array (two elements per byte)"
    else:
        need = f"{dtype.c_name} elements or {dtype.bits}-bit unsigned codes"
    raise TypeError(f"{what}: a {dtype_name} array cannot hold {dtype.c_name}; expected {need}")


def resolve_dtype(adapter, x, claimed, what, raw_codes_option=None, expected=None):
    """The sfmoe dtype of `x`: `claimed` if given (checked against the array), else its own.
    When the array's own dtype is not an sfmoe one, the message suggests raw_codes_option (the
    caller's keyword for naming raw codes' dtype) if the caller has one, else what it expects."""
    name = adapter.dtype_name(x)
    if claimed is None:
        native = _FRAMEWORK_NAMES.get(name)
        if native is None:
            if raw_codes_option:
                hint = f"; for raw codes say which dtype they hold ({raw_codes_option}=...)"
            else:
                hint = f"; expected {expected} values" if expected else ""
            raise TypeError(f"{what}: {name} arrays are not an sfmoe dtype{hint}")
        return native
    dtype = as_dtype(claimed, what)
    _check_holds(name, adapter.itemsize(x), dtype, what)
    return dtype


class _NumPyLike:
    """What NumPy and CuPy arrays answer alike."""

    @staticmethod
    def dtype_name(x):
        return x.dtype.name

    @staticmethod
    def itemsize(x):
        return x.dtype.itemsize

    @staticmethod
    def shape(x):
        return tuple(x.shape)


class _NumPy(_NumPyLike):
    name = "numpy"

    @staticmethod
    def prepare_input(x):
        if not x.flags.c_contiguous or x.ctypes.data % ALIGNMENT:
            copy = aligned_empty(x.shape, x.dtype)
            copy[...] = x
            return copy
        return x

    @staticmethod
    def check_output(x, what):
        if not x.flags.writeable:
            raise ValueError(f"{what}: the array is read-only")
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: the array must be C-contiguous")

    @staticmethod
    def empty(shape, dtype, like):
        return aligned_empty(shape, numpy_container(dtype))

    @staticmethod
    def zeros(shape, dtype, like):
        out = aligned_empty(shape, numpy_container(dtype))
        out.reshape(-1).view(np.uint8)[...] = 0
        return out

    @staticmethod
    def stand_in(x):
        return aligned_empty((1,), x.dtype)

    @staticmethod
    def same_device(a, b):
        return True

    @staticmethod
    def device_name(x):
        return "cpu"

    @staticmethod
    def is_host(x):
        return True

    @staticmethod
    def int64_from_values(values, like):
        out = aligned_empty((len(values),), np.int64)
        out[...] = values
        return out

    @staticmethod
    def int64_to_int32_ids(x):
        return np.where((x < _INT32_MIN) | (x > _INT32_MAX), -1, x).astype(np.int32)

    @staticmethod
    def one_group_offsets(rows, like):
        return _NumPy.int64_from_values([0, rows], like)

    @staticmethod
    def for_binding(x):
        # ml_dtypes element types (user-defined NumPy types) do not travel through DLPack or the
        # buffer protocol: hand their bytes over as unsigned integers of the same width.
        if x.dtype.num >= 256:
            return x.view(f"u{x.dtype.itemsize}")
        return x

    @staticmethod
    def flatten(x):
        return x.reshape(-1)

    @staticmethod
    def stream(x):
        return 0

    @staticmethod
    def device_context(x):
        return contextlib.nullcontext()

    @staticmethod
    def scalar_f32(value, like):
        s = aligned_empty((), np.float32)
        s[()] = value
        return s

    @staticmethod
    def as_scale(s, like, what):
        if s.dtype != np.float32 or s.size != 1:
            raise TypeError(f"{what}: expected a single float32 value, got {s.dtype} x {s.size}")
        return _NumPy.prepare_input(s.reshape(()))

    @staticmethod
    def reciprocal(s):
        out = aligned_empty((), np.float32)
        np.divide(np.float32(1.0), s, out=out)
        return out

    @staticmethod
    def current_scale(x_f32, fp8_max, power_of_two):
        amax = np.float32(np.max(np.abs(x_f32))) if x_f32.size else np.float32(0.0)
        scale = aligned_empty((1,), np.float32)
        _C.fp8_scale_from_amax(np.array([amax], np.float32), scale, fp8_max, power_of_two)
        return scale.reshape(())


class _Torch:
    name = "torch"
    # Element types DLPack (and every nanobind version) understands; the others (float8, packed
    # float4, e8m0) are handed over as their bytes.
    _DLPACK_NAMES = {
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "bool",
    }

    def __init__(self, torch):
        self.torch = torch

    @staticmethod
    def dtype_name(x):
        return str(x.dtype).split(".", 1)[1]

    @staticmethod
    def itemsize(x):
        return x.element_size()

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    def prepare_input(self, x):
        if x.requires_grad and self.torch.is_grad_enabled():
            # Reading it through detach() would cut the autograd graph without a word.
            raise TypeError(
                "a tensor that requires grad reached a functional sfmoe op, which records no autograd: "
                "use sfmoe.torch (the MoE and GroupedLinear modules, or its router, permute, unpermute, "
                "grouped_activation and grouped_linear ops, which carry autograd), or pass x.detach() or "
                "call it under torch.no_grad() to compute without gradients"
            )
        x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        if x.numel() and x.data_ptr() % ALIGNMENT:
            x = x.clone()
        return x

    @staticmethod
    def check_output(x, what):
        if not x.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")

    def empty(self, shape, dtype, like):
        return self.torch.empty(shape, dtype=torch_container(dtype, self.torch), device=like.device)

    def zeros(self, shape, dtype, like):
        return self.torch.zeros(shape, dtype=torch_container(dtype, self.torch), device=like.device)

    def stand_in(self, x):
        return self.torch.empty((1,), dtype=x.dtype, device=x.device)

    @staticmethod
    def same_device(a, b):
        return a.device == b.device

    @staticmethod
    def device_name(x):
        return str(x.device)

    @staticmethod
    def is_host(x):
        return x.device.type == "cpu"

    def int64_from_values(self, values, like):  # host tensors only
        return self.torch.tensor(values, dtype=self.torch.int64, device=like.device)

    def int64_to_int32_ids(self, x):
        x = x.detach()
        return self.torch.where((x < _INT32_MIN) | (x > _INT32_MAX), -1, x).to(self.torch.int32)

    def one_group_offsets(self, rows, like):
        # [0, rows] computed on the device (no host-to-device copy): capturable in a CUDA graph.
        return self.torch.arange(2, dtype=self.torch.int64, device=like.device) * rows

    def for_binding(self, x):
        x = x.detach()
        if self.dtype_name(x) not in self._DLPACK_NAMES:
            x = x.view(self.torch.uint8)
        if x.is_cuda:
            # stream=-1: no synchronization on export. The op itself runs on the current stream,
            # which is where the tensors' producers ran.
            return x.__dlpack__(stream=-1)
        return x

    @staticmethod
    def flatten(x):
        return x.reshape(-1)

    def stream(self, x):
        return self.torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0

    def device_context(self, x):
        return self.torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()

    def scalar_f32(self, value, like):
        return self.torch.full((), value, dtype=self.torch.float32, device=like.device)

    def as_scale(self, s, like, what):
        if s.dtype != self.torch.float32 or s.numel() != 1:
            raise TypeError(f"{what}: expected a single float32 value, got {s.dtype} x {s.numel()}")
        if s.device != like.device:
            raise ValueError(f"{what}: the scale is on {s.device} but the data on {like.device}")
        return self.prepare_input(s.reshape(()))

    def reciprocal(self, s):
        # A tensor divisor (not a Python number): PyTorch would multiply by a rounded reciprocal.
        return self.torch.div(self.torch.ones_like(s), s)

    def current_scale(self, x_f32, fp8_max, power_of_two):
        """scale = fp8_max / amax with the rules of numerics::fp8_scale_from_amax, computed on the
        tensor's device (no host round trip)."""
        torch = self.torch
        if x_f32.numel():
            amax = x_f32.abs().amax()
        else:
            amax = torch.zeros((), dtype=torch.float32, device=x_f32.device)
        quotient = torch.div(torch.full_like(amax, fp8_max), amax)
        quotient = torch.where(torch.isinf(quotient), torch.full_like(quotient, FLT_MAX), quotient)
        usable = (amax > 0) & ~torch.isinf(amax)  # false for NaN as well
        scale = torch.where(usable, quotient, torch.ones_like(quotient))
        if power_of_two:
            exponent_mask = -(1 << 23)  # 0xFF800000 as int32: keep sign and exponent
            scale = torch.bitwise_and(scale.view(torch.int32), exponent_mask).view(torch.float32)
        return scale


class _CuPy(_NumPyLike):
    name = "cupy"

    def __init__(self, cupy):
        self.cupy = cupy

    def prepare_input(self, x):
        if not x.flags.c_contiguous or x.data.ptr % ALIGNMENT:
            x = x.copy(order="C")
        return x

    @staticmethod
    def check_output(x, what):
        if not x.flags.c_contiguous:
            raise ValueError(f"{what}: the array must be C-contiguous")

    def empty(self, shape, dtype, like):
        dtype = as_dtype(dtype)
        container = numpy_container(dtype)
        if container.num >= 256:  # CuPy has no ml_dtypes types: raw unsigned codes
            container = np.dtype(f"u{container.itemsize}")
        with like.device:
            return self.cupy.empty(shape, dtype=container)

    def zeros(self, shape, dtype, like):
        out = self.empty(shape, dtype, like)
        with like.device:
            out.reshape(-1).view(np.uint8)[...] = 0
        return out

    def stand_in(self, x):
        with x.device:
            return self.cupy.empty((1,), dtype=x.dtype)

    @staticmethod
    def same_device(a, b):
        return a.device == b.device

    @staticmethod
    def device_name(x):
        return f"cuda:{x.device.id}"

    @staticmethod
    def is_host(x):
        return False

    def one_group_offsets(self, rows, like):
        with like.device:
            return self.cupy.arange(2, dtype=np.int64) * rows

    def int64_to_int32_ids(self, x):
        with x.device:
            return self.cupy.where((x < _INT32_MIN) | (x > _INT32_MAX), -1, x).astype(np.int32)

    @staticmethod
    def for_binding(x):
        return x.__dlpack__(stream=-1)

    @staticmethod
    def flatten(x):
        return x.reshape(-1)

    def stream(self, x):
        with x.device:
            return self.cupy.cuda.get_current_stream().ptr

    @staticmethod
    def device_context(x):
        return x.device

    def scalar_f32(self, value, like):
        with like.device:
            return self.cupy.full((), value, dtype=np.float32)

    def as_scale(self, s, like, what):
        if s.dtype != np.float32 or s.size != 1:
            raise TypeError(f"{what}: expected a single float32 value, got {s.dtype} x {s.size}")
        return self.prepare_input(s.reshape(()))

    def reciprocal(self, s):
        return self.cupy.divide(self.cupy.ones_like(s), s)

    def current_scale(self, x_f32, fp8_max, power_of_two):
        # Computing amax here would need a host round trip; ops must stay sync-free. The device
        # amax op of the grouped quantization family will serve every framework.
        raise NotImplementedError(
            "quantize_fp8: current scaling (scale=None) is not available for CuPy arrays yet; "
            "pass a scale (a number or a one-element float32 CuPy array)"
        )


NUMPY = _NumPy()
_adapters = {}


def adapt(x, what):
    """(adapter, array) for any accepted array; raises TypeError for anything else."""
    if isinstance(x, np.ndarray):
        return NUMPY, x
    if isinstance(x, np.generic):
        return NUMPY, np.asarray(x)
    module = type(x).__module__.split(".", 1)[0]
    if module == "torch":
        import torch

        if isinstance(x, torch.Tensor):
            if "torch" not in _adapters:
                _adapters["torch"] = _Torch(torch)
            return _adapters["torch"], x
    if module == "cupy":
        import cupy

        if isinstance(x, cupy.ndarray):
            if "cupy" not in _adapters:
                _adapters["cupy"] = _CuPy(cupy)
            return _adapters["cupy"], x
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        if device_type in _DLPACK_HOST_DEVICES:
            return NUMPY, np.from_dlpack(x)
        raise TypeError(
            f"{what}: {type(x).__name__} on DLPack device type {device_type}: device arrays are "
            "accepted as torch.Tensor or cupy.ndarray"
        )
    raise TypeError(f"{what}: expected a NumPy array, a torch.Tensor or a CuPy array, got {type(x).__name__}")


def logical_shape(container_shape, dtype, what):
    """The element shape of an array holding `dtype` (FP4: two elements per byte, innermost)."""
    if dtype != DType.FP4_E2M1:
        return tuple(container_shape)
    if not container_shape:
        raise ValueError(f"{what}: packed fp4_e2m1 data needs at least one dimension")
    return tuple(container_shape[:-1]) + (2 * container_shape[-1],)


def container_shape(logical, dtype, what):
    """The array shape that holds elements of shape `logical` as `dtype`."""
    if dtype != DType.FP4_E2M1:
        return tuple(logical)
    if not logical or logical[-1] % 2:
        raise ValueError(
            f"{what}: fp4_e2m1 packs two elements per byte, so the innermost dimension must be "
            f"even (got shape {tuple(logical)})"
        )
    return tuple(logical[:-1]) + (logical[-1] // 2,)


def empty_planned(adapter, spec, like, what):
    """An empty array for one planned buffer (a `_C.plan_*` entry: None, or (dtype, shape in
    elements, bytes)) on like's device; None for an absent buffer."""
    if spec is None:
        return None
    dtype, shape, _ = spec
    dtype = DType(dtype)
    return adapter.empty(container_shape(shape, dtype, what), dtype, like)


def empty_bytes(adapter, nbytes, dtype, like):
    """An empty 1-D `dtype` array of at least `nbytes` bytes (a workspace the library sizes in
    bytes), or None when it needs none."""
    if nbytes <= 0:
        return None
    item = _C.dtype_bits(int(dtype)) // 8
    return adapter.empty((-(-nbytes // item),), dtype, like)


def output_array(adapter, out, shape, dtype, like, peer):
    """`out` checked as an output beside `like` (the same kind of array as `peer`, of `dtype`,
    writable), or a new empty `shape` array when it is None."""
    if out is None:
        return adapter.empty(shape, dtype, like)
    out_adapter, out = adapt(out, "out")
    if out_adapter is not adapter:
        raise TypeError(f"out: must be the same kind of array as {peer} ({adapter.name})")
    resolve_dtype(adapter, out, dtype, "out")
    adapter.check_output(out, "out")
    return out


def checked_input(x, what, dtypes, ndim=None):
    """(adapter, x ready for the library, sfmoe dtype) of an input array whose dtype is one of
    `dtypes` and, when given, with `ndim` dimensions; TypeError / ValueError otherwise."""
    adapter, x = adapt(x, what)
    names = " or ".join(d.c_name for d in dtypes)
    dtype = resolve_dtype(adapter, x, None, what, expected=names)
    if dtype not in dtypes:
        raise TypeError(f"{what}: expected {names} values, got {dtype.c_name}")
    if ndim is not None and len(adapter.shape(x)) != ndim:
        raise ValueError(f"{what}: expected a {ndim}-D array, got shape {adapter.shape(x)}")
    return adapter, adapter.prepare_input(x), dtype


def bound_input(x, what, dtype):
    """An input array of sfmoe dtype `dtype` as the binding takes it (the binding itself checks
    only the element width, so an int32 array would pass as float32)."""
    adapter, x, _ = checked_input(x, what, (dtype,))
    return adapter.for_binding(x)


def expert_ids(x, what):
    """Expert ids as the ops take them (int32), from int32 or int64 arrays (what torch.topk and
    NumPy's argsort give). An int64 id outside int32 becomes -1, which the ops treat as the bad id
    it is (refused on the host, skipped and reported on the device) rather than a wrapped,
    plausible one; no value is read back to the host."""
    adapter, array = adapt(x, what)
    name = adapter.dtype_name(array)
    if name == "int64":
        array = adapter.int64_to_int32_ids(array)
    elif name != "int32":
        raise TypeError(f"{what}: expected int32 or int64 expert ids, got {name}")
    return bound_input(array, what, DType.INT32)


def index_array(values, what, like_adapter, like, dtype=DType.INT64):
    """An index input (offsets, counts) as the binding takes it: an array of `dtype`, or on the host
    a Python sequence of integers (as everywhere else in the package); a sequence beside device
    data is refused (it would need a copy to the device)."""
    if isinstance(values, (list, tuple)):
        if not like_adapter.is_host(like):
            raise TypeError(
                f"{what}: pass an {dtype.c_name} array on the data's device (a Python sequence "
                "would need a copy to the device)"
            )
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{what}: expected integers, got {type(v).__name__}")
        values = np.asarray(values, dtype=np.int64 if dtype == DType.INT64 else np.int32)
    return bound_input(values, what, dtype)
