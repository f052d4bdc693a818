"""A device that cannot run is not offered: OpenCL platforms and CUDA GPUs prove they build
and run a kernel at discovery, the answer is kept per driver and CPU, a physical device two
platforms offer is offered once, and ``polydev devices -v`` says what was left out and why.

Discovery's rules run over stand-in drivers (no OpenCL or CUDA needed); the probe itself runs
on the machine's real OpenCL devices, and its child process is made to crash for real.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest

import polydev
from polydev import ExcludedDevice, Reg
from polydev.backends.opencl import platform as cl_platform
from polydev.backends.opencl import probe as cl_probe
from polydev.probes import cached_probes, host_cpu
from polydev.tools.cli import main

from needs import opencl_devices


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Every test keeps its probe answers in a cache folder of its own."""
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path / "cache"))


# --- the probe cache ----------------------------------------------------------------------------

def test_answers_are_kept_per_key_and_probed_once():
    calls = []

    def probe(indices):
        calls.append(indices)
        return [None if i == 0 else f"broken {i}" for i in indices]

    keys = [{"driver": "a", "version": "1"}, {"driver": "b", "version": "1"}]
    assert cached_probes("test", keys, probe) == [(None, True), ("broken 1", True)]
    assert cached_probes("test", keys, probe) == [(None, False), ("broken 1", False)]
    assert calls == [[0, 1]]
    # a new driver version is a new key: probed, the others still from the cache
    keys[1]["version"] = "2"
    assert cached_probes("test", keys, probe) == [(None, False), ("broken 1", True)]
    assert calls == [[0, 1], [1]]


def test_a_corrupt_cache_is_probed_again_and_rewritten(tmp_path):
    path = tmp_path / "cache" / "probes" / "test.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert cached_probes("test", [{"k": 1}], lambda idx: ["no"] * len(idx)) == [("no", True)]
    assert json.loads(path.read_text()) == {'{"k": 1}': "no"}


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(blocker))      # a file: no folder in it
    assert cached_probes("test", [{"k": 1}], lambda idx: [None]) == [(None, True)]


def test_the_host_cpu_names_model_and_flags():
    cpu = host_cpu()
    assert cpu and "flags" in cpu or not os.path.exists("/proc/cpuinfo")


# --- OpenCL discovery over stand-in drivers ------------------------------------------------------

class _Error(Exception):
    pass


def _stand_in_cl(*platforms):
    """A pyopencl stand-in: platforms of devices, each (name, type); nothing computes."""
    device_type = SimpleNamespace(CPU=2, GPU=4, ACCELERATOR=8, ALL=0xFFFFFFFF)

    def device(name, kind, memory=1 << 30):
        return SimpleNamespace(name=name, type=getattr(device_type, kind), vendor_id=1,
                               global_mem_size=memory, version="OpenCL 3.0",
                               driver_version="1.0", get_info=_no_info)

    made = [SimpleNamespace(name=name, version=version,
                            get_devices=lambda device_type, ds=[device(*d) for d in devs]: ds)
            for name, version, devs in platforms]
    return SimpleNamespace(Error=_Error, device_type=device_type, get_platforms=lambda: made,
                           Context=lambda devices: SimpleNamespace(devices=devices),
                           device_info=SimpleNamespace())


def _no_info(what):
    raise _Error("no such query")


@pytest.fixture
def answers(monkeypatch):
    """The probe's answer per platform version (default: works), fresh each time."""
    table: dict[str, str | None] = {}

    def probe_devices(p_index, platform, devices):
        return [(table.get(platform.version), True) for _ in devices]

    monkeypatch.setattr(cl_platform, "probe_devices", probe_devices)
    for env in (cl_platform.PLATFORM_ENV, cl_platform.DEVICE_ENV):
        monkeypatch.delenv(env, raising=False)
    return table


BROKEN = "cannot build a kernel: error: unknown target CPU 'generic'"


def test_a_broken_platform_beside_a_working_one_is_left_out_and_logged(answers, caplog):
    answers["PoCL 3.0"] = BROKEN
    cl = _stand_in_cl(("Portable Computing Language", "PoCL 3.0", [("pthread-EPYC", "CPU")]),
                      ("Portable Computing Language", "PoCL 3.1", [("cpu-EPYC", "CPU")]))
    with caplog.at_level(logging.WARNING):
        found = cl_platform.discover(cl)
    assert [d.name for _, d in found.found] == ["cpu-EPYC"]
    assert found.reason is None
    (left_out,) = found.excluded
    assert "platform 0" in left_out.description and "PoCL 3.0" in left_out.description
    assert left_out.reason == BROKEN
    assert "PoCL 3.0" in caplog.text and "unknown target CPU 'generic'" in caplog.text


