"""bench/llama_bench.py, the anchor of bench/models.py: a llama-bench binary named by
``NAME=PATH`` or after its build folder, run with the bench's flags (ik_llama.cpp's with its
run-time repacking), and its JSON read back into rates; a failed run says why. The binary is
a stand-in script that records its arguments and prints llama-bench's JSON."""

from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "llama_bench.py"


@pytest.fixture(scope="module")
def llama_bench():
    spec = importlib.util.spec_from_file_location("bench_llama_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _fake(folder: Path, help_text: str, status: int = 0) -> Path:
    """A llama-bench stand-in in folder/bin: --help prints ``help_text``; a run writes its
    arguments beside it and prints two tests' JSON."""
    out = [{"n_prompt": 512, "n_gen": 0, "avg_ts": 600.5},
           {"n_prompt": 4096, "n_gen": 0, "avg_ts": 350.25},
           {"n_prompt": 0, "n_gen": 128, "avg_ts": 150.0}]
    binary = folder / "bin" / "llama-bench"
    binary.parent.mkdir(parents=True)
    binary.write_text(f"""#!/bin/sh
if [ "$1" = "--help" ]; then echo '{help_text}'; exit 0; fi
echo "$@" > "{binary}.args"
echo "loading the model failed" >&2
[ {status} -ne 0 ] && exit {status}
echo '{json.dumps(out)}'
""")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_a_binary_is_named_after_its_build_folder_or_as_given(llama_bench, tmp_path):
    binary = _fake(tmp_path / "ik-native", "-rtr, --run-time-repack")
    assert llama_bench.LlamaBench.parse(str(binary)).name == "ik-native"
    assert llama_bench.LlamaBench.parse(f"mine={binary}") == llama_bench.LlamaBench(
        "mine", str(binary))
    with pytest.raises(SystemExit, match="not an executable"):
        llama_bench.LlamaBench.parse(str(tmp_path / "nothing"))


@pytest.mark.parametrize("help_text, repacks", [("-rtr, --run-time-repack", True),
                                                ("-fa, --flash-attn", False)])
def test_a_run_reads_every_test_and_repacks_where_it_can(llama_bench, tmp_path, help_text,
                                                         repacks):
    binary = _fake(tmp_path / "build", help_text)
    got = llama_bench.llama_bench_child("x", str(binary), "m.gguf", 2, [512, 4096], 128)
    assert (got["pp512"], got["pp4096"], got["tg"]) == (600.5, 350.25, 150.0)
    assert got["rss"] > 0
    args = Path(f"{binary}.args").read_text().split()
    assert args[:2] == ["-m", "m.gguf"] and "-t" in args and args[args.index("-t") + 1] == "2"
    assert args[args.index("-p") + 1] == "512,4096" and args[args.index("-n") + 1] == "128"
    assert ("-rtr" in args) == repacks


def test_a_failed_run_says_why(llama_bench, tmp_path):
    binary = _fake(tmp_path / "build", "", status=3)
    with pytest.raises(RuntimeError, match="exited with 3: loading the model failed"):
        llama_bench.llama_bench_child("x", str(binary), "m.gguf", 2, [512], 128)
