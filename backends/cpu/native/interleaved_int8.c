/* The interleaved weights (interleaved.h) times activation rows quantized to int8: the
 * products of numerics="int8", with AVX-512 VNNI's vpdpbusd.
 *
 * vpdpbusd multiplies 64 unsigned bytes by 64 signed ones and adds each four adjacent products
 * to an int32 lane: 64 products per instruction where the int16 kernels' vpdpwssd makes 32.
 * Products of several activation rows are compute-bound (a prompt; a batch of sequences), so
 * they run up to twice as fast; a single row reads its weight at the speed of memory either
 * way. The price is the activations' precision: int8 with a float scale per 32 values (a
 * relative error of up to 1/254 of the group's largest value) where int16 has 1/65534 (see
 * polydev.numerics for what that does to the logits).
 *
 * The layout keeps two values of each row per 16-bit pair (interleaved.h), so a vector of four
 * values per row is made from two chunks: their 64 bytes with the 16-bit pairs permuted so that
 * chunk j's pair of row r and chunk j + 1's are adjacent (one vpermw), which makes 32-bit lane
 * r hold values 4 k .. 4 k + 3 of row r. The weights are the unsigned operand: nibbles and
 * 6-bit values as they are stored, Q8_0's bytes with their sign bit flipped (value + 128).
 * Each type's offset (8 for Q4_0, 16 for Q5_0, 32 for Q6_K, 128 for Q8_0) comes off in int32
 * as the offset times the activations' integer sum; minimums (Q4_K, Q5_K, Q4_1, Q5_1) are
 * applied in float to the activations' sums as quantized (quantize_unit says why).
 *
 * A unit is 32 values of each row (a K-quant's sub-block, or a 32-value block), unpacked into
 * 8 vectors of quads: vector v multiplies activations 4 v .. 4 v + 3 of the unit (vectors 0-3
 * are the low nibbles, 4-7 the high ones). No int32 lane can overflow: a unit sums 32 products
 * of at most 255 * 128.
 */
#include "interleaved.h"

#if defined(INT8_KERNELS)

#define TILE8 8                       /* activation rows per pass over a group's blocks */
#define UNIT 32                       /* values of a unit */
#define SPAN8_UNITS 8                 /* units of a prompt's unpacked span: 256 values */

/* --- activations --------------------------------------------------------------------------- */

int8_rows int8_rows_new(int64_t K, int64_t n_rows) {
    int8_rows a = {malloc((size_t)(n_rows * K)), malloc(sizeof(float) * n_rows * (K / UNIT)),
                   malloc(sizeof(float) * n_rows * (K / UNIT)),
                   malloc(sizeof(int32_t) * n_rows * (K / 16)), K, n_rows};
    if (!a.q || !a.e || !a.sums || !a.isums) int8_rows_free(&a);
    return a;
}

void int8_rows_free(int8_rows *a) {
    free(a->q);
    free(a->e);
    free(a->sums);
    free(a->isums);
    a->q = 0, a->e = a->sums = 0, a->isums = 0;
}

/* 32 values: q = round(x / e) with e their largest magnitude / 127, the integer sums of q's
 * two halves, and the sum of the values as quantized (e times the integer sum). A weight with
 * a minimum, w = d q + m, multiplies the quantized values in both terms: with the float sum of
 * x in the minimum's term the activations' rounding met d q alone, whose values are all >= 0,
 * instead of the centred w, and SmolLM2's logits (Q4_1) went 6x further from float64. A value
 * that is not finite makes e NaN (the whole unit reads as NaN, as the int16 activations do). */
static inline void quantize_unit(const float *x, int8_t *q, float *e, float *sum,
                                 int32_t *isums) {
    const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const int finite = isfinite(_mm512_reduce_add_ps(_mm512_add_ps(a, b))) && isfinite(amax);
    const __m512 inv = _mm512_set1_ps(finite && amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qb));
    isums[0] = _mm512_reduce_add_epi32(qa);
    isums[1] = _mm512_reduce_add_epi32(qb);
    *e = finite ? amax / 127.0f : NAN;
    *sum = (float)(isums[0] + isums[1]) * *e;
}

