"""llama.cpp's own C++ ``llama-bench`` as a bench script's anchor: which binary, how it runs,
and what it measured.

A binary is named on the command line as ``NAME=PATH`` or ``PATH`` (``--llama-bench``,
repeatable; bench/anchors.sh builds mainline's and ik_llama.cpp's and prints the options).
Each run is one process with the bench's thread count and flash attention on, one repetition
of each test (the bench script takes rounds in turns with polydev instead), its JSON read
back; ik_llama.cpp's binary (found by its ``-rtr`` option) runs with its run-time repacking,
its fastest CPU layout.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LlamaBench:
    """A llama-bench binary: its label in the figures and its path."""

    name: str
    path: str

    @classmethod
    def parse(cls, spec: str) -> "LlamaBench":
        """``NAME=PATH`` or ``PATH`` (named after its build folder: .../ik-native/bin/x is
        ``ik-native``)."""
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            parent = Path(path).resolve().parent
            name = parent.parent.name if parent.name == "bin" else parent.name
        if not os.access(path, os.X_OK):
            raise SystemExit(f"--llama-bench {spec}: {path} is not an executable file")
        return cls(name, path)

    @property
    def repacks(self) -> bool:
        """Whether this is ik_llama.cpp's llama-bench, which has run-time repacking (-rtr)."""
        done = subprocess.run([self.path, "--help"], capture_output=True, text=True,
                              check=False)
        return "-rtr" in done.stdout + done.stderr

    def command(self, model: str, threads: int, prompts: list[int], n_gen: int,
                extra: tuple[str, ...] = ()) -> list[str]:
        """The command that runs pp``prompts`` and tg``n_gen`` once each on ``model``, with
        llama-bench's options ``extra`` (``-ngl 99`` for a GPU build, say)."""
        cmd = [self.path, "-m", model, "-t", str(threads), "-fa", "1", "-ub", "512",
               "-p", ",".join(map(str, prompts)), "-n", str(n_gen), "-r", "1", "-o", "json"]
        return cmd + (["-rtr", "1"] if self.repacks else []) + list(extra)


def llama_bench_child(name: str, path: str, model: str, threads: int, prompts: list[int],
                      n_gen: int, extra: tuple[str, ...] = ()) -> dict:
    """Run llama-bench once (in the bench's child process, so that RUSAGE_CHILDREN is its
    own): {"pp<N>": t/s per prompt size, "tg": t/s, "rss": its peak RSS in bytes}."""
    bench = LlamaBench(name, path)
    done = subprocess.run(bench.command(model, threads, prompts, n_gen, extra),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{name} exited with {done.returncode}: {tail}")
    out: dict = {"rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
    for test in json.loads(done.stdout):
        if test["n_gen"]:
            out["tg"] = test["avg_ts"]
        else:
            out[f"pp{test['n_prompt']}"] = test["avg_ts"]
    return out
