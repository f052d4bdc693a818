/* The vectors of the interleaved products (interleaved.c): one lane per row of a group of 16
 * weight rows. With AVX-512 BW and VNNI a group is one 512-bit register; with AVX2 it is two
 * 256-bit halves (rows 0-7 and 8-15), so each operation below is one instruction or two and
 * the kernels are written once for both.
 *   r16_pairs   32 int16: two consecutive values of each of the 16 rows (a 32-byte chunk
 *               of the interleaved layout, widened; bytes 0-15 are rows 0-7)
 *   r16_sums    16 int32: each row's integer sum
 *   r16_floats  16 floats: each row's float sum, or a per-row scale
 */
#ifndef POLYDEV_ROWS16_H
#define POLYDEV_ROWS16_H

#include "int16.h"

#if defined(INT16_KERNELS)
#define ROWS16_KERNELS 1

#define R16 static inline __attribute__((always_inline))

#if IVEC == 32
typedef __m512i r16_pairs;
typedef __m512i r16_sums;
typedef __m512 r16_floats;

R16 r16_pairs r16_u8(const uint8_t *p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
}
R16 r16_pairs r16_i8(const uint8_t *p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
}
/* 32 signed bytes in a register, widened */
R16 r16_pairs r16_widen_i8(__m256i q) { return _mm512_cvtepi8_epi16(q); }
/* pairs stored unpacked (32 int16), and stored back */
R16 r16_pairs r16_load(const int16_t *p) { return _mm512_load_si512((const void *)p); }
R16 void r16_keep(int16_t *p, r16_pairs v) { _mm512_store_si512((void *)p, v); }
R16 r16_pairs r16_and(r16_pairs v, short c) { return _mm512_and_si512(v, _mm512_set1_epi16(c)); }
R16 r16_pairs r16_srl(r16_pairs v, int n) { return _mm512_srli_epi16(v, n); }
R16 r16_pairs r16_sub(r16_pairs v, short c) { return _mm512_sub_epi16(v, _mm512_set1_epi16(c)); }
/* Chunk j's low and high nibbles (its values 2 j + i and 16 + 2 j + i of each row), and with
 * `planes` (the sub-block's two planes of fifth bits, interleaved.h: bit j of byte 2 r + i)
 * 16 more where the bit is set: a test into a mask and a masked add per vector */
R16 void r16_nibbles(const uint8_t *chunk, const uint8_t *planes, int j, r16_pairs *lo,
                     r16_pairs *hi) {
    const r16_pairs v = r16_u8(chunk);
    *lo = r16_and(v, 0xF);
    *hi = r16_srl(v, 4);
    if (!planes) return;
    const __mmask64 both = _mm512_test_epi8_mask(_mm512_loadu_si512((const void *)planes),
                                                 _mm512_set1_epi8((char)(1 << j)));
    const __m512i sixteen = _mm512_set1_epi16(16);
    *lo = _mm512_mask_add_epi16(*lo, (__mmask32)both, *lo, sixteen);
    *hi = _mm512_mask_add_epi16(*hi, (__mmask32)(both >> 32), *hi, sixteen);
}
/* acc + each row's pair of values times the pair of activations at x (broadcast); the
 * broadcast is folded into the instruction, which GCC 12's intrinsics do not do */
