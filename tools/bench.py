"""``polydev bench``: llama-bench for polydev. Prompt processing (``-p``), generation (``-n``)
and both (``-pg``) for each model and device mix, repeated ``-r`` times, as a markdown table
(default), CSV, JSON or JSON lines (streamed as each row finishes).

The tests are llama-bench's: ppN evaluates N random tokens in ubatches of ``-b``; tgN
evaluates N tokens one at a time after the context is warmed with one token; pgP,N does both.
Each repetition starts from an empty context after one warm-up run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from polydev.errors import InvalidArgumentError, MissingDependencyError

from .info import add_numerics_option
from .placement_options import placement_settings

FORMATS = ("md", "csv", "json", "jsonl")


@dataclass
class Row:
    model: str
    size_mib: float
    params_m: float
    devices: str
    ngl: int
    test: str
    t_s: float
    stddev: float
    reps: int

    def cells(self) -> list:
        return [self.model, f"{self.size_mib:.2f} MiB", f"{self.params_m:.2f} M", self.devices,
                self.ngl, self.test, f"{self.t_s:.2f} ± {self.stddev:.2f}"]


HEADERS = ["model", "size", "params", "devices", "ngl", "test", "t/s"]


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidArgumentError(f"{what} {text!r}: expected numbers such as 512,1024") from None
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"{what} {text!r}: numbers must be 0 or more")
    return values


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    """``polydev bench [-m MODEL ...] [-p N] [-n N] [-pg P,N] [-ngl N] ...``."""
    p = sub.add_parser("bench", parents=parents, help="llama-bench: prompt and generation t/s",
                       description="Measure prompt processing and generation speed, as "
                                   "llama-bench does, for each model and device mix.")
    p.add_argument("-m", "--model", action="append", metavar="PATH",
                   help="a GGUF file (repeat for several; default: gemma-3-270m)")
    p.add_argument("-p", "--n-prompt", default="512", metavar="N[,N]",
                   help="prompt sizes to test (default 512; 0 = none)")
    p.add_argument("-n", "--n-gen", default="128", metavar="N[,N]",
                   help="generated tokens to test (default 128; 0 = none)")
    p.add_argument("-pg", metavar="P,N", action="append", default=[],
                   help="a prompt of P tokens then N generated, timed together (may repeat)")
    p.add_argument("-r", "--repetitions", type=int, default=5, metavar="N",
                   help="repetitions of each test (default 5)")
    p.add_argument("-o", "--output", choices=FORMATS, default="md",
                   help="md (default), csv, json, or jsonl (one row per line as it finishes)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, metavar="N",
                   help="layers to offload (default -1 = all)")
    p.add_argument("-ts", "--tensor-split", metavar="A,B", help="share of layers per device")
    p.add_argument("--device", dest="devices", metavar="D1,D2",
                   help="devices to offload to, or 'none'")
    p.add_argument("-b", "--batch-size", dest="n_batch", type=int, default=512, metavar="N",
                   help="ubatch size for prompts (default 512)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random tokens")
    add_numerics_option(p)
    p.set_defaults(run=run)


def _tests(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    tests = [(f"pp{n}", n, 0) for n in _ints(args.n_prompt, "-p") if n]
    tests += [(f"tg{n}", 0, n) for n in _ints(args.n_gen, "-n") if n]
    for pg in args.pg:
        values = _ints(pg, "-pg")
        if len(values) != 2:
            raise InvalidArgumentError(f"-pg {pg!r}: expected P,N such as 512,128")
        tests.append((f"pp{values[0]}+tg{values[1]}", values[0], values[1]))
    if not tests:
        raise InvalidArgumentError("nothing to measure: -p, -n and -pg are all empty")
    return tests


def measure(model, n_prompt: int, n_gen: int, rng: np.random.Generator) -> float:
    """Seconds of one llama-bench test on ``model`` (its context emptied first)."""
    model.reset()
    vocab = model.hparams.n_vocab
    start = time.perf_counter()
    if n_prompt:
        model.evaluator.eval(rng.integers(0, vocab, n_prompt))
    if n_gen:
        if not n_prompt:
            model.evaluator.eval(rng.integers(0, vocab, 1))    # llama-bench's warm token
            start = time.perf_counter()
        for token in rng.integers(0, vocab, n_gen):
            model.evaluator.eval([int(token)])
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    try:
        from polydev.models import GGUFFile, default_model_path, load
    except ImportError as e:
        raise MissingDependencyError(f"polydev bench needs the models extra: pip install "
                                     f"'polydev[models]' ({e})") from None
    if args.repetitions < 1:
        raise InvalidArgumentError(f"-r must be 1 or more, got {args.repetitions}")
    tests = _tests(args)
    paths = args.model or [str(default_model_path())]
    settings = placement_settings(args, n_ctx=max(p + n for _, p, n in tests) + 1)
    rows: list[Row] = []
    rng = np.random.default_rng(args.seed)
    for path in paths:
        with GGUFFile(path) as f:
            size = sum(t.nbytes for t in f.tensors.values()) / 2**20
            params = sum(t.n_elements for t in f.tensors.values()) / 1e6
        with load(path, settings=settings, progress=False, numerics=args.numerics) as model:
            devices = "+".join(dict.fromkeys(d.name for d in model.placement.layer_devices))
            for name, n_prompt, n_gen in tests:
                print(f"polydev bench: {os.path.basename(path)} {name} ...", end="\r",
                      file=sys.stderr, flush=True)
                measure(model, min(n_prompt, settings.n_batch) or 0, min(n_gen, 1), rng)
                speeds = [(n_prompt + n_gen) / measure(model, n_prompt, n_gen, rng)
                          for _ in range(args.repetitions)]
                row = Row(os.path.basename(path), round(size, 2), round(params, 2), devices,
                          args.n_gpu_layers, name, statistics.mean(speeds),
                          statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                          args.repetitions)
                rows.append(row)
                if args.output == "jsonl":
                    print(json.dumps(asdict(row)), flush=True)
    print(" " * 60, end="\r", file=sys.stderr)
    _print(rows, args.output)
    return 0


def _print(rows: list[Row], fmt: str) -> None:
    if fmt == "md":
        print(_markdown(rows))
    elif fmt == "csv":
        print(",".join(asdict(rows[0]).keys()))
        for r in rows:
            print(",".join(str(v) for v in asdict(r).values()))
    elif fmt == "json":
        print(json.dumps([asdict(r) for r in rows], indent=1))


def _markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |",
             "| " + " | ".join("---:" if h in ("size", "params", "ngl", "t/s") else "---"
                               for h in HEADERS) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)
