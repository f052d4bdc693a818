"""``polydev compare``: every device against the CPU backend, op by op (test-backend-ops)."""

from __future__ import annotations

import argparse
import re
import sys
import threading
from contextlib import nullcontext
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

import polydev
from polydev import Device
from polydev.errors import InvalidArgumentError

from .case import Case
from .catalogue import (all_op_names, check_op_filter, eval_cases, parse_op_filter, perf_cases,
                        select)
from .coverage import coverage_report
from .report import ConsolePrinter, Printer, make_printer
from .runner import Result, Status, run_perf, run_support, run_test

REFERENCE_DEVICE = "CPU"
# --reference: the CPU backend as it runs (compiled kernels where they apply), or its numpy
# kernels alone (ggml's use_ref: then the compiled CPU kernels are checked like any device)
REFERENCES = {"cpu": None, "numpy": "numpy"}
CHUNK = 100            # cases per job with -j, as test-backend-ops hands them out


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev compare [test|perf|support] ...``."""
    p = sub.add_parser(
        "compare", parents=parents,
        help="check every device's ops against the CPU backend (test-backend-ops)",
        description="Run the op cases on each device and compare every result with the CPU "
                    "backend (mode test), time them (perf) or ask which are supported (support). "
                    "Exit status 0 only if every tested device passed.")
    p.add_argument("mode", nargs="?", default="test", choices=["test", "perf", "support"],
                   help="test (default): compare with the CPU; perf: time realistic sizes; "
                        "support: list SUPPORTED / NOT SUPPORTED without computing")
    p.add_argument("-o", dest="ops", metavar="OPS",
                   help="comma-separated op names (ADD,MUL_MAT,SILU; any case) or full case "
                        "names 'OP(vars)'")
    p.add_argument("-b", dest="devices", metavar="DEVICES",
                   help="comma-separated device names to test (default: every device)")
    p.add_argument("-p", dest="params", metavar="REGEX",
                   help="only cases whose parameters match this regular expression")
    p.add_argument("--output", type=str.lower, choices=["console", "csv", "json"],
                   default="console",
                   help="console (default; coloured on a terminal), csv, or json: one JSON "
                        "object per line, per case as it finishes, then per device and a "
                        "summary")
    p.add_argument("--list-ops", action="store_true", help="print every op name and exit")
    p.add_argument("--show-coverage", action="store_true",
                   help="which ops have cases and which devices have kernels for them")
    p.add_argument("-j", dest="jobs", type=_count(1), default=1, metavar="N",
                   help="parallel jobs in test mode, each with its own backends (default 1)")
    p.add_argument("--seed", type=_count(0), default=0,
                   help="seed of the random inputs, 0 or more (default 0)")
    p.add_argument("--reference", type=str.lower, choices=sorted(REFERENCES), default="cpu",
                   help="what each device is compared with: cpu (default), the CPU backend as "
                        "it runs; numpy, its numpy kernels alone, so that -b CPU checks the "
                        "compiled CPU kernels against them")
    p.add_argument("--model", metavar="GGUF",
                   help="instead of the op cases: compute this model's graph for --prompt on "
                        "each -b device and on the CPU, node by node, and print the first node "
                        "that differs beyond its threshold")
    p.add_argument("--prompt", default="The capital of France is",
                   help="the prompt of --model (default: 'The capital of France is')")
    p.set_defaults(run=run)


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value
    return parse


def run(args: argparse.Namespace) -> int:
    """Run the selected cases on the selected devices; 0 only if every device passed."""
    if args.list_ops:
        print("\n".join(all_op_names()))
        return 0
    if args.model is not None:
        return _compare_model(args)
    devices = polydev.devices()
    if args.show_coverage:
        print(coverage_report(eval_cases(), devices))
        return 0
    cases = _selected_cases(args)
    wanted = _wanted_devices(args.devices)
    printer = make_printer(args.output)
    if isinstance(printer, ConsolePrinter):
        reference = REFERENCE_DEVICE + ("" if args.reference == "cpu" else f"-{args.reference}")
        printer.start(len(devices), reference if args.mode == "test" else "")
    devices_ok, failures = 0, []
    for i, device in enumerate(devices):
        if wanted is not None and device.name.lower() not in wanted:
            printer.device_header(i, len(devices), device.name, skip_reason="Skipping")
            devices_ok += 1
            continue
        printer.device_header(i, len(devices), device.name, device.description, device.memory())
        results = _run_device(device, cases, args, printer)
        failed = [r for r in results if r.status is Status.FAIL]
        ok = not failed
        if args.mode == "test":
            passed = sum(r.status is Status.OK for r in results)
            supported = sum(r.status is not Status.NOT_SUPPORTED for r in results)
            printer.device_summary(device.name, passed, supported, ok)
        devices_ok += ok
        failures += failed
    printer.finish(devices_ok, len(devices), failures, args.mode)
    return 0 if devices_ok == len(devices) else 1


def _compare_model(args: argparse.Namespace) -> int:
    from .model import compare_model

    if not args.devices:
        raise InvalidArgumentError("compare --model needs the devices to check: -b OpenCL0")
    names = [d.strip() for d in args.devices.split(",") if d.strip()]
    return max(compare_model(args.model, name, args.prompt) for name in names)


def _selected_cases(args: argparse.Namespace) -> list[Case]:
    op_filter = None
    if args.ops is not None:
        op_filter = check_op_filter(parse_op_filter(args.ops))
        if not op_filter:
            raise InvalidArgumentError(f"-o {args.ops!r} names no op")
    if args.params:
        try:
            re.compile(args.params)
        except re.error as e:
            raise InvalidArgumentError(f"-p {args.params!r} is not a regular expression: {e}")
    source = perf_cases() if args.mode == "perf" else eval_cases()
    cases = list(select(source, op_filter, args.params))
    if not cases:
        given = " ".join(f"{flag} {value!r}" for flag, value in
                         (("-o", args.ops), ("-p", args.params)) if value)
        raise InvalidArgumentError(f"no {args.mode} case matches {given}")
    return cases


def _wanted_devices(names: str | None) -> set[str] | None:
    if names is None:
        return None
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise InvalidArgumentError(f"-b {names!r} names no device")
    for name in wanted:          # an unknown name is a mistake, not a silent skip
        polydev.device(name)
    return {polydev.device(n).name.lower() for n in wanted}


def _run_device(device: Device, cases: Sequence[Case], args: argparse.Namespace,
                printer: Printer) -> list[Result]:
    progress = _Progress(device.name, len(cases), enabled=args.output != "console")
    reference = polydev.device(REFERENCE_DEVICE)

    def run_case(c: Case, backend, ref, rng) -> Result:
        if args.mode == "test":
            return run_test(c, backend, ref, rng)
        return run_perf(c, backend, rng) if args.mode == "perf" else run_support(c, backend)

    stop = threading.Event()          # set on Ctrl-C: the jobs end after their current case

    def run_chunk(chunk: Sequence[Case], seed: int, report: Callable[[Result], None]) -> list:
        rng = np.random.default_rng(seed)
        out = []
        reference_backend = (reference.init_backend(REFERENCES[args.reference])
                             if args.mode == "test" else nullcontext())
        with device.init_backend() as backend, reference_backend as ref:
            for c in chunk:
                if stop.is_set():
                    break
                out.append(run_case(c, backend, ref, rng))
                report(out[-1])
        return out

    def report(r: Result) -> None:
        printer.result(r)
        progress.step()

    try:
        if args.jobs == 1 or args.mode != "test":
            return run_chunk(cases, args.seed, report)
        chunks = [cases[i:i + CHUNK] for i in range(0, len(cases), CHUNK)]
        results: list[Result] = []
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(run_chunk, chunk, args.seed + i, lambda r: None)
                       for i, chunk in enumerate(chunks)]
            try:
                for future in futures:          # printed in catalogue order, chunk by chunk
                    for r in future.result():
                        report(r)
                        results.append(r)
            except BaseException:               # Ctrl-C: drop the queued chunks, stop the rest
                stop.set()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        return results
    finally:
        progress.done()


class _Progress:
    """A one-line counter on stderr while csv/json goes to stdout (terminal only)."""

    def __init__(self, name: str, total: int, enabled: bool) -> None:
        self.name, self.total, self.n = name, total, 0
        self.enabled = enabled and sys.stderr.isatty()

    def step(self) -> None:
        self.n += 1
        if self.enabled and (self.n % 20 == 0 or self.n == self.total):
            print(f"\r{self.name}: {self.n}/{self.total} cases", end="", file=sys.stderr,
                  flush=True)

    def done(self) -> None:
        if self.enabled:
            print(file=sys.stderr)
