"""Proving an OpenCL device works before it is offered: a tiny kernel built and run.

An installed platform is not always one that works: PoCL 3.0 (LLVM 14) fails every build on a
processor its LLVM does not know ("unknown target CPU 'generic'" on AMD's Zen 5). So every
device builds and runs ``PROBE_SOURCE`` once, in a child process (a driver that crashes in its
compiler must not take polydev down), and the answer is kept per platform, driver version,
device and CPU (``polydev.probes``): after the first time it costs a file read.

Run as ``python -m polydev.backends.opencl.probe`` it is that child: it reads
``{"platform": i, "name": ..., "version": ..., "devices": [j, ...]}`` on stdin and prints one
JSON list, an answer per device (null: it works; else why not).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np

from polydev.probes import cached_probes, error_lines, host_cpu

PROBE_KIND = "opencl"
# A working driver builds and runs the probe in about a second, cold; one that needs this
# long is unusable for polydev's forty programs. (PyPI's PoCL on AMD Zen 4 churns through 3 GB
# for one to three minutes before it crashes.)
PROBE_TIMEOUT_S = 30
# What polydev's kernels lean on, in one kernel: 16-wide vectors passed to and returned from
# the driver's library (exp, sqrt, fma, conversions), halves, integer shifts. A driver whose
# compiler and library disagree on how wide vectors are passed fails here: PyPI's PoCL 3.0
# on AMD Zen 4 builds for "znver3" (no AVX-512) against its AVX-512 library, and its LLVM
# aborts ("Do not know how to scalarize this operator's operand") or computes garbage.
PROBE_SOURCE = """
__kernel void polydev_probe(__global const float *x, __global const half *h,
                            __global float *y) {
    const int i = get_global_id(0);
    const float16 v = vload16(i, x);
    float16 r = exp(v) + sqrt(fabs(v)) * v;
    r += convert_float16(convert_int16(v * 4.0f) >> 1);
    r = fma(r, v, (float16)(1.0f)) + vload_half16(i, h);
    vstore16(r, i, y);
}
"""
PROBE_ROWS = 4                 # work-items, 16 values each
PROBE_TOLERANCE = 1e-5         # relative: OpenCL's exp and sqrt may differ by a few ulp


def _probe_inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The probe's inputs and the values it must compute (float64, from numpy)."""
    x = ((np.arange(16 * PROBE_ROWS) - 20) / 8).astype(np.float32)
    h = (np.arange(16 * PROBE_ROWS) / 16).astype(np.float16)
    v = x.astype(np.float64)
    r = np.exp(v) + np.sqrt(np.abs(v)) * v + ((x * 4).astype(np.int32) >> 1)
    return x, h, r * v + 1 + h.astype(np.float64)


def compiler_message(error: Exception, limit: int = 3) -> str:
    """The compiler's own error lines from pyopencl's build exception (its log holds the
    whole build output, notes and option lists included)."""
    lines = [line for line in error_lines(str(error))
             if not line.startswith("clBuildProgram failed")]
    return "; ".join(lines[:limit]) or str(error).strip()


def run_probe(cl: Any, context: Any, device: Any, keep: list) -> str | None:
    """Build and run the probe kernel on ``device``: None when it computes the right values,
    else why not. A driver may also crash or abort in here: run it in a child process. The
    OpenCL objects made go to ``keep``, never released: a broken driver may abort as it
    releases them (PyPI's PoCL on Zen 4 does), before the child has given its answer."""
    try:
        program = cl.Program(context, PROBE_SOURCE)
        keep.append(program)
        program.build(devices=[device])
    except Exception as e:        # cl.Error with the build log, or worse
        return f"cannot build a kernel: {compiler_message(e)}"
    x, h, expected = _probe_inputs()
    try:
        queue = cl.CommandQueue(context, device)
        flags = cl.mem_flags
        x_buf = cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=x)
        h_buf = cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=h)
        y_buf = cl.Buffer(context, flags.WRITE_ONLY, x.nbytes)
        keep += [queue, x_buf, h_buf, y_buf]
        kernel = cl.Kernel(program, "polydev_probe")
        keep.append(kernel)
        kernel(queue, (PROBE_ROWS,), None, x_buf, h_buf, y_buf)
        out = np.empty_like(x)
        cl.enqueue_copy(queue, out, y_buf)
        queue.finish()
    except Exception as e:        # cl.Error, or pyopencl not finding the kernel it built
        return f"cannot run a kernel: {type(e).__name__}: {e}"
    error = np.abs(out - expected) / np.maximum(np.abs(expected), 1.0)
    if not error.max() <= PROBE_TOLERANCE:          # NaN fails too
        worst = int(np.nanargmax(error)) if not np.isnan(error).all() else 0
        return (f"a kernel computed wrong values: {out[worst]!r} where {expected[worst]:.6g} "
                f"is right")
    return None