def test_a_device_two_working_platforms_offer_is_offered_once_by_the_first(answers):
    cl = _stand_in_cl(("PoCL", "3.0", [("pthread", "CPU"), ("pthread", "CPU")]),
                      ("PoCL", "3.1", [("cpu", "CPU"), ("cpu", "CPU")]),
                      ("GPU vendor", "2.0", [("big GPU", "GPU")]))
    found = cl_platform.discover(cl)
    # both devices of the first platform (POCL_DEVICES="pthread pthread"), and the GPU
    assert [(ctx.name, d.name) for ctx, d in found.found] == [
        ("PoCL", "pthread"), ("PoCL", "pthread"), ("GPU vendor", "big GPU")]
    assert [e.reason for e in found.excluded] == [
        "the same device as OpenCL0, offered by an earlier platform"] * 2


def test_the_working_platform_wins_whatever_the_order(answers):
    answers["3.1"] = BROKEN
    cl = _stand_in_cl(("PoCL", "3.1", [("cpu", "CPU")]), ("PoCL", "3.0", [("pthread", "CPU")]))
    found = cl_platform.discover(cl)
    assert [d.name for _, d in found.found] == ["pthread"]
    assert [e.reason for e in found.excluded] == [BROKEN]


def test_with_no_working_device_the_reason_names_the_platform_and_the_message(answers):
    answers["3.0"] = BROKEN
    cl = _stand_in_cl(("PoCL", "3.0", [("pthread", "CPU"), ("pthread", "CPU")]))
    found = cl_platform.discover(cl)
    assert found.found == []
    assert found.reason.startswith("no OpenCL device works: platform 0 PoCL (3.0): pthread: ")
    assert BROKEN in found.reason and found.reason.endswith("(and 1 more)")


