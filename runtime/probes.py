"""Answers a backend finds once per machine: can this driver build and run a kernel here?

A driver that is installed is not always one that works: a compiler that does not know this
processor fails every build. Backends prove each device at discovery with a tiny kernel and
leave out those that fail. Building costs up to a second, so the answer is kept in
``$POLYDEV_CACHE_DIR/probes/<kind>.json`` under a key of everything it depends on (the
driver and its version, the device, this CPU): a later process reads it in milliseconds, and
a new driver or another machine sharing the cache finds no answer and probes again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import threading
import zlib
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .env import cache_dir
from .files import write_atomic

log = logging.getLogger(__name__)

__all__ = ["cached_probes", "cpu_info", "error_lines", "host_cpu", "physical_cores"]

_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` ("model name", "flags", ...); empty
    where there is none (not Linux)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break                 # the end of the first processor
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on: hyperthreads of one core
    count once, as llama.cpp counts its default threads (a second thread on a core shares its
    vector units, and the products are bound by those). The CPUs it may run on where
    /proc/cpuinfo does not say which core each is."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/cpuinfo") as f:
            cores = cores_of(f.read(), allowed)
    except OSError:
        cores = 0
    if cores:
        return cores
    return len(allowed) if allowed is not None else (os.cpu_count() or 1)


def cores_of(cpuinfo: str, allowed: set[int] | None) -> int:
    """The distinct (physical id, core id) of the processors in ``cpuinfo`` (/proc/cpuinfo's
    text) that are in ``allowed`` (all where None); 0 where it does not name the cores."""
    cores = set()
    for record in cpuinfo.split("\n\n"):
        fields = dict((k.strip(), v.strip()) for k, _, v in
                      (line.partition(":") for line in record.splitlines()) if k.strip())
        try:
            processor = int(fields["processor"])
        except (KeyError, ValueError):
            continue
        if "core id" in fields and (allowed is None or processor in allowed):
            cores.add((fields.get("physical id"), fields["core id"]))
    return len(cores)


def host_cpu() -> str:
    """This CPU as a compiler targets it: its model, family and a checksum of its feature
    flags (CRC-32: a key needs no cryptographic hash, and hashlib loads libcrypto)."""
    info = cpu_info()
    if not info:
        return f"{platform.machine()} {platform.processor()}"
    flags = zlib.crc32(info.get("flags", "").encode())
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}, flags {flags:08x})")


def error_lines(text: str) -> list[str]:
    """The lines of a compiler's or driver's output that report an error (its log also holds
    warnings, notes and option lists), stripped."""
    return [line.strip() for line in text.splitlines() if "error" in line.lower()]


def cached_probes(kind: str, keys: Sequence[Mapping[str, object]],
                  probe: Callable[[list[int]], list[str | None]]) -> list[tuple[str | None, bool]]:
    """The answer for each of ``keys``: None where that device works, else why it does not.

    Answers not in the cache come from one call ``probe(indices)`` (the indices into
    ``keys`` of the devices to prove, in order) and are then kept. Each result is
    ``(answer, fresh)``; ``fresh`` is True when ``probe`` found it in this call (the answer is
    new to this machine) and False when it came from the cache. A key must be
    JSON-serialisable and name everything the answer depends on."""
    texts = [json.dumps(key, sort_keys=True) for key in keys]
    try:
        path = cache_dir("probes") / f"{kind}.json"
    except OSError as e:                   # no cache folder can be made: probe every time
        log.debug("no probe cache: %s", e)
        return [(answer, True) for answer in probe(list(range(len(keys))))]
    with _lock:
        known = _read(path)
    missing = [i for i, text in enumerate(texts) if text not in known]
    found = dict(zip(missing, probe(missing))) if missing else {}
    if found:
        with _lock:
            answers = _read(path)          # another process may have written meanwhile
            answers.update((texts[i], answer) for i, answer in found.items())
            _write(path, answers)
    return [(found[i], True) if i in found else (known[text], False)
            for i, text in enumerate(texts)]


def _read(path: Path) -> dict[str, str | None]:
    try:
        answers = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:     # unreadable or corrupt: probe again, rewrite it
        log.debug("ignoring the probe cache %s: %s", path, e)
        return {}
    if not isinstance(answers, dict):
        return {}
    return {k: v for k, v in answers.items() if v is None or isinstance(v, str)}


def _write(path: Path, answers: dict[str, str | None]) -> None:
    """Write through a temporary file and a rename: a reader never sees half a file."""
    try:
        write_atomic(path, json.dumps(answers, indent=1, sort_keys=True))
    except OSError as e:                   # a read-only cache: probe again next time
        log.debug("cannot write the probe cache %s: %s", path, e)
