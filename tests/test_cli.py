"""The ``polydev`` command as people use it: mistakes are one line and exit status 1, Ctrl-C and
closed pipes end without a traceback, options work in any case and in any position."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import polydev
from polydev.tools.cli import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, main

COMMAND = [sys.executable, "-m", "polydev.tools.cli"]


def _polydev(*argv: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(COMMAND + list(argv), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, **kwargs)


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"polydev {polydev.__version__}"


@pytest.mark.parametrize("argv", [["--log-level", "debug", "devices"],
                                  ["devices", "--log-level", "Debug"],
                                  ["devices", "--log-level=DEBUG", "--json"]])
def test_log_level_in_any_case_before_or_after_the_subcommand(argv):
    done = _polydev(*argv)
    assert done.returncode == 0, done.stderr
    assert "DEBUG polydev.registry: backend CPU" in done.stderr     # something useful


def test_a_bad_log_level_is_a_usage_error():
    done = _polydev("devices", "--log-level", "loud")
    assert done.returncode == 2 and "'loud' is not one of DEBUG" in done.stderr
    assert "Traceback" not in done.stderr


def _cut_short(argv: str, head: str) -> subprocess.CompletedProcess:
    """``polydev argv | head``: what head printed, what polydev said on stderr, and polydev's
    exit status (pipefail: head's own is 0). ``--log-level error``: the log's warnings are not
    the pipe's business, and one of them comes and goes with the machine's probe cache (the
    "OpenCL device left out" of a broken driver is said once, by the process that probes)."""
    command = f"set -o pipefail; {sys.executable} -m polydev.tools.cli --log-level error {argv}"
    return subprocess.run(["bash", "-c", f"{command} | {head}"], capture_output=True,
                          text=True, timeout=300)


def test_a_closed_pipe_ends_quietly():
    done = _cut_short("devices --json", "head -c 1")
    assert done.stdout == "{" and done.stderr == ""
    # 0 where it wrote everything before head closed the pipe
    assert done.returncode in (0, EXIT_BROKEN_PIPE)
    # a long stream cut short: the writer meets the closed pipe mid-run
    done = _cut_short("compare -b CPU -o ADD,MUL --output json", "head -n 1")
    assert json.loads(done.stdout)["type"] in ("case", "device") and done.stderr == ""
    assert done.returncode == EXIT_BROKEN_PIPE


def test_ctrl_c_stops_a_parallel_run_early_without_a_traceback():
    """Ctrl-C ends the run where it is: status 130, one line, the cases already printed kept
    whole, no summary, and far fewer cases than the whole run has. How fast it stops is a
    figure of bench/interrupt.py, not a limit here (a loaded machine cannot keep one)."""
    proc = subprocess.Popen(COMMAND + ["compare", "-b", "CPU", "-j", "2", "--output", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while json.loads(proc.stdout.readline())["type"] != "case":
        pass                                 # skipped devices first; then the first chunk
    proc.send_signal(signal.SIGINT)
    # read the rest through the same buffered reader: communicate() reads the raw pipe and
    # would miss what readline() had already buffered, cutting the next line in two
    out = proc.stdout.read()
    err = proc.stderr.read()
    proc.wait(timeout=120)                   # a hang guard, not a speed limit
    assert proc.returncode == EXIT_INTERRUPTED
    assert _one_line_error(err) == "polydev: interrupted"
    assert all(json.loads(line)["type"] == "case" for line in out.splitlines())   # kept
    assert "summary" not in out
    every = _polydev("compare", "support", "-b", "CPU", "--output", "json").stdout
    n_cases = sum(json.loads(line)["type"] == "case" for line in every.splitlines())
    assert len(out.splitlines()) < n_cases / 4, "it ran on after Ctrl-C"


@pytest.mark.parametrize("argv,message", [
    (["-p", "nomatch"], "no test case matches -p 'nomatch'"),
    (["-o", "ADD", "-p", "nomatch"], "no test case matches -o 'ADD' -p 'nomatch'"),
    (["-b", ","], "-b ',' names no device"),
    (["-b", ""], "-b '' names no device"),
    (["-o", ","], "-o ',' names no op"),
    (["-o", "mul_matt"], "did you mean MUL_MAT"),
])
def test_a_selection_that_matches_nothing_is_an_error(capsys, argv, message):
    assert main(["compare", *argv]) == 1
    captured = capsys.readouterr()
    assert message in _one_line_error(captured.err)
    assert "OK" not in captured.out


@pytest.mark.parametrize("argv,message", [
    (["--seed", "-1"], "-1 is less than 0"),
    (["-j", "0"], "0 is less than 1"),
    (["--output", "xml"], "invalid choice: 'xml'"),
])
def test_bad_numbers_and_choices_are_usage_errors(argv, message):
    done = _polydev("compare", *argv)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["run", "bench"])
def test_a_bad_numerics_is_a_usage_error(command):
    done = _polydev(command, "--numerics", "approximate")
    assert done.returncode == 2 and "invalid choice: 'approximate'" in done.stderr
    assert "Traceback" not in done.stderr


def test_op_names_and_output_are_case_insensitive(capsys):
    assert main(["compare", "-b", "cpu", "-o", "add,Silu", "-p", "ne_a=\\[128,2,2,2\\]|ne=\\[10,5",
                 "--output", "JSON"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["op_name"] for r in records if r["type"] == "case"} == {"ADD", "SILU"}


def test_json_output_streams_one_object_per_case(capsys):
    assert main(["compare", "-b", "CPU", "-o", "NEG,ABS", "--output", "json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    records = [r for r in records if "skipped" not in r]       # the devices not named by -b
    kinds = [r["type"] for r in records]
    assert kinds == ["case"] * (len(kinds) - 2) + ["device", "summary"]
    assert all(r["passed"] and r["backend_name"] == "CPU" for r in records[:-2])
    assert records[-1]["ok"] is True


def test_asking_for_a_device_of_an_unusable_backend_says_why(capsys):
    reasons = {r.name: r.unavailable_reason for r in polydev.registry().regs if not r.devices}
    if "CUDA" not in reasons:
        pytest.skip("the CUDA backend has devices here")
    assert main(["compare", "-b", "cuda:0"]) == 1
    line = _one_line_error(capsys.readouterr().err)
    assert "backend CUDA has none" in line and reasons["CUDA"] in line


def test_a_bad_environment_variable_is_an_error_naming_it_not_a_missing_device():
    env = {"POLYDEV_CPU_WEIGHT_CACHE_MB": "abc"}
    listed = _polydev("devices", "--json", env=env)
    assert listed.returncode == 0
    assert [d["name"] for d in json.loads(listed.stdout)["devices"]][-1] == "CPU"
    script = ("import numpy as np, polydev\n"
              "from polydev import Context, GGMLType, BufferUsage, alloc_ctx_tensors, ops\n"
              "from polydev import build_graph\n"
              # BF16: a weight type the compiled kernels leave to the float32 weight cache
              "ctx = Context(); w = ctx.new_tensor_2d(GGMLType.BF16, 32, 4)\n"
              "x = ctx.new_tensor_1d(GGMLType.F32, 32); y = ops.mul_mat(ctx, w, x)\n"
              "cpu = polydev.init_backend('CPU'); buf = alloc_ctx_tensors(ctx, cpu)\n"
              "buf.usage = BufferUsage.WEIGHTS\n"
              "cpu.graph_compute(build_graph(y))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert done.returncode == 1
    assert "ConfigError: POLYDEV_CPU_WEIGHT_CACHE_MB='abc' is not a finite number" in done.stderr


def test_no_command_prints_help():
    done = _polydev()
    assert done.returncode == 2 and "commands:" in done.stdout
