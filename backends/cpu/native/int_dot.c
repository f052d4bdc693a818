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

/* n_rows activation rows of K values as int16 values q, with one scale e per `group` values
 * (32 for the 32-value block types; 256 for the K-quants, whose products sum a whole block in
 * integers) and, for weights with a minimum, the float sum of each 32 values */
typedef struct {
    int16_t *q;          /* [n_rows][K] */
    float *e;            /* [n_rows][K / group] */
    float *sums;         /* [n_rows][K / 32] */
    int64_t K, n_rows, group;
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

/* n (a multiple of 32) floats to int16 rounded to nearest on one scale e = max|x| / 32767,
 * and the float sum of each 32 */
static inline void quantize_group(const float *x, int64_t n, int16_t *q, float *e, float *sums) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    int finite = 1;
    for (int64_t j = 0; j < n; j += 32) {
        __m256 s = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_loadu_ps(x + j + 8 * k);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
            s = _mm256_add_ps(s, v);
        }
        float total = hsum8(s);
        sums[j / 32] = total;
        finite &= isfinite(total) != 0;
    }
    float amax = hmax(mx);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    if (!finite) {                       /* inf or NaN: the whole group reads as NaN */
        inv = _mm256_setzero_ps();
        amax = NAN;
    }
    for (int64_t j = 0; j < n; j += 16) {
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), inv));
        /* packs works within 128-bit lanes: the permute puts the values back in order */
        _mm256_storeu_si256((__m256i *)(q + j),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8));
    }
    *e = amax / 32767.0f;
}

static void quantize_rows(const float *x, int64_t x_stride, int16_rows *a, int n_threads) {
    const int64_t ne = a->K / a->group, ns = a->K / 32;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && a->n_rows >= 8)
    for (int64_t r = 0; r < a->n_rows; r++)
        for (int64_t j = 0; j < ne; j++)
            quantize_group(x + r * x_stride + a->group * j, a->group, a->q + r * a->K + a->group * j,
                           a->e + r * ne + j, a->sums + r * ns + j * (a->group / 32));
}

/* --- the 32-value block types -----------------------------------------------------------------
 * A block's values as signed bytes, its scale d and minimum m (0 without one). The group's
 * integer sum is scaled in float, d e sum q X + m sum x: the scales are float per 32 values. */

#define VALUES(NAME) static inline __attribute__((always_inline)) __m256i NAME(const uint8_t *b)

VALUES(v_q4_0) { return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)); }
VALUES(v_q4_1) { return nibbles(b + 4); }
VALUES(v_q5_0) {
    __m256i v = _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
    return _mm256_sub_epi8(v, _mm256_set1_epi8(16));
}
VALUES(v_q5_1) { return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)); }
VALUES(v_q8_0) { return _mm256_loadu_si256((const __m256i *)(b + 2)); }

/* Block b of one weight row times ROWS activation rows (a constant of each inlined copy, so
 * the sums stay in registers): the block is unpacked and widened once for every row */
#define BLOCK32_PRODUCT(NAME, BYTES, VAL, MIN)                                                \
static inline __attribute__((always_inline)) void NAME##_block(                              \
        const uint8_t *row, const int16_rows *a, int64_t r0, const int ROWS, int64_t b,     \
        __m256 *acc, float *shift) {                                                        \
    const int64_t nb = a->K / QK;                                                           \
    const uint8_t *block = row + b * (BYTES);                                               \
    const float d = f16(block);                                                             \
    __m256i q = VAL(block);                                                                 \
    __m256i w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));                           \
    __m256i w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));                      \
    for (int r = 0; r < ROWS; r++) {                                                        \
        const int16_t *x = a->q + (r0 + r) * a->K + QK * b;                                 \
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x);                                \
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + 16));                         \
        __m256i p = MADD16(MADD16(_mm256_setzero_si256(), w0, x0), w1, x1);                 \
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                                     \
                                 _mm256_set1_ps(d * a->e[(r0 + r) * nb + b]), acc[r]);      \
        if (MIN) shift[r] = fmaf(f16(block + 2), a->sums[(r0 + r) * nb + b], shift[r]);     \
    }                                                                                       \
}                                                                                           \
                                                                                            \
/* two blocks at a time into two sets of sums: each sum's chain of dependent multiply-adds  \
 * is half as long, so a single row (a decode step) does not wait on their latency */       \
