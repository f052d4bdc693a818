"""polydev.models.loader: weights byte for byte as gguf.GGUFReader reads them, zero-copy on the
CPU, uploads to another device, tied output copies, and nothing left behind on failure."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tqdm")

from polydev import BufferUsage, tensor_get  # noqa: E402
from polydev.errors import ClosedError  # noqa: E402
from polydev.models import loader as loader_module  # noqa: E402
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.loader import load_weights  # noqa: E402

from model_files import GEMMA3, SMOLLM2, gguf_reader, model_path, write_test_model  # noqa: E402
from needs import OPENCL, opencl_mark  # noqa: E402

needs_opencl = opencl_mark()


def reader_bytes(reader, name: str) -> np.ndarray:
    t = next(t for t in reader.tensors if t.name == name)
    return np.asarray(t.data).reshape(-1).view(np.uint8)


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_cpu_load_is_the_mapping_and_equals_the_gguf_reader(name):
    path = model_path(name)
    reader = gguf_reader(path)
    with load_weights(path, devices=[], progress=False) as weights:
        mapping = np.frombuffer(weights.file.mapping, dtype=np.uint8)
        assert [b.name for b in weights.buffers] == ["CPU_Mapped"]
        assert weights.buffers[0].usage == BufferUsage.WEIGHTS
        for t in reader.tensors:
            w = weights[t.name]
            data = w.buffer.host_array[w.offset:w.offset + w.nbytes]
            assert np.shares_memory(data, mapping), t.name          # no copy
            assert not data.flags.writeable
            np.testing.assert_array_equal(data, reader_bytes(reader, t.name), err_msg=t.name)
            assert list(w.ne[:len(t.shape)]) == [int(n) for n in t.shape]
        # both models tie their output matrix to the token embedding
        out, emb = weights["output.weight"], weights["token_embd.weight"]
        assert out.buffer is emb.buffer and out.offset == emb.offset and out is not emb
        del mapping, data


@needs_opencl
def test_upload_to_an_opencl_device(tmp_path):
    path = write_test_model(tmp_path / "m.gguf", tied=True)
    device = OPENCL[0]
    free_before = device.memory()[0]
    reader = gguf_reader(path)
    with load_weights(path, devices=[device], n_gpu_layers=2, progress=False) as weights:
        kinds = {b.name for b in weights.buffers}
        assert kinds == {"CPU_Mapped", device.name}
        assert all(b.usage == BufferUsage.WEIGHTS for b in weights.buffers)
        for name, tp in weights.placement.tensors.items():
            w = weights[name]
            assert w.buffer.buft.device is tp.device     # CPU weights sit in the mapping
            got = tensor_get(w)
            np.testing.assert_array_equal(got, reader_bytes(reader, tp.source), err_msg=name)
        out = weights["output.weight"]
        assert out.buffer.name == device.name          # the tied copy lives on the device
        assert device.memory()[0] < free_before
    assert device.memory()[0] == free_before
    with pytest.raises(ClosedError):
        weights["output.weight"]


@needs_opencl
def test_a_failed_upload_leaves_nothing_allocated(tmp_path, monkeypatch):
    path = write_test_model(tmp_path / "m.gguf")
    device = OPENCL[0]
    free_before = device.memory()[0]
    made, opened = [], []
    real_alloc, real_open = loader_module.alloc_ctx_tensors, loader_module.GGUFFile

    def recording_alloc(ctx, buft):
        buf = real_alloc(ctx, buft)
        made.append(buf)
        return buf

    class RecordingFile(real_open):
        def __init__(self, p):
            super().__init__(p)
            opened.append(self)

    calls = {"n": 0}
    real_set = type(device.init_backend()).set_tensor_async

    def failing_set(self, t, data, offset=0):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt      # the user pressed Ctrl-C half-way through
        return real_set(self, t, data, offset)

    monkeypatch.setattr(loader_module, "alloc_ctx_tensors", recording_alloc)
    monkeypatch.setattr(loader_module, "GGUFFile", RecordingFile)
    monkeypatch.setattr(type(device.init_backend()), "set_tensor_async", failing_set)
    with pytest.raises(KeyboardInterrupt):
        load_weights(path, devices=[device], progress=False)
    assert made and all(b.closed for b in made)
    assert opened and all(f.closed for f in opened)
    assert device.memory()[0] == free_before


def test_an_open_file_is_left_open(tmp_path):
    path = write_test_model(tmp_path / "m.gguf")
    with GGUFFile(path) as f:
        weights = load_weights(f, devices=[], progress=False)
        weights.close()
        assert not f.closed and f.tensor_data("output.weight").size > 0
        assert weights.closed


def test_unknown_weight_names(tmp_path):
    with load_weights(write_test_model(tmp_path / "m.gguf"), devices=[]) as weights:
        assert weights.get("blk.99.attn_q.weight") is None
        assert "blk.0.attn_q.weight" in weights
        with pytest.raises(KeyError, match="no weight named 'nope'"):
            weights["nope"]
