/* polydev's compiled CPU kernels: products of ggml block-format weights with float32
 * activations, read straight from the blocks (no float32 copy of the weight), and fp16 to
 * float32 conversion.
 *
 * Built once per x86-64 feature level (variants.py) as the package is installed. A decoded block
 * holds exactly what ggml's reference dequantize_row_* gives (the same float32 operations in
 * the same order: this file is compiled with -ffp-contract=off). The block products apply each
 * group's scale to its partial sum instead (AVX_SCALED_ROWS), so they differ from the numpy
 * path (decode, then BLAS) by the order of the sums and float32 rounding.
 */
#include "blocks.h"

#define MAX_ROWS 8      /* activation rows a weight block is reused for, per pass */

/* What the loader checks: the sources this library was built from (a checksum) and its
 * feature level, both set by the build (setup.py, or the loader's own build). */
#ifndef PD_SOURCE_ID
#define PD_SOURCE_ID "unknown"
#endif
#ifndef PD_VARIANT
#define PD_VARIANT "unknown"
#endif
const char *pd_source_id(void) { return PD_SOURCE_ID; }
const char *pd_variant(void) { return PD_VARIANT; }

/* --- one block to float32, as ggml's dequantize_row_* ------------------------------------ */

static inline __attribute__((always_inline)) void dq_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0xF) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static inline __attribute__((always_inline)) void dq_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b), m = f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0xF) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static inline __attribute__((always_inline)) void dq_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (float)(((qs[j] & 0xF) | h0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
    }
}

