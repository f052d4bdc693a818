"""One way to build kernels, for every backend: ``compile_cached``.

A backend hands over what a build depends on (its sources, the compiler's options, the
identity of the compiler and of the device) and a function that compiles them into a file.
The artifact lands in ``$POLYDEV_CACHE_DIR/<kind>/`` under a name that hashes all of it, so a
changed source, option, compiler or device never reuses a stale build. A build writes a
temporary file beside its target and renames it (never half an artifact), under an exclusive
lock of the target, so two processes that need the same kernels build them once and never
read each other's partial file. A failed build raises ``CompileError`` with the compiler's
own lines.

The policy when a build fails is the backend's, said once in the log: the CPU falls back to
its numpy kernels; an OpenCL or CUDA device that cannot build its kernels at discovery is
listed as unusable with the reason (``polydev devices -v``). Builds happen when a device
starts (its first stream) or a plan binds a node, never when ``supports_op`` asks.
"""

from __future__ import annotations

import fcntl
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from .env import cache_dir
from .errors import CompileError
from .files import replacing
from .probes import error_lines

__all__ = ["compile_cached", "build_key", "compiler_message"]

log = logging.getLogger(__name__)

# what a compile function receives: the temporary path to write the artifact to
Compile = Callable[[Path], None]


def build_key(sources: Mapping[str, str | bytes], options: Sequence[str],
              identity: Mapping[str, object]) -> str:
    """A digest of everything an artifact depends on: each source's name and text, the
    options in order, and the compiler's and device's identity (name: value pairs)."""
    # imported here: hashlib loads OpenSSL's libcrypto (4 MiB of resident memory), which a
    # process whose kernels are installed never needs
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(sources):
        text = sources[name]
        digest.update(name.encode() + b"\0")
        digest.update(text if isinstance(text, bytes) else text.encode())
        digest.update(b"\0")
    for option in options:
        digest.update(b"option\0" + str(option).encode() + b"\0")
    for name in sorted(identity):
        digest.update(f"{name}={identity[name]}\0".encode())
    return digest.hexdigest()[:24]


def compiler_message(error: BaseException, limit: int = 3) -> str:
    """The compiler's own error lines from what a failed build raised (its output, where it
    carries some), else the error itself, in one line."""
    text = "\n".join(str(part) for part in (getattr(error, "stderr", None),
                                            getattr(error, "stdout", None), error) if part)
    lines = error_lines(text)
    return "; ".join(lines[:limit]) or f"{type(error).__name__}: {str(error).strip()}"


def compile_cached(kind: str, what: str, sources: Mapping[str, str | bytes],
                   options: Sequence[str], identity: Mapping[str, object], compile: Compile,
                   suffix: str = "") -> Path:
    """The artifact of ``sources`` built with ``options`` by the compiler and for the device
    that ``identity`` names: from the cache where it was built before, else built now by
    ``compile(temporary_path)`` and renamed into place. ``what`` names the build in the log and
    in errors ("the CPU kernels (x86-64-v3)"). Raises ``CompileError`` where it fails."""
    target = cache_dir(kind) / f"{build_key(sources, options, identity)}{suffix}"
    if target.exists():
        return target
    with _locked(target):
        if target.exists():                  # another process built it while we waited
            return target
        log.info("building %s into %s", what, target)
        try:
            with replacing(target, suffix=suffix) as tmp:
                compile(tmp)
        except CompileError:
            raise
        except Exception as e:           # the compiler's failure, in its own words
            raise CompileError(f"{what} did not build: {compiler_message(e)}") from e
    return target


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    """An exclusive lock of ``target``'s build, across processes (a lock file beside it)."""
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
