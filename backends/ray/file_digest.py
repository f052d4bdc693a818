"""Whether a node's copy of a model file holds the driver's bytes, without sending them.

A remote device reads a weight from its own node's copy of the model file when that copy is
the driver's: first the file is recognised once (its size and a digest of its first MiB,
where a GGUF keeps its metadata and tensor table), then every weight read there is checked
against the digest of the driver's bytes of that weight. The driver hashes the next weight
while the node reads and checks the one before, and neither waits for the other; a weight
whose bytes differ there is an error of the load, never other weights.

The digest is CRC-32 with the length: it finds another file's bytes (another model, another
version of it, a damaged copy) but no forger, and none is needed: whoever can change a node's
file runs that node. At 6.5 GB/s it hashes a 1B-class model in 50 ms on each side, where
blake2b (1.3 GB/s) took a third of the load.
"""

from __future__ import annotations

import os
import zlib

__all__ = ["bytes_digest", "file_signature"]

HEAD_BYTES = 1 << 20


def bytes_digest(data) -> str:
    """The digest of ``data`` (bytes or a numpy array): its length and CRC-32."""
    view = memoryview(data).cast("B")
    return f"{len(view)}:{zlib.crc32(view):08x}"


def file_signature(path: str) -> tuple[int, str] | None:
    """(size, digest of the first MiB) of the file at ``path``; None where it cannot be
    read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return size, bytes_digest(f.read(HEAD_BYTES))
    except OSError:
        return None
