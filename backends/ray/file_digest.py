"""Whether a node's copy of a model file holds the driver's bytes, without sending them.

A remote device reads a weight from its own node's copy of the model file when that copy is
the driver's: first the file is recognised once (its size and a digest of its first MiB,
where a GGUF keeps its metadata and tensor table), then every weight read there is checked
against the digest (blake2b) of the driver's bytes of that weight. The driver hashes the next
weight while the node reads and checks the one before, and neither waits for the other; a
weight whose bytes differ there is an error of the load, never other weights.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["bytes_digest", "file_signature"]

HEAD_BYTES = 1 << 20


def bytes_digest(data) -> str:
    """The blake2b digest of ``data`` (bytes or a numpy array)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def file_signature(path: str) -> tuple[int, str] | None:
    """(size, digest of the first MiB) of the file at ``path``; None where it cannot be
    read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return size, bytes_digest(f.read(HEAD_BYTES))
    except OSError:
        return None
