"""polydev.models.gguf against the gguf package (writer and reader), and on corrupt files."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from polydev.errors import ClosedError, GGUFError  # noqa: E402
from polydev.models.gguf import GGUFFile, StringArray  # noqa: E402
from polydev.types import GGMLType  # noqa: E402

from model_files import GEMMA3, SMOLLM2, model_path  # noqa: E402

RNG = np.random.default_rng(0)


def write_small(path: Path, alignment: int | None = None) -> Path:
    """A small GGUF file with every kind of value and three tensor types."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_float32("test.f32", 0.5)
    w.add_bool("test.bool", True)
    w.add_int64("test.i64", -(2**40))
    w.add_string("test.str", "héllo")
    w.add_array("test.strings", ["a", "", "ünï", "<s>"])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.floats", [0.25, -1.5])
    w.add_tensor("a.weight", RNG.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("b.weight", RNG.standard_normal((2, 32)).astype(np.float16))
    q8 = gguf.quants.quantize(RNG.standard_normal((4, 64)).astype(np.float32), GGMLType.Q8_0)
    w.add_tensor("c.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def small(tmp_path) -> Path:
    return write_small(tmp_path / "small.gguf")


def reader_value(field) -> object:
    return field.contents()


def assert_same_as_reader(path: Path) -> None:
    """Every key and tensor equals what gguf.GGUFReader reads."""
    ref = gguf.GGUFReader(str(path))
    with GGUFFile(path) as f:
        keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert list(f.metadata) == keys
        for key in keys:
            want, got = reader_value(ref.fields[key]), f.metadata[key]
            if isinstance(got, StringArray):
                assert got.tolist() == want, key
            elif isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, np.asarray(want), err_msg=key)
            else:
                assert got == pytest.approx(want), key
        assert f.alignment == ref.alignment and f.data_offset == ref.data_offset
        assert list(f.tensors) == [t.name for t in ref.tensors]
        for t in ref.tensors:
            info = f.tensors[t.name]
            assert (info.type, info.ne, info.offset, info.nbytes) == (
                GGMLType(t.tensor_type), tuple(int(n) for n in t.shape), t.data_offset, t.n_bytes)
            raw = np.asarray(t.data).reshape(-1).view(np.uint8)
            assert np.array_equal(f.tensor_data(info), raw)


def test_constants_are_the_gguf_packages():
    """polydev's own copies of the two enums equal the gguf package's, name for value."""
    from polydev.models.gguf import GGUFValueType, TokenType

    for ours, theirs in ((GGUFValueType, gguf.GGUFValueType), (TokenType, gguf.TokenType)):
        assert {m.name: m.value for m in ours} == {m.name: m.value for m in theirs}


def test_the_model_layer_runs_without_importing_the_gguf_package():
    import subprocess
    import sys

    code = ("import sys, polydev.models; from polydev.models import load, Tokenizer; "
            "sys.exit('gguf' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_reads_what_the_gguf_writer_wrote(small):
    assert_same_as_reader(small)
    with GGUFFile(small) as f:
        assert f.version == 3 and f.metadata["test.str"] == "héllo"
        assert f.metadata["test.i64"] == -(2**40) and f.metadata["test.bool"] is True
        strings = f.metadata["test.strings"]
        assert isinstance(strings, StringArray) and len(strings) == 4
        assert strings[2] == "ünï" and strings.raw(2) == "ünï".encode()
        assert f.value_type("test.ints") == gguf.GGUFValueType.ARRAY
        assert f.array_type("test.ints") == gguf.GGUFValueType.INT32


@pytest.mark.parametrize("alignment", [64, 256])
def test_general_alignment(tmp_path, alignment):
    path = write_small(tmp_path / "a.gguf", alignment)
    assert_same_as_reader(path)
    with GGUFFile(path) as f:
        assert f.alignment == alignment and f.data_offset % alignment == 0
        assert all((t.offset - f.data_offset) % alignment == 0 for t in f.tensors.values())


def test_version_2_reads_like_3(small):
    data = bytearray(small.read_bytes())
    struct.pack_into("<I", data, 4, 2)
    small.write_bytes(bytes(data))
    with GGUFFile(small) as f:
        assert f.version == 2 and f.metadata["test.str"] == "héllo"


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_real_models_match_the_gguf_reader(name):
    assert_same_as_reader(model_path(name))


def test_tensor_data_is_a_view_of_the_mapping(small):
    with GGUFFile(small) as f:
        whole = np.frombuffer(f.mapping, dtype=np.uint8)
        base = whole.ctypes.data
        for info in f.tensors.values():
            data = f.tensor_data(info)
            assert not data.flags.writeable
            assert data.ctypes.data == base + info.offset
            del data
        del whole
    with pytest.raises(ClosedError):
        f.tensor_data("a.weight")


# --- corrupt files -----------------------------------------------------------------------

def patched(path: Path, offset: int, fmt: str, value) -> Path:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))
    return path


