/* What the int16 products share (int_dot.c: a few activation rows; int_gemm.c: many): the
 * activation rows quantized to int16, and the weights' quantized values unpacked for them.
 * See int_dot.c for the arithmetic and its bounds. */
#ifndef POLYDEV_INT16_H
#define POLYDEV_INT16_H

#include "blocks.h"

#if defined(__AVX2__) && defined(__FMA__)

#define INT16_KERNELS 1

/* --- the integer vector: IVEC int16 lanes (or IVEC / 2 int32 sums), 32 with AVX-512 BW and
 * VNNI, else 16 ----------------------------------------------------------------------------------
 * iv_madd(acc, a, b) adds the sums of adjacent int16 products of a and b to acc's int32 lanes.
 * Zen 4 runs vpdpwssd as many times a second on 512 bits as on 256, so the wide build does
 * twice the work per instruction. The VNNI instruction is written as inline assembly: it
 * accumulates in place, and GCC 12's intrinsic for it copies every accumulator in and out of a
 * spare register around each use, which doubled the instructions of a tiled product. */
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define IVEC 32
typedef __m512i ivec;
typedef __m512 fvec;
static inline __attribute__((always_inline)) ivec iv_madd(ivec acc, ivec a, ivec b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
}
static inline ivec iv_load(const int16_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline ivec iv_zero(void) { return _mm512_setzero_si512(); }
static inline ivec iv_add32(ivec a, ivec b) { return _mm512_add_epi32(a, b); }
static inline ivec iv_mul16(ivec a, ivec b) { return _mm512_mullo_epi16(a, b); }
static inline ivec iv_set16(short v) { return _mm512_set1_epi16(v); }
static inline ivec iv_bcast128(__m128i v) { return _mm512_broadcast_i32x4(v); }
static inline ivec iv_shuffle_bytes(ivec v, ivec mask) { return _mm512_shuffle_epi8(v, mask); }
static inline fvec fv_zero(void) { return _mm512_setzero_ps(); }
/* acc + the int32 sums times s */
static inline fvec fv_scale_add(ivec sums, float s, fvec acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(s), acc);
}
/* acc + a b, for 8 floats */
static inline fvec fv_fma8(__m256 a, __m256 b, fvec acc) {
    return _mm512_fmadd_ps(_mm512_zextps256_ps512(a), _mm512_zextps256_ps512(b), acc);
}
static inline float fv_total(fvec v) { return _mm512_reduce_add_ps(v); }
#else
#define IVEC 16
typedef __m256i ivec;
typedef __m256 fvec;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
static inline __attribute__((always_inline)) ivec iv_madd(ivec acc, ivec a, ivec b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
}
#elif defined(__AVXVNNI__)
static inline __attribute__((always_inline)) ivec iv_madd(ivec acc, ivec a, ivec b) {
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(a), "xm"(b));
    return acc;
}
#else
static inline ivec iv_madd(ivec acc, ivec a, ivec b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}
#endif
static inline ivec iv_load(const int16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline ivec iv_zero(void) { return _mm256_setzero_si256(); }
static inline ivec iv_add32(ivec a, ivec b) { return _mm256_add_epi32(a, b); }
static inline ivec iv_mul16(ivec a, ivec b) { return _mm256_mullo_epi16(a, b); }
static inline ivec iv_set16(short v) { return _mm256_set1_epi16(v); }
static inline ivec iv_bcast128(__m128i v) { return _mm256_broadcastsi128_si256(v); }
static inline ivec iv_shuffle_bytes(ivec v, ivec mask) { return _mm256_shuffle_epi8(v, mask); }
static inline fvec fv_zero(void) { return _mm256_setzero_ps(); }
static inline fvec fv_scale_add(ivec sums, float s, fvec acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(s), acc);
}
static inline fvec fv_fma8(__m256 a, __m256 b, fvec acc) { return _mm256_fmadd_ps(a, b, acc); }
#endif

#if IVEC == 16
static inline float fv_total(fvec v) { return hsum8(v); }
#endif

/* --- 32 int16 weights (a group): one vector or two ------------------------------------------ */
#define W32_VECS (32 / IVEC)
typedef struct { ivec v[W32_VECS]; } w32;

/* 32 bytes, unsigned (u) or signed (i), widened to int16 */
static inline __attribute__((always_inline)) w32 w32_u8(__m256i q) {
#if IVEC == 32
    return (w32){{_mm512_cvtepu8_epi16(q)}};
#else
    return (w32){{_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)),
                  _mm256_cvtepu8_epi16(_mm256_extracti128_si256(q, 1))}};
#endif
}

static inline __attribute__((always_inline)) w32 w32_i8(__m256i q) {
#if IVEC == 32
    return (w32){{_mm512_cvtepi8_epi16(q)}};
#else
    return (w32){{_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                  _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1))}};
#endif
}

