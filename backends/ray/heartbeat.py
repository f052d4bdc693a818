"""Finding a lost node in seconds: each node's device actors are pinged from that node.

Ray itself learns that a node is gone only when its health checks have failed several times
(15 s and more by default), and a call waiting on that node would hang until the time-out
(``POLYDEV_RAY_TIMEOUT``, 60 s). So a daemon thread of the driver asks, a few times per
``POLYDEV_RAY_HEARTBEAT`` seconds, each node's ``NodeWatch`` actor how long ago each of the
node's device actors last answered a ping; the device actors answer on a concurrency group
of their own, so a ping never waits behind a computation. A device is marked lost
(``RayDevice.lost``) when its actor has not answered for ``POLYDEV_RAY_HEARTBEAT`` seconds,
when Ray reports it dead, or when its node's watch itself stops answering (the node's raylet
or host gone); every wait on it then ends with ``RemoteDeviceError`` at once. The pings come
from the node's watch, not from the driver: Ray runs one caller's calls to an actor in order,
so a driver's ping would wait behind the driver's calls that wait for another device.
An idle node costs a few hundred microseconds of its actors' time a second.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Sequence

from polydev.env import env_float

if TYPE_CHECKING:
    from .device import RayDevice

__all__ = ["Heartbeat", "heartbeat", "lost_after_s"]

log = logging.getLogger(__name__)

BEATS_PER_PERIOD = 5


def lost_after_s() -> float:
    """Seconds without an answer before a device is lost (POLYDEV_RAY_HEARTBEAT)."""
    return env_float("POLYDEV_RAY_HEARTBEAT")


class _Node:
    """One node's watch actor, its devices, its beat in flight and when it last answered."""

    def __init__(self, devices: list["RayDevice"], now: float) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .actor import NodeWatch

        self.devices = devices
        self.watch = ray.remote(NodeWatch).options(
            num_cpus=0, max_concurrency=1,
            scheduling_strategy=NodeAffinitySchedulingStrategy(devices[0].node_id, soft=False)
        ).remote([d.actor for d in devices])
        self.answered = now
        self.beat: Any = None

    def close(self) -> None:
        import ray

        try:
            ray.kill(self.watch, no_restart=True)
        except Exception:                     # gone with its node already
            pass


class Heartbeat:
    """Watches the nodes of the devices it is given until ``stop``; marks lost the devices
    that stop answering."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}    # by Ray's node id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, devices: Sequence["RayDevice"]) -> None:
        """Watch ``devices`` with the devices already watched on their nodes (a node's watch
        is made again with its whole set of devices)."""
        by_node: dict[str, list] = {}
        for device in devices:
            by_node.setdefault(device.node_id, []).append(device)
        with self._lock:
            now = time.monotonic()
            for node_id, added in by_node.items():
                old = self._nodes.pop(node_id, None)
                kept = [] if old is None else [d for d in old.devices if d.lost is None]
                names = {d.name for d in added}
                if old is not None:
                    old.close()
                self._nodes[node_id] = _Node([*(d for d in kept if d.name not in names),
                                              *added], now)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="polydev-ray-heartbeat",
                                                daemon=True)
                self._thread.start()

    def stop(self) -> None:
        """Stop watching everything (the thread ends within one beat)."""
        with self._lock:
            nodes, self._nodes = list(self._nodes.values()), {}
            thread, self._thread = self._thread, None
            self._stop.set()
        for node in nodes:
            node.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        import ray

        while not self._stop.wait(lost_after_s() / BEATS_PER_PERIOD):
            if not ray.is_initialized():      # Ray shut down under the devices
                return
            with self._lock:
                nodes = [n for n in self._nodes.values()
                         if any(d.lost is None for d in n.devices)]
            for node in nodes:
                try:
                    self._beat(node)
                except Exception:             # a heartbeat must never take the driver down
                    log.exception("the Ray heartbeat failed")

    def _beat(self, node: _Node) -> None:
        import ray

        now, limit = time.monotonic(), lost_after_s()
        if node.beat is not None and ray.wait([node.beat], timeout=0)[0]:
            beat, node.beat = node.beat, None
            try:
                ages = ray.get(beat)
            except ray.exceptions.RayActorError:
                _lose(node.devices, "its node's watch is gone: the node is lost")
                return
            except ray.exceptions.RayError:
                ages = None                   # not an answer; the next beat decides
            if ages is not None:
                node.answered = now
                for device, age in zip(node.devices, ages):
                    _judge(device, age, limit)
        if now - node.answered > limit:
            _lose(node.devices, f"its node has not answered a heartbeat for "
                                f"{now - node.answered:.1f} s (POLYDEV_RAY_HEARTBEAT="
                                f"{limit:g}): the node is lost or stalled")
        elif node.beat is None:
            node.beat = node.watch.beat.remote()


def _judge(device: "RayDevice", age: float | None, limit: float) -> None:
    if age is None:
        device.mark_lost("its actor is gone (Ray reports it dead)")
    elif age > limit:
        device.mark_lost(f"it has not answered a heartbeat for {age:.1f} s "
                         f"(POLYDEV_RAY_HEARTBEAT={limit:g}): its actor is stalled or lost")


def _lose(devices: list["RayDevice"], reason: str) -> None:
    for device in devices:
        device.mark_lost(reason)


_heartbeat = Heartbeat()


def heartbeat() -> Heartbeat:
    """The process's heartbeat (one thread for every remote device)."""
    return _heartbeat