static inline __attribute__((always_inline)) void dq_q5_1(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b), m = f16(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (float)((qs[j] & 0xF) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

static inline __attribute__((always_inline)) void dq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static inline __attribute__((always_inline)) void dq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        scale_min_k4(2 * j, scales, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(2 * j + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
        y += 64;
        q += 32;
    }
}

static inline __attribute__((always_inline)) void dq_q5_k(const uint8_t *restrict b, float *restrict y) {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 4; j++) {
        uint8_t sc, m;
        scale_min_k4(2 * j, scales, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        scale_min_k4(2 * j + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++)
            y[l] = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            y[l + 32] = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        y += 64;
        ql += 32;
        u1 <<= 2;
        u2 <<= 2;
    }
}

static inline __attribute__((always_inline)) void dq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int n = 0; n < 2; n++) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static inline __attribute__((always_inline)) void dq_f16(const uint8_t *restrict b, float *restrict y) {
    for (int j = 0; j < 32; j++) y[j] = f16(b + 2 * j);
}

typedef void (*block_decoder)(const uint8_t *, float *);

/* elements per block, bytes per block, decoder; 0 elements: not a type this file decodes */
static int geometry(int type, int *block, int *bytes, block_decoder *dq) {
#define PD_CASE(TYPE, name, id, values, size, has_min)                                     \
    case T_##TYPE: *block = values; *bytes = size; *dq = dq_##name; return 1;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
    return 0;
}

/* Elements per block of `type` as these kernels read it, or 0 where there is no kernel. */
int pd_block_size(int type) {
    int block = 0, bytes = 0;
    block_decoder dq = 0;
    return geometry(type, &block, &bytes, &dq) ? block : 0;
}

/* Eight partial sums per activation row, so each block's product is a few vector FMAs. */
static inline __attribute__((always_inline)) void dot_block(const float *restrict w, const float *restrict x, int n, float *restrict acc) {
    for (int j = 0; j < n; j += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(w[j + l], x[j + l], acc[l]);
}

/* y[r, i] = sum_k W[i, k] * x[r, k] for rows i in [i0, i1) of W and n_rows rows of x: one
 * copy per type, so each block decoder is inlined into its loop. */
#define ROWS_TIMES(NAME, BLOCK, BYTES, DQ)                                                    \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t i0, int64_t i1, int64_t K,     \
                 const float *x, int64_t x_stride, int64_t n_rows, float *y,                \
                 int64_t y_stride, const float *sums) {                                     \
    (void)sums;                                                                             \
    float buf[BLOCK] __attribute__((aligned(32)));                                          \
    int64_t nb = K / (BLOCK);                                                               \
    for (int64_t r0 = 0; r0 < n_rows; r0 += MAX_ROWS) {                                     \
        int64_t nr = n_rows - r0 < MAX_ROWS ? n_rows - r0 : MAX_ROWS;                       \
        for (int64_t i = i0; i < i1; i++) {                                                 \
            const uint8_t *row = w + i * w_stride;                                          \
            float acc[MAX_ROWS][8] __attribute__((aligned(32)));                            \
            memset(acc, 0, sizeof acc);                                                     \
            for (int64_t b = 0; b < nb; b++) {                                              \
                DQ(row + b * (BYTES), buf);                                                 \
                for (int64_t r = 0; r < nr; r++)                                            \
                    dot_block(buf, x + (r0 + r) * x_stride + b * (BLOCK), BLOCK, acc[r]);   \
            }                                                                               \
            for (int64_t r = 0; r < nr; r++) {                                              \
                float *a = acc[r];                                                          \
                y[(r0 + r) * y_stride + i] = ((a[0] + a[4]) + (a[1] + a[5])) +              \
                                             ((a[2] + a[6]) + (a[3] + a[7]));               \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
}

ROWS_TIMES(rows_f16, QK, 64, dq_f16)
ROWS_TIMES(rows_q4_0, QK, 18, dq_q4_0)
ROWS_TIMES(rows_q4_1, QK, 20, dq_q4_1)
ROWS_TIMES(rows_q5_0, QK, 22, dq_q5_0)
ROWS_TIMES(rows_q5_1, QK, 24, dq_q5_1)
ROWS_TIMES(rows_q8_0, QK, 34, dq_q8_0)
ROWS_TIMES(rows_q4_k, QK_K, 144, dq_q4_k)
ROWS_TIMES(rows_q5_k, QK_K, 176, dq_q5_k)
ROWS_TIMES(rows_q6_k, QK_K, 210, dq_q6_k)


#if defined(__AVX2__) && defined(__FMA__)
/* --- AVX2: 32-element groups as four vectors of 8 floats ---------------------------------------
 * Decoded groups (g_*) hold the scalar decoders' values (the same float32 operations): the
 * dequantizer and the f16/Q6_K products give what the loops above give. The other products
 * factor each group's scale out of its sum (AVX_SCALED_ROWS), as ggml's own dot products do. */

#define AVX_KERNELS 1

/* 32 bytes to four vectors of 8 floats (as unsigned or signed bytes) */
static inline __attribute__((always_inline)) void u8_to_f32(__m256i v, __m256 *out) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

static inline __attribute__((always_inline)) void i8_to_f32(__m256i v, __m256 *out) {
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

/* 8 bytes at p widened to eight 32-bit lanes (unsigned or signed): the widening reads memory
 * itself, where widening a loaded vector takes an extract or shift per 8 bytes */
static inline __attribute__((always_inline)) __m256i u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline __attribute__((always_inline)) __m256i i8x8(const uint8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 16 bytes of nibbles as 32-bit lanes: the low nibbles are elements 0-15, the high ones 16-31 */
static inline __attribute__((always_inline)) void nibbles_i32(const uint8_t *qs, __m256i *q) {
    __m256i a = u8x8(qs), b = u8x8(qs + 8), mask = _mm256_set1_epi32(0xF);
    q[0] = _mm256_and_si256(a, mask);
    q[1] = _mm256_and_si256(b, mask);
    q[2] = _mm256_srli_epi32(a, 4);
    q[3] = _mm256_srli_epi32(b, 4);
}

static inline __attribute__((always_inline)) void scale_all(__m256 *w, float d) {
    __m256 vd = _mm256_set1_ps(d);
    for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(w[k], vd);
}

static inline __attribute__((always_inline)) void scale_add(__m256 *w, float d, float m) {
    __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
    for (int k = 0; k < 4; k++) w[k] = _mm256_add_ps(_mm256_mul_ps(w[k], vd), vm);
}

/* --- a 32-value group as its quantized values q (as floats) and the map its decoding applies,
 * w = d * q + m: the products below factor d and m out of their sums ---------------------- */
#define QUANTS(NAME) static inline __attribute__((always_inline)) void NAME(                 \
    const uint8_t *b, int g, __m256 *q, float *d, float *m)

QUANTS(q_q4_0) {
    (void)g;
    __m256i v[4];
    nibbles_i32(b + 2, v);
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtepi32_ps(_mm256_sub_epi32(v[k], _mm256_set1_epi32(8)));
    *d = f16(b), *m = 0.0f;
}

QUANTS(q_q4_1) {
    (void)g;
    __m256i v[4];
    nibbles_i32(b + 4, v);
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtepi32_ps(v[k]);
    *d = f16(b), *m = f16(b + 2);
}

QUANTS(q_q5_0) {
    (void)g;
    __m256i v = _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
    i8_to_f32(_mm256_sub_epi8(v, _mm256_set1_epi8(16)), q);
    *d = f16(b), *m = 0.0f;
}

QUANTS(q_q5_1) {
    (void)g;
    u8_to_f32(_mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)), q);
    *d = f16(b), *m = f16(b + 2);
}

QUANTS(q_q8_0) {
    (void)g;
    for (int k = 0; k < 4; k++) q[k] = _mm256_cvtepi32_ps(i8x8(b + 2 + 8 * k));
    *d = f16(b), *m = 0.0f;
}

/* group g of a Q4_K (Q5_K) block: its values (blocks.h), scale and min g */
QUANTS(q_q4_k) {
    uint8_t sc, mn;
    scale_min_k4(g, b + 4, &sc, &mn);
    u8_to_f32(q4_k_values(b, g), q);
    *d = f16(b) * sc, *m = -(f16(b + 2) * mn);
}

QUANTS(q_q5_k) {
    uint8_t sc, mn;
    scale_min_k4(g, b + 4, &sc, &mn);
    u8_to_f32(q5_k_values(b, g), q);
    *d = f16(b) * sc, *m = -(f16(b + 2) * mn);
}

/* the decoded group, d * q + m in float32 as the scalar decoders round it (d * q - |m| is
 * d * q + m exactly) */
#define DECODED(NAME, Q, HAS_MIN)                                                            \
static inline __attribute__((always_inline)) void NAME(const uint8_t *b, int g, __m256 *w) {  \
    float d, m;                                                                             \
    Q(b, g, w, &d, &m);                                                                     \
    if (HAS_MIN) scale_add(w, d, m); else scale_all(w, d);                                  \
}

DECODED(g_q4_0, q_q4_0, 0)
DECODED(g_q4_1, q_q4_1, 1)
DECODED(g_q5_0, q_q5_0, 0)
DECODED(g_q5_1, q_q5_1, 1)
DECODED(g_q8_0, q_q8_0, 0)
DECODED(g_q4_k, q_q4_k, 1)
DECODED(g_q5_k, q_q5_k, 1)

static inline __attribute__((always_inline)) void g_f16(const uint8_t *b, int g, __m256 *w) {
    (void)g;
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 16 * k)));
}