void pd_quantize_rows_int8(const float *x, int64_t x_stride, int8_rows *a, int n_threads) {
    const int64_t units = a->K / UNIT;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1 && a->n_rows >= 8)
    for (int64_t r = 0; r < a->n_rows; r++)
        for (int64_t u = 0; u < units; u++)
            quantize_unit(x + r * x_stride + UNIT * u, a->q + r * a->K + UNIT * u,
                          a->e + r * units + u, a->sums + r * units + u,
                          a->isums + r * 2 * units + 2 * u);
}

/* what a kernel of one group needs of ROWS activation rows, from value v0 on */
typedef struct {
    const int8_t *x[TILE8];
    const float *e[TILE8], *sums[TILE8];          /* per unit */
    const int32_t *isums[TILE8];                  /* per 16 values */
} act8_rows;

static inline __attribute__((always_inline)) act8_rows act8_at(const int8_rows *a, int64_t r0,
                                                               int ROWS, int64_t v0) {
    act8_rows t;
    const int64_t units = a->K / UNIT;
    for (int r = 0; r < ROWS; r++) {
        t.x[r] = a->q + (r0 + r) * a->K + v0;
        t.e[r] = a->e + (r0 + r) * units + v0 / UNIT;
        t.sums[r] = a->sums + (r0 + r) * units + v0 / UNIT;
        t.isums[r] = a->isums + (r0 + r) * 2 * units + v0 / 16;
    }
    return t;
}

/* --- the weights as quads ------------------------------------------------------------------ */

/* 64 bytes of two chunks (pairs of 16 rows) to quads: 16-bit pair r of the first chunk and
 * pair r of the second next to each other in 32-bit lane r */
static inline __attribute__((always_inline)) __m512i pairs_to_quads(__m512i two_chunks) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                           24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                           1, 16, 0);
    return _mm512_permutexvar_epi16(order, two_chunks);
}

/* the fifth bits of chunks 2 k and 2 k + 1 (a plane of them, interleaved.h: bit j of byte
 * 2 r + i; `high` picks the high nibbles' plane) at the bytes of their quads: byte 4 r + i
 * from the first chunk, 4 r + 2 + i from the second (the plane twice, made quads as the
 * chunks are, tested for bit 2 k in the first's bytes and 2 k + 1 in the second's) */
static inline __attribute__((always_inline)) __mmask64 quad_fifth_bits(const uint8_t *planes,
                                                                       int k, int high) {
    const __m512i twice = _mm512_broadcast_i64x4(
        _mm256_loadu_si256((const __m256i *)(planes + 32 * high)));
    const uint32_t first = 1u << (2 * k), second = 1u << (2 * k + 1);
    const __m512i bits = _mm512_set1_epi32((int)(first | first << 8 | second << 16
                                                 | second << 24));
    return _mm512_test_epi8_mask(pairs_to_quads(twice), bits);
}

/* nibbles at q (8 chunks; their planes of fifth bits at `planes`, or none): vectors k and
 * 4 + k of a unit */
