"""Files that are valid GGUF but wrong models: each is one typed error naming the key or
tensor, from ``polydev.models.load`` and ``polydev info`` alike, before anything is sized by
it; and every architecture's table agrees with what the tests write and llama.cpp reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("regex")

from polydev.errors import ModelFileError, UnsupportedError  # noqa: E402
from polydev.models import load  # noqa: E402
from polydev.models.arch import ARCHITECTURES, architecture  # noqa: E402
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.hparams import HParams  # noqa: E402
from polydev.models.model_check import check_tensors  # noqa: E402

from model_files import arch_case_kwargs, rewrite, write_test_model  # noqa: E402

U32 = gguf.GGUFValueType.UINT32


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return write_test_model(tmp_path_factory.mktemp("base") / "m.gguf", n_layer=2,
                            weight_type="F16")


def _broken(tmp_path, base, **changes) -> Path:
    return rewrite(base, tmp_path / "broken.gguf", **changes)


CASES = {
    "missing tensor": (dict(drop=["blk.1.attn_k.weight"]),
                       ModelFileError, r"required tensor blk\.1\.attn_k\.weight .*is missing"),
    "missing output norm": (dict(drop=["output_norm.weight"]), ModelFileError,
                            r"required tensor output_norm\.weight is missing"),
    "empty name": (dict(rename={"blk.0.ffn_up.weight": ""}), ModelFileError,
                   r"a tensor has an empty name"),
    "unknown tensor": (dict(rename={"blk.0.ffn_up.weight": "blk.0.ffn_upp.weight"}),
                       ModelFileError, r"'blk\.0\.ffn_upp\.weight' is not part of a llama"),
    "layer past block_count": (dict(rename={"blk.1.ffn_up.weight": "blk.7.ffn_up.weight"}),
                               ModelFileError, r"blk\.7\.ffn_up\.weight names layer 7, but "
                                               r"llama\.block_count is 2"),
    "fewer blocks than block_count": (dict(keys={"llama.block_count": (3, U32)}),
                                      ModelFileError, r"required tensor blk\.2\..* is missing"),
    "no heads": (dict(keys={"llama.attention.head_count": (0, U32)}), ModelFileError,
                 r"llama\.attention\.head_count is 0: must be above 0"),
    "kv heads do not divide": (dict(keys={"llama.attention.head_count_kv": (3, U32)}),
                               ModelFileError, r"head_count_kv is 3: must be above 0 and "
                                               r"divide head_count \(4\)"),
    "embedding length disagrees": (dict(keys={"llama.embedding_length": (96, U32)}),
                                   ModelFileError, r"token_embd\.weight has shape \(64, 320\), "
                                                   r"expected \(96, 320\)"),
    "vocabulary shorter than the embedding": (
        dict(reshape={"token_embd.weight": (64, 400)}), ModelFileError,
        r"token_embd\.weight has shape \(64, 400\), expected \(64, 320\) \(n_embd, n_vocab: "
        r"n_embd 64, n_vocab 320\)"),
    "wrong shape": (dict(reshape={"blk.0.attn_q.weight": (64, 32)}), ModelFileError,
                    r"blk\.0\.attn_q\.weight has shape \(64, 32\), expected \(64, 64\)"),
    "huge block_count": (dict(keys={"llama.block_count": (10**9, U32)}), ModelFileError,
                         r"block_count is 1000000000: must be 1 to 512"),
    "missing block_count": (dict(drop_keys=["llama.block_count"]), ModelFileError,
                            r"llama\.block_count is missing"),
    "block_count a string": (dict(keys={"llama.block_count": ("two",
                                                              gguf.GGUFValueType.STRING)}),
                             ModelFileError, r"block_count must be an integer; it is 'two'"),
    "rms epsilon zero": (dict(keys={"llama.attention.layer_norm_rms_epsilon": (
        0.0, gguf.GGUFValueType.FLOAT32)}), ModelFileError, r"rms_epsilon is 0\.0"),
    "more experts used than exist": (dict(keys={"llama.expert_used_count": (2, U32)}),
                                     ModelFileError, r"expert_used_count is 2 without experts"),
    "no vocabulary": (dict(drop_keys=["tokenizer.ggml.tokens"]), ModelFileError,
                      r"has no vocabulary"),
    "unsupported architecture": (dict(keys={"general.architecture": (
        "bert", gguf.GGUFValueType.STRING)}), UnsupportedError,
        r"architecture 'bert' is not supported \(polydev runs .*gemma3.*llama"),
}


@pytest.fixture(scope="module")
def kv_b_base(tmp_path_factory) -> Path:
    """A deepseek2 in the older form (attn_kv_b): 4 heads, kv_lora_rank 64, k heads of 32
    non-rope and 16 rope values, v heads of 40."""
    return write_test_model(tmp_path_factory.mktemp("kvb") / "kvb.gguf",
                            **arch_case_kwargs("deepseek2-kvb", "F16"))


KV_B_CASES = {
    "attn_kv_b of the wrong shape": (
        dict(reshape={"blk.1.attn_kv_b.weight": (64, 4 * (48 + 40))}), ModelFileError,
        r"tensor blk\.1\.attn_kv_b\.weight has shape \(64, 352\), expected \(64, 288\) "
        r"\(n_lora_kv, n_head \* \(n_embd_head_k_mla - n_rot \+ n_embd_head_v_mla\): "
        r"n_lora_kv 64, n_head 4, n_embd_head_v_mla 40, n_embd_head_k_mla 48, n_rot 16\)"),
    "attn_kv_b missing": (dict(drop=["blk.0.attn_kv_b.weight"]), ModelFileError,
                          r"required tensor blk\.0\.attn_kv_b\.weight is missing \(deepseek2's "
                          r"k and v decompression \(the older form"),
    "one kv head": (dict(keys={"deepseek2.attention.head_count_kv": (1, U32)}), ModelFileError,
                    r"deepseek2: in the older form \(attn_kv_b, no attention\.key_length_mla\) "
                    r"the cache holds every head's K and V: head_count_kv must equal "
                    r"head_count"),
    "key_length_mla without value_length_mla": (
        dict(keys={"deepseek2.attention.key_length_mla": (48, U32)}), ModelFileError,
        r"deepseek2\.attention\.value_length_mla is missing or 0 while key_length_mla is 48"),
    "MLA keys over attn_kv_b": (
        dict(keys={"deepseek2.attention.key_length_mla": (48, U32),
                   "deepseek2.attention.value_length_mla": (40, U32)}), ModelFileError,
        r"deepseek2: in llama\.cpp's MLA form \(attention\.key_length_mla set\) the cache "
        r"holds one compressed row per token: head_count_kv must be 1"),
    "no non-rope part": (dict(keys={"deepseek2.attention.key_length": (16, U32)}),
                         ModelFileError, r"deepseek2: a decompressed k head .* must be longer "
                                         r"than its rope part"),
}
"""deepseek2 files in the older form that are wrong, each told what is wrong."""


@pytest.mark.parametrize("base_file, case", [("base", case) for case in CASES]
                         + [("kv_b_base", case) for case in KV_B_CASES])
def test_a_wrong_model_is_one_typed_error(tmp_path, request, base_file, case):
    """Each case broken from its base file (a llama, or deepseek2's older form)."""
    changes, error, message = (CASES if base_file == "base" else KV_B_CASES)[case]
    path = _broken(tmp_path, request.getfixturevalue(base_file), **changes)
    with pytest.raises(error, match=message):
        load(path, devices=[], n_ctx=64, progress=False)


def test_a_malformed_older_form_deepseek2_is_one_line_of_polydev_info(tmp_path, kv_b_base):
    changes, _, message = KV_B_CASES["attn_kv_b of the wrong shape"]
    _info_says_it_in_one_line(_broken(tmp_path, kv_b_base, **changes), message)


@pytest.mark.parametrize("case", ["missing tensor", "empty name", "huge block_count",
                                  "unsupported architecture", "vocabulary shorter than the "
                                  "embedding"])
def test_polydev_info_says_it_in_one_line(tmp_path, base, case):
    changes, _, message = CASES[case]
    _info_says_it_in_one_line(_broken(tmp_path, base, **changes), message)


def _info_says_it_in_one_line(path: Path, message: str) -> None:
    """``polydev info`` on ``path`` fails with one line on stderr that matches ``message``."""
    run = subprocess.run([sys.executable, "-m", "polydev.tools.cli", "info", "-m", str(path)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    import re
    assert re.search(message, lines[0]), lines[0]


def test_a_fused_qkv_stands_in_for_q_k_v(tmp_path, base):
    """llama.cpp's create_tensor_qkv: attn_qkv in place of the three (and then they are not
    required)."""
    with GGUFFile(base) as f:
        hp = HParams.from_gguf(f)
        present = check_tensors(f, hp)
    assert present["blk.0.attn_q.weight"].unless == "blk.0.attn_qkv.weight"
    q, k, v = (64, 32, 32)
    path = rewrite(base, tmp_path / "fused.gguf",
                   drop=["blk.0.attn_q.weight", "blk.0.attn_k.weight"],
                   rename={"blk.0.attn_v.weight": "blk.0.attn_qkv.weight"},
                   reshape={"blk.0.attn_v.weight": (64, q + k + v)})
    with GGUFFile(path) as f:
        present = check_tensors(f, HParams.from_gguf(f))
    assert present["blk.0.attn_qkv.weight"].shape == (64, q + k + v)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_table_entry_is_consistent(name):
    """Short names unique (the builders read weights by them) and ops placement knows (an
    ``unless`` naming no tensor of the entry, a key or expression with an unknown name,
    raise as the table is imported: tests/test_models_tables.py)."""
    spec = architecture(name)
    shorts = [t.short for t in spec.tensors]
    assert len(shorts) == len(set(shorts)), name
    for t in spec.tensors:
        assert t.op in ("GET_ROWS", "MUL_MAT", "MUL_MAT_ID", "MUL", "ADD", "ROPE",
                        "FLASH_ATTN_EXT"), t