/* group g of a Q6_K block: half n = g / 4, quarter q = g % 4 of that half */
static inline __attribute__((always_inline)) void g_q6_k(const uint8_t *b, int g, __m256 *w) {
    int n = g >> 2, q = g & 3;
    const uint8_t *ql = b + 64 * n + 32 * (q & 1), *qh = b + 128 + 32 * n;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * n + 2 * q;
    __m256i low = _mm256_loadu_si256((const __m256i *)ql);
    if (q >> 1) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0xF));
    __m256i high = _mm256_loadu_si256((const __m256i *)qh);
    high = _mm256_and_si256(_mm256_srli_epi16(high, 2 * q), _mm256_set1_epi8(3));
    __m256i v = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    i8_to_f32(_mm256_sub_epi8(v, _mm256_set1_epi8(32)), w);
    float d = f16(b + 208);
    __m256 lo = _mm256_set1_ps(d * sc[0]), hi = _mm256_set1_ps(d * sc[1]);
    w[0] = _mm256_mul_ps(lo, w[0]);
    w[1] = _mm256_mul_ps(lo, w[1]);
    w[2] = _mm256_mul_ps(hi, w[2]);
    w[3] = _mm256_mul_ps(hi, w[3]);
}


/* AVX_ONE_ROW: with one activation row (a decode step) the products keep their sums in
 * named registers. The loops over up to MAX_ROWS rows index their accumulators at run time,
 * which puts them in memory: each group's multiply-add then waited on a store and a reload,
 * and that chain, not the arithmetic, set the speed (in registers, SmolLM2's Q4_1 decode
 * step ran about 1.25x faster). Each row's operations are the same as the general loops', in
 * the same order, so the results are identical. */

#define AVX_ROWS_TIMES(NAME, BLOCK, BYTES, G)                                                \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t i0, int64_t i1, int64_t K,     \
                 const float *x, int64_t x_stride, int64_t n_rows, float *y,                \
                 int64_t y_stride, const float *sums) {                                     \
    (void)sums;                                                                             \
    int64_t nb = K / (BLOCK);                                                               \
    if (n_rows == 1) {      /* decode: the sums in registers (see AVX_ONE_ROW) */           \
        for (int64_t i = i0; i < i1; i++) {                                                 \
            const uint8_t *row = w + i * w_stride;                                          \
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), \
                             _mm256_setzero_ps()};                                          \
            for (int64_t b = 0; b < nb; b++) {                                              \
                for (int g = 0; g < (BLOCK) / 32; g++) {                                    \
                    __m256 v[4];                                                            \
                    G(row + b * (BYTES), g, v);                                             \
                    const float *xg = x + b * (BLOCK) + 32 * g;                             \
                    for (int k = 0; k < 4; k++)                                             \
                        acc[k] = _mm256_fmadd_ps(v[k], _mm256_loadu_ps(xg + 8 * k), acc[k]); \
                }                                                                           \
            }                                                                               \
            y[i] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]),                        \
                                      _mm256_add_ps(acc[2], acc[3])));                      \
        }                                                                                   \
        return;                                                                             \
    }                                                                                       \
    for (int64_t r0 = 0; r0 < n_rows; r0 += MAX_ROWS) {                                     \
        int64_t nr = n_rows - r0 < MAX_ROWS ? n_rows - r0 : MAX_ROWS;                       \
        const float *xr = x + r0 * x_stride;                                                \
        for (int64_t i = i0; i < i1; i++) {                                                 \
            const uint8_t *row = w + i * w_stride;                                          \
            __m256 acc[MAX_ROWS][4];                                                        \
            for (int64_t r = 0; r < nr; r++)                                                \
                for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();                \
            for (int64_t b = 0; b < nb; b++) {                                              \
                for (int g = 0; g < (BLOCK) / 32; g++) {                                    \
                    __m256 v[4];                                                            \
                    G(row + b * (BYTES), g, v);                                             \
                    const float *xg = xr + b * (BLOCK) + 32 * g;                            \
                    for (int64_t r = 0; r < nr; r++)                                        \
                        for (int k = 0; k < 4; k++)                                         \
                            acc[r][k] = _mm256_fmadd_ps(                                    \
                                v[k], _mm256_loadu_ps(xg + r * x_stride + 8 * k), acc[r][k]); \
                }                                                                           \
            }                                                                               \
            for (int64_t r = 0; r < nr; r++)                                                \
                y[(r0 + r) * y_stride + i] = hsum8(_mm256_add_ps(                            \
                    _mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]))); \
        }                                                                                   \
    }                                                                                       \
}

