"""Finding a lost node in seconds: every device actor sends a beat, a collector keeps the time.

Ray itself learns that a node is gone only when its health checks have failed several times
(15 s and more by default), and a call waiting on that node would hang until the time-out
(``POLYDEV_RAY_TIMEOUT``, 60 s). So each device actor sends a beat a few times per
``POLYDEV_RAY_HEARTBEAT`` seconds, from a thread of its own, to one ``HeartbeatCollector``
actor on the driver's node, which notes when each beat came by its own clock; a daemon thread
of the driver asks the collector for the beats' ages, and a device whose actor has not beaten
for ``POLYDEV_RAY_HEARTBEAT`` seconds (its node's raylet killed, its host gone, its process
stalled) is marked lost (``RayDevice.lost``): every wait on it then ends with
``RemoteDeviceError`` at once.

The beats go to a collector rather than the driver pinging each actor: Ray runs one caller's
calls to an actor in order, so a driver's ping would wait behind the driver's calls that wait
for another device (a pipeline's second stage waits for the first, seconds on a long
prompt). One collector for the cluster, not a watch per node: an idle Ray worker process
costs about 0.5% of a core by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from polydev.env import env_float

if TYPE_CHECKING:
    from .device import RayDevice

__all__ = ["Heartbeat", "HeartbeatCollector", "heartbeat", "lost_after_s"]

log = logging.getLogger(__name__)

# beats and looks per period: a lost node is found within about 1.7 periods (the last beat,
# a period, then a look and its answer), and the beats cost little beside an idle Ray
# worker's own 0.5% of a core
BEATS_PER_PERIOD = 3


def lost_after_s() -> float:
    """Seconds without a beat before a device is lost (POLYDEV_RAY_HEARTBEAT)."""
    return env_float("POLYDEV_RAY_HEARTBEAT")


class HeartbeatCollector:
    """The actor the device actors send their beats to: when each beat last came."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def beat(self, key: str) -> None:
        """A beat of the actor that sends under ``key``: now."""
        self.seen[key] = time.monotonic()

    def ages(self) -> dict[str, float]:
        """Seconds since each sender's last beat, by its key."""
        now = time.monotonic()
        return {key: now - when for key, when in self.seen.items()}


class Heartbeat:
    """Watches the devices it is given until ``stop``; marks lost those whose beats stop."""

    def __init__(self) -> None:
        # by actor id: (the device, when it was watched, the seconds it may go without a beat)
        self._devices: dict[str, tuple["RayDevice", float, float]] = {}
        self._collector: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, devices: Sequence["RayDevice"]) -> None:
        """Have ``devices``' actors send their beats (at the POLYDEV_RAY_HEARTBEAT of now),
        and watch them; lost devices watched before are forgotten."""
        with self._lock:
            if self._collector is None:
                self._collector = _start_collector()
            self._devices = {k: v for k, v in self._devices.items() if v[0].lost is None}
            self._start_beats(devices)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="polydev-ray-heartbeat",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop watching (the thread ends within one beat) and stop the collector."""
        import ray

        with self._lock:
            collector, self._collector = self._collector, None
            thread, self._thread = self._thread, None
            self._devices.clear()
            self._stop.set()
        if collector is not None and ray.is_initialized():
            ray.kill(collector, no_restart=True)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _start_beats(self, devices: Sequence["RayDevice"]) -> None:
        from .actor import HEARTBEAT_GROUP

        now, limit = time.monotonic(), lost_after_s()
        for device in devices:
            key = device.actor._actor_id.hex()
            self._devices[key] = (device, now, limit)
            device.actor.start_heartbeat.options(concurrency_group=HEARTBEAT_GROUP).remote(
                self._collector, key, limit / BEATS_PER_PERIOD)

    def _run(self) -> None:
        import ray

        asked, asked_at = None, 0.0
        while not self._stop.wait(lost_after_s() / BEATS_PER_PERIOD):
            if not ray.is_initialized():      # Ray shut down under the devices
                return
            try:
                if asked is not None and ray.wait([asked], timeout=0)[0]:
                    ages, asked = ray.get(asked), None
                    self._judge(ages, asked_at)
                if asked is None:             # the next look goes out as this one is judged
                    with self._lock:
                        collector = self._collector
                    if collector is None:
                        continue
                    asked, asked_at = collector.ages.remote(), time.monotonic()
                elif time.monotonic() - asked_at > lost_after_s():
                    log.warning("the Ray heartbeat's collector has not answered for %.1f s",
                                time.monotonic() - asked_at)
            except ray.exceptions.RayActorError:
                log.error("the Ray heartbeat's collector is gone: starting another")
                asked = None
                self._restart_collector()
            except Exception:                 # a heartbeat must never take the driver down
                log.exception("the Ray heartbeat failed")
                asked = None

    def _restart_collector(self) -> None:
        with self._lock:
            if self._collector is None:       # stopped meanwhile
                return
            self._collector = _start_collector()
            self._start_beats([v[0] for v in self._devices.values() if v[0].lost is None])

    def _judge(self, ages: dict[str, float], asked_at: float) -> None:
        with self._lock:
            watched = list(self._devices.items())
        for key, (device, since, limit) in watched:
            if since > asked_at:              # watched again since: these ages are not its
                continue
            age = ages.get(key, asked_at - since)     # no beat yet: since it was watched
            if device.lost is None and age > limit:
                device.mark_lost(f"it has not sent a heartbeat for {age:.1f} s "
                                 f"(POLYDEV_RAY_HEARTBEAT={limit:g}): its node or its actor "
                                 f"is lost or stalled")


def _start_collector() -> Any:
    """The collector, on this process's node (no CPU of Ray's)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(HeartbeatCollector).options(num_cpus=0, max_concurrency=1,
                                                  scheduling_strategy=here).remote()


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """The process's heartbeat (one thread and one collector for every remote device)."""
    return _heartbeat
