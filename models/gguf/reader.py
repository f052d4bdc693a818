"""The GGUF file format, read over ``mmap``: header, metadata and tensor table; nothing else.

Opening a file parses the header and indexes every key and tensor without copying any tensor
data and without decoding string arrays (a 262,144-entry vocabulary is indexed, not decoded):
``GGUFFile.tensor_data(name)`` is a read-only view into the mapping and ``metadata[key]`` of a
string array is a ``StringArray`` that decodes an entry when it is read.

Every length and count read from the file is checked against the bytes that remain before it
is used, so a corrupt file raises ``GGUFError`` naming the file, what is wrong and the byte
offset, never a crash, a hang or a huge allocation. The checks are ggml's (``gguf.cpp``), so
a file polydev opens is one llama.cpp opens: version 2 or 3, a power-of-two
``general.alignment``, non-empty unique keys, unique tensor names under 64 bytes, at most 4
dimensions, whole blocks per row, tensors stored in order each padded to the alignment (no
two overlap), and every byte inside the file.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from polydev.errors import GGUFError
from polydev.lifetime import Resource
from polydev.types import TYPE_TRAITS, GGMLType

from .constants import GGUFValueType

__all__ = ["GGUFFile", "GGUFTensorInfo", "StringArray", "GGUF_MAGIC", "DEFAULT_ALIGNMENT"]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32          # GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_NAME = 64                   # GGML_MAX_NAME, terminating zero included
SUPPORTED_VERSIONS = (2, 3)     # version 1 used 32-bit counts and is long gone

# Fixed-size value types: (struct code, numpy dtype) of one little-endian element.
_SCALARS: dict[GGUFValueType, tuple[str, np.dtype]] = {
    GGUFValueType.UINT8: ("<B", np.dtype("<u1")),
    GGUFValueType.INT8: ("<b", np.dtype("<i1")),
    GGUFValueType.UINT16: ("<H", np.dtype("<u2")),
    GGUFValueType.INT16: ("<h", np.dtype("<i2")),
    GGUFValueType.UINT32: ("<I", np.dtype("<u4")),
    GGUFValueType.INT32: ("<i", np.dtype("<i4")),
    GGUFValueType.FLOAT32: ("<f", np.dtype("<f4")),
    GGUFValueType.BOOL: ("<?", np.dtype("?")),
    GGUFValueType.UINT64: ("<Q", np.dtype("<u8")),
    GGUFValueType.INT64: ("<q", np.dtype("<i8")),
    GGUFValueType.FLOAT64: ("<d", np.dtype("<f8")),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table. ``ne`` is in ggml order (ne0 contiguous); ``offset`` is
    the absolute file offset of the data."""

    name: str
    type: GGMLType
    ne: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        """How many elements the tensor holds."""
        return int(np.prod(self.ne, dtype=np.int64)) if self.ne else 1


class StringArray:
    """A GGUF array of strings, indexed at open and decoded entry by entry when read."""

    def __init__(self, data: memoryview, starts: array, lengths: array) -> None:
        self._data = data
        self._starts = starts
        self._lengths = lengths

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> str:
        return self.raw(i).decode("utf-8", errors="replace")

    def raw(self, i: int) -> bytes:
        """Entry ``i`` as the file's bytes (GGUF strings are UTF-8 but not checked)."""
        start = self._starts[i]
        return bytes(self._data[start:start + self._lengths[i]])

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def tolist(self) -> list[str]:
        """Every entry, decoded."""
        return list(self)

    def joined(self) -> tuple[bytes, np.ndarray]:
        """Every entry's bytes, one after another, and where each ends (int64, a leading 0):
        entry ``i`` is ``blob[ends[i]:ends[i + 1]]``. One copy, without a loop over entries:
        they lie in the file one after another, each after its 8-byte length."""
        lengths = np.frombuffer(self._lengths, np.int64)
        ends = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=ends[1:])
        if not len(lengths):
            return b"", ends
        starts = np.frombuffer(self._starts, np.int64)
        first = int(starts[0])
        region = np.frombuffer(self._data, np.uint8, count=int(starts[-1] + lengths[-1]) - first,
                               offset=first)
        keep = np.ones(len(region), bool)
        keep[((starts[1:] - 8 - first)[:, None] + np.arange(8)).ravel()] = False
        return region[keep].tobytes(), ends

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


class _Cursor:
    """Reads little-endian values from the mapping, refusing to read past its end."""

    def __init__(self, data: memoryview, path: str) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.path = path

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (at byte offset {self.pos if at is None else at})")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"truncated file: {what} needs {n} bytes, "
                            f"{max(self.size - self.pos, 0)} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return v

    def raw_string(self, what: str) -> tuple[int, int]:
        """(start, length) of a string; its length is checked against the file first."""
        at = self.pos
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what} claims {n} bytes but only {self.size - self.pos} remain", at)
        start = self.pos
        self.pos += n
        return start, n

    def string(self, what: str) -> str:
        at = self.pos
        start, n = self.raw_string(what)
        try:
            return bytes(self.data[start:start + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason})", at) from None

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        t = self.u32(what)
        try:
            return GGUFValueType(t)
        except ValueError:
            raise self.fail(f"{what} has unknown value type {t}", at) from None


