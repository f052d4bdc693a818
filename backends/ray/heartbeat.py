"""Finding a lost node in seconds: every remote device's actor is pinged on a thread of its own.

Ray itself learns that a node is gone only when its health checks have failed several times
(15 s and more by default), and a call waiting on that node would hang until the time-out
(``POLYDEV_RAY_TIMEOUT``, 60 s). So the driver pings each device actor once a fifth of
``POLYDEV_RAY_HEARTBEAT`` seconds, from a daemon thread; the actor answers on its own
concurrency group, so a ping never waits behind a long computation. A device whose actor has
not answered for ``POLYDEV_RAY_HEARTBEAT`` seconds, or whose actor Ray reports dead, is marked
lost (``RayDevice.lost``); every wait on it then ends with ``RemoteDeviceError`` at once.
A ping is a few hundred microseconds of an actor's time: idle devices cost next to nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from polydev.env import env_float

from .actor import HEARTBEAT_GROUP

if TYPE_CHECKING:
    from .device import RayDevice

__all__ = ["Heartbeat", "heartbeat", "lost_after_s"]

log = logging.getLogger(__name__)

PINGS_PER_PERIOD = 5


def lost_after_s() -> float:
    """Seconds without an answer before a device is lost (POLYDEV_RAY_HEARTBEAT)."""
    return env_float("POLYDEV_RAY_HEARTBEAT")


class _Watched:
    """One device's heartbeat: its ping in flight and when it last answered."""

    def __init__(self, device: "RayDevice", now: float) -> None:
        self.device = device
        self.answered = now
        self.ping: Any = None


class Heartbeat:
    """Pings the devices it watches until ``stop``; marks lost the ones that stop answering."""

    def __init__(self) -> None:
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, device: "RayDevice") -> None:
        """Start pinging ``device`` (in place of a device of the same name watched before)."""
        with self._lock:
            self._watched[device.name] = _Watched(device, time.monotonic())
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="polydev-ray-heartbeat",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop pinging everything (the thread ends within one period)."""
        with self._lock:
            self._watched.clear()
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop.wait(lost_after_s() / PINGS_PER_PERIOD):
            with self._lock:
                watched = [w for w in self._watched.values() if w.device.lost is None]
            try:
                self._beat(watched)
            except Exception:                 # a heartbeat must never take the driver down
                log.exception("the Ray heartbeat failed")

    def _beat(self, watched: list[_Watched]) -> None:
        import ray

        now = time.monotonic()
        in_flight = [w.ping for w in watched if w.ping is not None]
        ready = set(ray.wait(in_flight, num_returns=len(in_flight), timeout=0)[0]
                    if in_flight else ())
        limit = lost_after_s()
        for w in watched:
            if w.ping is not None and w.ping in ready:
                self._answered(w, now)
            if w.device.lost is not None:
                continue
            if now - w.answered > limit:
                w.device.mark_lost(f"it has not answered a heartbeat for {now - w.answered:.1f}"
                                   f" s (POLYDEV_RAY_HEARTBEAT={limit:g}): its node "
                                   f"{w.device.node} or its actor is lost or stalled")
            elif w.ping is None:
                w.ping = w.device.actor.ping.options(
                    concurrency_group=HEARTBEAT_GROUP).remote()

    @staticmethod
    def _answered(w: _Watched, now: float) -> None:
        import ray
        from ray import exceptions as rex

        ping, w.ping = w.ping, None
        try:
            ray.get(ping, timeout=0)
        except rex.RayActorError as e:
            w.device.mark_lost(f"Ray reports its actor dead ({type(e).__name__})")
            return
        except rex.RayError:
            return                            # not an answer; the next ping decides
        w.answered = now


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """The process's heartbeat (one thread for every remote device)."""
    return _heartbeat