static inline __attribute__((always_inline)) void NAME##_tile(                               \
        const uint8_t *row, const int16_rows *a, int64_t r0, const int ROWS, float *y,      \
        int64_t y_stride) {                                                                 \
    const int64_t nb = a->K / QK;                                                           \
    __m256 acc[2][4];                                                                       \
    float shift[2][4];                                                                      \
    for (int r = 0; r < ROWS; r++)                                                          \
        acc[0][r] = acc[1][r] = _mm256_setzero_ps(), shift[0][r] = shift[1][r] = 0.0f;      \
    int64_t b = 0;                                                                          \
    for (; b + 2 <= nb; b += 2) {                                                           \
        NAME##_block(row, a, r0, ROWS, b, acc[0], shift[0]);                                \
        NAME##_block(row, a, r0, ROWS, b + 1, acc[1], shift[1]);                            \
    }                                                                                       \
    if (b < nb) NAME##_block(row, a, r0, ROWS, b, acc[0], shift[0]);                        \
    for (int r = 0; r < ROWS; r++)                                                          \
        y[(r0 + r) * y_stride] = hsum8(_mm256_add_ps(acc[0][r], acc[1][r]))                 \
                                 + (shift[0][r] + shift[1][r]);                             \
}

/* --- the K-quants -------------------------------------------------------------------------------
 * Their sub-block scales are small integers (6 bits; 8 for Q6_K) under one float per 256
 * values, and the activations have one scale per 256 values too, so a block's products sum in
 * integers: each sub-block's int16 weights are multiplied by its scale first (at most 15 * 63,
 * 31 * 63 and 32 * 128: all int16), and one float multiply-add per 256 values (per 128 for
 * Q6_K) applies d e. No lane of the int32 sums can overflow: at most 32 products of
 * 945 * 32767 (Q4_K) or 1953 * 32767 (Q5_K) per 256 values, 16 of 4096 * 32767 (Q6_K) per 128,
 * all below 2^31. The minimum's term, sum_g m_g sum x_g, is one float multiply-add per block. */

typedef struct {
    __m256i scales;      /* Q4_K, Q5_K: the 8 sub-block scales as int16, in both halves */
    __m256 mins;         /* Q4_K, Q5_K: -dmin m_g for the 8 groups' activation sums */
    float d;
} k_scales;

/* Q4_K and Q5_K: 12 bytes hold 8 six-bit scales and 8 minimums (see scale_min_k4); four at
 * a time from three 32-bit words */
static inline __attribute__((always_inline)) k_scales scales_k4(const uint8_t *b) {
    uint32_t u[3];
    memcpy(u, b + 4, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x30303030;
    uint64_t sc = (uint64_t)((u[2] & low4) | ((u[0] >> 2) & top2)) << 32 | (u[0] & low6);
    uint64_t mn = (uint64_t)(((u[2] >> 4) & low4) | ((u[1] >> 2) & top2)) << 32 | (u[1] & low6);
    k_scales k;
    k.scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
    k.mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))),
                           _mm256_set1_ps(-f16(b + 2)));
    k.d = f16(b);
    return k;
}

static inline __attribute__((always_inline)) k_scales scales_q6_k(const uint8_t *b) {
    k_scales k;                          /* w_q6_k reads its int8 scales from the block */
    k.scales = _mm256_setzero_si256();
    k.mins = _mm256_setzero_ps();
    k.d = f16(b + 208);
    return k;
}

/* scale s of the 8 in both halves of `scales` (Q4_K, Q5_K), in all 16 int16 lanes */
static inline __attribute__((always_inline)) __m256i scale_k4(__m256i scales, int s) {
    return _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)(0x0100 * (2 * s + 1) + 2 * s)));
}

/* group g (32 values) of a block as two vectors of 16 int16 weights, times their scales */
#define K_WEIGHTS(NAME) static inline __attribute__((always_inline)) void NAME(              \
    const uint8_t *b, __m256i scales, int g, __m256i *w0, __m256i *w1)

K_WEIGHTS(w_q4_k) {
    __m256i q = q4_k_values(b, g), s = scale_k4(scales, g);
    *w0 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), s);
    *w1 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)), s);
}

K_WEIGHTS(w_q5_k) {
    __m256i q = q5_k_values(b, g), s = scale_k4(scales, g);
    *w0 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), s);
    *w1 = _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1)), s);
}

/* group g of a Q6_K block: half n = g / 4, quarter q = g % 4 of that half; its first 16
 * values have scale 8 n + 2 q, the next 16 the one after */
K_WEIGHTS(w_q6_k) {
    int n = g >> 2, q = g & 3;
    __m256i low = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (q & 1)));
    if (q >> 1) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0xF));
    __m256i high = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    high = _mm256_and_si256(_mm256_srli_epi16(high, 2 * q), _mm256_set1_epi8(3));
    __m256i v = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                                _mm256_set1_epi8(32));
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * n + 2 * q);
    (void)scales;
    *w0 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                             _mm256_set1_epi16(sc[0]));
    *w1 = _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                             _mm256_set1_epi16(sc[1]));
}

/* FLUSH: the groups whose integer sums may add before they are scaled in float (8, or 4 for
 * Q6_K); MIN: the type has minimums */
