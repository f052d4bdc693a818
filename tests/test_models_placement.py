"""polydev.models.placement: the knobs' record (checked and normalised once), llama.cpp's layer
rule at its edges, tensor split proportions, overrides, a device that lacks an op,
accelerate's device_map and max_memory fit.

The accelerators are stand-ins (type GPU, their own non-host memory, the CPU's kernel table);
placement only asks a device its type, memory, buffer type and supports_op."""

from __future__ import annotations

import bisect
import dataclasses
import re

import numpy as np
import pytest

pytest.importorskip("gguf")

import polydev  # noqa: E402
from polydev import BufferType, Device, DeviceType, GGMLType, HostArrayBuffer, Op  # noqa: E402
from polydev.errors import (AllocationError, DeviceNotFoundError, InvalidArgumentError,  # noqa: E402
                            UnsupportedError)
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.placement import plan_placement  # noqa: E402
from polydev.models.placement_settings import PlacementSettings, parse_size  # noqa: E402

from model_files import write_test_model  # noqa: E402

N_LAYER = 4
GIB = 2**30


class _GPUBuft(BufferType):
    def _alloc(self, size):
        return HostArrayBuffer(self, np.zeros(size, np.uint8))


class FakeGPU(Device):
    """An accelerator stand-in; ``lacks`` lists (op name, weight type) it cannot run."""

    type = DeviceType.GPU

    def __init__(self, name: str, free: int = 8 * GIB, lacks=()):
        super().__init__(name, "stand-in accelerator")
        self._buft = _GPUBuft(name, self, is_host=False)
        self.free = free
        self.lacks = set(lacks)

    def memory(self):
        return self.free, 16 * GIB

    @property
    def buffer_type(self):
        return self._buft

    def supports_buft(self, buft):
        return buft is self._buft

    @property
    def kernels(self):
        return polydev.device("CPU").kernels

    def supports_op(self, op):
        weight = op.src[0] if op.op != Op.MUL else op.src[1]
        if (op.op.name, weight.type) in self.lacks:
            return False
        return super().supports_op(op)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("p") / "m.gguf", n_layer=N_LAYER)
    with GGUFFile(path) as f:
        yield f


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("t") / "t.gguf", n_layer=N_LAYER, tied=True)
    with GGUFFile(path) as f:
        yield f


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("e") / "e.gguf", n_layer=2, n_expert=4)
    with GGUFFile(path) as f:
        yield f


def names(plan) -> list[str]:
    return [d.name for d in plan.layer_devices]


def llama_cpp_layers(n_layer: int, ngl: int, devices: list[str], split: list[float]) -> list[str]:
    """llama.cpp's get_layer_buft_list, written out independently (float32 as in C++)."""
    ngl = n_layer + 1 if ngl == -1 else ngl
    cum = np.cumsum(np.asarray(split, np.float32), dtype=np.float32)
    points = list(cum / cum[-1])
    first = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1) if devices else 0
    out = []
    for il in range(n_layer + 1):
        if il < first or il - first >= act:
            out.append("CPU")
        else:
            x = np.float32(il - first) / np.float32(act)
            out.append(devices[bisect.bisect_right(points, x)])
    return out


# --- the record ---------------------------------------------------------------------------------

def test_the_record_normalises_once():
    gpu = FakeGPU("GPU0")
    settings = PlacementSettings(devices=gpu, tensor_split=[3, 1], override_tensor="a=CPU,b=1",
                                 device_map={"0-1": gpu, "output": 0},
                                 max_memory={"GPU0": "1GiB", 1: 2048}, type_k="q8_0")
    assert settings.devices == (gpu,) and settings.tensor_split == (3.0, 1.0)
    assert settings.override_tensor == ((re.compile("a"), "CPU"), (re.compile("b"), "1"))
    assert settings.device_map == (("0-1", gpu), ("output", 0))
    assert settings.max_memory == (("GPU0", GIB), (1, 2048))
    assert (settings.type_k, settings.type_v) == (GGMLType.Q8_0, GGMLType.F16)
    assert dataclasses.replace(settings) == settings           # normalising again changes nothing
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.n_ctx = 1
    assert settings.as_dict()["device_map"] == {"0-1": "GPU0", "output": "0"}


