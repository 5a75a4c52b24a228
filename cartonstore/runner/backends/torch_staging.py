"""Moving numpy arrays into torch tensors on a device and back, for the
torchscript runner.

To a GPU, inputs go through page-locked ("pinned") host buffers that a
runner keeps and reuses: a copy from pageable memory is staged by the
driver through a small pinned bounce buffer, synchronously, at a fraction
of the bus's speed (7 GiB/s against 51 GiB/s on an H100; bench_gpu_staging.py
measures it), and allocating pinned memory per request costs more than
the copy. Buffers are kept per input name, grown to the largest tensor
seen: a call takes one from its name's free list and gives it back, so a
runner holds as many per name as it ran calls at once (max_concurrency),
whichever threads ran them.
A big input is copied into its buffer by several threads, chunk by chunk,
and each chunk goes to the device while the next ones are copied.

BF16 crosses as its 16-bit pattern both ways, so it round-trips exactly
(numpy's bfloat16 is ml_dtypes', which torch.from_numpy does not take).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

COPY_CHUNK = 8 << 20   # big enough that a chunk's DMA is not all latency, small enough to overlap
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _copy_pool() -> ThreadPoolExecutor:
    """Threads that copy into pinned buffers: as many as the runner may use
    cores, up to 8 (past that a host's memory bandwidth is spent)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            _POOL = ThreadPoolExecutor(max_workers=max(1, min(8, cores)), thread_name_prefix="pinned-copy")
        return _POOL


def _is_bfloat16(array: np.ndarray) -> bool:
    return array.dtype.name == "bfloat16"


class TensorStaging:
    """numpy <-> torch on ``device`` ("cpu" or "cuda:N"); ``pinned`` stages
    GPU inputs through reused page-locked buffers (else pageable copies)."""

    def __init__(self, torch: Any, device: str, *, pinned: bool = True) -> None:
        self._torch = torch
        self._device = device
        self._pinned = pinned and device.startswith("cuda")
        self._free: dict[str, list[tuple[Any, Any]]] = {}   # name -> (pinned buffer, its last copy's event)
        self._free_lock = threading.Lock()

    def to_device(self, array: np.ndarray, name: str) -> Any:
        """A tensor on the device with ``array``'s values (C order, any alignment)."""
        torch = self._torch
        bf16 = _is_bfloat16(array)
        if bf16:
            array = array.view(np.int16)
        if not self._pinned:
            # from_numpy shares memory; it needs an aligned, writable array
            # (binary inputs are views at arbitrary offsets of the body).
            host = torch.from_numpy(np.require(array, requirements=["A", "C", "W"]))
            tensor = host.to(self._device, non_blocking=True)
        else:
            tensor = self._staged(array, name)
        return tensor.view(torch.bfloat16) if bf16 else tensor

    def _staged(self, array: np.ndarray, name: str) -> Any:
        """``array`` on the device, through a pinned buffer for ``name``
        (taken from its free list, given back after): copied into it in
        chunks by the copy pool (numpy's copy lets go of the GIL: one
        thread's memcpy is a fraction of the memory's bandwidth), each chunk
        sent to the device as soon as it is in (the bus works while the next
        chunks are copied). A buffer too small is synchronized before it is
        dropped: its last copy may still be reading it."""
        torch = self._torch
        nbytes = array.nbytes
        with self._free_lock:
            free = self._free.get(name)
            buffer, sent = free.pop() if free else (None, None)
        if sent is not None:
            sent.synchronize()   # the last copy from it is done (a model's outputs need not have waited for it)
        if buffer is None or buffer.numel() < nbytes:
            buffer = None   # the old one goes first: page-locked memory is scarce
            buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
        host, source = buffer[:nbytes], np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        pinned_view = host.numpy()
        device = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        spans = [(start, min(start + COPY_CHUNK, nbytes)) for start in range(0, nbytes, COPY_CHUNK)]
        chunked = len(spans) > 1
        copies = [_copy_pool().submit(np.copyto, pinned_view[a:b], source[a:b]) for a, b in spans] if chunked else []
        try:
            if not chunked:
                np.copyto(pinned_view, source)
                device.copy_(host, non_blocking=True)
            for (a, b), copied in zip(spans, copies, strict=False):   # no copies when unchunked
                copied.result()
                device[a:b].copy_(host[a:b], non_blocking=True)
        finally:
            # whatever happened: no copy thread still writes the buffer, and the next use
            # waits for every transfer from it queued so far (success or not)
            wait(copies)
            sent = torch.cuda.Event()
            sent.record(torch.cuda.current_stream(self._device))   # the copies' stream: any thread, not cuda:0's
            with self._free_lock:
                self._free.setdefault(name, []).append((buffer, sent))
        dtype = torch.from_numpy(np.empty(0, array.dtype)).dtype
        return device.view(dtype).view(array.shape)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A tensor's values on the host (BF16 as numpy's bfloat16, exactly)."""
        torch = self._torch
        value = tensor.detach().cpu()
        if value.dtype == torch.bfloat16:
            from cartonstore.v2.datatypes import numpy_dtype

            return value.view(torch.int16).numpy().view(numpy_dtype("BF16"))
        return value.numpy()
