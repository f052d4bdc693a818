"""The CPU backend's weight cache making a copy that replaces a weight (backends/cpu/weights.py,
``WeightCache.replacement``): made a step of rows at a time, the model file's pages of each
step dropped as soon as it is copied, so the file's pages and the copy are not resident whole
at once; kept like any entry of the cache."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, tensor_alloc
from polydev.backends.cpu import weights
from polydev.backends.cpu.weights import WeightCache

from resident import mapping_resident_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="madvise and /proc/self/smaps are Linux's")

ROW_BYTES = mmap.PAGESIZE       # a row a page: a step's pages are its rows'
STEP_ROWS = 32


@pytest.fixture
def file_weight(tmp_path):
    """An I8 weight of 8 steps' rows in a buffer over a read-only file mapping (a model's
    weights as the loader maps them), its bytes, and the mapping's address."""
    n_rows = 8 * STEP_ROWS
    data = np.random.default_rng(0).integers(0, 256, n_rows * ROW_BYTES, dtype=np.uint8)
    (tmp_path / "weights").write_bytes(data.tobytes())
    with open(tmp_path / "weights", "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cpu = polydev.device("CPU")
    with cpu.buffer_from_host_ptr(mapping) as buf:
        w = Context().new_tensor_2d(GGMLType.I8, ROW_BYTES, n_rows, name="w")
        tensor_alloc(buf, w, 0)
        yield w, data, buf.host_array.ctypes.data


def test_each_step_of_a_replacement_drops_the_pages_it_copied(file_weight, monkeypatch):
    """Each step's rows are copied, then their pages dropped, before the next step; then the
    whole weight is marked replaced. (Which pages the OS maps around a read is its own
    choice, so the order of the calls is checked here, and test_buffers.py checks what a
    drop does to the pages.)"""
    w, data, address = file_weight
    monkeypatch.setattr(weights, "REPLACE_STEP_BYTES", STEP_ROWS * ROW_BYTES)
    buf, source, events = w.buffer, w.buffer.host_array, []
    for method in ("drop_pages", "replaced_by_copy"):
        def spy(offset, nbytes, call=getattr(buf, method), method=method):
            events.append((method, offset, nbytes))
            call(offset, nbytes)
        monkeypatch.setattr(buf, method, spy)

    def copy_rows(out: np.ndarray, r0: int, n: int) -> None:
        events.append(("copy_rows", r0, n))
        out[r0 * ROW_BYTES:(r0 + n) * ROW_BYTES] = source[r0 * ROW_BYTES:(r0 + n) * ROW_BYTES]

    cache = WeightCache(lambda: 1 << 30)
    get = cache.replacement(w, "copy", data.size, copy_rows)
    copy = get()
    step_bytes = STEP_ROWS * ROW_BYTES
    expected = [event for r0 in range(0, 8 * STEP_ROWS, STEP_ROWS)
                for event in (("copy_rows", r0, STEP_ROWS),
                              ("drop_pages", r0 * ROW_BYTES, step_bytes))]
    # (after these, the buffer's own drop of the whole range)
    assert events[:len(expected) + 1] == expected + [("replaced_by_copy", 0, data.size)]
    assert np.array_equal(copy, data)
    assert mapping_resident_bytes(address) == 0          # none of the file is held
    made = len(events)
    assert get() is copy and len(events) == made and cache.nbytes == data.size     # kept


def test_steps_are_whole_multiples_of_the_rows_asked(file_weight, monkeypatch):
    w, data, _ = file_weight
    monkeypatch.setattr(weights, "REPLACE_STEP_BYTES", 40 * ROW_BYTES)
    steps = []
    weights.copy_replacing(w, data.size, lambda out, r0, n: steps.append((r0, n)), 16)
    assert steps == [(0, 32), (32, 32), (64, 32), (96, 32), (128, 32), (160, 32), (192, 32),
                     (224, 32)]
