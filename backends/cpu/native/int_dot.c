/* Products of block-format weights with activations quantized to 16-bit integers.
 *
 * The float32 products (kernels.c) widen every weight to float and multiply-add; on a 1B-class
 * model that widening, not the weight's bytes, sets their speed (a Q4_K mat-vec read 6.4 GB/s
 * of weights where memory gives 50). Here each 32-value group of an activation row is
 * quantized once per product, x ~ e X with X in int16 and e = max|x| / 32767, and a weight
 * group's quantized values, as signed bytes widened to int16, multiply X in integers
 * (vpmaddwd, or vpdpwssd with VNNI). The group's scales apply to the integer sum, once.
 *
 * Why 16 bits and not llama.cpp's 8: an activation then carries a relative error of at most
 * 1.5e-5 of its group's largest value (llama.cpp's: 4e-3), the integer work per weight is the
 * same on AVX2 (llama.cpp's 8-bit products need two sign operations and a second widening
 * multiply-add), and the int16 row of a decode step still sits in L1. Sums are exact in int32:
 * a group's 32 products are at most 32 * 128 * 32767 < 2^28.
 *
 * A weight's map w = d q + m (d per 32 values, per 16 for Q6_K) is factored out of the
 * group's sum: sum w x = d e sum q X + m sum x, with sum x the float sum of the group's own
 * activations. Non-finite activations make the group's scale NaN, so they reach the result as
 * they do in float32 arithmetic.
 */
#include "blocks.h"

#if defined(__AVX2__) && defined(__FMA__)

#define INT16_KERNELS 1

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define MADD16(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define MADD16(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
#define MADD16(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif

/* --- activations --------------------------------------------------------------------------- */

/* n_rows activation rows of K values, each 32-value group as int16 values q and a scale e,
 * and (for weights with a minimum) the float sum of the group's activations */
typedef struct {
    int16_t *q;          /* [n_rows][K] */
    float *e, *sums;     /* [n_rows][K / 32] */
    int64_t K, n_rows;
} int16_rows;

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* one group: 32 floats to 32 int16 (rounded to nearest), its scale and its sum */
static inline void quantize_group(const float *x, int16_t *q, float *e, float *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], mx = _mm256_setzero_ps(), s = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
        s = _mm256_add_ps(s, v[k]);
    }
    float amax = hmax(mx), total = hsum8(s);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    if (!isfinite(total)) {              /* inf or NaN: the whole group reads as NaN */
        inv = _mm256_setzero_ps();
        amax = NAN;
    }
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv));
    /* packs works within 128-bit lanes: the permute puts the values back in order */
    _mm256_storeu_si256((__m256i *)q, _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
    _mm256_storeu_si256((__m256i *)(q + 16),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(i2, i3), 0xD8));
    *e = amax / 32767.0f;
    *sum = total;
}

static void quantize_rows(const float *x, int64_t x_stride, int16_rows *a, int n_threads) {
    int64_t ng = a->K / 32;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && a->n_rows >= 8)
    for (int64_t r = 0; r < a->n_rows; r++)
        for (int64_t j = 0; j < ng; j++)
            quantize_group(x + r * x_stride + 32 * j, a->q + r * a->K + 32 * j,
                           a->e + r * ng + j, a->sums + r * ng + j);
}

/* --- weights: a block's scales once, then each 32-value group's quantized values as signed
 * bytes. d_lo[g] applies to values 0-15 of group g, d_hi[g] to 16-31 (they differ for Q6_K
 * only), m[g] is the group's minimum (0 without one; the products read it where MIN is set) ---------------------------------------- */

#define SCALES(NAME) static inline __attribute__((always_inline)) void NAME(                 \
    const uint8_t *b, float *d_lo, float *d_hi, float *m)
#define VALUES(NAME) static inline __attribute__((always_inline)) __m256i NAME(              \
    const uint8_t *b, int g)

SCALES(sc_d) { *d_lo = *d_hi = f16(b); *m = 0.0f; }                 /* Q4_0, Q5_0, Q8_0 */
SCALES(sc_dm) { *d_lo = *d_hi = f16(b); *m = f16(b + 2); }          /* Q4_1, Q5_1 */

SCALES(sc_k) {                                                      /* Q4_K, Q5_K */
    float d = f16(b), dmin = f16(b + 2);
    for (int g = 0; g < 8; g++) {
        uint8_t sc, mn;
        scale_min_k4(g, b + 4, &sc, &mn);
        d_lo[g] = d_hi[g] = d * sc;
        m[g] = -(dmin * mn);
    }
}