/* The same product with each group's map factored out of its sum:
 * sum_j (d q_j + m) x_j = d (sum_j q_j x_j) + m (sum_j x_j), the group sums of x computed once
 * per call (sums[r * K / 32 + group]). Four vector operations a group fewer than decoding
 * first (eight with a minimum); the result differs from the decoded product's by float32
 * rounding. */
#define AVX_SCALED_ROWS(NAME, BLOCK, BYTES, Q, HAS_MIN)                                      \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t i0, int64_t i1, int64_t K,     \
                 const float *x, int64_t x_stride, int64_t n_rows, float *y,                \
                 int64_t y_stride, const float *sums) {                                     \
    int64_t nb = K / (BLOCK), ng = K / 32;                                                  \
    if (n_rows == 1) {      /* decode: the sums in registers (see AVX_ONE_ROW) */           \
        for (int64_t i = i0; i < i1; i++) {                                                 \
            const uint8_t *row = w + i * w_stride;                                          \
            __m256 acc = _mm256_setzero_ps();                                               \
            float shift = 0.0f;                                                             \
            for (int64_t b = 0; b < nb; b++) {                                              \
                for (int g = 0; g < (BLOCK) / 32; g++) {                                    \
                    __m256 q[4];                                                            \
                    float d, m;                                                             \
                    Q(row + b * (BYTES), g, q, &d, &m);                                     \
                    int64_t group = b * ((BLOCK) / 32) + g;                                 \
                    const float *xg = x + 32 * group;                                       \
                    __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg));                    \
                    t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xg + 8), t);                  \
                    t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xg + 16), t);                 \
                    t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xg + 24), t);                 \
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), t, acc);                       \
                    if (HAS_MIN) shift = fmaf(m, sums[group], shift);                       \
                }                                                                           \
            }                                                                               \
            y[i] = hsum8(acc) + shift;                                                       \
        }                                                                                   \
        return;                                                                             \
    }                                                                                       \
    for (int64_t r0 = 0; r0 < n_rows; r0 += MAX_ROWS) {                                     \
        int64_t nr = n_rows - r0 < MAX_ROWS ? n_rows - r0 : MAX_ROWS;                       \
        for (int64_t i = i0; i < i1; i++) {                                                 \
            const uint8_t *row = w + i * w_stride;                                          \
            __m256 acc[MAX_ROWS];                                                           \
            float shift[MAX_ROWS];                                                          \
            for (int64_t r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps(), shift[r] = 0.0f; \
            for (int64_t b = 0; b < nb; b++) {                                              \
                for (int g = 0; g < (BLOCK) / 32; g++) {                                    \
                    __m256 q[4];                                                            \
                    float d, m;                                                             \
                    Q(row + b * (BYTES), g, q, &d, &m);                                     \
                    __m256 vd = _mm256_set1_ps(d);                                          \
                    int64_t group = b * ((BLOCK) / 32) + g;                                 \
                    for (int64_t r = 0; r < nr; r++) {                                      \
                        const float *xg = x + (r0 + r) * x_stride + 32 * group;             \
                        __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg));                \
                        t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xg + 8), t);              \
                        t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xg + 16), t);             \
                        t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xg + 24), t);             \
                        acc[r] = _mm256_fmadd_ps(vd, t, acc[r]);                            \
                        if (HAS_MIN) shift[r] = fmaf(m, sums[(r0 + r) * ng + group], shift[r]); \
                    }                                                                       \
                }                                                                           \
            }                                                                               \
            for (int64_t r = 0; r < nr; r++)                                                \
                y[(r0 + r) * y_stride + i] = hsum8(acc[r]) + shift[r];                       \
        }                                                                                   \
    }                                                                                       \
}

