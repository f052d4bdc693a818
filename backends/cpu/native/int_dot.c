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
#include "int16.h"

#ifdef INT16_KERNELS

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
    float amax = hmax8(mx);
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

int16_rows int16_rows_new(int64_t K, int64_t n_rows, int64_t group) {
    int16_rows a = {malloc(sizeof(int16_t) * n_rows * K), malloc(sizeof(float) * n_rows * (K / group)),
                    malloc(sizeof(float) * n_rows * (K / QK)), K, n_rows, group};
    if (!a.q || !a.e || !a.sums) int16_rows_free(&a);
    return a;
}

void int16_rows_free(int16_rows *a) {
    free(a->q);
    free(a->e);
    free(a->sums);
    a->q = 0, a->e = a->sums = 0;
}

void pd_quantize_rows_int16(const float *x, int64_t x_stride, int16_rows *a, int n_threads) {
    const int64_t ne = a->K / a->group, ns = a->K / 32;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && a->n_rows >= 8)
    for (int64_t r = 0; r < a->n_rows; r++)
        for (int64_t j = 0; j < ne; j++)
            quantize_group(x + r * x_stride + a->group * j, a->group, a->q + r * a->K + a->group * j,
                           a->e + r * ne + j, a->sums + r * ns + j * (a->group / 32));
}

/* --- the 32-value block types (their VALUES in int16.h): a block's integer sum is scaled in
 * float, d e sum q X + m sum x, since the scales are float per 32 values ---------------------- */

/* Block b of one weight row times ROWS activation rows (a constant of each inlined copy, so
 * the sums stay in registers): the block is unpacked and widened once for every row */
#define BLOCK32_PRODUCT(NAME, BYTES, VAL, MIN)                                                \
static inline __attribute__((always_inline)) void NAME##_block(                              \
        const uint8_t *row, const int16_rows *a, int64_t r0, const int ROWS, int64_t b,     \
        fvec *acc, float *shift) {                                                          \
    const int64_t nb = a->K / QK;                                                           \
    const uint8_t *block = row + b * (BYTES);                                               \
    const float d = f16(block);                                                             \
    const w32 w = w32_i8(VAL(block));                                                       \
    for (int r = 0; r < ROWS; r++) {                                                        \
        ivec p = w32_madd(iv_zero(), w, a->q + (r0 + r) * a->K + QK * b);                   \
        acc[r] = fv_scale_add(p, d * a->e[(r0 + r) * nb + b], acc[r]);                      \
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
    fvec acc[2][4];                                                                         \
    float shift[2][4];                                                                      \
    for (int r = 0; r < ROWS; r++)                                                          \
        acc[0][r] = acc[1][r] = fv_zero(), shift[0][r] = shift[1][r] = 0.0f;                \
    int64_t b = 0;                                                                          \
    for (; b + 2 <= nb; b += 2) {                                                           \
        NAME##_block(row, a, r0, ROWS, b, acc[0], shift[0]);                                \
        NAME##_block(row, a, r0, ROWS, b + 1, acc[1], shift[1]);                            \
    }                                                                                       \
    if (b < nb) NAME##_block(row, a, r0, ROWS, b, acc[0], shift[0]);                        \
    for (int r = 0; r < ROWS; r++)                                                          \
        y[(r0 + r) * y_stride] = fv_total(acc[0][r]) + fv_total(acc[1][r])                  \
                                 + (shift[0][r] + shift[1][r]);                             \
}

/* --- the K-quants (see int16.h): a block's products sum in integers ------------------------- */

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
    fvec acc[4];                                                                            \
    __m256 shift[4];                                                                        \
    for (int r = 0; r < ROWS; r++) acc[r] = fv_zero(), shift[r] = _mm256_setzero_ps();      \
    for (int64_t b = 0; b < nb; b++) {                                                      \
        const uint8_t *block = row + b * (BYTES);                                           \
        const k_scales k = SCALES(block);                                                   \
        _Pragma("GCC unroll 2")                                                             \
        for (int g0 = 0; g0 < 8; g0 += (FLUSH)) {                                           \
            ivec sum[4][4];                                                                 \
            for (int r = 0; r < ROWS; r++)                                                  \
                for (int c = 0; c < CHAINS; c++) sum[r][c] = iv_zero();                     \
            _Pragma("GCC unroll 8")                                                         \
            for (int g = g0; g < g0 + (FLUSH); g++) {                                       \
                const w32 w = WEIGHTS(block, k.scales, g);                                  \
                const int c = g % CHAINS;                                                   \
                for (int r = 0; r < ROWS; r++)                                              \
                    sum[r][c] = w32_madd(sum[r][c], w, a->q + (r0 + r) * a->K + QK_K * b + 32 * g); \
            }                                                                               \
            for (int r = 0; r < ROWS; r++) {                                                \
                for (int c = 1; c < CHAINS; c++) sum[r][0] = iv_add32(sum[r][0], sum[r][c]); \
                acc[r] = fv_scale_add(sum[r][0], k.d * a->e[(r0 + r) * nb + b], acc[r]);    \
            }                                                                               \
        }                                                                                   \
        if (MIN)                                                                            \
            for (int r = 0; r < ROWS; r++)                                                  \
                shift[r] = _mm256_fmadd_ps(k.mins,                                          \
                                           _mm256_loadu_ps(a->sums + (r0 + r) * (a->K / 32) + 8 * b), \
                                           shift[r]);                                       \
    }                                                                                       \
    for (int r = 0; r < ROWS; r++)                                                          \
        y[(r0 + r) * y_stride] = fv_total(acc[r]) + (MIN ? hsum8(shift[r]) : 0.0f);         \
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
#define PD_CASE(TYPE, name, id, values, bytes, has_min) case T_##TYPE: return i16_##name;
    switch (type) { PD_QUANT_TYPES(PD_CASE) }
#undef PD_CASE
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

/* from this many activation rows on, the K-quants multiply through int_gemm.c */
#define GEMM_ROWS 8

/* y[r, i] = sum_k W[i, k] x[r, k] with x quantized to int16 groups (see the top of the file).
 * Returns 0, or 1 where the type has no integer kernel here, or 2 when the scratch memory
 * could not be had (nothing written either way). */
int pd_mul_mat_int16(int type, const uint8_t *w, int64_t w_stride, int64_t M, int64_t K,
                     const float *x, int64_t x_stride, int64_t n_rows,
                     float *y, int64_t y_stride, int n_threads) {
#ifdef INT16_KERNELS
    int16_kernel kernel = int16_kernel_of(type);
    if (!kernel) return 1;
    int16_rows a = int16_rows_new(K, n_rows, block_values(type));  /* a scale per block */
    int status = 2;
    if (a.q) {
        pd_quantize_rows_int16(x, x_stride, &a, n_threads);
        /* many rows: the GEMM unpacks each weight block once for all of them */
        status = n_rows >= GEMM_ROWS ? pd_gemm_int16(type, w, w_stride, M, &a, y, y_stride,
                                                     n_threads) : 1;
        if (status == 1) {
            const int64_t chunk = 16;
            int64_t n_chunks = (M + chunk - 1) / chunk;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
            for (int64_t c = 0; c < n_chunks; c++) {
                int64_t i1 = (c + 1) * chunk < M ? (c + 1) * chunk : M;
                kernel(w, w_stride, c * chunk, i1, &a, y, y_stride);
            }
            status = 0;
        }
    }
    int16_rows_free(&a);
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
