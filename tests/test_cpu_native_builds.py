"""The CPU kernels' builds (backends/cpu/native/variants.py): one library per x86-64 feature
level, built with the package; each level this CPU can run gives the numpy path's results,
the best one loads without a compiler, and a missing or stale build is rebuilt or said."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import polydev
from polydev.backends.cpu import native
from polydev.backends.cpu.native import variants
from polydev.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
NATIVE_TESTS = [HERE / name for name in ("test_cpu_native.py", "test_cpu_native_catalogue.py",
                                         "test_cpu_binary_glu.py", "test_cpu_row_ops.py")]
# the interleaved products are built where the int16 kernels are: AVX2 and up
INTERLEAVED_TESTS = HERE / "test_cpu_interleaved.py"


def _lower_levels() -> list[str]:
    """The levels this CPU runs besides the best one (which the rest of the suite uses)."""
    return [v.name for v in variants.supported()[1:]]


def _tests_of(level: str) -> list[Path]:
    variant = next(v for v in variants.variants() if v.name == level)
    return NATIVE_TESTS + ([INTERLEAVED_TESTS] if "avx2" in variant.needs else [])


@pytest.mark.parametrize("level", _lower_levels())
def test_each_level_this_cpu_runs_passes_the_kernel_tests(level):
    """test_cpu_native.py (every kernel against float64 and the numpy path), the catalogue
    against the numpy path, the element-wise and router kernels and, from AVX2 on, the
    interleaved products, with the kernels of ``level``: the plain-C level has no SIMD code
    at all, so its scalar paths are checked here too."""
    env = {**os.environ, native.VARIANT_ENV: level}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *map(str, _tests_of(level))], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1]


def test_the_installed_build_of_the_best_level_loads():
    """The package's install built the kernels (setup.py): the best level this CPU runs is
    loaded from there, with no compiler needed at run time."""
    best = variants.supported()[0]
    path = native.installed_path(best)
    assert path is not None, f"the install did not build the CPU kernels for {best.name}"
    lib = native.kernels()
    if lib is None or lib.origin != "installed":
        if native.library_source_id(native._open_library(path)) != variants.source_id():
            pytest.skip("the C sources changed since the install (an editable checkout): "
                        "reinstall to rebuild")
    assert lib is not None and lib.origin == "installed" and lib.variant == best.name


def test_an_installed_build_of_other_sources_is_passed_over(monkeypatch, tmp_path, caplog):
    """A build of older sources may lack entry points these sources declare: it is refused by
    its source checksum before any is looked up (then the loader builds these)."""
    def source_id() -> bytes:            # a function takes ctypes' argtypes and restype
        return b"other sources"
    older_build = types.SimpleNamespace(pd_source_id=source_id)     # no entry points at all
    monkeypatch.setattr(native, "installed_path", lambda variant: tmp_path / "old.so")
    monkeypatch.setattr(native, "_open_library", lambda path: older_build)
    with caplog.at_level(logging.INFO, logger=native.__name__):
        assert native._load_installed(variants.supported()[0]) is None
    assert "built from other sources" in caplog.text


def test_without_an_installed_build_the_loader_builds_one_once(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "installed_path", lambda variant: None)
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    lib = native._load()
    assert lib is not None and lib.origin == "built"
    assert lib.variant == variants.supported()[0].name
    assert lib.source_id == variants.source_id()
    builds = list((tmp_path / "kernels").glob("*.so"))
    assert len(builds) == 1
    run = subprocess.run

    def no_second_compile(args, *rest, **kwargs):
        assert "-o" not in args, "built twice"
        return run(args, *rest, **kwargs)
    monkeypatch.setattr(native.subprocess, "run", no_second_compile)
    assert native._load().path == builds[0]


def test_a_compiler_that_fails_leaves_the_numpy_path_and_says_why(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(native, "installed_path", lambda variant: None)
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: error: no such target' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native._load() is None
    assert "the CPU kernels" in caplog.text and "did not build" in caplog.text
    assert "broken-cc: error: no such target" in caplog.text
    assert list((tmp_path / "kernels").glob("*.so")) == []      # nothing half-written


def test_without_kernels_or_compiler_the_numpy_path_is_said(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(native, "installed_path", lambda variant: None)
    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native._load() is None
    assert "no C compiler" in caplog.text and "float32 copies" in caplog.text


def test_a_level_is_asked_for_by_name_and_checked(monkeypatch):
    monkeypatch.setenv(native.VARIANT_ENV, "x86-64-v9")
    with pytest.raises(ConfigError, match="no such build"):
        native.chosen_variant()
    if variants.variants()[-1].name != "x86-64":
        pytest.skip("not an x86-64 processor")
    monkeypatch.setattr(variants, "cpu_flags", lambda: frozenset({"sse2"}))
    monkeypatch.setenv(native.VARIANT_ENV, "x86-64-v3")
    with pytest.raises(ConfigError, match="this CPU lacks .*avx2"):
        native.chosen_variant()
    monkeypatch.setenv(native.VARIANT_ENV, "x86-64")
    assert native.chosen_variant().name == "x86-64"
    monkeypatch.delenv(native.VARIANT_ENV)
    assert native.chosen_variant().name == "x86-64"       # the best this CPU runs


def test_the_package_installs_without_a_compiler(tmp_path):
    """setup.py's build never fails the install: with no compiler each level is left out
    (and polydev runs its numpy path, or builds at run time)."""
    env = {**os.environ, "CC": "/bin/false", "LDSHARED": "/bin/false -shared"}
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext",
                           "--build-lib", str(tmp_path / "lib"),
                           "--build-temp", str(tmp_path / "temp")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list((tmp_path / "lib").rglob("*.so"))


def test_supports_op_never_builds_and_a_stream_loads_the_kernels(monkeypatch):
    """Builds happen as a device's first stream starts, never inside supports_op."""
    from polydev import Context, GGMLType, ops

    ctx = Context()
    product = ops.mul_mat(ctx, ctx.new_tensor(GGMLType.Q4_0, (256, 8)),
                          ctx.new_tensor(GGMLType.F32, (256, 2)))
    native.kernels.cache_clear()
    loads = []
    monkeypatch.setattr(native, "_load", lambda: loads.append(1) or None)
    try:
        assert polydev.device("CPU").supports_op(product)          # the numpy kernel's answer
        assert loads == []
        with polydev.init_backend("CPU"):
            assert loads == [1]
    finally:
        native.kernels.cache_clear()           # the real kernels again for the other tests