AVX_SCALED_ROWS(avx_q4_0, QK, 18, q_q4_0, 0)
AVX_SCALED_ROWS(avx_q4_1, QK, 20, q_q4_1, 1)
AVX_SCALED_ROWS(avx_q5_0, QK, 22, q_q5_0, 0)
AVX_SCALED_ROWS(avx_q5_1, QK, 24, q_q5_1, 1)
AVX_SCALED_ROWS(avx_q8_0, QK, 34, q_q8_0, 0)
AVX_SCALED_ROWS(avx_q4_k, QK_K, 144, q_q4_k, 1)
AVX_SCALED_ROWS(avx_q5_k, QK_K, 176, q_q5_k, 1)

AVX_ROWS_TIMES(avx_f16, QK, 64, g_f16)
AVX_ROWS_TIMES(avx_q6_k, QK_K, 210, g_q6_k)

#define AVX_DEQUANTIZE(NAME, BLOCK, BYTES, G)                                                \
static void NAME(const uint8_t *row, int64_t nb, float *dst) {                              \
    for (int64_t b = 0; b < nb; b++)                                                        \
        for (int g = 0; g < (BLOCK) / 32; g++) {                                            \
            __m256 v[4];                                                                    \
            G(row + b * (BYTES), g, v);                                                     \
            for (int k = 0; k < 4; k++)                                                     \
                _mm256_storeu_ps(dst + b * (BLOCK) + 32 * g + 8 * k, v[k]);                \
        }                                                                                   \
}

AVX_DEQUANTIZE(avx_dq_f16, QK, 64, g_f16)
AVX_DEQUANTIZE(avx_dq_q4_0, QK, 18, g_q4_0)
AVX_DEQUANTIZE(avx_dq_q4_1, QK, 20, g_q4_1)
AVX_DEQUANTIZE(avx_dq_q5_0, QK, 22, g_q5_0)
AVX_DEQUANTIZE(avx_dq_q5_1, QK, 24, g_q5_1)
AVX_DEQUANTIZE(avx_dq_q8_0, QK, 34, g_q8_0)
AVX_DEQUANTIZE(avx_dq_q4_k, QK_K, 144, g_q4_k)
AVX_DEQUANTIZE(avx_dq_q5_k, QK_K, 176, g_q5_k)
AVX_DEQUANTIZE(avx_dq_q6_k, QK_K, 210, g_q6_k)

typedef void (*row_decoder)(const uint8_t *, int64_t, float *);

static row_decoder avx_row_decoder(int type) {
#define PD_CASE(TYPE, name, id, values, bytes, has_min) case T_##TYPE: return avx_dq_##name;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
    return 0;
}
#endif

/* sums: the activations' 32-value group sums (group_sums), where the kernel needs them */
typedef void (*rows_kernel)(const uint8_t *, int64_t, int64_t, int64_t, int64_t, const float *,
                            int64_t, int64_t, float *, int64_t, const float *);

static rows_kernel scalar_rows_of(int type) {
#define PD_CASE(TYPE, name, id, values, bytes, has_min) case T_##TYPE: return rows_##name;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
    return 0;
}

/* The fastest kernel of `type`; *needs_sums: it reads the activations' group sums. */
static rows_kernel rows_of(int type, int *needs_sums) {
    *needs_sums = 0;
#ifdef AVX_KERNELS
#define PD_CASE(TYPE, name, id, values, bytes, has_min)                                    \
    case T_##TYPE: *needs_sums = has_min; return avx_##name;
    switch (type) { PD_BLOCK_TYPES(PD_CASE) }
#undef PD_CASE
#endif
    return scalar_rows_of(type);
}

/* sums[r * K / 32 + j]: the sum of x[r, 32 j .. 32 j + 31] */
static void group_sums(const float *x, int64_t x_stride, int64_t n_rows, int64_t K, float *sums) {
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t j = 0; j < K / 32; j++) {
            const float *xg = x + r * x_stride + 32 * j;
            float s = 0.0f;
            for (int l = 0; l < 32; l++) s += xg[l];
            sums[r * (K / 32) + j] = s;
        }
}

/* The product of an M x K block-format weight (rows `w_stride` bytes apart) with n_rows
 * float32 activation rows of length K: y[r, i] = sum_k W[i, k] x[r, k]. Rows of W are shared
 * among n_threads threads; K is a whole number of blocks (the caller checks). */
