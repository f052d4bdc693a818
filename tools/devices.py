"""``polydev devices``: every device polydev can use, as a table or JSON."""

from __future__ import annotations

import argparse
import json

import polydev
from polydev.device import DeviceProps

from polydev.errors import DeviceNotFoundError

from .table import format_table

CAPS = ("async_", "host_buffer", "buffer_from_host_ptr", "events")
CAP_LABELS = {"async_": "async", "host_buffer": "host_buffer",
              "buffer_from_host_ptr": "from_host_ptr", "events": "events"}


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev devices [--json] [-v] [--require BACKEND]``."""
    p = sub.add_parser("devices", parents=parents,
                       help="list every device (name, type, memory, capabilities)",
                       description="List every device of every registered backend, "
                                   "accelerators first and the CPU last.")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also list devices left out and why (a driver that cannot build a "
                        "kernel, a device another platform offers already), backends without "
                        "devices and why, and backends that failed to load")
    p.add_argument("--require", action="append", default=[], metavar="BACKEND",
                   help="fail (exit status 1, one line saying why) unless the named backend "
                        "(cpu, opencl, cuda, ray; any case) offers a device; repeatable. A "
                        "set-up script's check that a driver works")
    p.set_defaults(run=run)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _props_dict(p: DeviceProps, reg: str) -> dict:
    return {"name": p.name, "description": p.description, "backend": reg, "type": p.type.name,
            "memory_free": p.memory_free, "memory_total": p.memory_total,
            "device_id": p.device_id,
            "caps": {CAP_LABELS[c]: getattr(p.caps, c) for c in CAPS}}


def _check_required(names: list[str]) -> None:
    """DeviceNotFoundError naming the first required backend without a device, and why."""
    for name in names:
        reg = polydev.registry().reg_by_name(name)
        if reg.devices:
            continue
        why = reg.unavailable_reason or "no reason given"
        raise DeviceNotFoundError(f"backend {reg.name} has no usable device: {why}")


def run(args: argparse.Namespace) -> int:
    """Print the devices as a table (or JSON), and with -v the backends without any."""
    reg = polydev.registry()
    _check_required(args.require)
    devices = [(d.props(), d.reg.name if d.reg else "?") for d in reg.devices]
    unavailable = {r.name: r.unavailable_reason for r in reg.regs if not r.devices}
    excluded = [(r.name, e) for r in reg.regs for e in r.excluded]
    if args.json:
        print(json.dumps({"devices": [_props_dict(p, r) for p, r in devices],
                          "excluded_devices": [{"backend": name, "description": e.description,
                                                "reason": e.reason} for name, e in excluded],
                          "unavailable_backends": unavailable,
                          "load_errors": reg.load_errors}, indent=2))
        return 0
    rows = [(p.name, p.description, p.type.name, f"{_mib(p.memory_free)} / {_mib(p.memory_total)}",
             ",".join(CAP_LABELS[c] for c in CAPS if getattr(p.caps, c)) or "-")
            for p, _ in devices]
    print(format_table(["name", "description", "type", "memory free / total", "caps"], rows))
    if args.verbose:
        for name, e in excluded:
            print(f"\nbackend {name} left out {e.description}: {e.reason}")
        for name, reason in unavailable.items():
            print(f"\nbackend {name}: no devices ({reason or 'no reason given'})")
        for name, err in reg.load_errors.items():
            print(f"\nbackend {name} failed to load: {err}")
    return 0
