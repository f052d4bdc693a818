"""Reading ``POLYDEV_*`` environment variables: a bad value is an error that names the variable.

A typo in a variable must never make a device disappear or fall back silently, so every
number polydev reads from the environment goes through these functions, at the moment it is
first needed (not at import or discovery), and a value that does not parse raises
``ConfigError`` saying which variable, what it holds and what it should hold. README.md has
the table of every variable.
"""

from __future__ import annotations

import os

from .errors import ConfigError

__all__ = ["env_int", "env_float", "env_text"]


def env_text(name: str) -> str | None:
    """The variable's value with surrounding blanks removed, or None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


def env_int(name: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """An integer variable (``default`` when unset or empty) within [minimum, maximum]."""
    text = env_text(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        expected = _range(minimum, maximum)
        raise ConfigError(f"{name}={text!r} is not an integer{expected}") from None
    _check_range(name, text, value, minimum, maximum)
    return value


def env_float(name: str, default: float, minimum: float | None = None) -> float:
    """A finite number variable (``default`` when unset or empty), at least ``minimum``."""
    text = env_text(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number{_range(minimum, None)}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={text!r} is not a finite number")
    _check_range(name, text, value, minimum, None)
    return value


def _range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" (expected {minimum} to {maximum})"
    if minimum is not None:
        return f" (expected {minimum} or more)"
    return ""


def _check_range(name: str, text: str, value, minimum, maximum) -> None:
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(f"{name}={text!r} is out of range{_range(minimum, maximum)}")