class GGUFFile(Resource):
    """A GGUF file opened over a read-only memory map.

    ``metadata`` maps keys to Python scalars, numpy arrays (numeric arrays, zero-copy) or
    ``StringArray``; ``tensors`` maps names to ``GGUFTensorInfo`` in file order.
    ``close()`` (or ``with``) unmaps the file once no view of it is alive.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._mmap = _map_file(self.path)
        self._data = memoryview(self._mmap)
        try:
            self._parse()
        except BaseException:
            self._free()
            raise

    # --- public API -----------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        return len(self._data)

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value of ``key``, or ``default``."""
        return self.metadata.get(key, default)

    def value_type(self, key: str) -> GGUFValueType:
        """The GGUF type of ``key``'s value (ARRAY for arrays)."""
        return self._types[key][0]

    def array_type(self, key: str) -> GGUFValueType | None:
        """The element type of ``key``'s value when it is an array, else None."""
        return self._types[key][1]

    def tensor_data(self, name: str | GGUFTensorInfo) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view into the mapping (no copy)."""
        self._check_open()
        info = name if isinstance(name, GGUFTensorInfo) else self.tensor(name)
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def header_bytes(self) -> memoryview:
        """The header and metadata bytes (what a cache of derived metadata keys on)."""
        self._check_open()
        return self._data[:self.metadata_end]

    def tensor(self, name: str) -> GGUFTensorInfo:
        """The tensor table entry of ``name``."""
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None

    @property
    def mapping(self) -> mmap.mmap:
        """The whole file's read-only mapping (what zero-copy buffers wrap)."""
        self._check_open()
        return self._mmap

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, "
                f"{len(self.metadata)} keys, {len(self.tensors)} tensors)")

    def _describe(self) -> str:
        return f"GGUF file {self.path}"

    def _free(self) -> None:
        self._data.release()
        try:
            self._mmap.close()
        except BufferError:
            # Views of the data are still alive (a user kept a tensor's bytes): the mapping
            # goes away with the last of them.
            pass

    # --- parsing --------------------------------------------------------------------------

    def _parse(self) -> None:
        cur = _Cursor(self._data, self.path)
        cur.need(4, "the magic")
        magic = bytes(self._data[:4])
        if magic != GGUF_MAGIC:
            raise cur.fail(f"not a GGUF file: the magic is {magic!r}, not {GGUF_MAGIC!r}", 0)
        cur.pos = 4
        self.version = cur.u32("the version")
        if self.version not in SUPPORTED_VERSIONS:
            if int.from_bytes(self.version.to_bytes(4, "little"), "big") in SUPPORTED_VERSIONS:
                raise cur.fail("big-endian GGUF files are not supported", 4)
            raise cur.fail(f"unsupported GGUF version {self.version} (polydev reads 2 and 3)", 4)
        n_tensors = cur.u64("the tensor count")
        n_kv = cur.u64("the key/value count")
        # Each key/value needs at least 12 bytes and each tensor entry 24: bound the counts
        # by the file before looping over them.
        remain = cur.size - cur.pos
        if n_kv > remain // 12 or n_tensors > remain // 24:
            raise cur.fail(f"{n_kv} keys and {n_tensors} tensors cannot fit in the "
                           f"{remain} bytes that remain", 8)
        self.metadata: dict[str, Any] = {}
        self._types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for i in range(n_kv):
            self._read_kv(cur, i)
        self.metadata_end = cur.pos     # header and metadata are bytes [0, metadata_end)
        self.alignment = self._alignment(cur)
        infos = [self._read_tensor_info(cur, i) for i in range(n_tensors)]
        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, GGUFTensorInfo] = {}
        expected = 0        # ggml requires the tensors in order, each padded to the alignment
        for name, type_, ne, rel, at in infos:
            info = self._place_tensor(cur, name, type_, ne, rel, at)
            if rel != expected:
                raise cur.fail(f"tensor {name!r} has data offset {rel}, expected {expected} "
                               "(tensors follow each other, padded to the alignment)", at)
            expected += -(-info.nbytes // self.alignment) * self.alignment
            self.tensors[name] = info

    def _read_kv(self, cur: _Cursor, i: int) -> None:
        at = cur.pos
        key = cur.string(f"the name of key #{i}")
        if not key:
            raise cur.fail(f"key #{i} has an empty name", at)
        if key in self.metadata:
            raise cur.fail(f"duplicate key {key!r}", at)
        vtype = cur.value_type(f"the type of key {key!r}")
        if vtype == GGUFValueType.ARRAY:
            etype = cur.value_type(f"the element type of key {key!r}")
            self.metadata[key] = self._read_array(cur, key, etype)
            self._types[key] = (vtype, etype)
        else:
            self.metadata[key] = self._read_scalar(cur, key, vtype)
            self._types[key] = (vtype, None)

    def _read_scalar(self, cur: _Cursor, key: str, vtype: GGUFValueType) -> Any:
        if vtype == GGUFValueType.STRING:
            return cur.string(f"the value of key {key!r}")
        code, dtype = _SCALARS[vtype]
        cur.need(dtype.itemsize, f"the value of key {key!r}")
        value = struct.unpack_from(code, cur.data, cur.pos)[0]
        cur.pos += dtype.itemsize
        return value

    def _read_array(self, cur: _Cursor, key: str, etype: GGUFValueType) -> Any:
        at = cur.pos
        n = cur.u64(f"the length of array {key!r}")
        remain = cur.size - cur.pos
        if etype == GGUFValueType.ARRAY:
            raise cur.fail(f"array {key!r} holds arrays, which polydev does not read", at)
        if etype == GGUFValueType.STRING:
            if n > remain // 8:
                raise cur.fail(f"array {key!r} claims {n} strings but only {remain} bytes "
                               "remain", at)
            return self._index_strings(cur, key, n)
        dtype = _SCALARS[etype][1]
        if n > remain // dtype.itemsize:
            raise cur.fail(f"array {key!r} claims {n} {etype.name} values "
                           f"({n * dtype.itemsize} bytes) but only {remain} bytes remain", at)
        values = np.frombuffer(self._mmap, dtype=dtype, count=n, offset=cur.pos)
        cur.pos += n * dtype.itemsize
        return values

    def _index_strings(self, cur: _Cursor, key: str, n: int) -> StringArray:
        # One pass over the lengths; this loop is the whole cost of opening a file with a
        # large vocabulary (about 30 ns per entry), and nothing is decoded.
        starts, lengths = array("q", bytes(8 * n)), array("q", bytes(8 * n))
        data, size, pos = cur.data, cur.size, cur.pos
        unpack = _U64.unpack_from
        for j in range(n):
            if pos + 8 > size:
                cur.pos = pos
                raise cur.fail(f"truncated file: string #{j} of array {key!r} has no length")
            length = unpack(data, pos)[0]
            pos += 8
            if length > size - pos:
                raise cur.fail(f"string #{j} of array {key!r} claims {length} bytes but only "
                               f"{size - pos} remain", pos - 8)
            starts[j], lengths[j] = pos, length
            pos += length
        cur.pos = pos
        return StringArray(self._data, starts, lengths)

    def _alignment(self, cur: _Cursor) -> int:
        key = "general.alignment"
        if key not in self.metadata:
            return DEFAULT_ALIGNMENT
        value = self.metadata[key]
        if self._types[key][0] != GGUFValueType.UINT32:
            raise cur.fail(f"{key} must be a UINT32, got {self._types[key][0].name}", 0)
        if value == 0 or value & (value - 1):
            raise cur.fail(f"{key} is {value}, not a power of two", 0)
        return value

    def _read_tensor_info(self, cur: _Cursor, i: int) -> tuple:
        at = cur.pos
        name = cur.string(f"the name of tensor #{i}")
        if len(name.encode()) >= MAX_NAME:
            raise cur.fail(f"tensor #{i}'s name is {len(name.encode())} bytes long (ggml allows "
                           f"{MAX_NAME - 1})", at)
        n_dims = cur.u32(f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})", at)
        ne = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
        type_at = cur.pos
        type_id = cur.u32(f"the type of tensor {name!r}")
        try:
            type_ = GGMLType(type_id)
        except ValueError:
            raise cur.fail(f"tensor {name!r} has unknown ggml type {type_id}", type_at) from None
        rel = cur.u64(f"the data offset of tensor {name!r}")
        return name, type_, ne, rel, at

    def _place_tensor(self, cur: _Cursor, name: str, type_: GGMLType, ne: tuple[int, ...],
                      rel: int, at: int) -> GGUFTensorInfo:
        if name in self.tensors:
            raise cur.fail(f"duplicate tensor name {name!r}", at)
        traits = TYPE_TRAITS[type_]
        if any(n >= 2**63 for n in ne):
            raise cur.fail(f"tensor {name!r} has a dimension past INT64_MAX: {list(ne)}", at)
        n_elements = int(np.prod([int(n) for n in ne], dtype=object)) if ne else 1
        if ne and ne[0] % traits.block_size:
            raise cur.fail(f"tensor {name!r} ({traits.name}) has ne0={ne[0]}, not a multiple of "
                           f"its block size {traits.block_size}", at)
        nbytes = n_elements // traits.block_size * traits.type_size
        start = self.data_offset + rel
        if start + nbytes > cur.size:
            raise cur.fail(f"tensor {name!r} needs bytes {start}..{start + nbytes} but the file "
                           f"ends at {cur.size}", at)
        return GGUFTensorInfo(name, type_, ne, start, nbytes)


def _map_file(path: str) -> mmap.mmap:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise GGUFError(f"{path}: the file is empty (at byte offset 0)")
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except IsADirectoryError:
        raise GGUFError(f"{path}: is a directory, not a GGUF file") from None
    except FileNotFoundError:
        raise GGUFError(f"{path}: no such file") from None
    except PermissionError:
        raise GGUFError(f"{path}: permission denied") from None

