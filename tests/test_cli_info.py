"""``polydev info``: the model, its tokenizer and tensors as the file says, the placement the
knobs ask for, and a user's mistakes as one line."""

from __future__ import annotations

import argparse
import json

import pytest

pytest.importorskip("gguf")

from polydev.models.placement_settings import PLACEMENT_KNOBS, PlacementSettings  # noqa: E402
from polydev.tools.cli import build_parser, main  # noqa: E402
from polydev.tools.placement_options import add_placement_options, placement_settings  # noqa: E402

from model_files import GEMMA3, SMOLLM2, gguf_reader, model_path, write_test_model  # noqa: E402


def info_json(capsys, *argv: str) -> dict:
    assert main(["info", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_the_report_matches_the_file(capsys, name):
    path = model_path(name)
    reader = gguf_reader(path)
    report = info_json(capsys, "-m", str(path), "--device", "none")
    arch = str(reader.fields["general.architecture"].contents())
    assert report["architecture"] == arch
    assert report["hparams"]["n_layer"] == reader.fields[f"{arch}.block_count"].contents()
    assert report["hparams"]["n_embd"] == reader.fields[f"{arch}.embedding_length"].contents()
    assert report["tensors"]["count"] == len(reader.tensors)
    assert report["tensors"]["bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    by_type = report["tensors"]["by_type"]
    assert sum(v["count"] for v in by_type.values()) == len(reader.tensors)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    assert report["tokenizer"]["n_vocab"] == n_vocab
    placement = report["placement"]
    assert set(placement["layers"]) == {"CPU"} and placement["output"] == "CPU"
    assert "tensors" not in placement


def test_the_default_model_is_gemma(capsys):
    model_path(GEMMA3)                        # skips without the package
    report = info_json(capsys)
    assert report["architecture"] == "gemma3" and report["file"].endswith(f"{GEMMA3}.gguf")


def test_text_report_and_knobs(capsys, tmp_path):
    path = write_test_model(tmp_path / "m.gguf", n_layer=6)
    assert main(["info", "-m", str(path), "--device", "none", "-ngl", "3", "--tensors",
                 "-ot", "attn_q=CPU"]) == 0
    out = capsys.readouterr().out
    assert "architecture llama" in out and "0-5, output" in out
    assert "blk.0.attn_q.weight" in out and "override attn_q" in out
    report = info_json(capsys, "-m", str(path), "--device", "none", "--tensors", "-c", "512")
    assert report["placement"]["settings"]["n_ctx"] == 512
    assert len(report["placement"]["tensors"]) == 6 * 9 + 3


@pytest.mark.parametrize("argv, message", [
    (["-m", "/no/such/model.gguf"], "no such file"),
    (["-sm", "row"], "not supported"),
    (["-ts", "3,x"], "expected numbers"),
    (["--device", "CUDA9"], "unknown device"),
    (["-ngl", "-5"], "n_gpu_layers"),
    (["-c", "0"], "n_ctx must be positive"),
])
def test_mistakes_are_one_line(capsys, tmp_path, argv, message):
    path = write_test_model(tmp_path / "m.gguf")
    if "-m" not in argv:
        argv = ["-m", str(path), *argv]
    assert main(["info", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and err.startswith("polydev: error:")


def test_the_command_line_makes_one_record():
    parse = build_parser().parse_args
    assert placement_settings(parse(["info"])) == PlacementSettings()     # the same defaults
    args = parse(["run", "-ngl", "5", "-ts", "3/1", "--device", "none", "-c", "512", "-b", "64",
                  "-ot", "attn_q=CPU", "-ot", "ffn=GPU0", "-nkvo", "--cpu-moe", "-sm", "none"])
    assert placement_settings(args) == PlacementSettings(
        devices=[], n_gpu_layers=5, tensor_split=[3, 1], n_ctx=512, n_batch=64,
        override_tensor=["attn_q=CPU", "ffn=GPU0"], no_kv_offload=True, cpu_moe=True,
        split_mode="none")
    bench = parse(["bench", "-ngl", "2", "-b", "64", "--device", "CPU,OpenCL0"])
    assert placement_settings(bench, n_ctx=100) == PlacementSettings(
        devices=["CPU", "OpenCL0"], n_gpu_layers=2, n_batch=64, n_ctx=100)


def test_every_placement_option_is_a_knob():
    """An option's dest is its knob's name: that is how the record gets it."""
    parser = argparse.ArgumentParser()
    add_placement_options(parser)
    assert set(vars(parser.parse_args([]))) <= set(PLACEMENT_KNOBS)


def test_a_corrupt_file_is_one_line(capsys, tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    assert main(["info", "-m", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.gguf" in err and "offset" in err
