"""Shared fixtures: every available device, and a helper that computes a one-op graph."""

from __future__ import annotations

import importlib.util
import os
from typing import Callable, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph
from polydev.types import type_from_numpy

from needs import device_params


# No property test has a time limit a loaded 2-core machine cannot keep: hypothesis's default
# deadline (200 ms an example) and its too-slow health check are wall-clock limits.
settings.register_profile("polydev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("polydev")


def pytest_configure(config) -> None:
    """Build the CPU backend's compiled kernels before any test runs (a build inside a test
    with a deadline would fail it). With POLYDEV_REQUIRE_OPENCL set (CI sets it), fewer than
    two working OpenCL devices (the multi-device tests need two) stop the run at once with one
    line saying why, instead of skipping or failing every OpenCL test; with
    POLYDEV_REQUIRE_RAY a missing ray the same for the remote-device tests."""
    from polydev.backends.cpu.native import kernels

    kernels()
    if os.environ.get("POLYDEV_REQUIRE_RAY") and importlib.util.find_spec("ray") is None:
        raise pytest.UsageError("POLYDEV_REQUIRE_RAY is set but ray is not installed "
                                "(pip install -e '.[ray]')")
    if os.environ.get("POLYDEV_REQUIRE_OPENCL"):
        _require_two_opencl_devices()


def _require_two_opencl_devices() -> None:
    reg = next((r for r in polydev.registry().regs if r.name == "OpenCL"), None)
    if reg is None:
        why = "the OpenCL backend is not registered"
    elif not reg.devices:
        why = reg.unavailable_reason or "no reason given"
    elif len(reg.devices) < 2:
        why = (f"only {reg.devices[0].name} works; the multi-device tests need two "
               f"(POCL_DEVICES=\"pthread pthread\" gives two PoCL devices)")
    else:
        return
    excluded = reg.excluded if reg is not None else []
    left_out = "".join(f"; left out: {e.description}: {e.reason}" for e in excluded)
    raise pytest.UsageError(f"POLYDEV_REQUIRE_OPENCL is set but {why}{left_out}")


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    """test-backend-ops' normalized mean squared error."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    denom = float(np.sum(ref * ref))
    err = float(np.sum((out - ref) ** 2))
    return err / denom if denom else err


def assert_close(out: np.ndarray, ref: np.ndarray, max_nmse: float = 1e-7) -> None:
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    assert not np.isnan(out).any(), "NaN in output"
    err = nmse(out, ref)
    assert err <= max_nmse, f"NMSE {err:.3e} > {max_nmse:.0e}"


@pytest.fixture(params=device_params())
def backend(request):
    """A backend on every registered device (each backend runs the same tests)."""
    with polydev.init_backend(request.param) as b:
        yield b


@pytest.fixture
def cpu():
    with polydev.init_backend("CPU") as b:
        yield b


@pytest.fixture
def fast_cpu():
    """The CPU backend as it computes by default (numerics="fast": int16 activations)."""
    with polydev.init_backend("CPU") as b:
        assert b.numerics == "fast"
        yield b


def compute(backend, build: Callable, *arrays: np.ndarray,
            types: Sequence[GGMLType | None] | None = None) -> np.ndarray:
    """Build ``build(ctx, *input_tensors)`` over inputs holding ``arrays`` (numpy shape =
    reversed ne), compute it on ``backend`` and return the result's values. An input of a
    block type is either values (quantized on upload) or a uint8 array of raw rows whose
    last axis is the row's bytes."""
    ctx = Context()
    types = types or [None] * len(arrays)
    inputs = [ctx.new_tensor(ty or type_from_numpy(a.dtype), _ne_of(a, ty), name=f"in{i}")
              for i, (a, ty) in enumerate(zip(arrays, types))]
    out = build(ctx, *inputs)
    graph = build_graph(out)
    skip_unless_supported(backend, graph)
    buf = alloc_ctx_tensors(ctx, backend)
    try:
        for t, a in zip(inputs, arrays):
            t.set_data(a)
        backend.graph_compute(graph)
        return out.numpy()
    finally:
        buf.close()


def skip_unless_supported(backend, graph) -> None:
    """Skip the test where an op is absent from the backend's kernel table (nothing to test)."""
    missing = [t for t in graph.nodes if not backend.supports_op(t)]
    if missing:
        pytest.skip(f"{backend.name} does not support {polydev.ops.op_desc(missing[0])} "
                    f"(result {missing[0].type}, sources "
                    f"{', '.join(str(s.type) for s in missing[0].src if s is not None)})")


def compute_graph(backend, out) -> None:
    """Compute the graph of ``out`` on ``backend``, skipping where it has no kernel for it."""
    graph = build_graph(out)
    skip_unless_supported(backend, graph)
    backend.graph_compute(graph)


def _ne_of(a: np.ndarray, type_: GGMLType | None) -> tuple[int, ...]:
    if type_ is not None and type_.traits.is_quantized and a.dtype == np.uint8:
        tr = type_.traits
        return (a.shape[-1] // tr.type_size * tr.block_size,) + a.shape[-2::-1]
    return a.shape[::-1]


@pytest.fixture(scope="session")
def ggml_backend():
    """ggml's own CPU backend (the oracle), when the optional ggml-python package is installed."""
    ggml = pytest.importorskip("ggml", reason="ggml-python (the optional ggml oracle) is not "
                               "installed")
    backend = ggml.ggml_backend_cpu_init()
    yield backend
    ggml.ggml_backend_free(backend)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
