"""Devices on other hosts through Ray: an actor per device, the same scheduler across hosts.

Registered through the ``polydev.backends`` entry point ``ray`` (extra ``ray``). It has
devices once connected: set ``POLYDEV_RAY_ADDRESS`` (a Ray address, or "local" for a
cluster of this machine alone) before the registry loads, or call ``connect(address)``.
Connecting starts, on every alive node, one actor per polydev device of that node (a GPU
takes one of Ray's GPUs, any other device ``POLYDEV_RAY_CPUS`` CPUs, 1 by default); each
runs polydev itself with that node's backends, after both sides' polydev version and
catalogue of ops and types were found equal. Devices are named ``ray:<node>/<device>``
(``ray:10.0.0.2/CUDA0``) and are used like any other: buffers, backends, events, graph
plans, the scheduler. Every wait is bounded by ``POLYDEV_RAY_TIMEOUT`` seconds, and a dead
actor or node raises ``RemoteDeviceError`` naming the device.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any, Sequence

from polydev.device import Device, Reg
from polydev.env import env_int, env_text
from polydev.errors import MissingDependencyError, RemoteDeviceError
from polydev.registry import reg_once, registry

from .heartbeat import heartbeat

__all__ = ["connect", "disconnect", "node_labels", "reconnect_lost", "register"]

log = logging.getLogger(__name__)

_NOT_CONNECTED = ("not connected: set POLYDEV_RAY_ADDRESS (an address, or \"local\") or call "
                  "polydev.backends.ray.connect(address)")


def _make_reg() -> Reg:
    if importlib.util.find_spec("ray") is None:
        return Reg("Ray", unavailable_reason="ray is not installed; pip install 'polydev[ray]'",
                   procs=_PROCS)
    address = env_text("POLYDEV_RAY_ADDRESS")
    if address is None:
        return Reg("Ray", unavailable_reason=_NOT_CONNECTED, procs=_PROCS)
    devices = _start_devices(address, None, {}, set())
    heartbeat().watch(devices)
    return Reg("Ray", devices, procs=_PROCS)


_PROCS = {"set_numerics": lambda backend, numerics: backend.set_numerics(numerics),
          "set_n_threads": lambda backend, n_threads: backend.set_n_threads(n_threads),
          "reconnect_lost": lambda: reconnect_lost()}
register = reg_once(_make_reg)


def connect(address: str | None = "local", devices: Sequence[str] | None = None,
            **init_kwargs: Any) -> list[Device]:
    """Join the Ray cluster at ``address`` ("local": start one on this machine; None: the
    one this process already joined), start an actor per device (only the device names in
    ``devices``, such as ["CPU", "OpenCL0"], when given) and register them. Returns the new
    devices (a device connected before stays as it was; a lost one is replaced where its
    node is back under the same name). ``init_kwargs`` go to ``ray.init``."""
    reg = registry().register(register())
    # MissingDependencyError where ray is not installed
    found = _start_devices(address, devices, init_kwargs, _serving(reg))
    return _register_started(reg, found)


def _serving(reg: Reg) -> set[tuple[str, str]]:
    """(node id, the device's name on its node) of each connected device that answers."""
    return {(d.node_id, d.remote_name) for d in reg.devices if d.lost is None}


def _register_started(reg: Reg, found: list[Device]) -> list[Device]:
    """Register the devices of new actors (each in place of a lost namesake; one whose name a
    serving device has is stopped), watched by the heartbeat; the devices registered."""
    import ray

    known = {d.name: d for d in reg.devices}
    added = []
    for device in found:
        before = known.get(device.name)
        if before is not None and before.lost is None:    # another node took its name
            log.warning("Ray: %s is connected already; its namesake on node %s is left out",
                        device.name, device.node_id)
            ray.kill(device.actor, no_restart=True)
            continue
        if before is not None:
            reg.devices.remove(before)
        reg.add_device(device)
        added.append(device)
    heartbeat().watch(added)
    reg.unavailable_reason = None if reg.devices else "no devices were found on the cluster"
    return added


def reconnect_lost() -> list[Device]:
    """Start again each lost device whose node is back under its name (alive with a node id
    of its own: a raylet that started again), on that node alone: the devices that took a
    lost one's place. The reg's "reconnect_lost" proc, which a server calls while it serves
    without a device; nothing is asked of Ray while no device is lost."""
    reg = registry().register(register())
    lost = {d.name: d for d in reg.devices if d.lost is not None}
    if not lost:
        return []
    import ray

    if not ray.is_initialized():
        return []
    alive = {label: node["NodeID"] for node, label in node_labels(ray.nodes())}
    back = {alive[d.node] for d in lost.values()
            if d.node in alive and alive[d.node] != d.node_id}
    if not back:
        return []
    names = sorted({d.remote_name for d in lost.values()})
    found = _start_devices(None, names, {}, _serving(reg), nodes=back)
    return [d for d in _register_started(reg, found) if d.name in lost]


def disconnect() -> None:
    """Stop the actors of every Ray device and take the devices out of the registry."""
    import ray

    heartbeat().stop()
    reg = registry().register(register())
    for device in reg.devices:
        ray.kill(device.actor, no_restart=True)
    reg.devices.clear()
    reg.unavailable_reason = _NOT_CONNECTED


# --- starting the actors ----------------------------------------------------------------------

def _start_devices(address: str | None, names: Sequence[str] | None, init_kwargs: dict,
                   serving: set[tuple[str, str]],
                   nodes: set[str] | None = None) -> list[Device]:
    """An actor for each device of every alive node (of the node ids ``nodes`` only, where
    given), but those of ``names`` only where given, and none for the devices in ``serving``
    (connected and answering: (node id, the device's name on its node))."""
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError(f"remote devices need ray ({e}); pip install "
                                     f"'polydev[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, **init_kwargs)
    wanted = None if names is None else {n.lower() for n in names}
    found: list[Device] = []
    labels = node_labels(ray.nodes())
    try:
        for node, label in labels:
            if nodes is None or node["NodeID"] in nodes:
                found += _node_devices(ray, node, label, wanted, serving)
    except BaseException:                     # no actor is kept that no device mirrors
        for device in found:
            ray.kill(device.actor, no_restart=True)
        raise
    log.info("Ray: %d devices started on %d nodes", len(found), len(labels))
    return found


def node_labels(nodes: Sequence[dict]) -> list[tuple[dict, str]]:
    """Each alive node of ``nodes`` (``ray.nodes()``) with the name its devices carry
    (``ray:<label>/<device>``), the head first, then by name: the node's name (``ray start
    --node-name``, its address by default), and where several alive nodes share one (nodes of
    one host), that name and the node manager's port, so that no two devices are named alike.
    A node that comes back under its name gets its devices' names back."""
    def order(node: dict) -> tuple:
        head = "node:__internal_head__" in node.get("Resources", {})
        return (not head, _node_name(node), node["NodeManagerPort"])

    nodes = sorted((n for n in nodes if n.get("Alive", True)), key=order)
    counts: dict[str, int] = {}
    for node in nodes:
        counts[_node_name(node)] = counts.get(_node_name(node), 0) + 1
    shared = sorted(name for name, n in counts.items() if n > 1)
    if shared:
        log.warning("Ray: several nodes are named %s; their devices are told apart by port "
                    "(ray start --node-name gives each node a name of its own)",
                    ", ".join(shared))
    return [(node, _node_name(node) if counts[_node_name(node)] == 1
             else f"{_node_name(node)}:{node['NodeManagerPort']}") for node in nodes]


def _node_name(node: dict) -> str:
    return node.get("NodeName") or node["NodeManagerAddress"]


def _node_devices(ray: Any, node: dict, label: str, wanted: set[str] | None,
                  serving: set[tuple[str, str]]) -> list[Device]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .actor import HEARTBEAT_GROUP, DeviceActor, node_devices
    from .calls import wait

    here = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    listed = wait(f"ray:{label}", ray.remote(node_devices).options(
        num_cpus=0, scheduling_strategy=here).remote(), "listing its devices")
    cpus = env_int("POLYDEV_RAY_CPUS")
    # (the device's name inside its actor, Ray's CPUs, Ray's GPUs): the probe's devices
    # (it holds no GPU, so it sees none), then one CUDA actor per GPU of the node, which
    # sees its GPU as CUDA0
    here_serving = {name for node_id, name in serving if node_id == node["NodeID"]}
    owned = [(e["name"], cpus, 0) for e in listed if not e["name"].startswith("CUDA")
             and (wanted is None or e["name"].lower() in wanted)
             and e["name"] not in here_serving]
    held = sum(not n.startswith("CUDA") for n in here_serving) * cpus
    owned = _fitting(owned, node, label, cpus, held)
    free_gpus = int(node.get("Resources", {}).get("GPU", 0)) - sum(
        n.startswith("CUDA") for n in here_serving)
    owned += [("CUDA0", 0, 1)] * max(free_gpus, 0)
    devices = []
    for name, n_cpus, n_gpus in owned:
        actor = ray.remote(concurrency_groups={HEARTBEAT_GROUP: 1})(DeviceActor).options(
            num_cpus=n_cpus, num_gpus=n_gpus, scheduling_strategy=here,
            max_concurrency=1).remote(name)
        device = _mirror(label, actor)
        if n_gpus and wanted is not None and device.remote_name.lower() not in wanted:
            ray.kill(actor, no_restart=True)
            continue
        devices.append(device)
    return devices


def _fitting(owned: list[tuple[str, int, int]], node: dict, label: str, cpus: int,
             held: int) -> list[tuple[str, int, int]]:
    """The devices whose actors the node's CPUs can hold beside the ``held`` CPUs of its
    devices connected before (an actor Ray cannot place would leave its device waiting for
    the time-out); the rest are left out, saying why."""
    node_cpus = node.get("Resources", {}).get("CPU", 0) - held
    fit = len(owned) if cpus == 0 else max(int(node_cpus // cpus), 0)
    if fit < len(owned):
        log.warning("Ray: node %s has %g CPUs, so it holds %d device actors of %d CPUs each "
                    "(POLYDEV_RAY_CPUS); left out: %s", label, node_cpus, fit, cpus,
                    ", ".join(name for name, _, _ in owned[fit:]))
    return owned[:fit]


def _mirror(node: str, actor: Any) -> Device:
    """The driver's side of one actor, once its polydev is found to match this one."""
    from .actor import catalogue
    from .calls import wait
    from .device import RayDevice

    import ray

    try:
        info = wait(f"ray:{node}", actor.info.remote(), "starting a device actor")
        mine, theirs = catalogue(), info["catalogue"]
        if mine != theirs:
            differs = [f"{key}: here {_short(mine[key])}, there {_short(theirs.get(key))}"
                       for key in mine if mine[key] != theirs.get(key)]
            raise RemoteDeviceError(f"ray:{node}/{info['name']}: polydev differs between this "
                                    f"process and the node ({'; '.join(differs)})")
    except BaseException:
        ray.kill(actor, no_restart=True)          # an actor no device mirrors is not kept
        raise
    return RayDevice(node, actor, info)


def _short(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} names ({', '.join(value[:3])}, ...)"
    return repr(value)