static inline __attribute__((always_inline)) void nibble_quads(const uint8_t *q,
                                                               const uint8_t *planes, int k,
                                                               __m512i *lo, __m512i *hi) {
    const __m512i v = pairs_to_quads(_mm512_loadu_si512((const void *)(q + 64 * k)));
    const __m512i low4 = _mm512_set1_epi8(0xF);
    *lo = _mm512_and_si512(v, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if (!planes) return;
    const __m512i sixteen = _mm512_set1_epi8(16);
    *lo = _mm512_mask_add_epi8(*lo, quad_fifth_bits(planes, k, 0), *lo, sixteen);
    *hi = _mm512_mask_add_epi8(*hi, quad_fifth_bits(planes, k, 1), *hi, sixteen);
}

/* Q6_K, sub-block g: vector 4 high + k as unsigned 6-bit values (see interleaved.h: the top
 * two bits of chunk j sit at bit 4 (j / 4) + 2 high of high-bit vector j % 4, and chunks
 * 2 k and 2 k + 1 read vectors 2 k % 4 and 2 k % 4 + 1, which are adjacent) */
static inline __attribute__((always_inline)) __m512i q6_quads(const uint8_t *p, int g, int high,
                                                             int k) {
    const uint8_t *q = p + 288 + 384 * g;
    __m512i nib = _mm512_loadu_si512((const void *)(q + 64 * k));
    const __m512i h = _mm512_loadu_si512((const void *)(q + 256 + 32 * ((2 * k) & 3)));
    const int s = 4 * (k >> 1) + 2 * high;
    if (high) nib = _mm512_srli_epi16(nib, 4);
    nib = _mm512_and_si512(nib, _mm512_set1_epi8(0xF));
    __m512i top = s < 4 ? _mm512_slli_epi16(h, 4 - s) : s > 4 ? _mm512_srli_epi16(h, s - 4) : h;
    top = _mm512_and_si512(top, _mm512_set1_epi8(0x30));
    return pairs_to_quads(_mm512_or_si512(nib, top));
}

/* unit u of a group block's values as 8 vectors of quads (u: a K-quant's sub-block, or 0) */
static inline __attribute__((always_inline)) void unit_quads(int type, const uint8_t *p, int u,
                                                            __m512i w[8]) {
    if (type == T_Q8_0) {
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_xor_si512(pairs_to_quads(_mm512_loadu_si512(
                (const void *)(p + 32 + 64 * k))), _mm512_set1_epi8((char)0x80));
        return;
    }
    if (type == T_Q6_K) {
        for (int v = 0; v < 8; v++) w[v] = q6_quads(p, u, v >> 2, v & 3);
        return;
    }
    const uint8_t *q = block_values(type) == QK_K ? p + K4_HEADER + k4_group_bytes(type) * u
                                                  : p + header_32(type);
    const int fifth = type == T_Q5_K || has_fifth_32(type);
    for (int k = 0; k < 4; k++) nibble_quads(q, fifth ? q + 256 : 0, k, &w[k], &w[4 + k]);
}

/* --- the products -------------------------------------------------------------------------- */

/* acc + each row's quad of weights times the quad of activations at x (broadcast) */
static inline __attribute__((always_inline)) __m512i dot_quad(__m512i acc, __m512i w,
                                                             const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}

/* the offset each type's stored values carry (0 where a minimum is applied instead; Q6_K's 32
 * comes off each half of a unit in add_q6_unit) */
static inline int value_offset(int type) {
    switch (type) {
    case T_Q4_0: return 8;
    case T_Q5_0: return 16;
    case T_Q6_K: return 32;
    case T_Q8_0: return 128;
    default: return 0;
    }
}

/* Q6_K's unit `at` (sub-block u of the block at p) for ROWS rows: each half's int32 sums
 * less 32 times its activations' integer sum, times its int8 scale and d, times the row's e */
static inline __attribute__((always_inline)) void add_q6_unit(
    const uint8_t *p, int u, int64_t at, act8_rows t, const int ROWS, __m512i s[][2],
    __m512 *acc) {
    const __m512 d = r16_fp16(p);
    const __m512 sc0 = _mm512_mul_ps(d, r16_i8_floats(p + 32 + 32 * u));
    const __m512 sc1 = _mm512_mul_ps(d, r16_i8_floats(p + 32 + 32 * u + 16));
    for (int r = 0; r < ROWS; r++) {
        const int32_t *xs = t.isums[r] + 2 * at;
        const __m512i h0 = _mm512_sub_epi32(s[r][0], _mm512_set1_epi32(32 * xs[0]));
        const __m512i h1 = _mm512_sub_epi32(s[r][1], _mm512_set1_epi32(32 * xs[1]));
        const __m512 f0 = _mm512_cvtepi32_ps(h0), f1 = _mm512_cvtepi32_ps(h1);
        const __m512 unit = _mm512_fmadd_ps(f1, sc1, _mm512_mul_ps(f0, sc0));
        acc[r] = _mm512_fmadd_ps(unit, _mm512_set1_ps(t.e[r][at]), acc[r]);
    }
}

/* The other types' unit `at` (sub-block u of a K-quant's block at p, or the 32-value block
 * at p) for ROWS rows: the int32 sums (HALVES of them) less the type's offset times the
 * activations' integer sum, times d (and a K-quant's 6-bit scale) and the row's e; then the
 * minimum's term, with the activations' sum as quantized */
static inline __attribute__((always_inline)) void add_unit(
    int type, const uint8_t *p, int u, int64_t at, act8_rows t, const int ROWS,
    const int HALVES, __m512i s[][2], __m512 *acc) {
    const int k_quant = block_values(type) == QK_K, offset = value_offset(type);
    const __m512 d = r16_fp16(p);
    const __m512 scale = k_quant ? _mm512_mul_ps(d, r16_u8_floats(p + 64 + 16 * u)) : d;
    __m512 mins = _mm512_setzero_ps();                  /* K-quants: subtracted; else added */
    if (k_quant)
        mins = _mm512_mul_ps(r16_fp16(p + 32), r16_u8_floats(p + 192 + 16 * u));
    else if (has_min_32(type))
        mins = r16_fp16(p + 32);
    for (int r = 0; r < ROWS; r++) {
        __m512i sum = HALVES == 2 ? _mm512_add_epi32(s[r][0], s[r][1]) : s[r][0];
        if (offset) {
            const int32_t *xs = t.isums[r] + 2 * at;
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset * (xs[0] + xs[1])));
        }
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                 _mm512_mul_ps(scale, _mm512_set1_ps(t.e[r][at])), acc[r]);
        if (k_quant)
            acc[r] = _mm512_fnmadd_ps(mins, _mm512_set1_ps(t.sums[r][at]), acc[r]);
        else if (has_min_32(type))
            acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(t.sums[r][at]), acc[r]);
    }
}