SCALES(sc_q6_k) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int g = 0; g < 8; g++) {        /* group g = 4 n + q: scales 8 n + 2 q and + 1 */
        int s = 8 * (g >> 2) + 2 * (g & 3);
        d_lo[g] = d * sc[s];
        d_hi[g] = d * sc[s + 1];
        m[g] = 0.0f;
    }
}

VALUES(v_q4_0) { (void)g; return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)); }
VALUES(v_q4_1) { (void)g; return nibbles(b + 4); }

VALUES(v_q5_0) {
    (void)g;
    __m256i v = _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(16));
}

VALUES(v_q5_1) { (void)g; return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)); }
VALUES(v_q8_0) { (void)g; return _mm256_loadu_si256((const __m256i *)(b + 2)); }

VALUES(v_q4_k) { return q4_k_values(b, g); }
VALUES(v_q5_k) { return q5_k_values(b, g); }

/* group g of a Q6_K block: half n = g / 4, quarter q = g % 4 of that half */
VALUES(v_q6_k) {
    int n = g >> 2, q = g & 3;
    __m256i low = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (q & 1)));
    if (q >> 1) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0xF));
    __m256i high = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    high = _mm256_and_si256(_mm256_srli_epi16(high, 2 * q), _mm256_set1_epi8(3));
    __m256i v = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(32));
}

/* --- the products ------------------------------------------------------------------------------
 * ROWS activation rows (a constant of each inlined copy, so the sums stay in registers) times
 * one weight row: each group is unpacked and widened once and multiplies every row's values */

#define INT16_PRODUCT(NAME, BLOCK, BYTES, SC, VAL, SPLIT, MIN)                                \
static inline __attribute__((always_inline)) void NAME##_tile(                               \
        const uint8_t *row, const int16_rows *a, int64_t r0, const int ROWS, float *y,      \
        int64_t y_stride) {                                                                 \
    enum { G = (BLOCK) / 32 };                                                              \
    const int64_t nb = a->K / (BLOCK), ng = a->K / 32;                                      \
    __m256 acc[4];                                                                          \
    float shift[4];                                                                         \
    for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps(), shift[r] = 0.0f;           \
    for (int64_t b = 0; b < nb; b++) {                                                      \
        const uint8_t *block = row + b * (BYTES);                                           \
        float d_lo[G], d_hi[G], m[G];                                                       \
        SC(block, d_lo, d_hi, m);                                                           \
        for (int g = 0; g < G; g++) {                                                       \
            __m256i q = VAL(block, g);                                                      \
            __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));                   \
            __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));              \
            const int64_t group = b * G + g;                                                \
            for (int r = 0; r < ROWS; r++) {                                                \
                const int16_t *x = a->q + (r0 + r) * a->K + 32 * group;                     \
                const float e = a->e[(r0 + r) * ng + group];                                \
                __m256i x0 = _mm256_loadu_si256((const __m256i *)x);                        \
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + 16));                 \
                if (SPLIT) {                                                                \
                    __m256i p0 = MADD16(_mm256_setzero_si256(), w0, x0);                    \
                    __m256i p1 = MADD16(_mm256_setzero_si256(), w1, x1);                    \
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),                        \
                                             _mm256_set1_ps(d_lo[g] * e), acc[r]);          \
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),                        \
                                             _mm256_set1_ps(d_hi[g] * e), acc[r]);          \
                } else {                                                                    \
                    __m256i p = MADD16(MADD16(_mm256_setzero_si256(), w0, x0), w1, x1);     \
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                         \
                                             _mm256_set1_ps(d_lo[g] * e), acc[r]);          \
                }                                                                           \
                if (MIN) shift[r] = fmaf(m[g], a->sums[(r0 + r) * ng + group], shift[r]);   \
            }                                                                               \
        }                                                                                   \
    }                                                                                       \
    for (int r = 0; r < ROWS; r++) y[(r0 + r) * y_stride] = hsum8(acc[r]) + shift[r];       \
}                                                                                           \
                                                                                            \