R16 r16_sums r16_dot_pair(r16_sums acc, r16_pairs w, const int16_t *x) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}
R16 r16_sums r16_sums_zero(void) { return _mm512_setzero_si512(); }
R16 r16_sums r16_sums_add(r16_sums a, r16_sums b) { return _mm512_add_epi32(a, b); }
/* s times 16 per-row scales (bytes) in int32 */
R16 r16_sums r16_times_u8(r16_sums s, const uint8_t *scales) {
    return _mm512_mullo_epi32(s, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)scales)));
}
R16 r16_floats r16_float(r16_sums s) { return _mm512_cvtepi32_ps(s); }
R16 r16_floats r16_fp16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
R16 r16_floats r16_u8_floats(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
R16 r16_floats r16_i8_floats(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
R16 r16_floats r16_floats_zero(void) { return _mm512_setzero_ps(); }
R16 r16_floats r16_loadf(const float *y) { return _mm512_loadu_ps(y); }
R16 r16_floats r16_mul(r16_floats a, r16_floats b) { return _mm512_mul_ps(a, b); }
R16 r16_floats r16_scaled(r16_floats a, float s) { return _mm512_mul_ps(a, _mm512_set1_ps(s)); }
/* acc + a b, acc + a s and acc - a s */
R16 r16_floats r16_fma(r16_floats a, r16_floats b, r16_floats acc) {
    return _mm512_fmadd_ps(a, b, acc);
}
R16 r16_floats r16_add_scaled(r16_floats acc, r16_floats a, float s) {
    return _mm512_fmadd_ps(a, _mm512_set1_ps(s), acc);
}
R16 r16_floats r16_sub_scaled(r16_floats acc, r16_floats a, float s) {
    return _mm512_fnmadd_ps(a, _mm512_set1_ps(s), acc);
}
R16 void r16_store(float *y, r16_floats v) { _mm512_storeu_ps(y, v); }

#else
typedef struct { __m256i h[2]; } r16_pairs;
typedef struct { __m256i h[2]; } r16_sums;
typedef struct { __m256 h[2]; } r16_floats;

/* the two halves of an operation: `v.h[k] = EXPR` for k = 0, 1 */
#define HALVES(EXPR) do { for (int k = 0; k < 2; k++) v.h[k] = (EXPR); } while (0)

R16 r16_pairs r16_u8(const uint8_t *p) {
    r16_pairs v;
    HALVES(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * k))));
    return v;
}
R16 r16_pairs r16_i8(const uint8_t *p) {
    r16_pairs v;
    HALVES(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * k))));
    return v;
}
R16 r16_pairs r16_widen_i8(__m256i q) {
    r16_pairs v = {{_mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1))}};
    return v;
}
R16 r16_pairs r16_load(const int16_t *p) {
    r16_pairs v;
    HALVES(_mm256_load_si256((const __m256i *)(p + 16 * k)));
    return v;
}
R16 void r16_keep(int16_t *p, r16_pairs v) {
    _mm256_store_si256((__m256i *)p, v.h[0]);
    _mm256_store_si256((__m256i *)(p + 16), v.h[1]);
}
R16 r16_pairs r16_and(r16_pairs a, short c) {
    r16_pairs v;
    HALVES(_mm256_and_si256(a.h[k], _mm256_set1_epi16(c)));
    return v;
}
R16 r16_pairs r16_srl(r16_pairs a, int n) {
    r16_pairs v;
    HALVES(_mm256_srli_epi16(a.h[k], n));
    return v;
}
R16 r16_pairs r16_sub(r16_pairs a, short c) {
    r16_pairs v;
    HALVES(_mm256_sub_epi16(a.h[k], _mm256_set1_epi16(c)));
    return v;
}
/* chunk j's fifth bits from a plane (bit j of each byte) at bit 4 of each byte: one shift
 * and one and (the 16-bit shift's bits from the neighbouring byte land elsewhere) */
R16 __m256i plane_bits(const uint8_t *plane, int j) {
    const __m256i p = _mm256_loadu_si256((const __m256i *)plane);
    const __m256i at4 = j < 4 ? _mm256_slli_epi16(p, 4 - j) : j > 4 ? _mm256_srli_epi16(p, j - 4)
                                                                      : p;
    return _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
}
/* Without mask registers the fifth bits are or-ed into the nibbles as bytes, and the bytes
 * widened: cheaper than putting them into each half's lanes. The planes' layout makes that 2
 * operations a vector where 32-bit masks spread over bytes took 6, a third of a Q5_K decode's
 * operations. */