void pd_mul_mat(int type, const uint8_t *w, int64_t w_stride, int64_t M, int64_t K,
                const float *x, int64_t x_stride, int64_t n_rows,
                float *y, int64_t y_stride, int n_threads) {
    int needs_sums;
    rows_kernel rows = rows_of(type, &needs_sums);
    float *sums = needs_sums ? malloc(sizeof(float) * n_rows * (K / 32)) : NULL;
    if (sums) group_sums(x, x_stride, n_rows, K, sums);
    else if (needs_sums) rows = scalar_rows_of(type);     /* no memory: the decoding loops */
    const int64_t chunk = 16;
    int64_t n_chunks = (M + chunk - 1) / chunk;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t i1 = (c + 1) * chunk < M ? (c + 1) * chunk : M;
        rows(w, w_stride, c * chunk, i1, K, x, x_stride, n_rows, y, y_stride, sums);
    }
    free(sums);
}

/* Rows [i0, i1) of a block-format weight to float32, out[(i - i0) * K + k]. */
void pd_dequantize_rows(int type, const uint8_t *w, int64_t w_stride, int64_t i0, int64_t i1,
                        int64_t K, float *out, int n_threads) {
    int block = 0, bytes = 0;
    block_decoder dq = 0;
    geometry(type, &block, &bytes, &dq);
    int64_t nb = K / block;
#ifdef AVX_KERNELS
    row_decoder fast = avx_row_decoder(type);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
    for (int64_t i = i0; i < i1; i++) fast(w + i * w_stride, nb, out + (i - i0) * K);
#else
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *row = w + i * w_stride;
        float *dst = out + (i - i0) * K;
        for (int64_t b = 0; b < nb; b++) dq(row + b * bytes, dst + b * block);
    }
#endif
}

/* fp16 values to contiguous float32: src[i3 * s3 + i2 * s2 + i1 * s1 + 2 * i0] (strides in
 * bytes) to dst[((i3 * n2 + i2) * n1 + i1) * n0 + i0]. */
/* GET_ROWS of block-format rows to float32: dst row r (dst_stride floats apart) is row idx[r]
 * of w decoded. Every index is checked first: returns -1 when all are in [0, n_src_rows),
 * else the position of the first that is not, and writes nothing. */
int64_t pd_get_rows_f32(int type, const uint8_t *w, int64_t w_stride, int64_t n_src_rows,
                        const int32_t *idx, int64_t n_idx, int64_t K, float *dst,
                        int64_t dst_stride) {
    for (int64_t r = 0; r < n_idx; r++)
        if (idx[r] < 0 || idx[r] >= n_src_rows) return r;
    for (int64_t r = 0; r < n_idx; r++)
        pd_dequantize_rows(type, w + (int64_t)idx[r] * w_stride, 0, 0, 1, K, dst + r * dst_stride, 1);
    return -1;
}

void pd_f16_to_f32(const uint8_t *src, int64_t n0, int64_t n1, int64_t s1, int64_t n2,
                   int64_t s2, int64_t n3, int64_t s3, float *dst) {
    for (int64_t i3 = 0; i3 < n3; i3++)
        for (int64_t i2 = 0; i2 < n2; i2++)
            for (int64_t i1 = 0; i1 < n1; i1++) {
                const uint8_t *s = src + i3 * s3 + i2 * s2 + i1 * s1;
                float *d = dst + ((i3 * n2 + i2) * n1 + i1) * n0;
                int64_t j = 0;
#if defined(__F16C__)
                for (; j + 8 <= n0; j += 8)
                    _mm256_storeu_ps(d + j, _mm256_cvtph_ps(
                        _mm_loadu_si128((const __m128i *)(s + 2 * j))));
#endif
                for (; j < n0; j++) d[j] = f16(s + 2 * j);
            }
}

/* The angles of a ROPE's tokens, shared by the ROPEs of a step that read the same positions
 * with the same parameters (the normal and NeoX modes: one position per token). */
typedef struct {
    const int32_t *pos;            /* [n_tokens] */
    int64_t n_tokens, half;
    const float *freq_factors;     /* [half], or 0 */
    const float *ramp_mix;         /* [half]: YaRN's extrapolation share per pair, or 0 */
    float theta_scale, freq_scale, mscale, unused;
    float *cos_t, *sin_t;          /* [n_tokens][half], times mscale */
    int32_t *seen;                 /* [n_tokens + half]: the positions (and the frequency
                                    * factors' bits) cos_t and sin_t are for */
    int64_t valid;                 /* whether they are for any */
} pd_rope_angles;

/* Fill t's tables for its positions, unless they hold them already (the first ROPE of a step
 * computes them, the others compare the positions and factors). Each angle takes the array kernel's
 * float32 operations in its order (ggml's): the running product p s^i as p, p s, (p s) s, ...,
 * divided by the frequency factor, times freq_scale, mixed by YaRN's ramp; cos and sin are
 * libm's cosf and sinf, as ggml's, where numpy's float32 ones differ from the correctly
 * rounded value in about 1 case in 7 by an ulp. */
