"""The status word: faults that kernels find (bad group offsets, NaN amax, ...) are recorded on the
device instead of stopping the step; the host reads them after a snapshot, whenever it next
synchronizes anyway (sfmoe.h, "device status word")."""

import dataclasses
import enum
import sys

from . import _C, _arrays
from ._dtypes import Memory


class Fault(enum.IntFlag):
    """The fault flags of a status word (``sfmoe_fault``)."""

    BAD_GROUP_OFFSETS = _C.FAULT_BAD_GROUP_OFFSETS
    GROUP_OVER_CAPACITY = _C.FAULT_GROUP_OVER_CAPACITY
    EP_OVERFLOW = _C.FAULT_EP_OVERFLOW
    NAN_AMAX = _C.FAULT_NAN_AMAX


@dataclasses.dataclass(frozen=True)
class FaultReport:
    """What a status word recorded: the OR of the faults, how many fault events there were
    (saturating), and the group and offending value of the first one (-1 and 0 when none)."""

    flags: Fault
    count: int
    first_group: int
    first_value: int

    def __bool__(self):
        return bool(self.flags)


def _placement(device):
    """(Memory, device ordinal) of a device given as "cpu", "cuda", "cuda:N", an int (a CUDA
    ordinal), a torch.device, or an array (where the array lives)."""
    if device is None:
        return Memory.HOST, 0
    if isinstance(device, bool):
        raise TypeError(f"device: expected a device, got {device!r}")
    if isinstance(device, int):
        return Memory.CUDA, device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cpu" and not index:
            return Memory.HOST, 0
        if kind == "cuda":
            try:
                return Memory.CUDA, int(index) if index else 0
            except ValueError:
                pass
        raise ValueError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if type(device).__module__ == "torch" and type(device).__name__ == "device":
        if device.type == "cpu":
            return Memory.HOST, 0
        if device.type == "cuda":
            return Memory.CUDA, device.index if device.index is not None else 0
        raise ValueError(f"device: {device} is neither the CPU nor a CUDA device")
    adapter, x = _arrays.adapt(device, "device")
    if adapter.is_host(x):
        return Memory.HOST, 0
    return Memory.CUDA, int(adapter.device_name(x).partition(":")[2] or 0)


def stream_handle(stream, memory, device):
    """The cudaStream_t (as an int) for `stream`: an int handle, a torch / CuPy stream object, or
    None for the current stream of whichever of torch and CuPy is loaded (else the default
    stream). Host memory needs none."""
    if memory == Memory.HOST:
        return 0
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.current_stream(device).cuda_stream
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            with cupy.cuda.Device(device):
                return cupy.cuda.get_current_stream().ptr
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attribute in ("cuda_stream", "ptr"):
        if hasattr(stream, attribute):
            return int(getattr(stream, attribute))
    raise TypeError(f"stream: expected a stream handle (int) or a torch / CuPy stream, got {stream!r}")


class StatusWord:
    """A status word in host memory (``device="cpu"``, for host arrays) or on a CUDA device
    (``"cuda:N"``, an ordinal, a torch.device, or an array whose device to use).

    Pass it as ``status_word=`` to ops that record faults. Every operation on it is enqueued on a
    stream (so it can sit in a captured CUDA graph): :meth:`reset` clears it, :meth:`snapshot`
    copies it into a pinned host mirror, and :meth:`read` returns the mirror without touching the
    device, so call it after synchronizing with the snapshot's stream. Creating a word allocates
    and synchronizes: do it outside the step. On the host, reset and snapshot act at once.
    """

    def __init__(self, device="cpu"):
        memory, ordinal = _placement(device)
        self._word = _C.StatusWord(int(memory), int(ordinal))

    @property
    def memory(self):
        return Memory(self._word.memory)

    @property
    def device(self):
        return "cpu" if self.memory == Memory.HOST else f"cuda:{self._word.device}"

    def reset(self, stream=None):
        """Clears the word on `stream` (default: the current torch / CuPy stream)."""
        self._word.reset(stream_handle(stream, self.memory, self._word.device))

    def snapshot(self, stream=None):
        """Enqueues a copy of the word into the host mirror on `stream`."""
        self._word.snapshot(stream_handle(stream, self.memory, self._word.device))

    def read(self):
        """The :class:`FaultReport` the last snapshot left in the mirror (does not wait)."""
        report = self._word.read()
        return FaultReport(Fault(report["flags"]), report["count"], report["first_group"], report["first_value"])

    def __repr__(self):
        return f"sfmoe.StatusWord({self.device!r})"
