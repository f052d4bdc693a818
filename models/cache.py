"""Where polydev keeps what it derives once and reuses: built tokenizers, the default model."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

from polydev.env import env_text

__all__ = ["cache_dir", "write_atomic"]

log = logging.getLogger(__name__)


def cache_dir(kind: str) -> Path:
    """``$POLYDEV_CACHE_DIR/<kind>`` (default ``$XDG_CACHE_HOME/polydev``, else
    ``~/.cache/polydev``), created if missing."""
    root = env_text("POLYDEV_CACHE_DIR")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        root = os.path.join(xdg, "polydev")
    path = Path(root) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


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
