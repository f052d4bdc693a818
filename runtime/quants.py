"""Vectorized numpy codecs for ggml's block formats, byte-compatible with ggml.

Each ``dequantize_*`` takes the raw bytes of whole blocks (any leading shape, last axis a multiple
of the block's byte size) and returns float32 values; each ``quantize_*`` takes float32 values
(last axis a multiple of the block size) and returns the blocks' bytes. The arithmetic follows
ggml's reference C code operation by operation in float32, so results are bit-exact.
"""

from __future__ import annotations

import numpy as np

QK = 32     # elements per block of the legacy formats (Q4_0 .. Q8_0)
QK_K = 256  # elements per super-block of the K formats

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)


def _blocks(raw: np.ndarray, type_size: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw).view(np.uint8)
    return raw.reshape(-1, type_size)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte ``start`` of every block, as a float32 column."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _finish(values: np.ndarray, raw: np.ndarray, type_size: int, block_size: int,
            out: np.ndarray | None) -> np.ndarray:
    shape = raw.shape[:-1] + (raw.shape[-1] // type_size * block_size,)
    values = values.reshape(shape)
    if out is None:
        return values
    np.copyto(out, values.reshape(out.shape))
    return out


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Low nibbles then high nibbles of each block's bytes: ggml's element order."""
    return (qs[:, None, :] >> _NIBBLE_SHIFTS[None, :, None]) & np.uint8(0xF)


# --- legacy 32-element formats ------------------------------------------------------------

def dequantize_q4_0(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 18)
    q = _nibbles(b[:, 2:]).reshape(-1, QK).astype(np.int8) - np.int8(8)
    return _finish(q.astype(np.float32) * _f16(b, 0), raw, 18, QK, out)


def dequantize_q4_1(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 20)
    q = _nibbles(b[:, 4:]).reshape(-1, QK).astype(np.float32)
    return _finish(q * _f16(b, 0) + _f16(b, 2), raw, 20, QK, out)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Bit e of the little-endian 32-bit field, for element e, as 0 or 16."""
    return np.unpackbits(qh, axis=-1, bitorder="little") << np.uint8(4)


def dequantize_q5_0(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 22)
    q = _nibbles(b[:, 6:]).reshape(-1, QK) | _high_bits(b[:, 2:6])
    q = q.astype(np.int8) - np.int8(16)
    return _finish(q.astype(np.float32) * _f16(b, 0), raw, 22, QK, out)


def dequantize_q5_1(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 24)
    q = (_nibbles(b[:, 8:]).reshape(-1, QK) | _high_bits(b[:, 4:8])).astype(np.float32)
    return _finish(q * _f16(b, 0) + _f16(b, 2), raw, 24, QK, out)


def dequantize_q8_0(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 34)
    q = b[:, 2:].view(np.int8).astype(np.float32)
    return _finish(q * _f16(b, 0), raw, 34, QK, out)


# --- K super-block formats ------------------------------------------------------------------

def _k4_scales_mins(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit (scale, min) pairs packed in 12 bytes (ggml's get_scale_min_k4)."""
    lo, hi, top = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([lo & 63, (top & 0xF) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def dequantize_q2_k(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 84)
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b, 80), _f16(b, 82)
    # element (n, j, h, l) = bits 2j of qs[32n + 16h + l], scale index 8n + 2j + h
    q = (qs.reshape(-1, 2, 1, 32) >> _CRUMB_SHIFTS[None, None, :, None]) & np.uint8(3)
    q = q.reshape(-1, 2, 4, 2, 16).astype(np.float32)
    dl = (d * (scales & np.uint8(0xF)).astype(np.float32)).reshape(-1, 2, 4, 2, 1)
    ml = (dmin * (scales >> np.uint8(4)).astype(np.float32)).reshape(-1, 2, 4, 2, 1)
    return _finish(dl * q - ml, raw, 84, QK_K, out)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit signed scales packed in 12 bytes, minus their bias of 32."""
    low = np.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1)
    high = (s[:, 8:12, None] >> _CRUMB_SHIFTS[None, None, :]) & 3      # [byte k%4, shift k//4]
    high = high.transpose(0, 2, 1).reshape(-1, 16)
    return (low | (high << 4)).astype(np.int8).astype(np.float32) - np.float32(32)


def dequantize_q3_k(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 110)
    hmask, qs, d = b[:, 0:32], b[:, 32:96], _f16(b, 108)
    q = (qs.reshape(-1, 2, 1, 32) >> _CRUMB_SHIFTS[None, None, :, None]) & np.uint8(3)
    # the high bit of element (n, j, h, l) is bit 4n + j of hmask[16h + l]; clear means -4
    bits = np.unpackbits(hmask[:, None, :], axis=1, bitorder="little")   # (nb, 8, 32)
    q = q.astype(np.int8) - ((bits.reshape(-1, 2, 4, 32) ^ np.uint8(1)) << np.uint8(2)).astype(np.int8)
    dl = (d * _q3_k_scales(b[:, 96:108])).reshape(-1, 2, 4, 2, 1)
    return _finish(dl * q.reshape(-1, 2, 4, 2, 16).astype(np.float32), raw, 110, QK_K, out)


def dequantize_q4_k(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 144)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k4_scales_mins(b[:, 4:16])
    # element (j, h, l) = nibble h of qs[32j + l], scale index 2j + h
    q = (b[:, 16:].reshape(-1, 4, 1, 32) >> _NIBBLE_SHIFTS[None, None, :, None]) & np.uint8(0xF)
    d1 = (d * sc).reshape(-1, 4, 2, 1)
    m1 = (dmin * mn).reshape(-1, 4, 2, 1)
    return _finish(d1 * q.astype(np.float32) - m1, raw, 144, QK_K, out)


def dequantize_q5_k(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 176)
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k4_scales_mins(b[:, 4:16])
    q = (b[:, 48:].reshape(-1, 4, 1, 32) >> _NIBBLE_SHIFTS[None, None, :, None]) & np.uint8(0xF)
    # the fifth bit of element (j, h, l) is bit 2j + h of qh[l]
    hb = np.unpackbits(b[:, None, 16:48], axis=1, bitorder="little").reshape(-1, 4, 2, 32)
    q = (q | (hb << np.uint8(4))).astype(np.float32)
    d1 = (d * sc).reshape(-1, 4, 2, 1)
    m1 = (dmin * mn).reshape(-1, 4, 2, 1)
    return _finish(d1 * q - m1, raw, 176, QK_K, out)


def dequantize_q6_k(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 210)
    ql, qh = b[:, 0:128], b[:, 128:192]
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    # element (n, g, l), g = 2*nib + half: nibble `nib` of ql[64n + 32*half + l],
    # two high bits at 2g of qh[32n + l], scale index 8n + 2g + l//16
    low = (ql.reshape(-1, 2, 1, 2, 32) >> _NIBBLE_SHIFTS[None, None, :, None, None]) & np.uint8(0xF)
    high = (qh.reshape(-1, 2, 1, 32) >> _CRUMB_SHIFTS[None, None, :, None]) & np.uint8(3)
    q = low.reshape(-1, 2, 4, 32) | (high << np.uint8(4))
    q = (q.astype(np.int8) - np.int8(32)).astype(np.float32).reshape(-1, 2, 4, 2, 16)
    dl = (d * sc).reshape(-1, 2, 4, 2, 1)
    return _finish(dl * q, raw, 210, QK_K, out)



# --- non-linear 4-bit formats ---------------------------------------------------------------------

# kvalues_iq4nl: the 16 levels of IQ4_NL/IQ4_XS, denser near zero like a weight distribution
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)


def dequantize_iq4_nl(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 18)
    q = IQ4_LEVELS[_nibbles(b[:, 2:]).reshape(-1, QK)]
    return _finish(q * _f16(b, 0), raw, 18, QK, out)


def dequantize_iq4_xs(raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    b = _blocks(raw, 136)
    d = _f16(b, 0)
    scales_h = b[:, 2:4].copy().view(np.uint16)                            # (nb, 1)
    scales_l = b[:, 4:8]
    # sub-block j's 6-bit scale: nibble j%2 of scales_l[j//2], two high bits at 2j of scales_h
    low = ((scales_l[:, :, None] >> _NIBBLE_SHIFTS[None, None, :]) & np.uint8(0xF)).reshape(-1, 8)
    high = (scales_h >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)
    ls = (low.astype(np.int16) | (high.astype(np.int16) << 4)) - np.int16(32)
    dl = (d * ls.astype(np.float32)).reshape(-1, 8, 1)
    q = IQ4_LEVELS[_nibbles(b[:, 8:].reshape(-1, 16)).reshape(-1, 8, QK)]
    return _finish(dl * q, raw, 136, QK_K, out)

# --- quantizers (ggml's *_ref functions) ------------------------------------------------------

def _as_blocks(values: np.ndarray, block_size: int) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1, block_size)


def _to_f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _abs_max_signed(blocks: np.ndarray) -> np.ndarray:
    """The value of largest magnitude in each block (first one on ties, as ggml's loop)."""
    idx = np.abs(blocks).argmax(axis=1)[:, None]
    return np.take_along_axis(blocks, idx, axis=1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    half = q.shape[1] // 2
    return (q[:, :half] & np.uint8(0xF)) | (q[:, half:] << np.uint8(4))


def _trunc_u8(x: np.ndarray, top: int) -> np.ndarray:
    """C's (int8_t) truncation of a non-negative float, then MIN(top, .)."""
    return np.minimum(np.trunc(x).astype(np.int16), top).astype(np.uint8)


def _shaped(blocks_bytes: np.ndarray, values: np.ndarray, block_size: int) -> np.ndarray:
    values = np.asarray(values)
    nblocks_per_row = values.shape[-1] // block_size
    return blocks_bytes.reshape(values.shape[:-1] + (nblocks_per_row * blocks_bytes.shape[1],))


def quantize_q4_0(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK)
    d = _abs_max_signed(x) / np.float32(-8)
    q = _trunc_u8(x * _reciprocal(d) + np.float32(8.5), 15)
    return _shaped(np.concatenate([_to_f16_bytes(d), _pack_nibbles(q)], axis=1), values, QK)


def quantize_q4_1(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = _trunc_u8((x - lo) * _reciprocal(d) + np.float32(0.5), 15)
    out = np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), _pack_nibbles(q)], axis=1)
    return _shaped(out, values, QK)


def _fifth_bits(q: np.ndarray) -> np.ndarray:
    return np.packbits(q >> np.uint8(4), axis=1, bitorder="little")


def quantize_q5_0(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK)
    d = _abs_max_signed(x) / np.float32(-16)
    q = _trunc_u8(x * _reciprocal(d) + np.float32(16.5), 31)
    out = np.concatenate([_to_f16_bytes(d), _fifth_bits(q), _pack_nibbles(q)], axis=1)
    return _shaped(out, values, QK)


def quantize_q5_1(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(31)
    q = _trunc_u8((x - lo) * _reciprocal(d) + np.float32(0.5), 31)
    out = np.concatenate([_to_f16_bytes(d), _to_f16_bytes(lo), _fifth_bits(q), _pack_nibbles(q)],
                         axis=1)
    return _shaped(out, values, QK)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf in float32 (x + 0.5 would round 0.49999997 up)."""
    a = np.abs(x)
    whole = np.floor(a)
    return np.copysign(whole + (a - whole >= np.float32(0.5)), x)


def quantize_q8_0(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK)
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(x * _reciprocal(d)).astype(np.int8).view(np.uint8)
    return _shaped(np.concatenate([_to_f16_bytes(d), q], axis=1), values, QK)



# --- K-quant quantizers -----------------------------------------------------------------------
#
# Not ggml's iterative searches (make_qkx2_quants, make_qx_quants): each sub-block gets the
# affine (or symmetric) fit of its range, refined by least squares on its levels, and the
# sub-block scales are stored in 6 or 8 bits against the super-block's fp16 scales. Any
# encoding is valid ggml data; these come within a few percent of ggml's error (see tests).

def _fit_affine(x: np.ndarray, n_max: int, rounds: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``x``: scale s > 0 and offset m >= 0 with x ~ s * q - m, q in 0..n_max."""
    lo = np.minimum(x.min(axis=-1, keepdims=True), 0)
    s = (x.max(axis=-1, keepdims=True) - lo) / np.float32(n_max)
    m = -lo
    n = np.float32(x.shape[-1])
    for _ in range(rounds):      # least squares for (s, m) given the levels, then re-level
        q = np.clip(np.rint((x + m) * _reciprocal(s)), 0, n_max)
        sq, sx = q.sum(-1, keepdims=True), x.sum(-1, keepdims=True)
        sqq, sxq = (q * q).sum(-1, keepdims=True), (x * q).sum(-1, keepdims=True)
        det = n * sqq - sq * sq
        with np.errstate(divide="ignore", invalid="ignore"):
            s_ls = (n * sxq - sq * sx) / det
            m_ls = (sq * s_ls - sx) / n
            s_0 = sxq / sqq                                      # the fit with m = 0
        s_new = np.where(m_ls >= 0, s_ls, s_0)
        m_new = np.where(m_ls >= 0, m_ls, 0)
        ok = np.isfinite(s_new) & (s_new > 0) & np.isfinite(m_new)
        s, m = np.where(ok, s_new, s).astype(np.float32), np.where(ok, m_new, m).astype(np.float32)
    return s, m


def _super_scale(v: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """fp16 super-scale d and integer multipliers in 0..top with d * k ~ v (v >= 0)."""
    d16 = (v.max(axis=-1, keepdims=True) / np.float32(top)).astype(np.float16).astype(np.float32)
    k = np.clip(np.rint(v * _reciprocal(d16)), 0, top).astype(np.uint8)
    return d16, k


def _pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit (scale, min) pairs into 12 bytes (inverse of _k4_scales_mins)."""
    lo = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    hi = (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6)
    top = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return np.concatenate([lo, hi, top], axis=1).astype(np.uint8)


def _affine_levels(x: np.ndarray, n_max: int) -> tuple[np.ndarray, ...]:
    """K-quant affine sub-blocks (nb, 8, 32): d, dmin, 6-bit scales, mins and the levels."""
    s, m = _fit_affine(x, n_max)
    d, sc = _super_scale(s[..., 0], 63)
    dmin, mn = _super_scale(m[..., 0], 63)
    step = (d * sc)[..., None]
    offset = (dmin * mn)[..., None]
    q = np.clip(np.rint((x + offset) * _reciprocal(step)), 0, n_max).astype(np.uint8)
    return d, dmin, sc, mn, q


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK_K).reshape(-1, 8, 32)
    d, dmin, sc, mn, q = _affine_levels(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << np.uint8(4))).reshape(-1, 128)   # sub-blocks 2j, 2j+1
    out = np.concatenate([_to_f16_bytes(d), _to_f16_bytes(dmin), _pack_k4_scales(sc, mn), qs],
                         axis=1)
    return _shaped(out, values, QK_K)


def quantize_q5_k(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK_K).reshape(-1, 8, 32)
    d, dmin, sc, mn, q = _affine_levels(x, 31)
    low = q & np.uint8(0xF)
    qs = (low[:, 0::2] | (low[:, 1::2] << np.uint8(4))).reshape(-1, 128)
    # bit k of qh[l] is the fifth bit of element l of sub-block k
    qh = np.packbits((q >> np.uint8(4)).transpose(0, 2, 1), axis=-1, bitorder="little")
    out = np.concatenate([_to_f16_bytes(d), _to_f16_bytes(dmin), _pack_k4_scales(sc, mn),
                          qh.reshape(-1, 32), qs], axis=1)
    return _shaped(out, values, QK_K)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    x = _as_blocks(values, QK_K).reshape(-1, 16, 16)
    # symmetric sub-blocks: the largest magnitude maps to -32, as ggml's make_qx_quants starts
    scale = _abs_max_signed(x.reshape(-1, 16)).reshape(-1, 16) / np.float32(-32)
    biggest = _abs_max_signed(scale)
    d = (biggest / np.float32(-128)).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale * _reciprocal(d)), -128, 127).astype(np.int8)
    step = (d * sc.astype(np.float32))[..., None]
    q = (np.clip(np.rint(x * _reciprocal(step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)                                         # (n, g, l)
    low = (q & np.uint8(0xF)).reshape(-1, 2, 2, 2, 32)                  # (n, nibble, half, l)
    ql = (low[:, :, 0] | (low[:, :, 1] << np.uint8(4))).reshape(-1, 128)
    high = (q >> np.uint8(4)) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    qh = np.bitwise_or.reduce(high, axis=2).reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), _to_f16_bytes(d)], axis=1)
    return _shaped(out, values, QK_K)

# --- 16-bit floats ----------------------------------------------------------------------------

def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """ggml's fp32 -> bf16: round to nearest even, NaN forced quiet. Returns uint16 bits."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16
    nan = ((u >> 16) | 64).astype(np.uint64)
    return np.where((u & 0x7FFFFFFF) > 0x7F800000, nan, rounded).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