static void rope_angles(pd_rope_angles *t) {
    const int64_t n = t->n_tokens, half = t->half, ff_bytes = t->freq_factors ? 4 * half : 0;
    if (t->valid && memcmp(t->seen, t->pos, sizeof(int32_t) * n) == 0
        && (!ff_bytes || memcmp(t->seen + n, t->freq_factors, ff_bytes) == 0))
        return;
    for (int64_t i = 0; i < n; i++) {
        float running = (float)t->pos[i];
        float *c = t->cos_t + i * half, *s = t->sin_t + i * half;
        for (int64_t p = 0; p < half; p++, running *= t->theta_scale) {
            const float extrap = t->freq_factors ? running / t->freq_factors[p] : running;
            float theta = extrap * t->freq_scale;
            if (t->ramp_mix)
                theta = theta * (1.0f - t->ramp_mix[p]) + extrap * t->ramp_mix[p];
            c[p] = cosf(theta) * t->mscale;
            s[p] = sinf(theta) * t->mscale;
        }
    }
    memcpy(t->seen, t->pos, sizeof(int32_t) * n);
    if (ff_bytes) memcpy(t->seen + n, t->freq_factors, ff_bytes);
    t->valid = 1;
}

/* ROPE of float32 rows in the normal (pairs 2p, 2p+1) or NeoX (pairs p, p + half) mode, token
 * i2 turned by the angles of its position (`angles`). The rotation is the array kernel's
 * float32 operations (x0 cos - x1 sin, x0 sin + x1 cos, nothing fused). Strides in bytes; a
 * and d may be the same memory (each pair is read before it is written). Channels outside
 * [n_offs, n_offs + 2 half) are copied when copy_rest is set. */
void pd_rope_f32(const pd_tensor *a, const pd_tensor *d, int64_t n_offs, int64_t half,
                 int neox, int copy_rest, pd_rope_angles *angles) {
    rope_angles(angles);
    const float *cos_t = angles->cos_t, *sin_t = angles->sin_t;
    int64_t step = neox ? 1 : 2, other = neox ? half : 1;
    for (int64_t i3 = 0; i3 < d->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < d->ne[2]; i2++) {
            const float *c = cos_t + i2 * half, *s = sin_t + i2 * half;
            for (int64_t i1 = 0; i1 < d->ne[1]; i1++) {
                const float *x = (const float *)tensor_row(a, i1, i2, i3);
                float *y = (float *)tensor_row(d, i1, i2, i3);
                const float *xr = x + n_offs;
                float *yr = y + n_offs;
                for (int64_t p = 0; p < half; p++) {
                    float x0 = xr[p * step], x1 = xr[p * step + other];
                    float r0 = x0 * c[p] - x1 * s[p];
                    float r1 = x0 * s[p] + x1 * c[p];
                    yr[p * step] = r0;
                    yr[p * step + other] = r1;
                }
                if (copy_rest) {
                    for (int64_t k = 0; k < n_offs; k++) y[k] = x[k];
                    for (int64_t k = n_offs + 2 * half; k < d->ne[0]; k++) y[k] = x[k];
                }
            }
        }
}

/* RMS_NORM of float32 rows, as ggml's CPU kernel: each square in float, summed in double,
 * then y = x * (1 / sqrtf(mean + eps)). The sum runs as eight partial sums (ggml's one chain
 * of dependent adds took 0.57 ms for a prompt's 512 rows of 2048; a double sum of 2048 float
 * squares is exact to a few ulps in any order), and the rows are split over the threads.
 * Strides in bytes; a and d may be the same memory. */
#define NORM_THREAD_WORK (1 << 16)  /* values from which RMS_NORM runs threaded */

static double sum_of_squares(const float *x, int64_t n) {
    int64_t k = 0;
    double sum = 0.0;
#if defined(__AVX__)
    __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    for (; k + 8 <= n; k += 8) {
        const __m256 v = _mm256_loadu_ps(x + k), sq = _mm256_mul_ps(v, v);
        acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(acc[0], acc[1]));
    sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
    for (; k < n; k++) sum += (double)(x[k] * x[k]);
    return sum;
}

void pd_rms_norm_f32(const pd_tensor *a, const pd_tensor *d, float eps, int n_threads) {
    const int64_t ne0 = d->ne[0], ne1 = d->ne[1], ne2 = d->ne[2];
    const int64_t rows = ne1 * ne2 * d->ne[3];
    const int parallel = n_threads > 1 && rows > 1 && rows * ne0 >= NORM_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i1 = r % ne1, i2 = r / ne1 % ne2, i3 = r / (ne1 * ne2);
        const float *x = (const float *)tensor_row(a, i1, i2, i3);
        float *y = (float *)tensor_row(d, i1, i2, i3);
        const float scale = 1.0f / sqrtf((float)(sum_of_squares(x, ne0) / (double)ne0) + eps);
        for (int64_t k = 0; k < ne0; k++) y[k] = x[k] * scale;
    }
}

