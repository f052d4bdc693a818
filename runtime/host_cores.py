"""Which other compute drivers of this process run on the host's own cores.

The CPU kernels' OpenMP threads spin for a while after each parallel region before they sleep
(libgomp's GOMP_SPINCOUNT, which libgomp reads once, as the kernels load). How long they should
spin depends on who else needs the cores: alone, a thread that outlasts the Python between two
decode steps is awake when the next step's first kernel starts; beside a driver that computes
on the same cores (an OpenCL CPU device such as PoCL), a spinning thread holds a core that
driver's threads need when the scheduler switches to its layers. A backend on such a device
says so here as it opens; the CPU kernels read it as they load (``backends/cpu/native``). A
model's loader opens its OpenCL backends before the CPU's; a process that ran the CPU kernels
before it opened one keeps the longer spin (libgomp read it once), unless GOMP_SPINCOUNT says.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_sharers: list[str] = []


def share_host_cores(who: str) -> None:
    """Note that ``who`` (a device's name) computes on the host's cores in this process."""
    with _lock:
        if who not in _sharers:
            _sharers.append(who)


def host_core_sharers() -> tuple[str, ...]:
    """The devices that noted they compute on the host's cores, in the order they did."""
    with _lock:
        return tuple(_sharers)
