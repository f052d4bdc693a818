"""Address arithmetic for the graph allocator: best-fit free blocks over up to 16 chunks.

This is ggml's ``ggml_dyn_tallocr``. It places byte ranges, not tensors, and allocates no
memory: an address is ``(chunk, offset)`` and each chunk remembers its high-water mark, which is
the size its backend buffer will get. The graph allocator runs a graph's execution through it to
learn where every tensor goes and how large each chunk must be.

Each chunk keeps its free blocks sorted by offset; the last one is the open-ended *tail*. An
allocation takes, in order of preference:

1. the best-fitting block that is not a tail (the smallest one that is large enough; ties go to
   the later block, as in ggml);
2. a tail, preferring one where the allocation ends under the chunk's high-water mark (memory
   that will be reserved anyway) with the least left over, else the one that grows its chunk
   least;
3. a new chunk. A chunk offers ``max_chunk_size`` bytes, or more when a single allocation is
   larger; the 16th chunk is unbounded, so allocation never fails here and an oversize request
   fails, if at all, when the backend allocates the buffer.

Unlike ggml there is no limit on the number of free blocks per chunk.
"""

from __future__ import annotations

from bisect import bisect_left

MAX_CHUNKS = 16
UNBOUNDED = 1 << 62   # ggml's SIZE_MAX / 2: a chunk size that never limits


def align_up(size: int, alignment: int) -> int:
    return (size + alignment - 1) // alignment * alignment


class _Chunk:
    """One chunk's free blocks (parallel lists sorted by offset) and high-water mark."""

    __slots__ = ("max_size", "offsets", "sizes")

    def __init__(self, size: int) -> None:
        self.offsets = [0]
        self.sizes = [size]
        self.max_size = 0

    def take(self, block: int, size: int) -> int:
        """Carve ``size`` bytes from the front of free block ``block``; return their offset."""
        offset = self.offsets[block]
        if self.sizes[block] == size:
            del self.offsets[block], self.sizes[block]
        else:
            self.offsets[block] += size
            self.sizes[block] -= size
        self.max_size = max(self.max_size, offset + size)
        return offset

    def give_back(self, offset: int, size: int) -> None:
        """Return [offset, offset+size) to the free list, merging it with adjacent blocks."""
        offsets, sizes = self.offsets, self.sizes
        i = bisect_left(offsets, offset)     # blocks before i start before the freed range
        merges_prev = i > 0 and offsets[i - 1] + sizes[i - 1] == offset
        merges_next = i < len(offsets) and offset + size == offsets[i]
        if merges_prev and merges_next:
            sizes[i - 1] += size + sizes[i]
            del offsets[i], sizes[i]
        elif merges_prev:
            sizes[i - 1] += size
        elif merges_next:
            offsets[i] = offset
            sizes[i] += size
        else:
            offsets.insert(i, offset)
            sizes.insert(i, size)


class ChunkAllocator:
    """Best-fit placement of byte ranges in up to ``MAX_CHUNKS`` chunks (see the module doc).

    ``alignment`` rounds every size up; ``max_chunk_size`` is the buffer type's max size.
    """

    def __init__(self, alignment: int, max_chunk_size: int) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.max_chunk_size = min(max_chunk_size, UNBOUNDED)
        self._chunks: list[_Chunk] = []

    def reset(self) -> None:
        """Forget every allocation and chunk."""
        self._chunks.clear()

    @property
    def n_chunks(self) -> int:
        return len(self._chunks)

    @property
    def chunk_sizes(self) -> list[int]:
        """Each chunk's high-water mark: the size its buffer needs."""
        return [c.max_size for c in self._chunks]

    def alloc(self, size: int) -> tuple[int, int]:
        """Place ``size`` bytes (rounded up to the alignment); return ``(chunk, offset)``."""
        size = align_up(size, self.alignment)
        chunk, block = self._best_inner_block(size)
        if chunk < 0:
            chunk, block = self._best_tail(size)
        if chunk < 0:
            chunk, block = self._new_chunk(size), 0
        return chunk, self._chunks[chunk].take(block, size)

    def free(self, chunk: int, offset: int, size: int) -> None:
        """Give back what ``alloc(size)`` returned as ``(chunk, offset)``, or its tail part."""
        self._chunks[chunk].give_back(offset, align_up(size, self.alignment))

    def _best_inner_block(self, size: int) -> tuple[int, int]:
        best = (-1, -1)
        best_size = UNBOUNDED * 2
        for c, chunk in enumerate(self._chunks):
            sizes = chunk.sizes
            for i in range(len(sizes) - 1):
                if size <= sizes[i] <= best_size:
                    best, best_size = (c, i), sizes[i]
        return best

    def _best_tail(self, size: int) -> tuple[int, int]:
        best = (-1, -1)
        best_reuse = None
        for c, chunk in enumerate(self._chunks):
            if not chunk.sizes or chunk.sizes[-1] < size:
                continue
            # >= 0: fits under the high-water mark with `reuse` bytes to spare; < 0: must grow
            reuse = chunk.max_size - chunk.offsets[-1] - size
            if (best_reuse is None or (best_reuse < 0 and reuse > best_reuse) or
                    (0 <= reuse < best_reuse)):
                best, best_reuse = (c, len(chunk.sizes) - 1), reuse
        return best

    def _new_chunk(self, size: int) -> int:
        if len(self._chunks) >= MAX_CHUNKS:   # unreachable: the last chunk is unbounded
            raise AssertionError("graph allocator: out of chunks")
        last = len(self._chunks) == MAX_CHUNKS - 1
        self._chunks.append(_Chunk(UNBOUNDED if last else max(size, self.max_chunk_size)))
        return len(self._chunks) - 1