/* SET_ROWS of float32 rows into float32 or fp16 rows (a KV cache): row i of src[i3][i2] goes
 * to dst row idx[i3 % idx.ne[2]][i2 % idx.ne[1]][i] of dst[i3][i2], as ggml broadcasts the
 * indices (int32, or int64 where idx64). Every index is checked before anything is written:
 * returns 0, or 1 (nothing written) when one is outside [0, dst.ne[1]), or 2 (nothing
 * written) for fp16 rows on a CPU without F16C. fp16 rounds to nearest-even, as numpy's
 * astype. */
static inline int64_t row_index(const pd_tensor *idx, int idx64, int64_t i, int64_t i2,
                                int64_t i3) {
    const uint8_t *at = tensor_row(idx, i2 % idx->ne[1], i3 % idx->ne[2], 0) + i * idx->nb[0];
    return idx64 ? *(const int64_t *)at : (int64_t)*(const int32_t *)at;
}

int pd_set_rows_f32(const pd_tensor *src, const pd_tensor *dst, const pd_tensor *idx, int idx64,
                    int dst_f16) {
#if !(defined(__F16C__) && defined(__AVX__))
    if (dst_f16) return 2;
#endif
    const int64_t ne0 = dst->ne[0];
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
            for (int64_t i = 0; i < src->ne[1]; i++) {
                int64_t r = row_index(idx, idx64, i, i2, i3);
                if (r < 0 || r >= dst->ne[1]) return 1;
            }
    for (int64_t i3 = 0; i3 < dst->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < dst->ne[2]; i2++)
            for (int64_t i = 0; i < src->ne[1]; i++) {
                const float *x = (const float *)tensor_row(src, i, i2, i3);
                uint8_t *row = tensor_row(dst, row_index(idx, idx64, i, i2, i3), i2, i3);
                if (!dst_f16) {
                    memcpy(row, x, (size_t)ne0 * 4);
                    continue;
                }
#if defined(__F16C__) && defined(__AVX__)
                uint16_t *h = (uint16_t *)row;
                int64_t k = 0;
                for (; k + 8 <= ne0; k += 8)
                    _mm_storeu_si128((__m128i *)(h + k),
                                     _mm256_cvtps_ph(_mm256_loadu_ps(x + k), _MM_FROUND_TO_NEAREST_INT));
                for (; k < ne0; k++) h[k] = _cvtss_sh(x[k], _MM_FROUND_TO_NEAREST_INT);
#endif
            }
    return 0;
}

/* Packed entry points: the backend binds each call once and replays it every step, so it packs
 * the integer arguments (tensors as TENSOR_WORDS words each, then pointers, strides, sizes
 * and flags, in the unpacked function's order) into one int64 array; a call then converts
 * one pointer through ctypes instead of 11 to 30 arguments at about 0.3 µs each. Float
 * arguments and per-step pointers stay separate. */

void pd_mul_mat_packed(const int64_t *a) {
    pd_mul_mat((int)a[0], P_PTR(1), a[2], a[3], a[4], (const float *)P_PTR(5), a[6], a[7],
               (float *)P_PTR(8), a[9], (int)a[10]);
}


void pd_rope_f32_packed(const int64_t *a) {
    const pd_tensor src = tensor_at(a), dst = tensor_at(a + TENSOR_WORDS);
    const int64_t *p = a + 2 * TENSOR_WORDS;
    pd_rope_f32(&src, &dst, p[0], p[1], (int)p[2], (int)p[3], (pd_rope_angles *)(intptr_t)p[4]);
}

void pd_rms_norm_f32_packed(const int64_t *a, float eps) {
    const pd_tensor src = tensor_at(a), dst = tensor_at(a + TENSOR_WORDS);
    pd_rms_norm_f32(&src, &dst, eps, (int)a[2 * TENSOR_WORDS]);
}

/* 0, or 1 for an index outside the weight's rows (nothing written then) */
int pd_get_rows_f32_packed(const int64_t *a) {
    return pd_get_rows_f32((int)a[0], P_PTR(1), a[2], a[3], (const int32_t *)P_PTR(4), a[5], a[6],
                           (float *)P_PTR(7), a[8]) < 0 ? 0 : 1;
}

int pd_set_rows_f32_packed(const int64_t *a) {
    const pd_tensor src = tensor_at(a), dst = tensor_at(a + TENSOR_WORDS);
    const pd_tensor idx = tensor_at(a + 2 * TENSOR_WORDS);
    const int64_t *p = a + 3 * TENSOR_WORDS;
    return pd_set_rows_f32(&src, &dst, &idx, (int)p[0], (int)p[1]);
}