@pytest.mark.parametrize("knobs, error, message", [
    (dict(n_gpu_layers=-2), InvalidArgumentError, "n_gpu_layers must be -1"),
    (dict(n_gpu_layers="3"), InvalidArgumentError, "n_gpu_layers must be a whole number"),
    (dict(split_mode="rows"), InvalidArgumentError, "split_mode must be"),
    (dict(split_mode="row"), UnsupportedError, "split_mode 'row'"),
    (dict(tensor_split=[1, -1]), InvalidArgumentError, "tensor_split entries"),
    (dict(tensor_split="3,1"), InvalidArgumentError, "tensor_split must be a list"),
    (dict(main_gpu=-1), InvalidArgumentError, "main_gpu must be 0 or more"),
    (dict(override_tensor=[("attn", 1.5)]), InvalidArgumentError, "not a device"),
    (dict(cpu_moe="yes"), InvalidArgumentError, "cpu_moe must be True or False"),
    (dict(devices=[3]), InvalidArgumentError, "devices: 3"),
    (dict(device_map="balanced"), InvalidArgumentError, "device_map must be 'auto'"),
    (dict(device_map={"(": "CPU"}), InvalidArgumentError, r"device_map key '\(': bad regex"),
    (dict(device_map={True: "CPU"}), InvalidArgumentError, "device_map key True"),
    (dict(max_memory={"GPU0": "lots"}), InvalidArgumentError, r"max_memory\['GPU0'\]"),
    (dict(max_memory="10GiB"), InvalidArgumentError, "max_memory must be a dict"),
    (dict(n_batch=0), InvalidArgumentError, "n_batch must be positive"),
    (dict(type_k="q4_0"), InvalidArgumentError, "type_k must be one of f16, f32, q8_0"),
    (dict(type_v="nonsense"), InvalidArgumentError, "type_v must be one of"),
])
def test_the_record_checks_each_knob_and_names_it(knobs, error, message):
    with pytest.raises(error, match=message):
        PlacementSettings(**knobs)


def test_an_unknown_knob_is_named_with_the_knobs_there_are():
    with pytest.raises(InvalidArgumentError, match="did you mean n_gpu_layers.*the knobs are "
                                                   "devices, n_gpu_layers, split_mode"):
        PlacementSettings().with_knobs(n_gpu_layer=3)
    with pytest.raises(InvalidArgumentError, match="unknown placement knob n_gpu_layer"):
        polydev.models.load("/no/such/model.gguf", n_gpu_layer=3)     # before the file opens


def test_plan_takes_the_record_or_keywords(model):
    gpu = FakeGPU("GPU0")
    settings = PlacementSettings(devices=[gpu], n_gpu_layers=2)
    plan = plan_placement(model, settings)
    assert plan.settings is settings
    assert names(plan) == names(plan_placement(model, devices=[gpu], n_gpu_layers=2))
    changed = plan_placement(model, settings, n_gpu_layers=1)
    assert changed.settings.n_gpu_layers == 1 and names(changed)[-2:] == ["CPU", "GPU0"]
    with pytest.raises(InvalidArgumentError, match="PlacementSettings"):
        plan_placement(model, {"n_gpu_layers": 2})


# --- llama.cpp's rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("ngl", [0, 1, N_LAYER - 1, N_LAYER, N_LAYER + 1, N_LAYER + 7, -1])
def test_n_gpu_layers_offloads_the_last_layers(model, ngl):
    gpu = FakeGPU("GPU0")
    plan = plan_placement(model, devices=[gpu], n_gpu_layers=ngl)
    first = max(N_LAYER + 1 - (N_LAYER + 1 if ngl == -1 else ngl), 0)
    assert names(plan) == ["CPU"] * first + ["GPU0"] * (N_LAYER + 1 - first)
    assert plan.tensors["token_embd.weight"].device.name == "CPU"
    assert plan.tensors["output.weight"].device.name == ("GPU0" if first <= N_LAYER else "CPU")
    assert plan.device_of("blk.0.attn_q.weight").name == names(plan)[0]


