"""polydev.kernel_build.compile_cached, the one way every backend builds its kernels: the
cache key, the cache hit, atomic writes, the lock between processes, and CompileError."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from polydev.errors import CompileError, UnsupportedError
from polydev.kernel_build import build_key, compile_cached

SOURCES = {"k.c": "int f(void) { return 1; }"}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_every_input_of_a_build_is_in_its_key():
    key = build_key(SOURCES, ["-O2"], {"compiler": "cc 12", "device": "x"})
    others = [build_key({"k.c": "int f(void) { return 2; }"}, ["-O2"], {"compiler": "cc 12",
                                                                      "device": "x"}),
              build_key({"j.c": SOURCES["k.c"]}, ["-O2"], {"compiler": "cc 12", "device": "x"}),
              build_key(SOURCES, ["-O3"], {"compiler": "cc 12", "device": "x"}),
              build_key(SOURCES, ["-O2"], {"compiler": "cc 13", "device": "x"}),
              build_key(SOURCES, ["-O2"], {"compiler": "cc 12", "device": "y"})]
    assert len({key, *others}) == 6
    assert key == build_key(dict(SOURCES), ["-O2"], {"device": "x", "compiler": "cc 12"})


def test_a_build_is_made_once_then_read_from_the_cache(cache):
    calls = []

    def compile(target: Path) -> None:
        calls.append(target)
        target.write_bytes(b"artifact")
    first = compile_cached("test-kind", "a test build", SOURCES, [], {}, compile, ".bin")
    second = compile_cached("test-kind", "a test build", SOURCES, [], {}, compile, ".bin")
    assert first == second and first.read_bytes() == b"artifact" and len(calls) == 1
    assert first.parent == cache / "test-kind" and calls[0] != first   # built beside, renamed


def test_a_failed_build_is_a_compile_error_and_leaves_nothing(cache):
    def compile(target: Path) -> None:
        target.write_bytes(b"half an artifact")
        raise OSError("k.c:1:5: error: expected ';' before '}' token\nnote: something")
    with pytest.raises(CompileError, match="a test build did not build: k.c:1:5: error: "
                                           "expected ';'") as raised:
        compile_cached("test-kind", "a test build", SOURCES, [], {}, compile)
    assert isinstance(raised.value, UnsupportedError)
    assert [p.name for p in (cache / "test-kind").iterdir() if not p.name.endswith(".lock")] == []


def _build_slowly(cache_root: str, log: str) -> str:
    import os

    os.environ["POLYDEV_CACHE_DIR"] = cache_root

    def compile(target: Path) -> None:
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(0.5)
        target.write_bytes(b"artifact")
    return str(compile_cached("test-kind", "a slow build", SOURCES, [], {}, compile))


def test_two_processes_build_once_and_read_the_same_artifact(cache, tmp_path):
    log = tmp_path / "builds.log"
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        paths = pool.starmap(_build_slowly, [(str(cache), str(log))] * 2)
    assert paths[0] == paths[1] and Path(paths[0]).read_bytes() == b"artifact"
    assert log.read_text() == "built\n"
