/* What every file of polydev's compiled CPU kernels shares: ggml's block geometry and type
 * ids, fp16 to float32, the K-quants' 6-bit scales, and the AVX2 unpacking of 4- and 5-bit
 * values. Each helper is ggml's reference arithmetic (see ggml-quants.c's dequantize_row_*). */
#ifndef POLYDEV_BLOCKS_H
#define POLYDEV_BLOCKS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define QK 32
#define QK_K 256

/* The block-format types the kernels read, once: X(TYPE, name, ggml type id, values per block,
 * bytes per block, has a minimum). A file's function for a type is named <prefix>_<name>
 * (dq_q4_k, i16_q4_k, ...), so a switch over the types is one of these lists with a case per
 * row. F16 is read in "blocks" of 32 halves. */
#define PD_QUANT_TYPES(X)                       \
    X(Q4_0, q4_0, 2, QK, 18, 0)                 \
    X(Q4_1, q4_1, 3, QK, 20, 1)                 \
    X(Q5_0, q5_0, 6, QK, 22, 0)                 \
    X(Q5_1, q5_1, 7, QK, 24, 1)                 \
    X(Q8_0, q8_0, 8, QK, 34, 0)                 \
    X(Q4_K, q4_k, 12, QK_K, 144, 1)             \
    X(Q5_K, q5_k, 13, QK_K, 176, 1)             \
    X(Q6_K, q6_k, 14, QK_K, 210, 0)
#define PD_BLOCK_TYPES(X) X(F16, f16, 1, QK, 64, 0) PD_QUANT_TYPES(X)

/* ggml type ids: T_F16, T_Q4_0, ... */
#define PD_TYPE_ID(TYPE, name, id, values, bytes, has_min) T_##TYPE = id,
enum { PD_BLOCK_TYPES(PD_TYPE_ID) };
#undef PD_TYPE_ID

/* values per block of `type`, 0 for a type the kernels do not read */
static inline int block_values(int type) {
#define PD_CASE(TYPE, name, id, values, bytes, has_min) case T_##TYPE: return values;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
    return 0;
}

/* bytes per block of `type`, 0 for a type the kernels do not read */
static inline int block_bytes(int type) {
#define PD_CASE(TYPE, name, id, values, bytes, has_min) case T_##TYPE: return bytes;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
    return 0;
}

/* the packed entry points' arguments: pointer i of the int64 array a */
#define P_PTR(i) ((const uint8_t *)(intptr_t)a[i])

/* A tensor argument, as the OpenCL and CUDA kernels take theirs (TENSOR(t) in their common
 * headers): the address of its first byte, ne[4] and nb[4] in ggml's layout (bytes). In a
 * packed argument array it is TENSOR_WORDS int64 in that order (native/arguments.py's
 * TensorWords). */
typedef struct {
    uint8_t *data;
    int64_t ne[4], nb[4];
} pd_tensor;
#define TENSOR_WORDS 9

static inline pd_tensor tensor_at(const int64_t *a) {
    pd_tensor t = {(uint8_t *)(intptr_t)a[0], {a[1], a[2], a[3], a[4]}, {a[5], a[6], a[7], a[8]}};
    return t;
}

/* the address of row (i1, i2, i3) of t */
static inline uint8_t *tensor_row(const pd_tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-08f;    /* 2^-24: zero or subnormal */
        return sign ? -v : v;
    }
    bits = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* the 6-bit scale and minimum j (0-7) of a Q4_K or Q5_K block's 12 scale bytes */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#if defined(__AVX2__)
/* the sum of v's 8 floats */
static inline __attribute__((always_inline)) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the largest of v's 8 floats (NaN lanes as _mm_max_ps takes them) */
static inline __attribute__((always_inline)) float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

#if defined(__FMA__)
/* exp of 8 floats: Cody-Waite range reduction and Cephes' degree-7 polynomial (about 1 ulp);
 * 0 below -87.3, where expf is subnormal; NaN stays NaN */
static inline __attribute__((always_inline)) __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365478515625f), hi = _mm256_set1_ps(88.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 c = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), c);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(y, x, nan);
}
#endif

#if defined(__AVX512F__)
/* exp8's operations on 16 floats: lane for lane the same results */
static inline __attribute__((always_inline)) __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3365478515625f), hi = _mm512_set1_ps(88.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 c = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), c);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
                                  23);
    __m512 y = _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
    return _mm512_mask_blend_ps(nan, y, x);
}
#endif

/* 16 bytes of nibbles: the low nibbles (elements 0-15) then the high ones (16-31) */
static inline __attribute__((always_inline)) __m256i nibbles(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(0xF);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
}

/* byte e is 0x10 where bit e of the 32-bit field is set, else 0 */
static inline __attribute__((always_inline)) __m256i fifth_bits(const uint8_t *p) {
    uint32_t bits;
    memcpy(&bits, p, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                             0x0101010101010101LL, 0x0000000000000000LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}


/* group g (0-7, 32 values) of a Q4_K block as bytes: nibble (g & 1) of bytes 32 (g / 2) .. + 31 */
static inline __attribute__((always_inline)) __m256i q4_k_values(const uint8_t *b, int g) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (g >> 1)));
    if (g & 1) v = _mm256_srli_epi16(v, 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0xF));
}

/* group g of a Q5_K block as bytes: as Q4_K (at offset 48), plus bit g of qh[l] as 16 */
static inline __attribute__((always_inline)) __m256i q5_k_values(const uint8_t *b, int g) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * (g >> 1)));
    if (g & 1) v = _mm256_srli_epi16(v, 4);
    v = _mm256_and_si256(v, _mm256_set1_epi8(0xF));
    __m256i bit = _mm256_set1_epi8((char)(1 << g));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
    __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                    _mm256_set1_epi8(16));
    return _mm256_or_si256(v, high);
}
#endif

#endif