def test_devices_verbose_names_what_was_left_out(monkeypatch, capsys):
    reg = Reg("Stand-in", excluded=[ExcludedDevice("platform 1 PoCL (3.0-rc2): pthread-EPYC",
                                                   BROKEN)])
    registry = polydev.registry()
    monkeypatch.setattr(registry, "_regs", registry.regs + [reg])
    assert main(["devices", "-v"]) == 0
    out = capsys.readouterr().out
    assert f"backend Stand-in left out platform 1 PoCL (3.0-rc2): pthread-EPYC: {BROKEN}" in out
    assert main(["devices", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["excluded_devices"]
    assert {"backend": "Stand-in", "description": "platform 1 PoCL (3.0-rc2): pthread-EPYC",
            "reason": BROKEN} in listed
    assert main(["devices", "--require", "stand-in"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("polydev: error: backend Stand-in has no usable device")


# --- the probe on real devices, and a driver that crashes -----------------------------------------

def test_the_probe_passes_on_a_working_opencl_device():
    device = opencl_devices(1)[0]
    keep: list = []
    assert cl_probe.run_probe(device.cl, device.platform.context, device.cl_device, keep) is None


def test_a_probe_that_computes_wrong_values_says_so(monkeypatch):
    device = opencl_devices(1)[0]
    wrong = cl_probe.PROBE_SOURCE.replace("+ 1.0f", "+ 2.0f").replace("(1.0f)", "(2.0f)")
    monkeypatch.setattr(cl_probe, "PROBE_SOURCE", wrong)
    answer = cl_probe.run_probe(device.cl, device.platform.context, device.cl_device, [])
    assert answer.startswith("a kernel computed wrong values")


def test_a_driver_that_crashes_in_the_probe_is_left_out_with_its_last_words(tmp_path,
                                                                            monkeypatch):
    """The probe's child is killed by SIGABRT after the driver printed an error: polydev
    keeps running and says what the driver said."""
    crashing = tmp_path / "python"
    crashing.write_text("#!/bin/sh\necho 'LLVM ERROR: Do not know how to scalarize' >&2\n"
                        "echo 'still have references to IRs' >&2\nkill -ABRT $$\n")
    crashing.chmod(crashing.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(crashing))
    platform = SimpleNamespace(name="PoCL", version="3.0-rc2")
    device = SimpleNamespace(name="pthread", version="HSTR: znver3", driver_version="3.0")
    ((answer, fresh),) = cl_probe.probe_devices(1, platform, [(0, device)])
    assert fresh
    assert answer == ("the driver was killed by SIGABRT while building or running a kernel: "
                      "LLVM ERROR: Do not know how to scalarize")
    ((again, fresh),) = cl_probe.probe_devices(1, platform, [(0, device)])
    assert (again, fresh) == (answer, False)                # kept: no second crash


def test_a_driver_that_hangs_in_the_probe_is_left_out(tmp_path, monkeypatch):
    hanging = tmp_path / "python"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(hanging.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(hanging))
    monkeypatch.setattr(cl_probe, "PROBE_TIMEOUT_S", 0.5)
    platform = SimpleNamespace(name="PoCL", version="3.0-rc2")
    device = SimpleNamespace(name="pthread", version="v", driver_version="3.0")
    ((answer, _),) = cl_probe.probe_devices(0, platform, [(0, device)])
    assert answer == "building and running a 10-line kernel took over 0.5 s"


# --- CUDA: a GPU whose kernels do not build ------------------------------------------------------

def _stand_in_cupy(n_gpus: int, broken: set[int]):
    """CuPy over stand-in GPUs; NVRTC fails for the architecture of the GPUs in ``broken``
    (each GPU has its own), with its log as NVRTC gives it."""
    import contextlib

    class NVRTCError(Exception):
        pass

    current = [0]

    @contextlib.contextmanager
    def use(index):
        current[0] = index
        yield

    def compile_program(program, options):
        if any(option.endswith(tuple(f"sm_9{i}" for i in broken)) for option in options):
            raise NVRTCError("NVRTC_ERROR_COMPILATION (6)")

    class Module:
        def load(self, cubin):
            assert cubin == b"cubin"

    nvrtc = SimpleNamespace(
        getVersion=lambda: (13, 0), NVRTCError=NVRTCError,
        createProgram=lambda source, name, headers, names: 1, compileProgram=compile_program,
        getProgramLog=lambda program: ("polydev.cu(12): error: identifier \"__hmax\" is "
                                       "undefined\n1 error detected in the compilation"),
        getCUBIN=lambda program: b"cubin", destroyProgram=lambda program: None)

    runtime = SimpleNamespace(
        getDeviceCount=lambda: n_gpus, driverGetVersion=lambda: 13000,
        getDeviceProperties=lambda i: {"name": f"GPU {i}".encode(), "integrated": 0,
                                       "major": 9, "minor": i},
        deviceGetPCIBusId=lambda i: f"0000:{i:02x}:00.0", CUDARuntimeError=RuntimeError)
    cuda = SimpleNamespace(runtime=runtime, Device=use, nvrtc=nvrtc,
                           function=SimpleNamespace(Module=Module))
    return SimpleNamespace(cuda=cuda, __version__="14.0.0")


def test_a_gpu_whose_kernels_do_not_build_is_listed_unusable_with_the_reason(monkeypatch,
                                                                             tmp_path):
    from polydev.backends import cuda

    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "cupy", _stand_in_cupy(3, broken={1}))
    reg = cuda._make_reg()
    assert [(d.name, d.index, d.description) for d in reg.devices] == [
        ("CUDA0", 0, "GPU 0"), ("CUDA1", 2, "GPU 2")]
    (left_out,) = reg.excluded
    assert left_out.description == "GPU 1 GPU 1"
    assert left_out.reason == ("the CUDA kernels for GPU 1 did not build: polydev.cu(12): error: "
                               "identifier \"__hmax\" is undefined; 1 error detected in the "
                               "compilation")
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 2     # one per architecture
    again = cuda._make_reg()                                  # from the cache: no build
    assert [e.reason for e in again.excluded] == [left_out.reason]


def test_no_gpu_that_builds_means_no_devices_and_the_reason(monkeypatch, tmp_path):
    from polydev.backends import cuda

    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "cupy", _stand_in_cupy(1, broken={0}))
    reg = cuda._make_reg()
    assert reg.devices == []
    assert reg.unavailable_reason.startswith("no GPU can run the backend's kernels (the CUDA "
                                             "kernels for GPU 0 did not build: polydev.cu(12)")


def test_required_opencl_without_a_usable_device_stops_the_run_with_one_line():
    """POLYDEV_REQUIRE_OPENCL and no usable platform (here: none selected) is one line at
    once, not hundreds of failures."""
    env = {**os.environ, "POLYDEV_REQUIRE_OPENCL": "1", "POLYDEV_OPENCL_PLATFORM": "no such"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_env.py"], cwd=os.path.dirname(os.path.dirname(__file__)),
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == ["ERROR: POLYDEV_REQUIRE_OPENCL is set but no OpenCL device matches "
                     "POLYDEV_OPENCL_PLATFORM='no such' POLYDEV_OPENCL_DEVICE=None"], lines


def test_physical_cores_count_hyperthreads_once():
    from polydev.probes import cores_of

    def cpu(processor: int, package: int, core: int) -> str:
        return f"processor\t: {processor}\nphysical id\t: {package}\ncore id\t\t: {core}\n"
    # two packages of two cores, each with two hyperthreads (processors 0-7)
    text = "\n".join(cpu(p, p // 4, (p // 2) % 2) for p in range(8))
    assert cores_of(text, None) == 4
    assert cores_of(text, {0, 1}) == 1                   # both threads of one core
    assert cores_of(text, {0, 2, 4}) == 3
    assert cores_of("processor\t: 0\nmodel name\t: x\n", None) == 0   # no core ids
