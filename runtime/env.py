"""Reading ``POLYDEV_*`` environment variables: a bad value is an error that names the variable.

A typo in a variable must never make a device disappear or fall back silently, so every
number polydev reads from the environment goes through these functions, at the moment it is
first needed (not at import or discovery), and a value that does not parse raises
``ConfigError`` saying which variable, what it holds and what it should hold. README.md has
the table of every variable.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError

__all__ = ["cache_dir", "env_int", "env_float", "env_text"]


def env_text(name: str) -> str | None:
    """The variable's value with surrounding blanks removed, or None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


def env_int(name: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An integer variable (``default`` when unset or empty) within [minimum, maximum]."""
    return _env_number(name, default, int, "an integer", minimum, maximum)


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    """A finite number variable (``default`` when unset or empty), at least ``minimum``."""
    return _env_number(name, default, _finite_float, "a finite number", minimum, None)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not finite")
    return value


def _env_number(name: str, default, parse: Callable[[str], Any], kind: str, minimum, maximum):
    text = env_text(name)
    if text is None:
        return default
    expected = _range(minimum, maximum)
    try:
        value = parse(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not {kind}{expected}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(f"{name}={text!r} is out of range{expected}")
    return value


def _range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" (expected {minimum} to {maximum})"
    if minimum is not None:
        return f" (expected {minimum} or more)"
    return ""


def cache_dir(kind: str) -> Path:
    """``$POLYDEV_CACHE_DIR/<kind>`` (default ``$XDG_CACHE_HOME/polydev``, else
    ``~/.cache/polydev``), created if missing: where polydev keeps what it derives once."""
    root = env_text("POLYDEV_CACHE_DIR")
    if root is None:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        root = os.path.join(xdg, "polydev")
    path = Path(root) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path
