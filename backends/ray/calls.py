"""Waiting on a remote device's calls: bounded by a time-out, faults as typed errors.

Every blocking wait of the Ray backend goes through ``wait``: a call still running after
``POLYDEV_RAY_TIMEOUT`` seconds (default 60), a dead actor, or a device the heartbeat found
lost (``heartbeat.py``: within ``POLYDEV_RAY_HEARTBEAT`` seconds) raises ``RemoteDeviceError``
naming the device; a polydev error raised on the remote side is raised again here as itself,
so a remote device fails the way a local one would.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from polydev.device import lost_text
from polydev.env import env_float
from polydev.errors import PolydevError, RemoteDeviceError

from .call_queue import resolved, send_all

if TYPE_CHECKING:
    from .device import RayDevice

__all__ = ["lost_error", "timeout_s", "wait"]

# how often a long wait looks whether the heartbeat found its device lost
_LOOK_EVERY_S = 0.1


def timeout_s() -> float:
    """Seconds a remote call may take before it is a fault (POLYDEV_RAY_TIMEOUT)."""
    return env_float("POLYDEV_RAY_TIMEOUT")


def wait(device: "RayDevice | str", refs: Any, what: str) -> Any:
    """``ray.get(refs)`` (``ObjectRef``s or ``call_queue.Pending``s, one or a list) within
    the time-out, with Ray's faults turned into polydev's, after every device's queued calls
    were sent. ``device``: the device waited on (its name alone before the device exists)."""
    import ray
    from ray import exceptions as rex

    refs = resolved(refs)
    send_all()                    # nothing queued waits while this process does
    name = device if isinstance(device, str) else device.name
    limit = timeout_s()
    deadline = time.monotonic() + limit
    while True:
        _raise_if_lost(device, what)
        try:
            return ray.get(refs, timeout=max(0.0, min(_LOOK_EVERY_S,
                                                      deadline - time.monotonic())))
        except rex.GetTimeoutError:
            if time.monotonic() < deadline:
                continue
            raise RemoteDeviceError(f"{name}: {what} did not finish within {limit:g} s "
                                    f"(POLYDEV_RAY_TIMEOUT); the device or its node may be "
                                    f"overloaded or lost") from None
        except rex.RayActorError as e:
            gone = f"its actor is gone ({type(e).__name__})"
            if isinstance(device, str):
                raise lost_error(name, gone, what) from None
            if not _is_its_actor(device, e):      # a call it waited for, of another device
                raise RemoteDeviceError(f"{name}: {what} failed: a device it waited for is "
                                        f"gone ({type(e).__name__})") from None
            device.mark_lost(gone)
        except rex.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, PolydevError):
                raise cause from None
            raise RemoteDeviceError(f"{name}: {what} failed on the remote side: "
                                    f"{type(cause).__name__ if cause else 'error'}: "
                                    f"{cause}") from e
        except rex.RayError as e:
            raise RemoteDeviceError(f"{name}: {what} failed in Ray: {e}") from e


def lost_error(name: str, reason: str, what: str) -> RemoteDeviceError:
    """The error of a wait on a lost device."""
    return RemoteDeviceError(f"{lost_text(name, reason)}; {what} cannot run on it")


def _raise_if_lost(device: "RayDevice | str", what: str) -> None:
    reason = None if isinstance(device, str) else device.lost
    if reason is not None:
        raise lost_error(device.name, reason, what)


def _is_its_actor(device: "RayDevice", error: Exception) -> bool:
    """Whether ``error`` is about ``device``'s own actor (one without an id is not taken for
    it: the heartbeat decides then)."""
    return getattr(error, "actor_id", None) == device.actor._actor_id.hex()