def compiler_identity(platform: Any, device: Any) -> dict[str, object]:
    """What a program's binary depends on besides its source and options: the platform, the
    driver, the device (whose version names the compiler's target CPU on PoCL) and this
    machine's CPU."""
    return {"platform": platform.name.strip(), "platform_version": platform.version.strip(),
            "device": device.name.strip(), "device_version": device.version.strip(),
            "driver_version": device.driver_version.strip(), "cpu": host_cpu()}


def device_key(platform_index: int, platform: Any, device: Any) -> dict[str, object]:
    """Everything a device's answer depends on: the compiler's identity, and the platform's
    place in the ICD loader's list (two installs of one driver differ by nothing else)."""
    return {"platform_index": platform_index, **compiler_identity(platform, device)}


def probe_devices(platform_index: int, platform: Any,
                  devices: list[tuple[int, Any]]) -> list[tuple[str | None, bool]]:
    """``(answer, fresh)`` for each ``(index in its platform, cl.Device)``: None where the
    device works, else why not; ``fresh`` where the probe ran now rather than coming from the
    cache."""
    keys = [device_key(platform_index, platform, d) for _, d in devices]

    def probe(indices: list[int]) -> list[str | None]:
        return _probe_in_child(platform_index, platform, [devices[i][0] for i in indices])

    return cached_probes(PROBE_KIND, keys, probe)


def _probe_in_child(platform_index: int, platform: Any, device_indices: list[int]) -> list:
    """The answers of a child process that probes the devices (one reason for all of them
    where the child gives none)."""
    request = {"platform": platform_index, "name": platform.name.strip(),
               "version": platform.version.strip(), "devices": device_indices}
    # the child reads no POLYDEV_* variable (it is told what to probe): without them it has
    # nothing to warn about, and its stderr holds the driver's words alone
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYDEV_")}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(request),
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        why = f"building and running a 10-line kernel took over {PROBE_TIMEOUT_S} s"
        return [why] * len(device_indices)
    except OSError:                       # no interpreter to start (embedded): probe here
        return _child(request)
    answers = _answers(done)
    if isinstance(answers, list) and len(answers) == len(device_indices):
        return answers
    return [answers if isinstance(answers, str) else
            f"the probe gave {answers!r} for {len(device_indices)} devices"] * len(device_indices)


def _answers(done: subprocess.CompletedProcess) -> list | str:
    """The child's list of answers, or why it gave none."""
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        if done.returncode != 0:
            return _child_failure(done)
        return f"the probe printed no answer: {done.stdout[-200:]!r}"


def _child_failure(done: subprocess.CompletedProcess) -> str:
    """Why the child ended without an answer: the signal that killed it, or its last line."""
    if done.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-done.returncode}"
    else:
        how = f"exited with status {done.returncode}"
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    # the driver's own error line, else its last words
    said = (error_lines(done.stderr) or lines or [""])[-1]
    return f"the driver {how} while building or running a kernel{': ' + said if said else ''}"


def _child(request: dict) -> list[str | None]:
    """In the child: probe the requested devices of the requested platform."""
    import pyopencl as cl

    platforms = cl.get_platforms()
    index = request["platform"]
    if index >= len(platforms):
        return [f"platform {index} is gone"] * len(request["devices"])
    platform = platforms[index]
    if (platform.name.strip(), platform.version.strip()) != (request["name"], request["version"]):
        return [f"platform {index} is now {platform.name.strip()!r}"] * len(request["devices"])
    all_devices = platform.get_devices(device_type=cl.device_type.ALL)
    chosen = [all_devices[j] for j in request["devices"]]
    try:
        context = cl.Context(chosen)
    except cl.Error as e:
        return [f"cannot create a context: {e}"] * len(chosen)
    keep = [context]
    return [run_probe(cl, context, d, keep) for d in chosen]


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.stdin.read()))), flush=True)
    os._exit(0)        # skip the driver's teardown: a broken one may crash there, answer given
