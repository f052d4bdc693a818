"""CPU memory: 64-byte-aligned numpy buffers, and buffers over existing host memory.

A large buffer is an anonymous memory mapping of its own (on Linux): the kernel backs a page
only when it is first written, and clearing to zero hands the pages back (``MADV_DONTNEED``:
they read as zeros again) instead of writing every byte. So a KV cache sized for a long
context holds only the cells a sequence has used, and ``reset`` returns them; ggml memsets,
which makes every page resident at once. The bytes read are the same either way.
"""

from __future__ import annotations

import mmap
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from polydev.buffer import Buffer, BufferType, HostArrayBuffer, wrap_host_memory
from polydev.errors import AllocationError, UnsupportedError

if TYPE_CHECKING:
    from .device import CPUDevice

ALIGNMENT = 64   # cache-line aligned base, and the alignment of every tensor in it
# from this size a buffer is a mapping of its own (smaller ones come from malloc's heap)
MAPPED_BYTES = 1 << 20
_LAZY_ZERO = sys.platform.startswith("linux") and hasattr(mmap, "MADV_DONTNEED")
REDROP_ROWS = 256   # rows read from a replaced weight between two drops: 16 MiB mapped at most


class CPUBuffer(HostArrayBuffer):
    """Host memory the CPU computes on; freeing it drops its decoded weights from the cache."""

    def __init__(self, buft: BufferType, array: np.ndarray, mapping: mmap.mmap | None = None,
                 read_only_file: mmap.mmap | None = None) -> None:
        super().__init__(buft, array)
        self._mapping = mapping          # the whole private anonymous mapping behind array
        self._read_only_file = read_only_file     # or the read-only file mapping it wraps
        # (offset, nbytes) of each weight a copy replaced -> its rows read since its last drop
        self._replaced: dict[tuple[int, int], int] = {}

    def drop_pages(self, offset: int, nbytes: int) -> None:
        """Let the OS take the whole pages of [offset, offset + nbytes) out of this process's
        memory where they map a read-only file (a model's weights once the kernels have a copy
        of their own, as llama.cpp unmaps what it copied): a later read brings them back from
        the file unchanged. Other memory is left alone, since dropping its pages would lose
        or zero them."""
        if self._read_only_file is None or not _LAZY_ZERO:
            return
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self._read_only_file.madvise(mmap.MADV_DONTNEED, start, end - start)

    def replaced_by_copy(self, offset: int, nbytes: int) -> None:
        """[offset, offset + nbytes) is a weight the kernels keep a copy of: drop its pages
        now, and again once enough of its rows were read (``rows_read``)."""
        self.drop_pages(offset, nbytes)
        self._replaced[(offset, nbytes)] = 0

    def rows_read(self, offset: int, nbytes: int, n_rows: int) -> None:
        """``n_rows`` rows of the weight at [offset, offset + nbytes) were read. A token
        embedding whose copy serves the output product is still read a few rows at a time by
        GET_ROWS, and the OS maps the pages around each row it faults in (64 KiB), so over a
        long prompt the whole range would come back beside the copy: where a copy replaced
        it, its pages are dropped again every REDROP_ROWS rows (dropping them on every
        decode step cost 1-3% of gemma-3's tg128)."""
        key = (offset, nbytes)
        if key in self._replaced:
            self._replaced[key] += n_rows
            if self._replaced[key] >= REDROP_ROWS:
                self.drop_pages(offset, nbytes)
                self._replaced[key] = 0

    def _clear(self, value: int) -> None:
        if value == 0 and self._mapping is not None:
            self._mapping.madvise(mmap.MADV_DONTNEED)   # zero-fill on the next touch
        else:
            super()._clear(value)

    def _free(self) -> None:
        device: CPUDevice = self.buft.device
        device.weight_cache.forget(self)
        self._mapping = None             # unmapped when the last view of it is gone
        super()._free()


class CPUBufferType(BufferType):
    """The "CPU" buffer type: host memory owned by numpy, 64-byte aligned."""

    def __init__(self, device: "CPUDevice") -> None:
        super().__init__("CPU", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        if _LAZY_ZERO and size >= MAPPED_BYTES:
            # private: MADV_DONTNEED zeroes private pages (a shared mapping keeps them)
            try:
                mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)   # page-aligned, zero
            except OSError as e:            # ENOMEM: more than the kernel will commit
                raise AllocationError(f"{self.device.name}: cannot allocate "
                                      f"{size / 2**20:,.2f} MiB of host memory: "
                                      f"{e.strerror or e}") from None
            return CPUBuffer(self, np.frombuffer(mapping, np.uint8), mapping)
        raw = np.empty(size + ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return CPUBuffer(self, raw[start:start + size])


class CPUMappedBufferType(BufferType):
    """The "CPU_Mapped" buffer type of buffers over memory polydev does not own."""

    def __init__(self, device: "CPUDevice") -> None:
        super().__init__("CPU_Mapped", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        raise UnsupportedError("CPU_Mapped buffers wrap existing memory: use "
                               "device.buffer_from_host_ptr")

    def wrap(self, host: Any) -> Buffer:
        """A buffer over ``host`` (numpy array, memoryview, bytes, mmap) without copying."""
        read_only_file = None
        if isinstance(host, mmap.mmap) and memoryview(host).readonly:    # ACCESS_READ: shared
            read_only_file = host
        return CPUBuffer(self, wrap_host_memory(host), read_only_file=read_only_file)
