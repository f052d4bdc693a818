"""Type traits and codecs: bit-exact against gguf.quants (ggml's own dequantizers)."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import GGMLType, TYPE_TRAITS, dequantize, quantize, row_size
from polydev.errors import ShapeError, TensorTypeError

gguf = pytest.importorskip("gguf")
pytest.importorskip("gguf.quants")        # loads the submodule the tests read as gguf.quants

DEQUANT = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
           GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
           GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.F16, GGMLType.BF16]
QUANT = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
         GGMLType.F16, GGMLType.BF16]


def _gguf_type(t: GGMLType):
    return gguf.GGMLQuantizationType[t.name]


def test_ids_and_sizes_match_gguf():
    for t, tr in TYPE_TRAITS.items():
        g = _gguf_type(t)
        assert int(g) == int(t)
        assert gguf.GGML_QUANT_SIZES[g] == (tr.block_size, tr.type_size), t.name


@pytest.mark.parametrize("qtype", DEQUANT, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_dequantize_bit_exact(qtype, seed):
    rng = np.random.default_rng(seed)
    tr = qtype.traits
    raw = rng.integers(0, 256, size=(5, tr.type_size * (512 // tr.block_size)), dtype=np.uint8)
    with np.errstate(all="ignore"):   # random bytes include NaN/Inf scales, on both sides
        ref = gguf.quants.dequantize(raw, _gguf_type(qtype))
        got = dequantize(raw, qtype)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("qtype", QUANT, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_quantize_byte_exact(qtype, scale):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 256)) * scale).astype(np.float32)
    x[0, :32] = 0.0                                   # an all-zero block
    x[1, 5] = x[1, 6] = np.float32(3.0) * scale       # ties for the largest magnitude
    ref = gguf.quants.quantize(x, _gguf_type(qtype))
    got = quantize(x, qtype)
    np.testing.assert_array_equal(got.view(np.uint8).reshape(6, -1),
                                  ref.view(np.uint8).reshape(6, -1))



K_QUANT = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
# ggml's test-quantize-fns: data 0.1 + 2 cos(i), error sqrt(sum of squares) / n
GGML_TOTAL_ERROR = 0.002
# relative RMS error on unit Gaussians; ggml's own quantizers reach 0.071, 0.036, 0.018
GAUSSIAN_REL_RMSE = {GGMLType.Q4_K: 0.080, GGMLType.Q5_K: 0.040, GGMLType.Q6_K: 0.020}


@pytest.mark.parametrize("qtype", K_QUANT, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3, 300.0])
def test_k_quants_round_trip_and_ggml_reads_the_same(qtype, scale):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((6, 1024)) * scale).astype(np.float32)
    x[0, :256] = 0.0                                  # an all-zero super-block
    x[1, :256] = np.float32(0.5 * scale)              # a constant one
    x[2, 256:512] = np.abs(x[2, 256:512])             # all positive: offset 0
    raw = quantize(x, qtype)
    assert raw.shape == (6, 1024 // 256 * qtype.traits.type_size)
    got = dequantize(raw, qtype)
    ref = gguf.quants.dequantize(raw, _gguf_type(qtype)).reshape(got.shape)
    np.testing.assert_array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(got[0, :256], 0.0)
    rel = np.sqrt(np.mean((got[3:] - x[3:]) ** 2)) / np.sqrt(np.mean(x[3:] ** 2))
    assert rel <= GAUSSIAN_REL_RMSE[qtype], f"relative RMSE {rel:.4f}"


@pytest.mark.parametrize("qtype", K_QUANT, ids=str)
def test_k_quants_meet_ggml_total_error(qtype):
    n = 32 * 128
    x = (0.1 + 2 * np.cos(np.arange(n, dtype=np.float32))).astype(np.float32)
    y = dequantize(quantize(x[None], qtype), qtype)[0]
    err = np.sqrt(np.sum((y.astype(np.float64) - x) ** 2)) / n
    assert err < GGML_TOTAL_ERROR


def test_row_size_and_errors():
    assert row_size(GGMLType.Q4_K, 4096) == 4096 // 256 * 144
    assert row_size(GGMLType.F16, 7) == 14
    with pytest.raises(ShapeError, match="block"):
        row_size(GGMLType.Q4_0, 33)
    with pytest.raises(TensorTypeError, match="cannot quantize"):
        quantize(np.zeros(256, np.float32), GGMLType.Q3_K)
    with pytest.raises(TensorTypeError, match="unknown tensor type"):
        GGMLType.parse("q9_9")
    assert GGMLType.parse("q4_k") is GGMLType.Q4_K and GGMLType.parse(1) is GGMLType.F16
    assert str(GGMLType.Q4_K) == "q4_K"
