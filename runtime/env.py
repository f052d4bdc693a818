"""``POLYDEV_*`` environment variables: each declared once, checked at start, an error where used.

A typo in a variable must never make a device disappear or fall back silently. Every variable
polydev reads is declared in ``VARIABLES`` with its kind, default and accepted range (README.md
has the same table for people). ``check_environment`` runs when polydev is imported: a value
that does not parse, a number out of range or an unknown ``POLYDEV_*`` name is a warning that
names the variable and what it accepts, whether or not the code that reads it ever runs. Where
a value is used (``env_int``, ``env_float``) a bad one raises ``ConfigError``.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = ["VARIABLES", "Variable", "cache_dir", "check_environment", "env_float", "env_int",
           "env_text"]

log = logging.getLogger(__name__)

PREFIX = "POLYDEV_"


@dataclass(frozen=True)
class Variable:
    """One ``POLYDEV_*`` variable: ``kind`` is int, float (finite) or str; numbers have a
    default and an accepted range (None: unbounded, or a default the reader computes)."""

    name: str
    kind: type = str
    default: float | None = None
    minimum: float | None = None
    maximum: float | None = None

    def read(self) -> float | str | None:
        """The value (the default when unset or empty); ConfigError where it is bad."""
        text = env_text(self.name)
        if text is None or self.kind is str:
            return self.default if text is None else text
        try:
            value = self.kind(text)
            if not math.isfinite(value):
                raise ValueError(text)
        except ValueError:
            raise ConfigError(f"{self.name}={text!r} is not {self.accepts()}") from None
        if ((self.minimum is not None and value < self.minimum)
                or (self.maximum is not None and value > self.maximum)):
            raise ConfigError(f"{self.name}={text!r} is out of range: expected "
                              f"{self.accepts()}")
        return value

    def accepts(self) -> str:
        """The values it accepts, in words ("an integer from 0 to 2")."""
        kind = "an integer" if self.kind is int else "a finite number"
        if self.minimum is not None and self.maximum is not None:
            return f"{kind} from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"{kind} of {self.minimum} or more"
        return kind


VARIABLES: dict[str, Variable] = {v.name: v for v in (
    Variable("POLYDEV_SCHED_DEBUG", int, 0, 0, 2),
    Variable("POLYDEV_BACKENDS"),
    Variable("POLYDEV_CPU_WEIGHT_CACHE_MB", float, None, 0),   # default: half the RAM
    Variable("POLYDEV_CPU_NATIVE", int, 1, 0, 1),
    Variable("POLYDEV_CPU_KERNELS"),
    Variable("POLYDEV_OP_OFFLOAD_MIN_BATCH", int, 32, 0),
    Variable("POLYDEV_CUDA_GRAPHS", int, 1, 0, 1),
    Variable("POLYDEV_RAY_ADDRESS"),
    Variable("POLYDEV_RAY_TIMEOUT", float, 60.0, 0.001),
    Variable("POLYDEV_RAY_CPUS", int, 1, 0),
    Variable("POLYDEV_RAY_HEARTBEAT", float, 5.0, 0.05),
    Variable("POLYDEV_OPENCL_PLATFORM"),
    Variable("POLYDEV_OPENCL_DEVICE"),
    Variable("POLYDEV_CACHE_DIR"),
    Variable("POLYDEV_API_KEY"),
    # read by the tests only
    Variable("POLYDEV_REQUIRE_OPENCL"),
    Variable("POLYDEV_REQUIRE_MODELS"),
    Variable("POLYDEV_REQUIRE_RAY"),
    Variable("POLYDEV_REQUIRE_LLAMA_CPP"),
    Variable("POLYDEV_LLAMA_VOCAB_DIR"),
)}


def env_text(name: str) -> str | None:
    """The variable's value with surrounding blanks removed, or None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value or None


def env_int(name: str) -> int:
    """A declared integer variable: its default when unset, ConfigError when bad."""
    return _declared(name, int).read()


def env_float(name: str) -> float | None:
    """A declared number variable: its default when unset, ConfigError when bad."""
    return _declared(name, float).read()


def _declared(name: str, kind: type) -> Variable:
    variable = VARIABLES[name]
    assert variable.kind is kind, f"{name} is declared as {variable.kind.__name__}"
    return variable


def check_environment() -> list[str]:
    """Warn about every bad ``POLYDEV_*`` variable: a value its reader would refuse, or a
    name polydev does not read (a typo). Returns the warnings (also logged)."""
    warnings = []
    for name in sorted(n for n in os.environ if n.startswith(PREFIX)):
        variable = VARIABLES.get(name)
        if variable is None:
            close = difflib.get_close_matches(name, VARIABLES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.append(f"{name} is not a variable polydev reads{hint}")
            continue
        try:
            variable.read()
        except ConfigError as e:
            warnings.append(f"{e}; it is an error where polydev uses it")
    for warning in warnings:
        log.warning("%s", warning)
    return warnings


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