/* w times s lane by lane (s: IVEC lanes, the same for every vector of w) */
static inline __attribute__((always_inline)) w32 w32_scaled(w32 w, ivec s) {
    for (int j = 0; j < W32_VECS; j++) w.v[j] = iv_mul16(w.v[j], s);
    return w;
}

/* w's first 16 values times s0, the next 16 times s1 */
static inline __attribute__((always_inline)) w32 w32_scaled_halves(w32 w, short s0, short s1) {
#if IVEC == 32
    ivec s = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(s0)),
                                _mm256_set1_epi16(s1), 1);
    w.v[0] = iv_mul16(w.v[0], s);
#else
    w.v[0] = iv_mul16(w.v[0], iv_set16(s0));
    w.v[1] = iv_mul16(w.v[1], iv_set16(s1));
#endif
    return w;
}

/* acc + the sums of w's products with the 32 int16 values at x */
static inline __attribute__((always_inline)) ivec w32_madd(ivec acc, w32 w, const int16_t *x) {
    for (int j = 0; j < W32_VECS; j++) acc = iv_madd(acc, w.v[j], iv_load(x + IVEC * j));
    return acc;
}

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


/* room for n_rows activation rows of K values with a scale per `group`; its q is 0 where
 * there was no memory (then nothing is held) */
int16_rows int16_rows_new(int64_t K, int64_t n_rows, int64_t group);
void int16_rows_free(int16_rows *a);

/* the activation rows of `a` (n_rows of K from x) as int16 groups (int_dot.c) */
void pd_quantize_rows_int16(const float *x, int64_t x_stride, int16_rows *a, int n_threads);

/* y = W x for many rows of x (a prompt), or 1 where it does not take the type, 2 where its
 * scratch memory could not be had (int_gemm.c) */
int pd_gemm_int16(int type, const uint8_t *w, int64_t w_stride, int64_t M, const int16_rows *a,
                  float *y, int64_t y_stride, int n_threads);

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
/* --- the K-quants -------------------------------------------------------------------------------
 * Their sub-block scales are small integers (6 bits; 8 for Q6_K) under one float per 256
 * values, and the activations have one scale per 256 values too, so a block's products sum in
 * integers: each sub-block's int16 weights are multiplied by its scale first (at most 15 * 63,
 * 31 * 63 and 32 * 128: all int16), and one float multiply-add per 256 values (per 128 for
 * Q6_K) applies d e. No lane of the int32 sums can overflow: at most 32 products of
 * 945 * 32767 (Q4_K) or 1953 * 32767 (Q5_K) per 256 values, 16 of 4096 * 32767 (Q6_K) per 128,
 * all below 2^31. The minimum's term, sum_g m_g sum x_g, is one float multiply-add per block. */

typedef struct {
    ivec scales;         /* Q4_K, Q5_K: the 8 sub-block scales as int16, in every 128 bits */
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
    k.scales = iv_bcast128(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
    k.mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn))),
                           _mm256_set1_ps(-f16(b + 2)));
    k.d = f16(b);
    return k;
}

static inline __attribute__((always_inline)) k_scales scales_q6_k(const uint8_t *b) {
    k_scales k;                          /* w_q6_k reads its int8 scales from the block */
    k.scales = iv_zero();
    k.mins = _mm256_setzero_ps();
    k.d = f16(b + 208);
    return k;
}

/* scale s of the 8 in every 128 bits of `scales` (Q4_K, Q5_K), in all lanes */
static inline __attribute__((always_inline)) ivec scale_k4(ivec scales, int s) {
    return iv_shuffle_bytes(scales, iv_set16((short)(0x0100 * (2 * s + 1) + 2 * s)));
}

/* group g (32 values) of a block as int16 weights times their sub-block scales */
#define K_WEIGHTS(NAME) static inline __attribute__((always_inline)) w32 NAME(               \
    const uint8_t *b, ivec scales, int g)

K_WEIGHTS(w_q4_k) { return w32_scaled(w32_u8(q4_k_values(b, g)), scale_k4(scales, g)); }
K_WEIGHTS(w_q5_k) { return w32_scaled(w32_u8(q5_k_values(b, g)), scale_k4(scales, g)); }

/* group g of a Q6_K block: half n = g / 4, quarter q = g % 4 of that half; its first 16
 * values have scale 8 n + 2 q, the next 16 the one after */
K_WEIGHTS(w_q6_k) {
    (void)scales;
    int n = g >> 2, q = g & 3;
    __m256i low = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32 * (q & 1)));
    if (q >> 1) low = _mm256_srli_epi16(low, 4);
    low = _mm256_and_si256(low, _mm256_set1_epi8(0xF));
    __m256i high = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
    high = _mm256_and_si256(_mm256_srli_epi16(high, 2 * q), _mm256_set1_epi8(3));
    __m256i v = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)),
                                _mm256_set1_epi8(32));
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * n + 2 * q);
    return w32_scaled_halves(w32_i8(v), sc[0], sc[1]);
}

#endif

#endif
