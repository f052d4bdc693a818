"""How fast Ctrl-C stops a long ``polydev`` command: ``polydev compare -b CPU -j 2`` is sent
SIGINT once its first case is out, and the time until it has exited (status 130) is
measured, median of several runs. Target: under a second (the test suite checks only that it
stops early and cleanly; a loaded machine cannot keep a time limit in a test)."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time

from polydev.backends.cpu.device import cpu_model

from figures import parse_args, print_figures  # bench/figures.py

COMMAND = [sys.executable, "-m", "polydev.tools.cli", "compare", "-b", "CPU", "-j", "2",
           "--output", "json"]
TARGET_S = 1.0


def stop_time() -> float:
    """Seconds from SIGINT (sent after the first case) to the process's exit."""
    proc = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    while json.loads(proc.stdout.readline())["type"] != "case":
        pass
    start = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    proc.wait(timeout=120)
    elapsed = time.perf_counter() - start
    if proc.returncode != 130:
        raise SystemExit(f"polydev compare ended with status {proc.returncode}, not 130")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    args = parse_args(__doc__, argv)
    runs = [stop_time() for _ in range(3 if args.quick else 7)]
    median = statistics.median(runs)
    print_figures("interrupt", cpu_model(), [
        {"name": "Ctrl-C to exit, polydev compare -j 2", "value": round(median, 3), "unit": "s",
         "target": TARGET_S, "better": "lower",
         "detail": f"median of {len(runs)}; {min(runs):.3f}-{max(runs):.3f} s"},
    ], args.json)


if __name__ == "__main__":
    main()
