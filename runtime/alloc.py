"""Placing tensors in buffers: ggml's tensor_alloc, view_init, the bump allocator and
alloc_ctx_tensors. (The graph allocator that reuses compute memory lives here too, later.)"""

from __future__ import annotations

from .buffer import Buffer, BufferType, MultiBuffer
from .context import Context
from .device import Backend
from .errors import AllocationError, NotAllocatedError
from .tensor import Tensor


def pad(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


def tensor_alloc(buffer: Buffer, t: Tensor, offset: int) -> None:
    """Place the non-view tensor ``t`` at byte ``offset`` of ``buffer``."""
    if t.buffer is not None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is already allocated in "
                              f"{t.buffer.name}")
    if t.view_src is not None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is a view; use view_init")
    size = buffer.alloc_size(t)
    if offset < 0 or offset + size > buffer.size:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} ({size} bytes at offset {offset}) "
                              f"does not fit buffer {buffer.name} of {buffer.size} bytes")
    t.buffer, t.offset = buffer, offset
    buffer.init_tensor(t)


def view_init(t: Tensor) -> None:
    """Point the view ``t`` at its (allocated) source's memory."""
    src = t.view_src
    if src is None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is not a view")
    if src.buffer is None:
        raise NotAllocatedError(f"view {t.name or '<unnamed>'}: its source "
                                f"{src.name or '<unnamed>'} is not allocated")
    t.buffer, t.offset = src.buffer, src.offset + t.view_offs
    src.buffer.init_tensor(t)


class TensorAllocator:
    """A bump allocator over one buffer: tensors are placed one after another, never freed."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer
        self.alignment = buffer.alignment
        self.offset = 0

    def alloc(self, t: Tensor) -> None:
        size = pad(self.buffer.alloc_size(t), self.alignment)
        if self.offset + size > self.buffer.size:
            raise AllocationError(
                f"not enough space in buffer {self.buffer.name} for {t.name or '<unnamed>'}: "
                f"needed {size} bytes, {self.buffer.size - self.offset} of {self.buffer.size} left")
        tensor_alloc(self.buffer, t, self.offset)
        self.offset += size


def _buft_of(target: Backend | BufferType) -> BufferType:
    return target.default_buffer_type if isinstance(target, Backend) else target


def _ranges(ctx: Context, buft: BufferType) -> list[tuple[int, int, int]]:
    """Split ctx's tensors into (first, last+1, bytes) ranges that fit buft's max size."""
    ranges, start, cur = [], 0, 0
    for i, t in enumerate(ctx.tensors):
        if t.buffer is not None or t.view_src is not None:
            continue
        size = pad(buft.alloc_size(t), buft.alignment)
        if cur > 0 and cur + size > buft.max_size:
            ranges.append((start, i, cur))
            start, cur = i, 0
        cur += size
    ranges.append((start, len(ctx.tensors), cur))
    return ranges


def alloc_ctx_tensors_size(ctx: Context, target: Backend | BufferType) -> int:
    """Bytes ``alloc_ctx_tensors`` would allocate."""
    return sum(n for _, _, n in _ranges(ctx, _buft_of(target)))


def alloc_ctx_tensors(ctx: Context, target: Backend | BufferType) -> Buffer | None:
    """Allocate every unallocated tensor of ``ctx`` in new buffers of ``target``'s buffer type.

    A new buffer starts whenever the next tensor would pass the type's max size (a tensor larger
    than the max size gets a buffer of its own); several buffers come back as a MultiBuffer.
    Returns None when there is nothing to allocate. On failure nothing stays allocated.
    """
    buft = _buft_of(target)
    ranges = [r for r in _ranges(ctx, buft) if r[2] > 0]
    if not ranges:
        _init_views(ctx.tensors)
        return None
    buffers: list[Buffer] = []
    placed: list[Tensor] = []
    try:
        for first, last, size in ranges:
            buf = buft.alloc_buffer(size)
            buffers.append(buf)
            talloc = TensorAllocator(buf)
            for t in ctx.tensors[first:last]:
                if t.buffer is None and t.view_src is None:
                    talloc.alloc(t)
                    placed.append(t)
                elif t.buffer is None and t.view_src is not None and t.view_src.buffer is not None:
                    view_init(t)
                    placed.append(t)
        _init_views(ctx.tensors)
    except Exception:
        for t in placed:
            t.buffer, t.offset = None, 0
        for b in buffers:
            b.close()
        raise
    return buffers[0] if len(buffers) == 1 else MultiBuffer(buffers)


def _init_views(tensors: list[Tensor]) -> None:
    for t in tensors:
        if t.buffer is None and t.view_src is not None and t.view_src.buffer is not None:
            view_init(t)
