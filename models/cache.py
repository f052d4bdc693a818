"""Where polydev keeps what it derives once and reuses: the default model."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from polydev.env import cache_dir

__all__ = ["cache_dir", "write_atomic"]

log = logging.getLogger(__name__)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