static void NAME(const uint8_t *w, int64_t w_stride, int64_t i0, int64_t i1,               \
                 const int16_rows *a, float *y, int64_t y_stride) {                         \
    int64_t r0 = 0;                                                                         \
    for (; r0 + 4 <= a->n_rows; r0 += 4)                                                    \
        for (int64_t i = i0; i < i1; i++)                                                   \
            NAME##_tile(w + i * w_stride, a, r0, 4, y + i, y_stride);                       \
    for (; r0 < a->n_rows; r0++)                                                            \
        for (int64_t i = i0; i < i1; i++)                                                   \
            NAME##_tile(w + i * w_stride, a, r0, 1, y + i, y_stride);                       \
}

INT16_PRODUCT(i16_q4_0, QK, 18, sc_d, v_q4_0, 0, 0)
INT16_PRODUCT(i16_q4_1, QK, 20, sc_dm, v_q4_1, 0, 1)
INT16_PRODUCT(i16_q5_0, QK, 22, sc_d, v_q5_0, 0, 0)
INT16_PRODUCT(i16_q5_1, QK, 24, sc_dm, v_q5_1, 0, 1)
INT16_PRODUCT(i16_q8_0, QK, 34, sc_d, v_q8_0, 0, 0)
INT16_PRODUCT(i16_q4_k, QK_K, 144, sc_k, v_q4_k, 0, 1)
INT16_PRODUCT(i16_q5_k, QK_K, 176, sc_k, v_q5_k, 0, 1)
INT16_PRODUCT(i16_q6_k, QK_K, 210, sc_q6_k, v_q6_k, 1, 0)

typedef void (*int16_kernel)(const uint8_t *, int64_t, int64_t, int64_t, const int16_rows *,
                             float *, int64_t);

static int16_kernel int16_kernel_of(int type) {
    switch (type) {
    case T_Q4_0: return i16_q4_0;
    case T_Q4_1: return i16_q4_1;
    case T_Q5_0: return i16_q5_0;
    case T_Q5_1: return i16_q5_1;
    case T_Q8_0: return i16_q8_0;
    case T_Q4_K: return i16_q4_k;
    case T_Q5_K: return i16_q5_k;
    case T_Q6_K: return i16_q6_k;
    }
    return 0;
}
#endif

/* 1 where pd_mul_mat_int16 multiplies `type` on this build, else 0 (no AVX2, or a type with
 * no integer kernel): the caller then uses the float32 products. */
int pd_int16_product_of(int type) {
#ifdef INT16_KERNELS
    return int16_kernel_of(type) != 0;
#else
    (void)type;
    return 0;
#endif
}

/* y[r, i] = sum_k W[i, k] x[r, k] with x quantized to int16 groups (see the top of the file).
 * Returns 0, or 1 where the type has no integer kernel here, or 2 when the activations'
 * memory could not be had (nothing written either way). */
int pd_mul_mat_int16(int type, const uint8_t *w, int64_t w_stride, int64_t M, int64_t K,
                     const float *x, int64_t x_stride, int64_t n_rows,
                     float *y, int64_t y_stride, int n_threads) {
#ifdef INT16_KERNELS
    int16_kernel kernel = int16_kernel_of(type);
    if (!kernel) return 1;
    int16_rows a = {malloc(sizeof(int16_t) * n_rows * K), malloc(sizeof(float) * n_rows * (K / 32)),
                    malloc(sizeof(float) * n_rows * (K / 32)), K, n_rows};
    int status = 2;
    if (a.q && a.e && a.sums) {
        quantize_rows(x, x_stride, &a, n_threads);
        const int64_t chunk = 16;
        int64_t n_chunks = (M + chunk - 1) / chunk;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
        for (int64_t c = 0; c < n_chunks; c++) {
            int64_t i1 = (c + 1) * chunk < M ? (c + 1) * chunk : M;
            kernel(w, w_stride, c * chunk, i1, &a, y, y_stride);
        }
        status = 0;
    }
    free(a.q);
    free(a.e);
    free(a.sums);
    return status;
#else
    (void)type, (void)w, (void)w_stride, (void)M, (void)K, (void)x, (void)x_stride;
    (void)n_rows, (void)y, (void)y_stride, (void)n_threads;
    return 1;
#endif
}

int pd_mul_mat_int16_packed(const int64_t *a) {
    return pd_mul_mat_int16((int)a[0], (const uint8_t *)(intptr_t)a[1], a[2], a[3], a[4],
                            (const float *)(intptr_t)a[5], a[6], a[7], (float *)(intptr_t)a[8],
                            a[9], (int)a[10]);
}
