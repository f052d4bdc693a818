"""graph_copy / compare_graph_backend, and the ``polydev compare`` tool: it passes CPU against
CPU, and it catches a backend with planted faults (wrong values, NaN, an out-of-bounds write,
an unwritten output, a crashing kernel)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, Reg, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu import CPUBackend, CPUDevice
from polydev.compare import compare_graph_backend, graph_copy
from polydev.errors import NotAllocatedError
from polydev.ops import op_desc
from polydev.tools.cli import main
from polydev.tools.compare import runner
from polydev.tools.compare.catalogue import all_op_names, eval_cases, parse_op_filter


# --- the library functions ------------------------------------------------------------------

def _small_graph(cpu, rng):
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (8, 3), "a")
    b = ctx.new_tensor(GGMLType.F16, (8, 3), "b")
    s = ops.add(ctx, a, ops.cpy(ctx, b, ctx.new_tensor(GGMLType.F32, (8, 3), "b32")))
    t = ctx.transpose(s)                              # a view op: computes nothing
    out = ops.sum_rows(ctx, ops.cont(ctx, t))
    buf = alloc_ctx_tensors(ctx, cpu)
    a.set_data(rng.standard_normal((3, 8)).astype(np.float32))
    b.set_data(rng.standard_normal((3, 8)).astype(np.float16))
    return buf, a, out, build_graph(out)


def test_graph_copy_copies_data_and_keeps_node_order(cpu, rng):
    buf, a, out, graph = _small_graph(cpu, rng)
    with buf, polydev.init_backend("CPU") as other, graph_copy(other, graph) as copy:
        assert [n.op for n in copy.graph.nodes] == [n.op for n in graph.nodes]
        assert all(c is not n for c, n in zip(copy.graph.nodes, graph.nodes))
        np.testing.assert_array_equal(copy.copy_of(a).numpy(), a.numpy())
        view = next(n for n in copy.graph.nodes if n.view_src is not None)
        assert view.view_src.buffer is copy.buffer        # views point into the copy
        other.graph_compute(copy.graph)
        cpu.graph_compute(graph)
        np.testing.assert_allclose(copy.copy_of(out).numpy(), out.numpy())
    assert copy.buffer is None                            # closed with the context


def test_graph_copy_needs_an_allocated_graph(cpu):
    ctx = Context()
    out = ops.neg(ctx, ctx.new_tensor(GGMLType.F32, (4,)))
    with pytest.raises(NotAllocatedError, match="allocated graph"):
        graph_copy(cpu, build_graph(out))


def test_compare_graph_backend_walks_nodes_skips_views_and_stops_early(cpu, rng):
    buf, _, out, graph = _small_graph(cpu, rng)
    seen = []

    def callback(i, t1, t2):
        seen.append((i, op_desc(t1)))
        np.testing.assert_allclose(t1.numpy(), t2.numpy())
        return True
    with buf, polydev.init_backend("CPU") as other:
        assert compare_graph_backend(cpu, other, graph, callback)
        assert [op for _, op in seen] == ["CPY", "ADD", "CONT", "SUM_ROWS"]   # no TRANSPOSE
        seen.clear()
        compare_graph_backend(cpu, other, graph, lambda i, a, b: seen.append(i) and False)
        assert len(seen) == 1                                                  # stopped early
        seen.clear()
        compare_graph_backend(cpu, other, graph, lambda i, a, b: seen.append(op_desc(a)),
                              test_nodes=[out])
        assert seen == ["SUM_ROWS"]


# --- the tool, CPU against CPU ------------------------------------------------------------------

def _run(capsys, *argv) -> tuple[int, str]:
    code = main(["compare", *argv])
    return code, capsys.readouterr().out


def test_the_catalogue_covers_every_kernel_of_the_cpu():
    cases = eval_cases()
    assert len(cases) > 3000
    assert {c.op for c in cases} <= set(all_op_names())
    kernels = set(polydev.device("CPU").supported_op_names()) & set(all_op_names())
    untested = kernels - {c.op for c in cases} - {"DUP", "RESHAPE", "VIEW", "PERMUTE",
                                                  "TRANSPOSE"}
    assert not untested, f"CPU kernels without a compare case: {sorted(untested)}"


def test_the_whole_catalogue_passes_cpu_against_cpu(capsys):
    code, out = _run(capsys, "-b", "CPU", "-j", "2")
    assert code == 0, out[-3000:]
    assert "Backend CPU: OK" in out and out.rstrip().endswith("OK")
    passed, total = map(int, out.split(" tests passed")[0].split()[-1].split("/"))
    assert passed == total > 3000


def test_the_compiled_cpu_kernels_pass_against_the_numpy_kernels(capsys):
    """--reference numpy (ggml's use_ref): the CPU backend's compiled kernels are checked
    against its numpy kernels like any other device's."""
    code, out = _run(capsys, "-b", "CPU", "--reference", "numpy", "-j", "2")
    assert code == 0, out[-3000:]
    assert "devices against CPU-numpy" in out.splitlines()[0]
    assert "Backend CPU: OK" in out


def _faulty_compiled_rms_norm(monkeypatch):
    """The compiled RMS_NORM made wrong by 1%, as a bug in it would be."""
    from polydev.backends.cpu.kernels import CPU_TABLE
    from polydev.kernels import Kernel
    from polydev.ops import Op

    compiled = CPU_TABLE._kernels[Op.RMS_NORM]

    def bind(backend, node):
        call, out = compiled.bind(backend, node), backend.env.view(node)

        def run():
            call()
            out[...] *= np.float32(1.01)
        return run
    monkeypatch.setitem(CPU_TABLE._kernels, Op.RMS_NORM, Kernel(compiled.accepts, bind))


def test_a_fault_in_a_compiled_cpu_kernel_shows_only_against_numpy(capsys, monkeypatch):
    from polydev.backends.cpu.native import kernels
    if kernels() is None:
        pytest.skip("the CPU's compiled kernels are not built here")
    _faulty_compiled_rms_norm(monkeypatch)
    argv = ("-b", "CPU", "-o", "RMS_NORM", "-p", "ne=\\[64,5,4,3\\]")
    code, out = _run(capsys, *argv)
    assert code == 0, "the CPU as reference compares the fault with itself"
    code, out = _run(capsys, *argv, "--reference", "numpy")
    assert code == 1 and "[RMS_NORM] ERR =" in out and "Backend CPU: FAIL" in out


def test_a_cpu_stream_of_numpy_kernels(rng):
    from polydev.backends.array import TABLE
    from polydev.errors import InvalidArgumentError

    with polydev.init_backend("CPU", "numpy") as b:
        assert b.name == "CPU-numpy" and b.kernels is TABLE
    with pytest.raises(InvalidArgumentError, match="compiled, numpy, got 'fortran'"):
        polydev.init_backend("CPU", "fortran")


def test_support_mode_and_csv_output(capsys):
    code, out = _run(capsys, "support", "-b", "CPU", "-o", "MUL_MAT", "-p", "type_a=q2_K",
                     "--output", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows
    assert list(rows[0]) == ["backend_name", "op_name", "op_params", "test_mode", "supported",
                             "error_message", "backend_reg_name"]
    assert {r["supported"] for r in rows} == {"1"} and {r["test_mode"] for r in rows} == {"support"}


def test_perf_mode_reports_throughput(capsys, monkeypatch):
    monkeypatch.setattr(runner, "PERF_MIN_SECONDS", 0.05)
    code, out = _run(capsys, "perf", "-b", "CPU", "-o", "ADD,MUL_MAT", "-p", "n=1,|ne=",
                     "--output", "json")
    records = _json_lines(out)
    assert code == 0 and records[-1] == {"type": "summary", "mode": "perf", "ok": True,
                                         "backends_passed": records[-1]["backends_total"],
                                         "backends_total": records[-1]["backends_total"],
                                         "failures": []}
    by_op = {r["op_name"]: r for r in records if r["type"] == "case"}
    assert by_op["MUL_MAT"]["flops"] > 0 and by_op["MUL_MAT"]["n_runs"] >= 1
    assert by_op["ADD"]["bandwidth_gb_s"] > 0


def _json_lines(out: str) -> list[dict]:
    """``--output json``: one JSON object per line, nothing else."""
    return [json.loads(line) for line in out.splitlines()]


def test_list_ops_and_coverage(capsys):
    code, out = _run(capsys, "--list-ops")
    assert code == 0 and "MUL_MAT" in out.split() and "SILU" in out.split()
    code, out = _run(capsys, "--show-coverage")
    assert code == 0 and "Ops with test cases" in out and "Ops that no case tests" in out


@pytest.mark.parametrize("argv,message", [
    (["-o", "ADDD"], "unknown op 'ADDD'"),
    (["-b", "NoSuchDevice0"], "NoSuchDevice0"),
    (["-p", "(["], "not a regular expression"),
])
def test_user_mistakes_are_errors_not_tracebacks(capsys, argv, message):
    assert main(["compare", *argv]) == 1
    assert message in capsys.readouterr().err


def test_op_filter_keeps_full_case_names_whole():
    assert parse_op_filter("ADD,MUL_MAT(type_a=f32,m=16),SILU") == [
        "ADD", "MUL_MAT(type_a=f32,m=16)", "SILU"]


# --- a backend with planted faults ----------------------------------------------------------------

def _out_bytes(node) -> np.ndarray:
    return node.buffer.host_array[node.offset:node.offset + node.nbytes]


def _wrong_value(node):
    _out_bytes(node).view(np.float32)[0] += 0.5


def _nan(node):
    _out_bytes(node).view(np.float32)[-1] = np.nan


def _out_of_bounds(node):
    start = node.offset + node.nbytes
    node.buffer.host_array[start:start + 128] = 0xAB


def _crash(node):
    raise RuntimeError("kernel exploded")


FAULTS = {"ADD": _wrong_value, "SILU": _nan, "SCALE": _out_of_bounds, "SQR": _crash}


class FaultyBackend(CPUBackend):
    def bind(self, node):
        call, fault = super().bind(node), FAULTS.get(op_desc(node))
        if fault is None:
            return call

        def run():
            call()
            fault(node)
        return run


class UnwrittenBackend(CPUBackend):
    """NEG leaves its output alone: only the NaN fill of results can tell."""

    def bind(self, node):
        return (lambda: None) if op_desc(node) == "NEG" else super().bind(node)


class _Device(CPUDevice):
    backend_class = FaultyBackend

    def __init__(self, name):
        super().__init__()
        self.name = name

    def _init_backend(self, params):
        return self.backend_class(self)


class _UnwrittenDevice(_Device):
    backend_class = UnwrittenBackend


@pytest.fixture
def faulty():
    reg = Reg("Faulty", [_Device("Faulty0"), _UnwrittenDevice("Faulty1")])
    polydev.register(reg)
    yield reg
    polydev.registry().unregister(reg)


@pytest.mark.parametrize("op,expected", [
    ("ADD", "[ADD] ERR ="),
    ("SILU", "[SILU] NaN at index"),
    ("SCALE", "guard mismatch"),
    ("SQR", "RuntimeError: kernel exploded"),
])
def test_planted_faults_are_caught(capsys, faulty, op, expected):
    code, out = _run(capsys, "-b", "Faulty0", "-o", op)
    assert code == 1
    assert expected in out
    assert "Backend Faulty0: FAIL" in out and "Failing tests:" in out
    assert "Skipping" in out                      # the devices not named with -b


def test_an_unwritten_output_is_caught(capsys, faulty):
    code, out = _run(capsys, "-b", "Faulty1", "-o", "NEG,ABS")
    assert code == 1
    assert "[NEG] NaN at index" in out and "ABS(" in out
    assert "ABS(type=f32,ne_a=[128,2,2,2],v=0): OK" in out   # the healthy op still passes


def test_a_faulty_device_fails_and_a_healthy_one_passes_in_one_run(capsys, faulty):
    code, out = _run(capsys, "-b", "Faulty0,Faulty1,CPU", "-o", "ADD,MUL",
                     "-p", "ne=\\[10,5,4,3\\],nr=\\[1,1,1,1\\]", "--output", "json")
    records = _json_lines(out)
    verdict = {d["name"]: d["ok"] for d in records if d["type"] == "device" and "skipped" not in d}
    assert code == 1 and verdict == {"Faulty0": False, "Faulty1": True, "CPU": True}
