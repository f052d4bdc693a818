"""What ``polydev compare`` prints: test-backend-ops' console lines (coloured on a terminal),
its CSV columns, or JSON lines."""

from __future__ import annotations

import csv
import json
import os
import sys
from typing import TextIO

from .runner import Result, Status

# test-backend-ops' csv columns, in its field order
CSV_FIELDS = ("backend_name", "op_name", "op_params", "test_mode", "supported", "error_message",
              "backend_reg_name")
PERF_FIELDS = ("time_us", "flops", "bandwidth_gb_s", "memory_kb", "n_runs")

GREEN, RED, YELLOW, RESET = "\033[1;32m", "\033[1;31m", "\033[1;33m", "\033[0m"


def use_colour(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def _si(value: float, unit: str) -> str:
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:8.2f} {prefix}{unit}"
    return f"{value:8.2f} {unit}"


class Printer:
    """The interface of the three formats; the console one prints as it goes."""

    def device_header(self, index: int, total: int, name: str, description: str = "",
                      memory: tuple[int, int] | None = None, skip_reason: str = "") -> None:
        pass

    def result(self, r: Result) -> None:
        pass

    def device_summary(self, name: str, passed: int, total: int, ok: bool) -> None:
        pass

    def finish(self, devices_ok: int, devices_total: int, failures: list[Result],
               mode: str) -> None:
        pass


class ConsolePrinter(Printer):
    def __init__(self, stream: TextIO | None = None, colour: bool | None = None) -> None:
        self.out = stream = stream or sys.stdout
        self.colour = use_colour(stream) if colour is None else colour

    def _paint(self, text: str, colour: str) -> str:
        return f"{colour}{text}{RESET}" if self.colour else text

    def _print(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def start(self, n_devices: int, reference: str = "") -> None:
        against = f" against {reference}" if reference else ""
        self._print(f"Testing {n_devices} devices{against}\n")

    def device_header(self, index, total, name, description="", memory=None, skip_reason=""):
        self._print(f"Backend {index + 1}/{total}: {name}")
        if skip_reason:
            self._print(f"  {skip_reason}")
            return
        self._print(f"  Device description: {description}")
        if memory is not None:
            free, total_mem = memory
            self._print(f"  Device memory: {total_mem // 2**20} MB ({free // 2**20} MB free)")
        self._print()

    def result(self, r: Result) -> None:
        head = f"  {r.case_name}: "
        if r.test_mode == "support":
            self._print(head + (self._paint("SUPPORTED", GREEN) if r.supported
                                else self._paint("NOT SUPPORTED", RED)))
        elif r.status is Status.NOT_SUPPORTED:
            self._print(head + f"not supported [{r.error_message or r.backend_name}]")
        elif r.test_mode == "perf":
            self._print(head + self._perf_figures(r, len(head)))
        elif r.passed:
            self._print(head + self._paint("OK", GREEN))
        else:   # the checker's messages first, as test-backend-ops prints them
            self._print(f"{r.error_message}  {head.strip()} " + self._paint("FAIL", RED))

    @staticmethod
    def _perf_figures(r: Result, used: int) -> str:
        width = (used + 7) // 8 * 8       # align the figures like test-backend-ops
        if width - used < 5:
            width += 8
        pad = " " * (width - used)
        line = f"{pad}{r.n_runs:8d} runs - {r.time_us:8.2f} us/run - "
        if r.flops:
            flop_per_run = r.flops * r.time_us / 1e6
            return line + f"{_si(flop_per_run, 'FLOP')}/run - {_si(r.flops, 'FLOPS')}"
        return line + f"{r.memory_kb:8d} kB/run - {r.bandwidth_gb_s:7.2f} GB/s"

    def device_summary(self, name, passed, total, ok):
        self._print(f"  {passed}/{total} tests passed")
        self._print(f"  Backend {name}: " + (self._paint("OK", GREEN) if ok
                                              else self._paint("FAIL", RED)))
        self._print()

    def finish(self, devices_ok, devices_total, failures, mode):
        self._print(f"{devices_ok}/{devices_total} backends passed")
        ok = devices_ok == devices_total
        self._print(self._paint("OK", GREEN) if ok else self._paint("FAIL", RED))
        if failures:
            self._print("\nFailing tests:")
            for r in failures:
                self._print(f"  [{r.backend_name}] {r.case_name}")


class CsvPrinter(Printer):
    """test-backend-ops' csv: one row per case, its seven columns (supported as 0/1)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stdout
        self.writer = csv.writer(stream, quoting=csv.QUOTE_ALL, lineterminator="\n")
        self.writer.writerow(CSV_FIELDS)
        self.stream = stream

    def result(self, r: Result) -> None:
        row = r.as_dict()
        row["supported"] = int(r.supported)
        self.writer.writerow([row[f] for f in CSV_FIELDS])
        self.stream.flush()


class JsonLinesPrinter(Printer):
    """JSON lines, each written and flushed as soon as it is known, so an interrupted run
    keeps what it measured: ``{"type": "case", ...}`` per case (the csv fields, ``passed``,
    and the figures in perf mode), ``{"type": "device", ...}`` per device, and a last
    ``{"type": "summary", ...}``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def _write(self, record: dict) -> None:
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()

    def result(self, r: Result) -> None:
        row = {"type": "case", **{f: getattr(r, f) for f in CSV_FIELDS}, "passed": r.passed}
        if r.test_mode == "perf" and r.supported:
            row.update({f: getattr(r, f) for f in PERF_FIELDS})
        self._write(row)

    def device_header(self, index, total, name, description="", memory=None, skip_reason=""):
        if skip_reason:
            self._write({"type": "device", "name": name, "skipped": skip_reason})

    def device_summary(self, name, passed, total, ok):
        self._write({"type": "device", "name": name, "passed": passed, "total": total, "ok": ok})

    def finish(self, devices_ok, devices_total, failures, mode):
        self._write({"type": "summary", "mode": mode, "ok": devices_ok == devices_total,
                     "backends_passed": devices_ok, "backends_total": devices_total,
                     "failures": [f"[{r.backend_name}] {r.case_name}" for r in failures]})


def make_printer(output: str, stream: TextIO | None = None) -> Printer:
    """The printer of ``--output`` (console, csv or json)."""
    printers = {"console": ConsolePrinter, "csv": CsvPrinter, "json": JsonLinesPrinter}
    return printers[output](stream)