def test_no_offload_devices_keeps_everything_on_the_cpu(model):
    plan = plan_placement(model, devices=[], n_gpu_layers=-1)
    assert set(names(plan)) == {"CPU"}
    assert all(t.buffer_type is plan.cpu.buffer_type for t in plan.tensors.values())


@pytest.mark.parametrize("split", [[1, 1], [1, 3], [3, 1], [1, 2], [0, 1], [2, 0], [0.1, 0.7]])
@pytest.mark.parametrize("ngl", [-1, 3, N_LAYER])
def test_tensor_split_proportions(model, split, ngl):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    plan = plan_placement(model, devices=gpus, n_gpu_layers=ngl, tensor_split=split)
    assert names(plan) == llama_cpp_layers(N_LAYER, ngl, ["GPU0", "GPU1"], split)


class LostGPU(FakeGPU):
    """A stand-in for a remote device whose node is gone."""

    lost = "its node stopped answering"


def test_a_lost_device_gives_its_layers_and_its_share_to_the_devices_that_remain(
        model, monkeypatch):
    gpus = [FakeGPU("GPU0"), LostGPU("GPU1"), FakeGPU("GPU2")]
    registered = {d.name: d for d in gpus}
    real = polydev.device
    monkeypatch.setattr(polydev, "device", lambda name: registered.get(name) or real(name))
    plan = plan_placement(model, devices=gpus, tensor_split=[1, 5, 3],
                          override_tensor=["attn_k=GPU1"])
    assert [d.name for d in plan.offload_devices] == ["GPU0", "GPU2"]
    assert names(plan) == llama_cpp_layers(N_LAYER, -1, ["GPU0", "GPU2"], [1, 3])
    assert plan.device_of("blk.1.attn_k.weight").name == "CPU"   # a rule's lost target
    only_lost = plan_placement(model, devices=[gpus[1]], n_gpu_layers=-1)
    assert set(names(only_lost)) == {"CPU"}
    for main_gpu, main in ((1, "GPU0"), (2, "GPU2")):        # the lost main: the first left
        plan = plan_placement(model, devices=gpus, split_mode="none", main_gpu=main_gpu)
        assert set(names(plan)) == {main}


@pytest.mark.parametrize("n_tokens, n_batch, stages, size", [
    (1, 512, 2, 1), (8, 512, 2, 4), (9, 512, 2, 5), (512, 512, 3, 171), (600, 512, 2, 512),
    (8, 512, 0, 512),
])
def test_a_batch_goes_as_one_micro_batch_per_pipeline_stage(n_tokens, n_batch, stages, size):
    from polydev.models.pipeline import micro_batch_size

    assert micro_batch_size(n_tokens, n_batch, stages) == size


def test_default_split_follows_free_memory(model):
    gpus = [FakeGPU("GPU0", free=1 * GIB), FakeGPU("GPU1", free=3 * GIB)]
    plan = plan_placement(model, devices=gpus)
    assert names(plan) == llama_cpp_layers(N_LAYER, -1, ["GPU0", "GPU1"], [1, 3])
    split_none = plan_placement(model, devices=gpus, tensor_split=[0, 0])
    assert split_none.layer_devices == plan.layer_devices


