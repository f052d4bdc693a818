"""The CPU backend's choice of product path (backends/cpu/product_path.py): for each numerics,
build features, weight type and row count, the path MUL_MAT and MUL_MAT_ID's experts take."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from polydev import GGMLType
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.product_path import BLOCK_PRODUCT_ROWS, ProductPath, product_path

Q4_0, Q4_K, F16 = int(GGMLType.Q4_0), int(GGMLType.Q4_K), int(GGMLType.F16)
FEW, MANY = 1, BLOCK_PRODUCT_ROWS + 1


@dataclass
class Features:
    """What product_path asks of a build of the kernels, set by hand: a build for a CPU other
    than this one (no AVX2, no AVX-512 VNNI)."""

    int16_products: set = field(default_factory=set)
    int16_gemms: set = field(default_factory=set)
    has_int8_products: bool = False

    def has_int16_product(self, type_id: int) -> bool:
        return type_id in self.int16_products

    def has_int16_gemm(self, type_id: int) -> bool:
        return type_id in self.int16_gemms


# AVX-512 VNNI: int16 products of both types, the GEMM of the K-quants, int8
VNNI = Features({Q4_0, Q4_K}, {Q4_K}, has_int8_products=True)
AVX2 = Features({Q4_0, Q4_K}, {Q4_K})             # int16, no int8
BASELINE = Features()                             # SSE2: float32 products only

P = ProductPath


@pytest.mark.parametrize("numerics, lib, type_id, n_rows, interleaved, expected", [
    # exact numerics: float32 from the blocks, tiles through BLAS for a prompt, whatever else
    ("exact", VNNI, Q4_K, FEW, True, P.BLOCKS),
    ("exact", VNNI, Q4_K, MANY, True, P.TILES_BLAS),
    ("exact", VNNI, Q4_K, BLOCK_PRODUCT_ROWS, False, P.BLOCKS),
    # an interleaved copy takes any number of rows, in int8 only under "int8" with its kernels
    ("fast", VNNI, Q4_K, FEW, True, P.INTERLEAVED_INT16),
    ("fast", VNNI, Q4_0, MANY, True, P.INTERLEAVED_INT16),
    ("int8", VNNI, Q4_K, MANY, True, P.INTERLEAVED_INT8),
    ("int8", AVX2, Q4_K, MANY, True, P.INTERLEAVED_INT16),
    # without a copy, int16 from the blocks: any rows with a GEMM, else a few rows only
    ("fast", VNNI, Q4_K, MANY, False, P.INT16),
    ("int8", VNNI, Q4_K, FEW, False, P.INT16),
    ("fast", AVX2, Q4_0, FEW, False, P.INT16),
    ("fast", AVX2, Q4_0, MANY, False, P.TILES_BLAS),
    # a type, or a build, without integer kernels: float32
    ("fast", VNNI, F16, FEW, False, P.BLOCKS),
    ("fast", VNNI, F16, MANY, False, P.TILES_BLAS),
    ("fast", BASELINE, Q4_K, FEW, False, P.BLOCKS),
    ("int8", BASELINE, Q4_K, MANY, False, P.TILES_BLAS),
])
def test_the_path_of_each_case(numerics, lib, type_id, n_rows, interleaved, expected):
    assert product_path(numerics, lib, type_id, n_rows, interleaved=interleaved) is expected


@pytest.mark.parametrize("numerics", ["exact", "fast", "int8"])
def test_rows_without_one_stride_take_the_array_kernel(numerics):
    assert product_path(numerics, VNNI, Q4_K, FEW, interleaved=True,
                        one_stride=False) is P.ARRAY


def test_the_activations_integers_of_each_path():
    assert P.INTERLEAVED_INT8.activation_bits == 8
    assert P.INTERLEAVED_INT16.activation_bits == P.INT16.activation_bits == 16
    assert all(p.activation_bits is None for p in (P.BLOCKS, P.TILES_BLAS, P.ARRAY))
    assert [p for p in P if p.interleaved] == [P.INTERLEAVED_INT8, P.INTERLEAVED_INT16]


@pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")
def test_this_build_answers_what_the_path_asks():
    """The loaded kernels have the features product_path reads, and "int8" takes int8 exactly
    where they say they have it."""
    lib = kernels()
    expected = P.INTERLEAVED_INT8 if lib.has_int8_products else P.INTERLEAVED_INT16
    assert product_path("int8", lib, Q4_K, FEW, interleaved=True) is expected
    int16 = lib.has_int16_product(Q4_0)
    assert product_path("fast", lib, Q4_0, FEW) is (P.INT16 if int16 else P.BLOCKS)