#define K_PRODUCT(NAME, BYTES, SCALES, WEIGHTS, FLUSH, MIN)                                   \
static inline __attribute__((always_inline)) void NAME##_tile(                               \
        const uint8_t *row, const int16_rows *a, int64_t r0, const int ROWS, float *y,      \
        int64_t y_stride) {                                                                 \
    /* one row (a decode step) spreads its sums over four chains of dependent multiply-adds, \
     * so it does not wait on their latency; four rows are four chains already */           \
    const int CHAINS = ROWS == 1 ? 4 : 1;                                                   \
    const int64_t nb = a->K / QK_K;                                                         \
    __m256 acc[4], shift[4];                                                                \
    for (int r = 0; r < ROWS; r++) acc[r] = shift[r] = _mm256_setzero_ps();                 \
    for (int64_t b = 0; b < nb; b++) {                                                      \
        const uint8_t *block = row + b * (BYTES);                                           \
        const k_scales k = SCALES(block);                                                   \
        _Pragma("GCC unroll 2")                                                             \
        for (int g0 = 0; g0 < 8; g0 += (FLUSH)) {                                           \
            __m256i sum[4][4];                                                              \
            for (int r = 0; r < ROWS; r++)                                                  \
                for (int c = 0; c < CHAINS; c++) sum[r][c] = _mm256_setzero_si256();        \
            _Pragma("GCC unroll 8")                                                         \
            for (int g = g0; g < g0 + (FLUSH); g++) {                                       \
                __m256i w0, w1;                                                             \
                WEIGHTS(block, k.scales, g, &w0, &w1);                                      \
                const int c0 = (2 * g) % CHAINS, c1 = (2 * g + 1) % CHAINS;                 \
                for (int r = 0; r < ROWS; r++) {                                            \
                    const int16_t *x = a->q + (r0 + r) * a->K + QK_K * b + 32 * g;          \
                    sum[r][c0] = MADD16(sum[r][c0], w0, _mm256_loadu_si256((const __m256i *)x)); \
                    sum[r][c1] = MADD16(sum[r][c1], w1,                                     \
                                        _mm256_loadu_si256((const __m256i *)(x + 16)));     \
                }                                                                           \
            }                                                                               \
            for (int r = 0; r < ROWS; r++) {                                                \
                for (int c = 1; c < CHAINS; c++)                                            \
                    sum[r][0] = _mm256_add_epi32(sum[r][0], sum[r][c]);                     \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][0]),                     \
                                         _mm256_set1_ps(k.d * a->e[(r0 + r) * nb + b]), acc[r]); \
            }                                                                               \
        }                                                                                   \
        if (MIN)                                                                            \
            for (int r = 0; r < ROWS; r++)                                                  \
                shift[r] = _mm256_fmadd_ps(k.mins,                                          \
                                           _mm256_loadu_ps(a->sums + (r0 + r) * (a->K / 32) + 8 * b), \
                                           shift[r]);                                       \
    }                                                                                       \
    for (int r = 0; r < ROWS; r++)                                                          \
        y[(r0 + r) * y_stride] = hsum8(acc[r]) + (MIN ? hsum8(shift[r]) : 0.0f);            \
}

/* the rows of a product: four activation rows at a time, then one */
#define ROWS_OF(NAME)                                                                       \
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

BLOCK32_PRODUCT(i16_q4_0, 18, v_q4_0, 0)
BLOCK32_PRODUCT(i16_q4_1, 20, v_q4_1, 1)
BLOCK32_PRODUCT(i16_q5_0, 22, v_q5_0, 0)
BLOCK32_PRODUCT(i16_q5_1, 24, v_q5_1, 1)
BLOCK32_PRODUCT(i16_q8_0, 34, v_q8_0, 0)
K_PRODUCT(i16_q4_k, 144, scales_k4, w_q4_k, 8, 1)
K_PRODUCT(i16_q5_k, 176, scales_k4, w_q5_k, 8, 1)
K_PRODUCT(i16_q6_k, 210, scales_q6_k, w_q6_k, 4, 0)
ROWS_OF(i16_q4_0)
ROWS_OF(i16_q4_1)
ROWS_OF(i16_q5_0)
ROWS_OF(i16_q5_1)
ROWS_OF(i16_q8_0)
ROWS_OF(i16_q4_k)
ROWS_OF(i16_q5_k)
ROWS_OF(i16_q6_k)

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
    const int64_t group = (type == T_Q4_K || type == T_Q5_K || type == T_Q6_K) ? QK_K : QK;
    int16_rows a = {malloc(sizeof(int16_t) * n_rows * K), malloc(sizeof(float) * n_rows * (K / group)),
                    malloc(sizeof(float) * n_rows * (K / QK)), K, n_rows, group};
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