def test_split_mode_none_uses_main_gpu(model):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    plan = plan_placement(model, devices=gpus, split_mode="none", main_gpu=1)
    assert names(plan) == ["GPU1"] * (N_LAYER + 1)
    with pytest.raises(InvalidArgumentError, match="main_gpu 2 is out of range"):
        plan_placement(model, devices=gpus, split_mode="none", main_gpu=2)
    with pytest.raises(UnsupportedError, match="row"):
        plan_placement(model, devices=gpus, split_mode="row")
    with pytest.raises(InvalidArgumentError, match="split_mode"):
        plan_placement(model, devices=gpus, split_mode="rows")


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_gpu_layers=-2), "n_gpu_layers"),
    (dict(tensor_split=[1, 1, 1]), "3 entries for 2 devices"),
    (dict(tensor_split=[1, -1]), ">= 0"),
    (dict(override_tensor=["no-equals-sign"]), "regex=device"),
    (dict(override_tensor=["(=CPU"]), "bad regex"),
    (dict(n_ctx=0), "positive"),
])
def test_bad_knobs_raise_typed_errors(model, kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        plan_placement(model, devices=[FakeGPU("GPU0"), FakeGPU("GPU1")], **kwargs)


def test_unknown_device_names():
    with pytest.raises(DeviceNotFoundError):
        polydev.device("CUDA7")


def test_default_devices_are_the_gpus(model, monkeypatch):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    every = [*gpus, polydev.device("CPU")]
    monkeypatch.setattr(polydev, "devices", lambda: every)
    plan = plan_placement(model)
    assert [d.name for d in plan.offload_devices] == ["GPU0", "GPU1"]
    assert names(plan)[-1] == "GPU1"


# --- per tensor ---------------------------------------------------------------------------------

def test_overrides_first_match_wins(model):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    plan = plan_placement(model, devices=gpus, tensor_split=[1, 0],
                          override_tensor=[r"ffn_up=GPU1", r"blk\.1\.ffn_.*=CPU,attn_k=GPU1"])
    assert plan.device_of("blk.1.ffn_up.weight").name == "GPU1"
    assert plan.device_of("blk.1.ffn_gate.weight").name == "CPU"
    assert plan.device_of("blk.2.ffn_gate.weight").name == "GPU0"
    assert plan.device_of("blk.3.attn_k.weight").name == "GPU1"
    assert plan.tensors["blk.1.ffn_gate.weight"].cause.startswith("override")


def test_cpu_moe_keeps_experts_on_the_cpu(moe):
    plan = plan_placement(moe, devices=[FakeGPU("GPU0")], cpu_moe=True)
    for name, t in plan.tensors.items():
        if "_exps" in name:
            assert t.device.name == "CPU" and t.op == "MUL_MAT_ID"
        elif name.startswith("blk."):
            assert t.device.name == "GPU0"


def test_a_device_without_the_op_does_not_get_the_weight(model):
    gpu = FakeGPU("GPU0", lacks={("MUL_MAT", GGMLType.Q8_0)})
    plan = plan_placement(model, devices=[gpu])
    q = plan.tensors["blk.2.attn_q.weight"]
    assert q.device.name == "CPU" and "GPU0 cannot run MUL_MAT on q8_0" in q.cause
    assert plan.device_of("blk.2.attn_norm.weight").name == "GPU0"     # MUL on f32 is fine
    assert names(plan)[2] == "GPU0"


def test_a_tied_output_matrix_is_placed_as_the_output_layer(tied):
    plan = plan_placement(tied, devices=[FakeGPU("GPU0")], n_gpu_layers=1)
    out, emb = plan.tensors["output.weight"], plan.tensors["token_embd.weight"]
    assert out.source == "token_embd.weight" and out.op == "MUL_MAT" and emb.op == "GET_ROWS"
    assert (out.device.name, emb.device.name) == ("GPU0", "CPU")
    cpu_only = plan_placement(tied, devices=[])
    weights = sum(t.nbytes for n, t in cpu_only.tensors.items() if n != "output.weight")
    assert cpu_only.usage["CPU"].weights == weights          # one copy in the mapping


# --- memory -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_ctx", [1, 256, 1000, 4096])
def test_kv_cache_per_layer_device(model, n_ctx):
    gpu = FakeGPU("GPU0")
    plan = plan_placement(model, devices=[gpu], n_gpu_layers=2, n_ctx=n_ctx, type_k="q8_0")
    cells = -(-n_ctx // 256) * 256
    k_row = 32 // 32 * 34            # 32 values of q8_0 (head_dim 16 x 2 kv heads)
    v_row = 32 * 2                   # f16
    per_layer = cells * (k_row + v_row)
    on_gpu = sum(1 for d in plan.kv_devices if d is gpu)
    assert on_gpu == 1                                 # layer 3 (and the output layer)
    assert plan.usage["GPU0"].kv_cache == per_layer * on_gpu
    assert plan.usage["CPU"].kv_cache == per_layer * (N_LAYER - on_gpu)
    off = plan_placement(model, devices=[gpu], n_gpu_layers=2, n_ctx=n_ctx, type_k="q8_0",
                         no_kv_offload=True)
    assert all(d.name == "CPU" for d in off.kv_devices)
    assert off.usage["CPU"].kv_cache == per_layer * N_LAYER


# --- accelerate ---------------------------------------------------------------------------------

def test_device_map_dict(model):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    plan = plan_placement(model, devices=gpus, device_map={
        "0-1": "GPU0", 2: gpus[1], "output": 1, r"attn_q": "cpu"})
    assert names(plan) == ["GPU0", "GPU0", "GPU1", "CPU", "GPU1"]
    assert plan.device_of("blk.0.attn_q.weight").name == "CPU"
    assert plan.device_of("blk.0.attn_k.weight").name == "GPU0"
    with pytest.raises(InvalidArgumentError, match="outside"):
        plan_placement(model, devices=gpus, device_map={"3-9": "GPU0"})
    with pytest.raises(InvalidArgumentError, match="input layer"):
        plan_placement(model, devices=gpus, device_map={"input": "GPU0"})


def layer_cost(plan, il: int) -> int:
    weights = sum(t.nbytes for t in plan.tensors.values() if t.layer == il)
    kv = plan.usage["CPU"].kv_cache // N_LAYER if il < N_LAYER else 0
    return weights + kv


def test_max_memory_fills_devices_in_order(model):
    gpus = [FakeGPU("GPU0"), FakeGPU("GPU1")]
    everything_on_cpu = plan_placement(model, devices=[], n_ctx=512)
    compute = everything_on_cpu.usage["CPU"].compute
    two_layers = compute + layer_cost(everything_on_cpu, 0) + layer_cost(everything_on_cpu, 1)
    plan = plan_placement(model, devices=gpus, n_ctx=512,
                          max_memory={"GPU0": two_layers + 100, "GPU1": "1GiB"})
    assert names(plan) == ["GPU0", "GPU0", "GPU1", "GPU1", "GPU1"]
    unnamed = plan_placement(model, devices=gpus, n_ctx=512, max_memory={1: two_layers + 100})
    assert names(unnamed) == ["GPU1", "GPU1", "CPU", "CPU", "CPU"]
    with pytest.raises(AllocationError, match="does not fit"):
        plan_placement(model, devices=gpus, n_ctx=512,
                       max_memory={"GPU0": 1000, "GPU1": 1000, "CPU": compute + 1000})


def test_device_map_auto_uses_free_memory(model):
    gpus = [FakeGPU("GPU0", free=16 * 2**20), FakeGPU("GPU1")]
    plan = plan_placement(model, devices=gpus, device_map="auto", n_ctx=256)
    assert set(names(plan)) <= {"GPU0", "GPU1"} and names(plan)[0] == "GPU0"


@pytest.mark.parametrize("text, expected", [
    (2048, 2048), ("10GiB", 10 * 2**30), ("500MB", 500 * 10**6), ("1.5 GB", 1_500_000_000),
    ("64kib", 65536), ("7", 7)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["ten", "5 parsecs", -1, float("nan"), True])
def test_parse_size_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        parse_size(bad)


def test_plan_as_dict(model):
    plan = plan_placement(model, devices=[FakeGPU("GPU0")], n_gpu_layers=2)
    d = plan.as_dict()
    assert d["layers"] == names(plan)[:-1] and d["output"] == "GPU0"
    assert {row["device"] for row in d["devices"]} == {"GPU0", "CPU"}
    assert sum(row["weights"] for row in d["devices"]) == sum(t["bytes"] for t in d["tensors"])