def first_tensor_type_offset(path: Path) -> int:
    """Byte offset of the first tensor entry's type field."""
    with GGUFFile(path) as f:
        name = next(iter(f.tensors))
        n_dims = len(f.tensors[name].ne)
        raw = path.read_bytes()
    entry = raw.index(struct.pack("<Q", len(name)) + name.encode(), f.metadata_end)
    return entry + 8 + len(name) + 4 + 8 * n_dims


@pytest.mark.parametrize("offset, fmt, value, message", [
    (0, "<4s", b"GGML", "not a GGUF file"),
    (4, "<I", 1, "unsupported GGUF version 1"),
    (4, "<I", 3 << 24, "big-endian"),
    (8, "<Q", 2**62, "cannot fit"),
    (16, "<Q", 2**40, "cannot fit"),
    (24, "<Q", 2**63, "claims"),                  # the first key's length
])
def test_corrupt_header_fields(small, offset, fmt, value, message):
    with pytest.raises(GGUFError, match=message) as e:
        GGUFFile(patched(small, offset, fmt, value))
    assert str(small) in str(e.value) and "offset" in str(e.value)


def test_unknown_tensor_type_names_the_tensor(small):
    patched(small, first_tensor_type_offset(small), "<I", 99)
    with pytest.raises(GGUFError, match=r"tensor 'a.weight' has unknown ggml type 99"):
        GGUFFile(small)


def test_tensor_offsets_must_follow_each_other(small):
    """ggml's rule: the first tensor at data offset 0, each next one after the previous,
    padded to the alignment; anything else (overlaps, gaps) is refused."""
    at = first_tensor_type_offset(small) + 4
    with pytest.raises(GGUFError, match=r"tensor 'a.weight' has data offset 32, expected 0"):
        GGUFFile(patched(small, at, "<Q", 32))


def test_an_empty_key_is_refused(small):
    raw = small.read_bytes()
    at = raw.index(struct.pack("<Q", len("test.f32")) + b"test.f32")
    with pytest.raises(GGUFError, match="empty name"):
        GGUFFile(patched(small, at, "<Q", 0))


def test_a_tensor_name_of_64_bytes_is_refused(tmp_path):
    path = tmp_path / "long.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tensor("x" * 64, np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="64 bytes long"):
        GGUFFile(path)


def test_array_length_past_the_end_is_refused_before_allocating(small):
    raw = small.read_bytes()
    key = b"test.strings"
    at = raw.index(key) + len(key) + 4 + 4          # value type, element type, then length
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match=r"array 'test.strings' claims 1152921504606846976"):
            GGUFFile(patched(small, at, "<Q", 2**60))
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("what", ["empty", "directory", "missing"])
def test_files_that_are_not_there(tmp_path, what):
    path = tmp_path / "x.gguf"
    if what == "empty":
        path.write_bytes(b"")
    elif what == "directory":
        path.mkdir()
    with pytest.raises(GGUFError, match=str(path)):
        GGUFFile(path)


def test_every_truncation_of_the_header_raises(small):
    raw = small.read_bytes()
    with GGUFFile(small) as f:
        end = f.data_offset
        last_tensor_end = max(t.offset + t.nbytes for t in f.tensors.values())
    cut = small.with_name("cut.gguf")
    for n in list(range(1, end)) + [last_tensor_end - 1]:
        cut.write_bytes(raw[:n])
        with pytest.raises(GGUFError):
            GGUFFile(cut)


# deadline: a hang guard (a minute per example), not a speed limit a loaded machine must keep
@settings(max_examples=300, deadline=60_000,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_files_open_or_raise_gguf_error(tmp_path_factory, data):
    """Flip bytes, write huge lengths, cut the file: reading gives a GGUFError or a file whose
    every value and tensor can be read; never another exception, a hang or a big allocation."""
    path = write_small(tmp_path_factory.mktemp("m") / "m.gguf")
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["byte", "u64", "u32"]))
        if kind == "byte":
            raw[at] = data.draw(st.integers(0, 255))
        else:
            size = 8 if kind == "u64" else 4
            value = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            raw[at:at + size] = (value % 2 ** (8 * size)).to_bytes(size, "little")
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    path.write_bytes(bytes(raw))
    tracemalloc.start()
    try:
        try:
            f = GGUFFile(path)
        except GGUFError:
            return
        with f:
            for value in f.metadata.values():
                if isinstance(value, StringArray):
                    value.tolist()
            for info in f.tensors.values():
                assert f.tensor_data(info).size == info.nbytes
        assert tracemalloc.get_traced_memory()[1] < 64 * len(raw) + (1 << 20)
    finally:
        tracemalloc.stop()
