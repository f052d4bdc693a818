"""The registry: entry-point discovery, ordering, lookup by name/type, torch-style names."""

from __future__ import annotations

import pytest

import polydev
from polydev import Device, DeviceType, Reg
from polydev.registry import Registry, _is_cpu_reg
from polydev.errors import DeviceNotFoundError


def test_cpu_is_registered_through_the_entry_point():
    from importlib import metadata
    names = [ep.name for ep in metadata.entry_points(group="polydev.backends")]
    assert "cpu" in names
    cpu = polydev.device("CPU")
    assert cpu.type == DeviceType.CPU and cpu.reg.name == "CPU"
    assert polydev.devices()[-1].type == DeviceType.CPU


@pytest.mark.parametrize("name", ["CPU", "cpu", "Cpu", "cpu:0"])
def test_lookup_is_case_insensitive_and_torch_style(name):
    assert polydev.device(name) is polydev.device("CPU")


def test_unknown_device_lists_known_ones():
    with pytest.raises(DeviceNotFoundError, match="known devices: .*CPU"):
        polydev.device("cuda:7")
    with pytest.raises(DeviceNotFoundError):
        polydev.init_backend("NoSuchThing")


class _FakeGPU(Device):
    type = DeviceType.GPU

    def memory(self):
        return (1, 2)


def test_order_dedup_and_best_device():
    reg = Registry()
    reg._loaded = True                      # no entry points: a registry under test control
    cpu_reg = Reg("CPU", [polydev.device("CPU").__class__()])
    gpu_reg = Reg("FAKE", [_FakeGPU("FAKE0", "a fake GPU"), _FakeGPU("FAKE1", "another")])
    reg.register(cpu_reg)
    reg.register(gpu_reg)
    assert reg.register(Reg("fake")) is gpu_reg          # same name: deduplicated
    assert [r.name for r in reg.regs] == ["FAKE", "CPU"]  # accelerators first, CPU last
    assert [d.name for d in reg.devices] == ["FAKE0", "FAKE1", "CPU"]
    assert reg.device("fake:1").name == "FAKE1"
    assert reg.device("fake").name == "FAKE0"
    assert reg.best_device().name == "FAKE0"
    assert reg.device_by_type(DeviceType.IGPU) is None


def test_broken_entry_point_is_reported_not_raised():
    from importlib.metadata import EntryPoint
    reg = Registry()
    reg._loaded = True
    reg._load_entry_point(EntryPoint("broken", "polydev_no_such_module:register",
                                     "polydev.backends"), 0)
    assert "broken" in reg._load_errors


def test_devices_command_lists_cpu(capsys):
    from polydev.tools.cli import main
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "CPU" in out and "from_host_ptr" in out
    assert main(["devices", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert data["devices"][-1]["name"] == "CPU"
    assert data["devices"][-1]["caps"]["async"] is False


def test_polydev_backends_loads_only_the_named_entry_points(monkeypatch):
    from polydev.errors import ConfigError

    monkeypatch.setenv("POLYDEV_BACKENDS", " CPU , ")
    reg = Registry()
    assert [r.name for r in reg.regs] == ["CPU"]
    assert reg.load_errors == {}
    monkeypatch.setenv("POLYDEV_BACKENDS", "cpu,cdua")
    reg = Registry()
    with pytest.raises(ConfigError, match=r"POLYDEV_BACKENDS='cpu,cdua' names cdua, which is "
                                          r"no installed backend \(installed: cpu, "):
        reg.load()
    with pytest.raises(ConfigError):                    # still an error the second time
        reg.devices
    monkeypatch.setenv("POLYDEV_BACKENDS", "all")
    assert "cpu" in {r.name.lower() for r in Registry().regs}


def test_a_device_asked_by_name_loads_its_backend_alone(monkeypatch):
    """A program that asks for the CPU alone starts no other backend's driver; asking for
    every device (or a name no entry point has) loads them all."""
    monkeypatch.delenv("POLYDEV_BACKENDS", raising=False)
    reg = Registry()
    cpu = reg.device("CPU")
    assert cpu.type == DeviceType.CPU
    assert reg._loaded_eps == {"cpu"} and not reg._loaded
    assert reg.device("cpu:0") is cpu and reg.device("cpu:") is cpu
    assert reg._loaded_eps == {"cpu"}
    with pytest.raises(DeviceNotFoundError, match="known devices: .*CPU"):
        reg.device("NoSuchThing0")
    assert reg._loaded
    from importlib import metadata
    assert reg._loaded_eps == {ep.name.lower()
                               for ep in metadata.entry_points(group="polydev.backends")}
    assert reg.device("CPU") is cpu and reg.devices[-1] is cpu


def test_devices_keep_the_entry_points_order_whichever_was_asked_first(monkeypatch):
    monkeypatch.delenv("POLYDEV_BACKENDS", raising=False)
    whole = Registry()
    everything = [r.name for r in whole.regs]
    for first in [d.name for d in whole.devices] + everything:
        reg = Registry()
        try:
            reg.device(first)
        except DeviceNotFoundError:       # a backend without devices (Ray without a cluster)
            pass
        assert [r.name for r in reg.regs] == everything
        reg.register(Reg("HAND", [_FakeGPU("HAND0", "a reg registered by hand")]))
        names = [r.name for r in reg.regs]
        assert [n for n in names if n != "HAND"] == everything
        # after the entry points' accelerator regs, whichever loaded first
        assert [r.name for r in reg.regs if not _is_cpu_reg(r)][-1] == "HAND"