/* A group's kernel: nb blocks from p for ROWS activation rows t, the 16 results of row r
 * stored at y + r y_stride, or added to what is there (`accumulate`). w8: the blocks'
 * units unpacked (a span, vector v of unit u at w8 + 64 (8 u + v)), or 0 to unpack here. */
static inline __attribute__((always_inline)) void group8(int type, const uint8_t *p, int64_t nb,
                                                        act8_rows t, const int ROWS, float *y,
                                                        int64_t y_stride, const uint8_t *w8,
                                                        int accumulate) {
    const int units = block_values(type) / UNIT;
    /* two sums per row: the unit's halves (Q6_K's have scales of their own; for the others,
     * two chains of dependent adds where one row cannot hide their latency) */
    const int HALVES = type == T_Q6_K || ROWS == 1 ? 2 : 1;
    const int64_t bytes = group_block_bytes(type);
    __m512 acc[TILE8];
    for (int r = 0; r < ROWS; r++)
        acc[r] = accumulate ? _mm512_loadu_ps(y + r * y_stride) : _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, p += bytes) {
        if (!w8) prefetch_rows_block(p, bytes, ROWS);
        for (int u = 0; u < units; u++) {
            const int64_t at = units * b + u;            /* the unit among t's */
            __m512i w[8], s[TILE8][2];
            if (w8) {
                for (int v = 0; v < 8; v++)
                    w[v] = _mm512_load_si512((const void *)(w8 + 64 * (8 * at + v)));
            } else {
                unit_quads(type, p, u, w);
            }
            for (int r = 0; r < ROWS; r++) s[r][0] = s[r][1] = _mm512_setzero_si512();
            for (int v = 0; v < 8; v++)
                for (int r = 0; r < ROWS; r++) {
                    const int half = HALVES == 2 ? v >> 2 : 0;
                    s[r][half] = dot_quad(s[r][half], w[v], t.x[r] + UNIT * at + 4 * v);
                }
            if (type == T_Q6_K)
                add_q6_unit(p, u, at, t, ROWS, s, acc);
            else
                add_unit(type, p, u, at, t, ROWS, HALVES, s, acc);
        }
    }
    for (int r = 0; r < ROWS; r++) _mm512_storeu_ps(y + r * y_stride, acc[r]);
}

