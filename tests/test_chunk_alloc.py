"""The graph allocator's address arithmetic: best fit, tails, chunks and merging."""

from __future__ import annotations

import pytest
from polydev.chunk_alloc import MAX_CHUNKS, ChunkAllocator


def test_sizes_are_rounded_to_the_alignment():
    a = ChunkAllocator(16, 1024)
    assert a.alloc(1) == (0, 0)
    assert a.alloc(17) == (0, 16)
    assert a.chunk_sizes == [48]


def test_best_fit_takes_the_smallest_hole_and_the_later_of_equals():
    a = ChunkAllocator(1, 1000)
    addrs = [a.alloc(n) for n in (30, 1, 10, 1, 20, 1, 10, 1)]
    for i in (0, 2, 4, 6):                          # holes of 30, 10, 20, 10
        a.free(*addrs[i], (30, 1, 10, 1, 20, 1, 10, 1)[i])
    assert a.alloc(10) == addrs[6]                  # a 10-byte hole; the later one
    assert a.alloc(15) == addrs[4]                  # the 20-byte hole beats the 30-byte one
    assert a.chunk_sizes == [74]                    # no growth


def test_an_inner_hole_beats_the_tail():
    a = ChunkAllocator(4, 32)
    x0 = a.alloc(24)                                 # [24 used][8 free tail]
    assert a.alloc(4) == (0, 24)                     # [24][4][4 free]
    a.free(*x0, 24)                                  # [24 free][4][4 free]
    assert a.alloc(4) == (0, 0)
    assert a.chunk_sizes == [28]


def test_a_tail_under_the_high_water_mark_beats_growing_another_chunk():
    a = ChunkAllocator(8, 64)
    a.alloc(40)
    b = a.alloc(16)                                  # chunk 0 reaches 56
    a.alloc(40)                                      # chunk 1: [0, 40)
    a.free(*b, 16)                                   # chunk 0's tail starts at 40 again
    assert a.alloc(8) == (0, 40)                     # fits under chunk 0's 56
    assert a.chunk_sizes == [56, 40]
    assert a.alloc(16) == (0, 48)                    # both must grow: chunk 0 by less
    assert a.chunk_sizes == [64, 40]


def test_freed_neighbours_merge_in_any_order():
    for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2], [0, 2, 1], [1, 2, 0], [2, 0, 1]):
        a = ChunkAllocator(8, 1 << 20)
        addrs = [a.alloc(64) for _ in range(3)]
        guard = a.alloc(8)
        for i in order:
            a.free(*addrs[i], 64)
        assert a.alloc(192) == (0, 0), order         # one merged block
        assert guard == (0, 192)


def test_a_new_chunk_when_nothing_fits_and_an_oversize_one_when_needed():
    a = ChunkAllocator(8, 64)
    assert a.alloc(48) == (0, 0)
    assert a.alloc(32) == (1, 0)                     # 16 left in chunk 0 is too little
    assert a.alloc(100) == (2, 0)                    # larger than the max size: its own chunk
    assert a.alloc(16) == (0, 48)
    assert a.chunk_sizes == [64, 32, 104]


def test_the_last_chunk_is_unbounded():
    a = ChunkAllocator(8, 8)
    for i in range(MAX_CHUNKS):
        assert a.alloc(8) == (i, 0)
    assert a.alloc(8) == (MAX_CHUNKS - 1, 8)
    assert a.n_chunks == MAX_CHUNKS


def test_alignment_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        ChunkAllocator(24, 64)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:   # pragma: no cover
    st = None


@pytest.mark.skipif(st is None, reason="hypothesis is not installed")
def test_random_alloc_free_sequences_never_overlap_and_merge_back():
    @settings(max_examples=200, deadline=None)
    @given(steps=st.lists(st.tuples(st.booleans(), st.integers(1, 200), st.integers(0, 1000)),
                          max_size=80),
           max_chunk=st.sampled_from([64, 256, 1 << 30]))
    def run(steps, max_chunk):
        a = ChunkAllocator(8, max_chunk)
        live: list[tuple[int, int, int]] = []
        for is_alloc, size, pick in steps:
            if is_alloc or not live:
                chunk, offset = a.alloc(size)
                end = offset + (size + 7) // 8 * 8
                for c, o, e in live:
                    assert c != chunk or e <= offset or end <= o
                assert end <= a.chunk_sizes[chunk]
                live.append((chunk, offset, end))
            else:
                c, o, e = live.pop(pick % len(live))
                a.free(c, o, e - o)
        for c, o, e in live:
            a.free(c, o, e - o)
        for chunk in a._chunks:                       # everything merged back into the tail
            assert chunk.offsets == [0]
    run()
