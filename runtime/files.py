"""Writing a file so that readers see the old one or the whole new one, never half of it.

Every file polydev derives once and reuses (built kernels, probe answers, the assembled
default model) is written to a temporary file beside its target and renamed onto it: a rename
within a folder is atomic, so another process reading the target meanwhile, or a run killed
halfway, never leaves a partial file under the target's name.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["replacing", "write_atomic"]

_UMASK = os.umask(0o022)        # read once (the only way to read it is to set it), then put back
os.umask(_UMASK)


@contextmanager
def replacing(path: Path, suffix: str = "") -> Iterator[Path]:
    """A new empty temporary file beside ``path`` for the block to write (or to have a
    compiler or another writer replace); renamed onto ``path`` when the block ends, removed
    when it raises. ``suffix`` ends the temporary name, for writers that go by it (a compiler
    choosing what to make by the output's extension)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    os.chmod(tmp, 0o666 & ~_UMASK)      # a plain new file's mode, not mkstemp's owner-only one
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)    # still there where the block or the rename raised


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through ``replacing``."""
    with replacing(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