/* n group blocks from p (one span) unpacked into w8 */
static inline __attribute__((always_inline)) void unpack_span8(int type, const uint8_t *p,
                                                              int64_t n, uint8_t *w8) {
    const int units = block_values(type) / UNIT;
    for (int64_t b = 0; b < n; b++, p += group_block_bytes(type)) {
        prefetch_block(p, group_block_bytes(type));
        for (int u = 0; u < units; u++) {
            __m512i w[8];
            unit_quads(type, p, u, w);
            for (int v = 0; v < 8; v++)
                _mm512_store_si512((void *)(w8 + 64 * (8 * (units * b + u) + v)), w[v]);
        }
    }
}

#define ROW_TILES8(TYPE, P, NB, V0, Y, W8, ACCUMULATE)                                        \
    ROW_TILES_OF(group8, act8_at, TILE8, TYPE, P, NB, V0, Y, W8, ACCUMULATE)

/* Group G's 16 results for every row of `a`. More rows than a tile (a prompt) unpack each
 * span of 256 values once into 4 KiB on the stack, which every tile then reads. */
#define GROUP_KERNEL8(NAME, TYPE)                                                            \
static void NAME(const uint8_t *p, int64_t G, const int8_rows *a, float *y,                \
                 int64_t y_stride) {                                                        \
    const int64_t nb = a->K / block_values(TYPE), bytes = group_block_bytes(TYPE);          \
    const int64_t span = SPAN8_UNITS * UNIT / block_values(TYPE);                           \
    const uint8_t *group = p + G * nb * bytes;                                              \
    y += ROWS16 * G;                                                                        \
    if (a->n_rows <= TILE8) {                                                               \
        ROW_TILES8(TYPE, group, nb, 0, y, (const uint8_t *)0, 0);                           \
        return;                                                                             \
    }                                                                                       \
    uint8_t w8[64 * 8 * SPAN8_UNITS] __attribute__((aligned(64)));                          \
    for (int64_t b0 = 0; b0 < nb; b0 += span) {                                             \
        const int64_t n = nb - b0 < span ? nb - b0 : span;                                  \
        unpack_span8(TYPE, group + b0 * bytes, n, w8);                                      \
        ROW_TILES8(TYPE, group + b0 * bytes, n, b0 * block_values(TYPE), y, w8, b0 > 0);    \
    }                                                                                       \
}

GROUP_KERNEL8(x16_q4_k_int8, T_Q4_K)
GROUP_KERNEL8(x16_q5_k_int8, T_Q5_K)
GROUP_KERNEL8(x16_q6_k_int8, T_Q6_K)
GROUP_KERNEL8(x16_q4_0_int8, T_Q4_0)
GROUP_KERNEL8(x16_q4_1_int8, T_Q4_1)
GROUP_KERNEL8(x16_q5_0_int8, T_Q5_0)
GROUP_KERNEL8(x16_q5_1_int8, T_Q5_1)
GROUP_KERNEL8(x16_q8_0_int8, T_Q8_0)

group_kernel8 group_kernel8_of(int type) {
    switch (type) {
    case T_Q4_K: return x16_q4_k_int8;
    case T_Q5_K: return x16_q5_k_int8;
    case T_Q6_K: return x16_q6_k_int8;
    case T_Q4_0: return x16_q4_0_int8;
    case T_Q4_1: return x16_q4_1_int8;
    case T_Q5_0: return x16_q5_0_int8;
    case T_Q5_1: return x16_q5_1_int8;
    case T_Q8_0: return x16_q8_0_int8;
    default: return 0;
    }
}
#endif

/* 1 where this build multiplies interleaved weights by int8 activations (AVX-512 VNNI), else
 * 0: numerics="int8" then runs the int16 kernels */
int pd_has_int8_products(void) {
#ifdef INT8_KERNELS
    return 1;
#else
    return 0;
#endif
}
