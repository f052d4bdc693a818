"""Which way the CPU backend multiplies a weight by float32 activation rows: one decision, made
here and named, that the MUL_MAT and MUL_MAT_ID binders dispatch on.

The compiled kernels have several products of a block-format (or F16) weight. Which one a
product takes depends on the numerics asked for (polydev.numerics), what this build of the
kernels has (int16 products need AVX2, int8 ones AVX-512 VNNI), the weight (its type, and
whether the weight cache keeps an interleaved copy of it) and the number of activation rows:

- ``ARRAY``: numpy's product (the shared array kernel), for activation or result rows the
  kernels cannot step through with one stride.
- ``INTERLEAVED_INT8``, ``INTERLEAVED_INT16``: from the weight's copy with 16 rows interleaved
  (native/interleaved.c), the activations quantized to int8 (numerics "int8", where the build
  has those kernels: native/interleaved_int8.c) or to int16. Under integer numerics a weight
  with such a copy takes it for any number of rows: those kernels reuse each unpacked weight
  block for a tile of rows, so they outrun both the integer kernels on the weight's own layout
  and the tiles through BLAS.
- ``INT16``: from the weight's own blocks, the activations quantized to int16
  (native/int_dot.c; many rows of the K-quants by the GEMM of native/int_gemm.c, which unpacks
  each weight block once for all rows instead of decoding it to float32 for BLAS).
- ``BLOCKS``: float32 products straight from the blocks (native/kernels.c), for a few rows (a
  decode step): each block is widened in registers where it is used, so a product reads the
  weight's own bytes, never a float32 copy of four to seven times their size.
- ``TILES_BLAS``: many rows (a prompt) in float32: the weight decoded a tile of rows at a time
  into one scratch buffer and each tile multiplied through numpy's BLAS, which is faster per
  row than the block kernels once the rows are many, and still holds no float32 copy of the
  whole weight.

The float32 paths give ggml's decoded values' products, equal to the numpy path's up to
float32 rounding; "exact" numerics take only them.
"""

from __future__ import annotations

from enum import Enum

from .native import NativeKernels

# up to this many activation rows the float32 products read the blocks; above, tiles + BLAS
BLOCK_PRODUCT_ROWS = 32


class ProductPath(Enum):
    """A way of multiplying a weight by float32 activation rows (see the module)."""

    ARRAY = "array"
    INTERLEAVED_INT8 = "interleaved-int8"
    INTERLEAVED_INT16 = "interleaved-int16"
    INT16 = "int16"
    BLOCKS = "blocks"
    TILES_BLAS = "tiles-blas"

    @property
    def interleaved(self) -> bool:
        """Whether the path multiplies from the weight's interleaved copy."""
        return self in (ProductPath.INTERLEAVED_INT8, ProductPath.INTERLEAVED_INT16)

    @property
    def activation_bits(self) -> int | None:
        """The integers the path quantizes the activations to (8 or 16), or None for a path
        that multiplies them in float32."""
        return _ACTIVATION_BITS.get(self)


_ACTIVATION_BITS = {ProductPath.INTERLEAVED_INT8: 8, ProductPath.INTERLEAVED_INT16: 16,
                    ProductPath.INT16: 16}


def product_path(numerics: str, lib: NativeKernels, type_id: int, n_rows: int, *,
                 interleaved: bool = False, one_stride: bool = True) -> ProductPath:
    """The path of a product of ``n_rows`` activation rows by a weight of ggml type ``type_id``
    under ``numerics`` ("exact", "fast" or "int8") with the kernels ``lib``. ``interleaved``:
    the weight cache keeps an interleaved copy of the weight (``interleaved_copy``);
    ``one_stride``: the activation rows, and the result's, are each one stride apart."""
    if not one_stride:
        return ProductPath.ARRAY
    if numerics != "exact":
        if interleaved:
            return (ProductPath.INTERLEAVED_INT8 if numerics == "int8" and lib.has_int8_products
                    else ProductPath.INTERLEAVED_INT16)
        if lib.has_int16_gemm(type_id) or (n_rows <= BLOCK_PRODUCT_ROWS
                                           and lib.has_int16_product(type_id)):
            return ProductPath.INT16
    return ProductPath.BLOCKS if n_rows <= BLOCK_PRODUCT_ROWS else ProductPath.TILES_BLAS
