"""Waiting on a remote device's calls: bounded by a time-out, faults as typed errors.

Every blocking wait of the Ray backend goes through ``wait``: a call still running after
``POLYDEV_RAY_TIMEOUT`` seconds (default 60), a dead actor or a lost node raises
``RemoteDeviceError`` naming the device; a polydev error raised on the remote side is
raised again here as itself, so a remote device fails the way a local one would.
"""

from __future__ import annotations

from typing import Any

from polydev.env import env_float
from polydev.errors import PolydevError, RemoteDeviceError

__all__ = ["timeout_s", "wait"]


def timeout_s() -> float:
    """Seconds a remote call may take before it is a fault (POLYDEV_RAY_TIMEOUT)."""
    return env_float("POLYDEV_RAY_TIMEOUT")


def wait(device_name: str, refs: Any, what: str) -> Any:
    """``ray.get(refs)`` within the time-out, with Ray's faults turned into polydev's."""
    import ray
    from ray import exceptions as rex

    limit = timeout_s()
    try:
        return ray.get(refs, timeout=limit)
    except rex.GetTimeoutError:
        raise RemoteDeviceError(f"{device_name}: {what} did not finish within {limit:g} s "
                                f"(POLYDEV_RAY_TIMEOUT); the device or its node may be "
                                f"overloaded or lost") from None
    except rex.RayActorError as e:
        raise RemoteDeviceError(f"{device_name}: its actor is gone ({type(e).__name__}), so "
                                f"{what} cannot run; the device is unusable") from None
    except rex.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, PolydevError):
            raise cause from None
        raise RemoteDeviceError(f"{device_name}: {what} failed on the remote side: "
                                f"{type(cause).__name__ if cause else 'error'}: {cause}") from e
    except rex.RayError as e:
        raise RemoteDeviceError(f"{device_name}: {what} failed in Ray: {e}") from e