R16 void r16_nibbles(const uint8_t *chunk, const uint8_t *planes, int j, r16_pairs *lo,
                     r16_pairs *hi) {
    if (!planes) {
        const r16_pairs v = r16_u8(chunk);
        *lo = r16_and(v, 0xF);
        *hi = r16_srl(v, 4);
        return;
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)chunk), low = _mm256_set1_epi8(0xF);
    *lo = r16_widen_i8(_mm256_or_si256(_mm256_and_si256(v, low), plane_bits(planes, j)));
    *hi = r16_widen_i8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                       plane_bits(planes + 32, j)));
}
#if defined(__AVXVNNI__)
R16 __m256i dot_half(__m256i acc, __m256i w, __m256i x) {
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
    return acc;
}
#else
/* in assembly: with the intrinsics GCC reassociates a chain of adds into a tree, computing
 * every product of an unrolled loop first and spilling them (half the speed) */
R16 __m256i dot_half(__m256i acc, __m256i w, __m256i x) {
    __m256i product;
    __asm__("vpmaddwd %[x], %[w], %[p]\n\tvpaddd %[p], %[acc], %[acc]"
            : [acc] "+x"(acc), [p] "=&x"(product) : [w] "x"(w), [x] "x"(x));
    return acc;
}
#endif
R16 r16_sums r16_dot_pair(r16_sums acc, r16_pairs w, const int16_t *x) {
    int32_t pair;
    memcpy(&pair, x, 4);
    const __m256i xs = _mm256_set1_epi32(pair);
    r16_sums v;
    HALVES(dot_half(acc.h[k], w.h[k], xs));
    return v;
}
R16 r16_sums r16_sums_zero(void) {
    r16_sums v;
    HALVES(_mm256_setzero_si256());
    return v;
}
R16 r16_sums r16_sums_add(r16_sums a, r16_sums b) {
    r16_sums v;
    HALVES(_mm256_add_epi32(a.h[k], b.h[k]));
    return v;
}
R16 r16_sums r16_times_u8(r16_sums s, const uint8_t *scales) {
    r16_sums v;
    HALVES(_mm256_mullo_epi32(s.h[k], _mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(scales + 8 * k)))));
    return v;
}
R16 r16_floats r16_float(r16_sums s) {
    r16_floats v;
    HALVES(_mm256_cvtepi32_ps(s.h[k]));
    return v;
}
R16 r16_floats r16_fp16(const uint8_t *p) {
    r16_floats v;
    HALVES(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * k))));
    return v;
}
R16 r16_floats r16_u8_floats(const uint8_t *p) {
    r16_floats v;
    HALVES(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64((const __m128i *)(p + 8 * k)))));
    return v;
}
R16 r16_floats r16_i8_floats(const uint8_t *p) {
    r16_floats v;
    HALVES(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
        _mm_loadl_epi64((const __m128i *)(p + 8 * k)))));
    return v;
}
R16 r16_floats r16_floats_zero(void) {
    r16_floats v;
    HALVES(_mm256_setzero_ps());
    return v;
}
R16 r16_floats r16_loadf(const float *y) {
    r16_floats v;
    HALVES(_mm256_loadu_ps(y + 8 * k));
    return v;
}
R16 r16_floats r16_mul(r16_floats a, r16_floats b) {
    r16_floats v;
    HALVES(_mm256_mul_ps(a.h[k], b.h[k]));
    return v;
}
R16 r16_floats r16_scaled(r16_floats a, float s) {
    r16_floats v;
    HALVES(_mm256_mul_ps(a.h[k], _mm256_set1_ps(s)));
    return v;
}
R16 r16_floats r16_fma(r16_floats a, r16_floats b, r16_floats acc) {
    r16_floats v;
    HALVES(_mm256_fmadd_ps(a.h[k], b.h[k], acc.h[k]));
    return v;
}
R16 r16_floats r16_add_scaled(r16_floats acc, r16_floats a, float s) {
    r16_floats v;
    HALVES(_mm256_fmadd_ps(a.h[k], _mm256_set1_ps(s), acc.h[k]));
    return v;
}
R16 r16_floats r16_sub_scaled(r16_floats acc, r16_floats a, float s) {
    r16_floats v;
    HALVES(_mm256_fnmadd_ps(a.h[k], _mm256_set1_ps(s), acc.h[k]));
    return v;
}
R16 void r16_store(float *y, r16_floats v) {
    _mm256_storeu_ps(y, v.h[0]);
    _mm256_storeu_ps(y + 8, v.h[1]);
}
#undef HALVES
#endif

#endif
#endif
