"""One round in flight (:class:`_Round`): the float32 tensor it works in, on the host or on
the device that compresses it, the copy back to the caller's tensor at synchronize, and the
exact sums of integer tensors; the ordering of GPU rounds with torch's streams
(:class:`_Ordering`, the worker's own streams)."""

from __future__ import annotations

from typing import Optional

import torch

from .. import _native
from . import _state
from ._state import _check_running, _w, size

_CONVERTIBLE = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_INTEGER = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
# Integers are summed in float32, which holds every integer of magnitude up to 2**24.
_EXACT_LIMIT = float(2**24)


class _Round:
    """One round in flight: the native handle, the float32 tensor it works in (on the host, or
    in the memory of the device that compresses it), and the caller's tensor when that is a
    different one (copied back at synchronize).

    An integer tensor's round works in a float32 host tensor of twice its length: its values,
    then their magnitudes, whose sums say whether the values' sums were exact (every partial
    sum of an element is at most the sum of its magnitudes)."""

    def __init__(self, name: str, tensor: torch.Tensor, host_only: bool = False):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in _CONVERTIBLE and tensor.dtype not in _INTEGER:
            raise TypeError(
                f"tensor {name!r} has dtype {tensor.dtype}: pushpull sums float32 "
                "(float64, float16 and bfloat16 are converted; int8, uint8, int16, int32 and "
                "int64 are summed exactly below 2**24); bool and complex tensors are not supported"
            )
        self.name = name
        self.tensor = tensor  # what synchronize returns (in place: the caller's own tensor)
        self.dtype = tensor.dtype
        self.numel = tensor.numel()
        self.shape = tuple(tensor.shape)
        self.native: Optional[_native.Handle] = None
        # Where it is compressed: None (the host path), "cuda:N" or "emulated".
        self.device: Optional[str] = None
        # The ordering shared by the rounds of one call on a GPU (_Ordering), if any.
        self.ordering = None
        # Integers: averaged here (floor division), after the exact sum.
        self.integer = tensor.dtype in _INTEGER
        self.int_average = False
        # A factor applied to the result at synchronize (Horovod's postscale_factor).
        self.scale = 1.0
        # What synchronize returns made of the result, if not the result itself (a
        # user-defined compressor's decompress).
        self.then = None
        if self.integer:
            flat = tensor.detach().reshape(-1).to("cpu", torch.float64)
            self.target = tensor
            self.work = torch.cat([flat, flat.abs()]).to(torch.float32)
            return
        if not host_only and tensor.device.type == "cuda":
            self.device = _w().cuda_route(tensor.device.index)
            if self.device is not None and not tensor.is_contiguous():
                raise ValueError(
                    f"tensor {name!r} is a non-contiguous CUDA tensor (shape {tuple(tensor.shape)}, "
                    f"strides {tensor.stride()}): hand in a contiguous tensor (e.g. .contiguous())"
                )
        elif not host_only and tensor.device.type == "cpu" and _state.route == "emulated":
            self.device = "emulated"
        direct = tensor.dtype == torch.float32 and tensor.is_contiguous()
        if self.device is None:
            direct = direct and tensor.device.type == "cpu"
        self.target = None if direct else tensor
        if direct:
            self.work = tensor.detach()
        elif self.device is not None:
            # Widened on the tensor's own device (exactly).
            self.work = tensor.detach().to(torch.float32).contiguous()
        else:
            self.work = tensor.detach().to("cpu", torch.float32).contiguous()

    def entry(self):
        w = self.work
        return (self.name, w, w.data_ptr(), w.numel())

    def start_broadcast(self, root: int) -> None:
        _check_running(f"broadcast of {self.name!r}")
        self.native = _w().broadcast(*self.entry(), root)
        _state.live.add(self)

    def _integer_result(self) -> torch.Tensor:
        n = self.numel
        values, magnitudes = self.work[:n], self.work[n:]
        if n and float(magnitudes.max()) >= _EXACT_LIMIT:
            i = int(torch.argmax(magnitudes))
            raise ValueError(
                f"integer tensor {self.name!r} ({self.dtype}): element {i} has magnitudes summing "
                f"to {float(magnitudes[i]):.0f} over the workers (for a broadcast, the root's), "
                "not below 2**24 = 16777216, so its float32 sum may not be exact; the tensor is "
                "unchanged (split the values, or send them as float64 bytes via broadcast_object)"
            )
        s = values.to(torch.int64)
        if self.int_average:
            s = torch.div(s, size(), rounding_mode="floor")
        with torch.no_grad():
            # int64 -> the dtype wraps modulo 2**bits, as a sum in that dtype would.
            self.target.copy_(s.view(self.target.shape).to(self.target.dtype))
        return self.target

    def finish(self) -> torch.Tensor:
        self.wait()
        return self.complete()

    def wait(self) -> None:
        """Waits for the round (raising its error); later work on the current stream is then
        ordered after it."""
        assert self.native is not None
        self.native.wait()
        if self.ordering is not None:
            self.ordering.after()

    def complete(self) -> torch.Tensor:
        """What is left once the result is there (or once later work on the current stream
        is ordered after it: ``Worker.order_after``): integers' exact sums, the scale, the
        copy into the caller's tensor."""
        if self.integer:
            result = self._integer_result()
        else:
            if self.scale != 1.0:
                with torch.no_grad():
                    self.work.mul_(self.scale)
            if self.target is not None:
                with torch.no_grad():
                    self.target.copy_(self.work)
            result = self.tensor
        return result if self.then is None else self.then(result)


class _Ordering:
    """The rounds of one call on a GPU, ordered with torch's streams: they run on the worker's
    stream, and once they are done (their handles resolved: the decode is queued there) later
    work on the stream current then waits for it; once per call and stream, not per tensor
    (each wait is two driver calls)."""

    def __init__(self, stream):
        self.stream = stream
        self.ordered = set()  # the streams already made to wait

    def after(self) -> None:
        current = torch.cuda.current_stream(self.stream.device)
        if current.cuda_stream not in self.ordered:
            current.wait_stream(self.stream)
            self.ordered.add(current.cuda_stream)


def _worker_stream(device: str):
    """The worker's stream on ``device`` ("cuda:N") as a torch stream."""
    s = _state.streams.get(device)
    if s is None:
        s = torch.cuda.ExternalStream(_w().device_stream(device), device=torch.device(device))
        _state.streams[device] = s
    return s
