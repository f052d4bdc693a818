/* The interleaved layout (interleaved.h): made from a weight's own blocks, and multiplied by a
 * few or many activation rows quantized to int16 (int_dot.c's activations). */
#include "interleaved.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(INTERLEAVED_KERNELS)

/* --- interleaving ------------------------------------------------------------------------- */

/* byte 2 r + i of chunk j of a 32-value group whose values (as small integers) are v[32]:
 * the pair 2 j + i in the low nibble and 16 + 2 j + i in the high one */
static void put_nibble_chunks(uint8_t *out, int r, const uint8_t *v) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 2; i++)
            out[32 * j + 2 * r + i] = (uint8_t)((v[2 * j + i] & 0xF) | (v[16 + 2 * j + i] << 4));
}

/* bytes 2 r + i of the two planes of fifth bits: bit j of the first is the fifth bit of value
 * 2 j + i (chunk j's low nibble), of the second of value 16 + 2 j + i (its high one) */
static void put_fifth_planes(uint8_t *planes, int r, const uint8_t *v) {
    for (int j = 0; j < 8; j++)
        for (int i = 0; i < 2; i++) {
            if (v[2 * j + i] & 16) planes[2 * r + i] |= (uint8_t)(1u << j);
            if (v[16 + 2 * j + i] & 16) planes[32 + 2 * r + i] |= (uint8_t)(1u << j);
        }
}

/* the values of sub-block g of a Q4_K or Q5_K block (Q5_K with their fifth bits) */
static void k4_group_values(const uint8_t *blk, int type, int g, uint8_t *v) {
    const uint8_t *qs = blk + (type == T_Q5_K ? 48 : 16) + 32 * (g >> 1);
    for (int l = 0; l < 32; l++) {
        v[l] = (qs[l] >> (4 * (g & 1))) & 0xF;
        if (type == T_Q5_K) v[l] |= ((blk[16 + l] >> g) & 1) << 4;
    }
}

static void interleave_k4(int type, const uint8_t *src[ROWS16], uint8_t *o) {
    for (int r = 0; r < ROWS16; r++) {
        const uint8_t *blk = src[r];
        memcpy(o + 2 * r, blk, 2);
        memcpy(o + 32 + 2 * r, blk + 2, 2);
        for (int g = 0; g < 8; g++) {
            uint8_t v[32];
            scale_min_k4(g, blk + 4, o + 64 + 16 * g + r, o + 192 + 16 * g + r);
            k4_group_values(blk, type, g, v);
            put_nibble_chunks(o + K4_HEADER + k4_group_bytes(type) * g, r, v);
            if (type != T_Q5_K) continue;
            put_fifth_planes(o + K4_HEADER + k4_group_bytes(type) * g + 256, r, v);
        }
    }
}

/* a Q6_K block's 256 values as unsigned 6-bit integers (ggml's dequantize_row_q6_K order) */
static void q6_k_values(const uint8_t *blk, uint8_t *v) {
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
        for (int l = 0; l < 32; l++) {
            v[128 * n + l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            v[128 * n + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            v[128 * n + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            v[128 * n + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

static void interleave_q6_k(const uint8_t *src[ROWS16], uint8_t *o) {
    for (int r = 0; r < ROWS16; r++) {
        const uint8_t *blk = src[r];
        uint8_t v[QK_K];
        memcpy(o + 2 * r, blk + 208, 2);
        for (int s = 0; s < 16; s++) o[32 + 16 * s + r] = blk[192 + s];
        q6_k_values(blk, v);
        for (int g = 0; g < 8; g++) {
            uint8_t *q = o + 288 + 384 * g;
            const uint8_t *vg = v + 32 * g;
            put_nibble_chunks(q, r, vg);
            for (int c = 0; c < 4; c++)
                for (int i = 0; i < 2; i++)
                    q[256 + 32 * c + 2 * r + i] = (uint8_t)(
                        (vg[2 * c + i] >> 4) | (vg[16 + 2 * c + i] >> 4) << 2
                        | (vg[8 + 2 * c + i] >> 4) << 4 | (vg[24 + 2 * c + i] >> 4) << 6);
        }
    }
}

static void interleave_32(int type, const uint8_t *src[ROWS16], uint8_t *o) {
    const int header = header_32(type);
    for (int r = 0; r < ROWS16; r++) {
        const uint8_t *blk = src[r];
        memcpy(o + 2 * r, blk, 2);
        if (has_min_32(type)) memcpy(o + 32 + 2 * r, blk + 2, 2);
        if (type == T_Q8_0) {
            for (int l = 0; l < 32; l++) o[32 + 32 * (l / 2) + 2 * r + (l & 1)] = blk[2 + l];
            continue;
        }
        /* ggml's order: value l (< 16) is byte l's low nibble, 16 + l its high one; the fifth
         * bit of value l is bit l of qh */
        const int fifth = has_fifth_32(type);
        const uint8_t *qs = blk + 2 + 2 * has_min_32(type) + 4 * fifth;
        uint32_t qh = 0;
        if (fifth) memcpy(&qh, blk + 2 + 2 * has_min_32(type), 4);
        uint8_t v[32];
        for (int l = 0; l < 16; l++) {
            v[l] = (uint8_t)((qs[l] & 0xF) | ((qh >> l) & 1) << 4);
            v[16 + l] = (uint8_t)((qs[l] >> 4) | ((qh >> (16 + l)) & 1) << 4);
        }
        put_nibble_chunks(o + header, r, v);
        if (fifth) put_fifth_planes(o + header + 256, r, v);
    }
}

/* --- the products ------------------------------------------------------------------------- */

/* the most activation rows a kernel multiplies per pass over a group's weights: a prompt's
 * tiles (with AVX-512, 8 spread the widening of each chunk over 16 products and fit the 32
 * registers; AVX2 has 16 registers and two of them per row) */
#if IVEC == 32
#define TILE 8
#else
#define TILE 4
#endif

/* what a kernel of one group needs of ROWS activation rows */
typedef struct {
    const int16_t *x[TILE];     /* each row's int16 values */
    const float *e[TILE];       /* each row's scale per block */
    const float *sums[TILE];    /* each row's float sum per 32 values */
} act_rows;

/* rows r0 .. r0 + ROWS - 1 of `a`, from value v0 on (a multiple of the blocks' values) */
static inline __attribute__((always_inline)) act_rows act_rows_at(const int16_rows *a,
                                                                  int64_t r0, int ROWS,
                                                                  int64_t v0) {
    act_rows t;
    const int64_t ne = a->K / a->group, ns = a->K / 32;
    for (int r = 0; r < ROWS; r++) {
        t.x[r] = a->q + (r0 + r) * a->K + v0;
        t.e[r] = a->e + (r0 + r) * ne + v0 / a->group;
        t.sums[r] = a->sums + (r0 + r) * ns + v0 / 32;
    }
    return t;
}

/* --- a group block's chunks as int16 pairs: unpacked where they are used (a few activation
 * rows), or once into a scratch span that every tile of a prompt's rows then reads. A span
 * is 256 values: one K-quant block (128 vectors of pairs) or eight 32-value blocks (16
 * each); vector v of block b of a span is at w16 + 32 (slots b + v). */

static inline int span_blocks(int type) { return block_values(type) == QK_K ? 1 : 8; }
static inline int slots(int type) { return block_values(type) == QK_K ? 128 : 16; }
#define SPAN_VALUES (ROWS16 * QK_K)             /* int16 of one span's unpacked pairs */

/* Q4_K, Q5_K: chunk j of sub-block g (vectors 16 g + 2 j and 16 g + 2 j + 1) */
static inline __attribute__((always_inline)) void k4_chunk(int type, const uint8_t *p, int g,
                                                           int j, r16_pairs *lo, r16_pairs *hi) {
    const uint8_t *q = p + K4_HEADER + k4_group_bytes(type) * g;
    r16_nibbles(q + 32 * j, type == T_Q5_K ? q + 256 : 0, j, lo, hi);
}

/* Q6_K: chunk j of sub-block g, its low (high 0) or high nibbles as 6-bit values, unpacked
 * as bytes 16 rows at once: the top 2 bits of chunk j sit at bit 4 (j / 4) + 2 high of the
 * sub-block's high-bit vector j % 4 (vector 16 g + 8 high + j) */
static inline __attribute__((always_inline)) r16_pairs q6_chunk(const uint8_t *p, int g,
                                                                int high, int j) {
    const uint8_t *q = p + 288 + 384 * g;
    const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * j));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(q + 256 + 32 * (j & 3)));
    const int s = 4 * (j >> 2) + 2 * high;
    __m256i nib = high ? _mm256_srli_epi16(v, 4) : v;
    nib = _mm256_and_si256(nib, _mm256_set1_epi8(0xF));
    /* 16-bit shifts: the bits a byte takes from its neighbour are masked off */
    __m256i top = s < 4 ? _mm256_slli_epi16(h, 4 - s) : s > 4 ? _mm256_srli_epi16(h, s - 4) : h;
    top = _mm256_and_si256(top, _mm256_set1_epi8(0x30));
    return r16_widen_i8(_mm256_sub_epi8(_mm256_or_si256(nib, top), _mm256_set1_epi8(32)));
}

/* a 32-value block's chunk j as signed values: Q8_0's 16 chunks (vector j, in lo), the
 * others' 8 as low and high nibbles (vectors 2 j, 2 j + 1) */
static inline __attribute__((always_inline)) void b32_chunk(int type, const uint8_t *p, int j,
                                                            r16_pairs *lo, r16_pairs *hi) {
    const int header = header_32(type);
    if (type == T_Q8_0) {
        *lo = r16_i8(p + 32 + 32 * j);
        return;
    }
    r16_nibbles(p + header + 32 * j, has_fifth_32(type) ? p + header + 256 : 0, j, lo, hi);
    if (!has_min_32(type)) {
        const short offset = type == T_Q4_0 ? 8 : type == T_Q5_0 ? 16 : 0;
        *lo = r16_sub(*lo, offset);
        *hi = r16_sub(*hi, offset);
    }
}

/* n group blocks from p (one span) unpacked into w16 */
static inline __attribute__((always_inline)) void unpack_span(int type, const uint8_t *p,
                                                              int64_t n, int16_t *w16) {
    for (int64_t b = 0; b < n; b++, p += group_block_bytes(type)) {
        prefetch_block(p, group_block_bytes(type));
        int16_t *w = w16 + 32 * slots(type) * b;
        r16_pairs lo, hi;
        if (block_values(type) == QK) {
            for (int j = 0; j < (type == T_Q8_0 ? 16 : 8); j++) {
                b32_chunk(type, p, j, &lo, &hi);
                r16_keep(w + 32 * (type == T_Q8_0 ? j : 2 * j), lo);
                if (type != T_Q8_0) r16_keep(w + 32 * (2 * j + 1), hi);
            }
            continue;
        }
        for (int g = 0; g < 8; g++)
            for (int j = 0; j < 8; j++) {
                if (type == T_Q6_K) {
                    r16_keep(w + 32 * (16 * g + j), q6_chunk(p, g, 0, j));
                    r16_keep(w + 32 * (16 * g + 8 + j), q6_chunk(p, g, 1, j));
                    continue;
                }
                k4_chunk(type, p, g, j, &lo, &hi);
                r16_keep(w + 32 * (16 * g + 2 * j), lo);
                r16_keep(w + 32 * (16 * g + 2 * j + 1), hi);
            }
    }
}

/* The kernels of one group: nb blocks from p for ROWS activation rows t, their 16 results
 * per row stored at y (row r at y + r y_stride), or added to what is there (`accumulate`).
 * w16: the blocks unpacked (unpack_span), or 0 to unpack them here. */
#define GROUP_BODY(NAME) static inline __attribute__((always_inline)) void NAME(             \
    int type, const uint8_t *p, int64_t nb, act_rows t, const int ROWS, float *y,           \
    int64_t y_stride, const int16_t *w16, int accumulate)

static inline __attribute__((always_inline)) void start_rows(r16_floats *acc, int ROWS,
                                                             const float *y, int64_t y_stride,
                                                             int accumulate) {
    for (int r = 0; r < ROWS; r++)
        acc[r] = accumulate ? r16_loadf(y + r * y_stride) : r16_floats_zero();
}

/* Q4_K and Q5_K: each sub-block's int32 sums times its scale (at most 32 * 31 * 32767 * 63,
 * below 2^31) in float, times the block's d e; the minimums' term in float as in int_dot.c.
 * Each sub-block's terms go straight into the row's one float sum: 8 rows then hold 16 of
 * AVX-512's 32 vector registers (their int32 sums and their float sums). */
GROUP_BODY(group_k4) {
    const int CHAINS = ROWS == 1 ? 2 : 1;        /* one row: two chains of dependent sums */
    r16_floats acc[TILE];
    start_rows(acc, ROWS, y, y_stride, accumulate);
    for (int64_t b = 0; b < nb; b++, p += group_block_bytes(type)) {
        if (!w16) prefetch_rows_block(p, group_block_bytes(type), ROWS);
        const r16_floats d = r16_fp16(p), dmin = r16_fp16(p + 32);
        for (int g = 0; g < 8; g++) {
            r16_sums s[TILE][2];
            for (int r = 0; r < ROWS; r++) s[r][0] = s[r][1] = r16_sums_zero();
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++) {
                r16_pairs lo, hi;
                if (w16) {
                    lo = r16_load(w16 + 32 * (slots(type) * b + 16 * g + 2 * j));
                    hi = r16_load(w16 + 32 * (slots(type) * b + 16 * g + 2 * j + 1));
                } else {
                    k4_chunk(type, p, g, j, &lo, &hi);
                }
                for (int r = 0; r < ROWS; r++) {
                    const int16_t *x = t.x[r] + QK_K * b + 32 * g + 2 * j;
                    s[r][j % CHAINS] = r16_dot_pair(s[r][j % CHAINS], lo, x);
                    s[r][(j + 1) % CHAINS] = r16_dot_pair(s[r][(j + 1) % CHAINS], hi, x + 16);
                }
            }
            const r16_floats mins = r16_mul(dmin, r16_u8_floats(p + 192 + 16 * g));
            for (int r = 0; r < ROWS; r++) {
                r16_sums sum = CHAINS == 2 ? r16_sums_add(s[r][0], s[r][1]) : s[r][0];
                acc[r] = r16_fma(r16_float(r16_times_u8(sum, p + 64 + 16 * g)),
                                 r16_scaled(d, t.e[r][b]), acc[r]);
                acc[r] = r16_sub_scaled(acc[r], mins, t.sums[r][8 * b + g]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) r16_store(y + r * y_stride, acc[r]);
}

/* Q6_K: each 16 values' int32 sums (at most 16 * 32 * 32768 = 2^24: exact in float) times
 * their int8 scale times d, in float, summed over the block; then times each row's e. (An
 * integer multiply per sub-block half and row took 15% of a prompt's time on AVX-512; the
 * block's float sums fit beside 8 rows' other registers here, not in the K4 kernels.) A
 * sub-block's first 16 values (the chunks' low nibbles) and its last 16 (the high ones) have
 * scales of their own, so they are summed in two passes over its chunks: one pass would
 * keep two sums per row, which for 4 rows fill AVX2's 16 registers. */
GROUP_BODY(group_q6_k) {
    (void)type;
    r16_floats acc[TILE];
    start_rows(acc, ROWS, y, y_stride, accumulate);
    for (int64_t b = 0; b < nb; b++, p += Q6_K_X16) {
        if (!w16) prefetch_rows_block(p, Q6_K_X16, ROWS);
        const r16_floats d = r16_fp16(p);
        r16_floats block[TILE];
        for (int r = 0; r < ROWS; r++) block[r] = r16_floats_zero();
        for (int g = 0; g < 8; g++) {
            _Pragma("GCC unroll 2")
            for (int high = 0; high < 2; high++) {
                r16_sums sums[TILE];
                for (int r = 0; r < ROWS; r++) sums[r] = r16_sums_zero();
                _Pragma("GCC unroll 8")
                for (int j = 0; j < 8; j++) {
                    const int v = 16 * g + 8 * high + j;
                    const r16_pairs w = w16 ? r16_load(w16 + 32 * (slots(type) * b + v))
                                            : q6_chunk(p, g, high, j);
                    for (int r = 0; r < ROWS; r++)
                        sums[r] = r16_dot_pair(sums[r], w,
                                               t.x[r] + QK_K * b + 32 * g + 16 * high + 2 * j);
                }
                const r16_floats scale = r16_mul(d, r16_i8_floats(p + 32 + 32 * g + 16 * high));
                for (int r = 0; r < ROWS; r++)
                    block[r] = r16_fma(r16_float(sums[r]), scale, block[r]);
            }
        }
        for (int r = 0; r < ROWS; r++) acc[r] = r16_add_scaled(acc[r], block[r], t.e[r][b]);
    }
    for (int r = 0; r < ROWS; r++) r16_store(y + r * y_stride, acc[r]);
}

/* the 32-value types: one block's int32 sums (at most 32 * 128 * 32767) times d e in float,
 * plus m times the block's float activation sum where the type has a minimum */
GROUP_BODY(group_32) {
    const int CHAINS = ROWS == 1 ? 2 : 1;
    const int chunks = type == T_Q8_0 ? 16 : 8;
    r16_floats acc[TILE];
    start_rows(acc, ROWS, y, y_stride, accumulate);
    for (int64_t b = 0; b < nb; b++, p += group_block_bytes(type)) {
        if (!w16) prefetch_rows_block(p, group_block_bytes(type), ROWS);
        r16_sums s[TILE][2];
        for (int r = 0; r < ROWS; r++) s[r][0] = s[r][1] = r16_sums_zero();
        _Pragma("GCC unroll 16")
        for (int j = 0; j < chunks; j++) {
            r16_pairs lo, hi;
            if (w16 && type == T_Q8_0) {
                lo = r16_load(w16 + 32 * (slots(type) * b + j));
            } else if (w16) {
                lo = r16_load(w16 + 32 * (slots(type) * b + 2 * j));
                hi = r16_load(w16 + 32 * (slots(type) * b + 2 * j + 1));
            } else {
                b32_chunk(type, p, j, &lo, &hi);
            }
            for (int r = 0; r < ROWS; r++) {
                const int16_t *x = t.x[r] + QK * b + 2 * j;
                s[r][j % CHAINS] = r16_dot_pair(s[r][j % CHAINS], lo, x);
                if (type != T_Q8_0)
                    s[r][(j + 1) % CHAINS] = r16_dot_pair(s[r][(j + 1) % CHAINS], hi, x + 16);
            }
        }
        const r16_floats d = r16_fp16(p);
        const r16_floats m = has_min_32(type) ? r16_fp16(p + 32) : r16_floats_zero();
        for (int r = 0; r < ROWS; r++) {
            r16_sums sum = CHAINS == 2 ? r16_sums_add(s[r][0], s[r][1]) : s[r][0];
            acc[r] = r16_fma(r16_float(sum), r16_scaled(d, t.e[r][b]), acc[r]);
            if (has_min_32(type)) acc[r] = r16_add_scaled(acc[r], m, t.sums[r][b]);
        }
    }
    for (int r = 0; r < ROWS; r++) r16_store(y + r * y_stride, acc[r]);
}

/* Group G's 16 results for every activation row, TILE, TILE / 2 or 1 rows at a time. More
 * rows than one tile (a prompt) unpack each span of the group's blocks once into a scratch
 * buffer on the stack (8 KiB: in L1), which every tile then reads: the unpacking was a
 * third of the vector operations of a tile (two thirds for the 5- and 6-bit types). */
#define ROW_TILES(BODY, TYPE, P, NB, V0, Y, W16, ACCUMULATE)                                 \
    ROW_TILES_OF(BODY, act_rows_at, TILE, TYPE, P, NB, V0, Y, W16, ACCUMULATE)

#define GROUP_KERNEL(NAME, BODY, TYPE)                                                      \
static void NAME(const uint8_t *p, int64_t G, const int16_rows *a, float *y,               \
                 int64_t y_stride) {                                                        \
    const int64_t nb = a->K / block_values(TYPE), bytes = group_block_bytes(TYPE);          \
    const uint8_t *group = p + G * nb * bytes;                                              \
    y += ROWS16 * G;                                                                        \
    if (a->n_rows <= TILE) {                                                                \
        ROW_TILES(BODY, TYPE, group, nb, 0, y, (const int16_t *)0, 0);                      \
        return;                                                                             \
    }                                                                                       \
    int16_t w16[SPAN_VALUES] __attribute__((aligned(64)));                                  \
    for (int64_t b0 = 0; b0 < nb; b0 += span_blocks(TYPE)) {                                \
        const int64_t n = nb - b0 < span_blocks(TYPE) ? nb - b0 : span_blocks(TYPE);        \
        unpack_span(TYPE, group + b0 * bytes, n, w16);                                      \
        ROW_TILES(BODY, TYPE, group + b0 * bytes, n, b0 * block_values(TYPE), y, w16,       \
                  b0 > 0);                                                                  \
    }                                                                                       \
}

GROUP_KERNEL(x16_q4_k, group_k4, T_Q4_K)
GROUP_KERNEL(x16_q5_k, group_k4, T_Q5_K)
GROUP_KERNEL(x16_q6_k, group_q6_k, T_Q6_K)
GROUP_KERNEL(x16_q4_0, group_32, T_Q4_0)
GROUP_KERNEL(x16_q4_1, group_32, T_Q4_1)
GROUP_KERNEL(x16_q5_0, group_32, T_Q5_0)
GROUP_KERNEL(x16_q5_1, group_32, T_Q5_1)
GROUP_KERNEL(x16_q8_0, group_32, T_Q8_0)

typedef void (*group_kernel)(const uint8_t *, int64_t, const int16_rows *, float *, int64_t);

static group_kernel group_kernel_of(int type) {
    switch (type) {
    case T_Q4_K: return x16_q4_k;
    case T_Q5_K: return x16_q5_k;
    case T_Q6_K: return x16_q6_k;
    case T_Q4_0: return x16_q4_0;
    case T_Q4_1: return x16_q4_1;
    case T_Q5_0: return x16_q5_0;
    case T_Q5_1: return x16_q5_1;
    case T_Q8_0: return x16_q8_0;
    default: return 0;
    }
}
#endif

/* Bytes of the interleaved copy of an M x K weight of `type`, or 0 where this build has no
 * interleaved kernel for it (no AVX2, another type, or M not a multiple of 16). */
int64_t pd_interleaved_bytes(int type, int64_t M, int64_t K) {
#ifdef INTERLEAVED_KERNELS
    const int64_t bytes = group_block_bytes(type);
    if (!bytes || M % ROWS16 || K % block_values(type)) return 0;
    return M / ROWS16 * (K / block_values(type)) * bytes;
#else
    (void)type, (void)M, (void)K;
    return 0;
#endif
}

/* out = the M x K weight w (rows w_stride bytes apart) interleaved; out holds
 * pd_interleaved_bytes(type, M, K) bytes. Returns 0, or 1 where that is 0. */
int pd_interleave(int type, const uint8_t *w, int64_t w_stride, int64_t M, int64_t K,
                  uint8_t *out, int n_threads) {
#ifdef INTERLEAVED_KERNELS
    const int64_t bytes = group_block_bytes(type);
    if (!pd_interleaved_bytes(type, M, K)) return 1;
    const int64_t nb = K / block_values(type), row_block = block_bytes(type);
    memset(out, 0, (size_t)pd_interleaved_bytes(type, M, K));   /* the fifth bits are or-ed in */
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_threads > 1)
    for (int64_t G = 0; G < M / ROWS16; G++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *src[ROWS16];
            for (int r = 0; r < ROWS16; r++)
                src[r] = w + (G * ROWS16 + r) * w_stride + b * row_block;
            uint8_t *o = out + (G * nb + b) * bytes;
            if (type == T_Q4_K || type == T_Q5_K) interleave_k4(type, src, o);
            else if (type == T_Q6_K) interleave_q6_k(src, o);
            else interleave_32(type, src, o);
        }
    return 0;
#else
    (void)type, (void)w, (void)w_stride, (void)M, (void)K, (void)out, (void)n_threads;
    return 1;
#endif
}

#ifdef INTERLEAVED_KERNELS
/* The activation rows of a product, quantized to int16 (int_dot.c's activations) or to int8
 * (interleaved_int8.c's: bits 8, where the build has those kernels). */
typedef struct {
    int bits;
    int16_rows a16;
    int8_rows a8;
} act_any;

/* n_rows rows of K values from x quantized for the kernels of `type`; 0 when there was no
 * memory (then nothing is held) */
static int act_quantize(act_any *a, int type, int bits, const float *x, int64_t x_stride,
                        int64_t K, int64_t n_rows, int n_threads) {
    memset(a, 0, sizeof(*a));
    a->bits = bits;
#ifdef INT8_KERNELS
    if (bits == 8) {
        a->a8 = int8_rows_new(K, n_rows);
        if (!a->a8.q) return 0;
        pd_quantize_rows_int8(x, x_stride, &a->a8, n_threads);
        return 1;
    }
#endif
    a->bits = 16;
    a->a16 = int16_rows_new(K, n_rows, block_values(type));
    if (!a->a16.q) return 0;
    pd_quantize_rows_int16(x, x_stride, &a->a16, n_threads);
    return 1;
}

static void act_free(act_any *a) {
    if (a->a16.q) int16_rows_free(&a->a16);
#ifdef INT8_KERNELS
    if (a->a8.q) int8_rows_free(&a->a8);
#endif
}

/* group G's results for rows [first, first + n) of a, stored from y (rows M apart) */
static inline void group_rows(int type, const uint8_t *p, int64_t G, const act_any *a,
                              int64_t first, int64_t n, float *y, int64_t y_stride) {
#ifdef INT8_KERNELS
    if (a->bits == 8) {
        const int8_rows *f = &a->a8;
        const int8_rows rows = {f->q + first * f->K, f->e + first * (f->K / QK),
                                f->sums + first * (f->K / QK), f->isums + first * (f->K / 16),
                                f->K, n};
        group_kernel8_of(type)(p, G, &rows, y, y_stride);
        return;
    }
#endif
    const int16_rows *f = &a->a16;
    const int16_rows rows = {f->q + first * f->K, f->e + first * (f->K / f->group),
                             f->sums + first * (f->K / QK), f->K, n, f->group};
    group_kernel_of(type)(p, G, &rows, y, y_stride);
}

/* Activation rows per pass over the weights: about ACT_PASS_BYTES of their integers, which
 * stay in L2 while each group's spans meet them. Every group reads all the rows of a pass, so
 * a prompt's 512 rows of 2048 int16 (2 MiB) in one pass came from L3 once per group: pp512 of
 * the 1B-class Q4_K model ran 6-8% slower than in passes of 512 KiB (256 KiB: 3% slower). */
#define ACT_PASS_BYTES (512 * 1024)
static int64_t rows_per_pass(int64_t K, int bits) {
    const int64_t rows = ACT_PASS_BYTES / (K * bits / 8) / TILE * TILE;
    return rows < TILE ? TILE : rows;
}
#endif

#ifdef INTERLEAVED_KERNELS
/* One product of a run of products: a weight's interleaved copy, its groups, the activation
 * rows it multiplies (rows from row0 on: all of them for the products of one activation, an
 * expert's for MUL_MAT_ID) and where its results go (row r of them at y + r y_stride). */
typedef struct {
    int type;
    const uint8_t *p;
    float *y;
    int64_t y_stride, groups, group_bytes, row0, rows;
} product;

/* Each thread's share of the products: the groups end to end (product by product), a
 * contiguous run of about the same bytes per thread, which the thread streams from its start
 * a block of STEAL_BYTES at a time and, once done, helps the others finish theirs from where
 * they are (a block at a time, taken off the owner's counter). With a fixed share per thread
 * (schedule(static)) the thread that started or ran slower held up the other at the region's
 * end: on a 2-vCPU Zen 4 the main thread waited there for 7% of a gemma-3-270m decode step.
 * Handed out one group at a time from one counter, each thread's stream broke at every group
 * (a mixture's decode step ran 20% slower); here each thread's blocks follow each other until
 * it steals. */
#define STEAL_BYTES (32 * 1024)
#define SMALL_TEAM 16              /* threads, and products, whose bookkeeping is on the stack */
typedef struct {
    _Alignas(64) int64_t next;       /* the owner's next group; a cache line of its own */
    int64_t end;
} share;

/* a place among the products' groups end to end: product i, its group G */
typedef struct {
    int64_t i, G;
} place;

/* group u's place: starts[i] is product i's first group end to end (a binary search: a
 * mixture's joined gate and up are hundreds of products in a prompt) */
static inline place place_of(const int64_t *starts, int64_t n_products, int64_t u) {
    int64_t lo = 0, hi = n_products - 1;                 /* the last product starting <= u */
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= u) lo = mid;
        else hi = mid - 1;
    }
    return (place){lo, u - starts[lo]};
}

static inline void step_place(const product *pr, int64_t n_products, place *at) {
    if (++at->G >= pr[at->i].groups && at->i + 1 < n_products) at->G = 0, at->i++;
}

/* the products and what run_groups needs to walk them */
typedef struct {
    const product *pr;
    const int64_t *starts;
    int64_t n;
    const act_any *a;
} products;

/* groups [u, stop) of the products, for their rows [r, r + pass) */
static void run_groups(const products *ps, int64_t u, int64_t stop, int64_t r, int64_t pass) {
    place at = place_of(ps->starts, ps->n, u);
    for (; u < stop; u++, step_place(ps->pr, ps->n, &at)) {
        const product *q = &ps->pr[at.i];
        if (r >= q->rows) continue;
        const int64_t n = q->rows - r < pass ? q->rows - r : pass;
        group_rows(q->type, q->p, at.G, ps->a, q->row0 + r, n, q->y + r * q->y_stride,
                   q->y_stride);
    }
}

static void stream_shares(const products *ps, int64_t pass, share *shares, int team, int me,
                          int64_t block) {
    for (int k = 0; k < team; k++) {
        share *s = &shares[(me + k) % team];
        for (;;) {
            const int64_t u = __atomic_fetch_add(&s->next, block, __ATOMIC_RELAXED);
            if (u >= s->end) break;
            run_groups(ps, u, u + block < s->end ? u + block : s->end, 0, pass);
        }
    }
}

/* thread t's share of `team`: the groups that start in bytes [total t / team, total (t + 1) /
 * team) of the products' groups end to end */
static void share_out(const product *pr, int64_t n_products, int64_t total, share *shares,
                      int team) {
    for (int t = 0; t <= team; t++) {
        const int64_t at = total * t / team;
        int64_t first = 0, before = 0;
        for (int64_t i = 0; i < n_products; i++) {
            const int64_t bytes = pr[i].groups * pr[i].group_bytes;
            if (at < before + bytes || i == n_products - 1) {
                const int64_t G = (at - before + pr[i].group_bytes - 1) / pr[i].group_bytes;
                first += G < pr[i].groups ? G : pr[i].groups;
                break;
            }
            before += bytes;
            first += pr[i].groups;
        }
        if (t < team) shares[t].next = first;
        if (t > 0) shares[t - 1].end = first;
    }
}

/* The products' groups for their activation rows in passes of rows_per_pass: where every
 * product's rows are one pass (a decode step, a few sequences, a mixture's experts) shared
 * out by stream_shares; a prompt's passes each over a fixed share of about the same bytes per
 * thread (the rows are many, the threads' work even). Returns 0, or 2 where its bookkeeping's
 * memory could not be had (nothing written then). */
static int run_products(const product *pr, int64_t n_products, const act_any *a, int64_t K,
                        int n_threads) {
    const int team = n_threads > 1 ? n_threads : 1;
    share small_shares[SMALL_TEAM];
    int64_t small_starts[SMALL_TEAM + 1];
    share *shares = team <= SMALL_TEAM ? small_shares
                                       : aligned_alloc(64, sizeof(share) * (size_t)team);
    int64_t *starts = n_products <= SMALL_TEAM ? small_starts
                                               : malloc(sizeof(int64_t) * (n_products + 1));
    if (!shares || !starts) {
        if (shares != small_shares) free(shares);
        if (starts != small_starts) free(starts);
        return 2;
    }
    int64_t total = 0, most = 0;
    starts[0] = 0;
    for (int64_t i = 0; i < n_products; i++) {
        total += pr[i].groups * pr[i].group_bytes;
        starts[i + 1] = starts[i] + pr[i].groups;
        most = pr[i].rows > most ? pr[i].rows : most;
    }
    const int64_t groups = starts[n_products], pass = rows_per_pass(K, a->bits);
    share_out(pr, n_products, total, shares, team);
    const int64_t block = STEAL_BYTES / pr[0].group_bytes > 1 ? STEAL_BYTES / pr[0].group_bytes
                                                               : 1;
    const products ps = {pr, starts, n_products, a};
#pragma omp parallel num_threads(team) if (team > 1)
    {
#ifdef _OPENMP
        const int me = omp_get_thread_num(), threads = omp_get_num_threads();
#else
        const int me = 0, threads = 1;
#endif
        if (most <= pass && threads == team) {
            stream_shares(&ps, pass, shares, team, me, block);
        } else {              /* fewer threads than asked for: the first does it all */
            const int64_t lo = threads == team ? shares[me].next : me == 0 ? 0 : groups;
            const int64_t hi = threads == team ? shares[me].end : groups;
            for (int64_t r = 0; r < most; r += pass) run_groups(&ps, lo, hi, r, pass);
        }
    }
    if (shares != small_shares) free(shares);
    if (starts != small_starts) free(starts);
    return 0;
}
#endif

/* The words of pd_mul_mat_interleaved's record (MulMatInterleavedArguments) and of
 * pd_mul_mat_id_interleaved's (MulMatIdInterleavedArguments), and those the calls joined into
 * one share (shared_input.py's _JOINS); a test reads these against the records. */
enum { MMI_TYPE, MMI_P, MMI_M, MMI_K, MMI_X, MMI_X_STRIDE, MMI_N_ROWS, MMI_Y, MMI_Y_STRIDE,
       MMI_N_THREADS, MMI_BITS, MMI_WORDS };
enum { MMID_TYPE, MMID_P, MMID_N_EXPERT, MMID_M, MMID_K, MMID_B, MMID_N_B, MMID_IDS,
       MMID_IDS_STRIDE, MMID_N_TOKENS, MMID_N_USED, MMID_D, MMID_N_THREADS, MMID_BITS,
       MMID_WORDS };
static const int MMI_SHARED[] = {MMI_X, MMI_X_STRIDE, MMI_N_ROWS, MMI_K, MMI_N_THREADS, MMI_BITS};
static const int MMID_SHARED[] = {MMID_K, MMID_B, MMID_N_B, MMID_IDS, MMID_IDS_STRIDE,
                                  MMID_N_TOKENS, MMID_N_USED, MMID_N_THREADS, MMID_BITS};
#define SHARED_MAX 8               /* calls joined into one at most (shared_input.py's) */

/* record i of `records` (an address), as its words */
static inline const int64_t *record_at(const int64_t *records, int64_t i) {
    return (const int64_t *)(intptr_t)records[i];
}

#ifdef INTERLEAVED_KERNELS
/* 1 where the records share the words `shared` and their types' interleaved kernels take
 * blocks of one size (the activations are quantized once for all of them) */
static int records_share(const int64_t *records, int64_t n, const int *shared, int n_shared,
                         int type_word) {
    const int64_t *r0 = record_at(records, 0);
    for (int64_t i = 0; i < n; i++) {
        const int64_t *r = record_at(records, i);
        for (int w = 0; w < n_shared; w++)
            if (r[shared[w]] != r0[shared[w]]) return 0;
        if (!group_kernel_of((int)r[type_word])
            || block_values((int)r[type_word]) != block_values((int)r0[type_word]))
            return 0;
    }
    return 1;
}
#endif

/* y[r, i] = sum_k W[i, k] x[r, k] with W interleaved (pd_interleave) and x quantized to int16
 * as pd_mul_mat_int16 does, or to int8 (`bits` 8, where the build has those kernels). Returns
 * 0, 1 where the type has no interleaved kernel, or 2 when the scratch memory could not be had
 * (nothing written either way). */
int pd_mul_mat_interleaved(int type, const uint8_t *p, int64_t M, int64_t K, const float *x,
                           int64_t x_stride, int64_t n_rows, float *y, int64_t y_stride,
                           int n_threads, int bits) {
    const int64_t record[MMI_WORDS] = {type, (int64_t)(intptr_t)p, M, K, (int64_t)(intptr_t)x,
                                       x_stride, n_rows, (int64_t)(intptr_t)y, y_stride,
                                       n_threads, bits};
    const int64_t records[1] = {(int64_t)(intptr_t)record};
    return pd_mul_mat_interleaved_shared(1, records);
}

/* The products of one activation (a layer's q, k and v; its gate and up): `n_products`
 * records of pd_mul_mat_interleaved (at the addresses in `records`) whose x, x_stride, n_rows,
 * K, n_threads and bits are the same and whose types have blocks of one size, run as one
 * call: the activations quantized once, and one parallel region over every product's groups
 * (run_products). Apart, a decode step's k and v products of a 1B-class llama (512 rows) read
 * their weights at 24-26 GB/s where the large ones read 33-35: each paid a parallel region, a
 * quantization and its streams' ramp for a third of a megabyte. Returns as
 * pd_mul_mat_interleaved does; 1 also where the records do not share their activations
 * (nothing written then). */
int pd_mul_mat_interleaved_shared(int64_t n_products, const int64_t *records) {
#ifdef INTERLEAVED_KERNELS
    product pr[SHARED_MAX];
    if (n_products < 1 || n_products > SHARED_MAX
        || !records_share(records, n_products, MMI_SHARED, sizeof MMI_SHARED / sizeof(int),
                          MMI_TYPE))
        return 1;
    const int64_t *r0 = record_at(records, 0);
    const int64_t K = r0[MMI_K], n_rows = r0[MMI_N_ROWS];
    for (int64_t i = 0; i < n_products; i++) {
        const int64_t *r = record_at(records, i);
        const int type = (int)r[MMI_TYPE];
        if (!pd_interleaved_bytes(type, r[MMI_M], K)) return 1;
        pr[i] = (product){type, (const uint8_t *)(intptr_t)r[MMI_P],
                          (float *)(intptr_t)r[MMI_Y], r[MMI_Y_STRIDE], r[MMI_M] / ROWS16,
                          pd_interleaved_bytes(type, ROWS16, K), 0, n_rows};
    }
    act_any a;
    if (!act_quantize(&a, (int)r0[MMI_TYPE], (int)r0[MMI_BITS],
                      (const float *)(intptr_t)r0[MMI_X], r0[MMI_X_STRIDE], K, n_rows,
                      (int)r0[MMI_N_THREADS]))
        return 2;
    const int status = run_products(pr, n_products, &a, K, (int)r0[MMI_N_THREADS]);
    act_free(&a);
    return status;
#else
    (void)n_products, (void)records;
    return 1;
#endif
}

int pd_mul_mat_interleaved_shared_packed(const int64_t *a) {
    return pd_mul_mat_interleaved_shared(a[0], (const int64_t *)(intptr_t)a[1]);
}

/* MUL_MAT_ID from the experts' interleaved copy p (expert e's at e * pd_interleaved_bytes):
 * for token t < n_tokens and slot u < n_used, row t * n_used + u of d (M floats) is expert
 * ids[t * ids_stride + u] times row t * n_b + u % n_b of b (K floats, contiguous). The pairs
 * are sorted by expert in C: each expert in use multiplies its rows at once, and one parallel
 * loop covers every expert's groups. Returns 0; 1 where the type has no interleaved kernel, 2
 * when memory could not be had, 3 for an expert id outside [0, n_expert) (nothing written
 * then). */
int pd_mul_mat_id_interleaved(int type, const uint8_t *p, int64_t n_expert, int64_t M,
                              int64_t K, const float *b, int64_t n_b, const int32_t *ids,
                              int64_t ids_stride, int64_t n_tokens, int64_t n_used, float *d,
                              int n_threads, int bits) {
    const int64_t record[MMID_WORDS] = {type, (int64_t)(intptr_t)p, n_expert, M, K,
                                        (int64_t)(intptr_t)b, n_b, (int64_t)(intptr_t)ids,
                                        ids_stride, n_tokens, n_used, (int64_t)(intptr_t)d,
                                        n_threads, bits};
    const int64_t records[1] = {(int64_t)(intptr_t)record};
    return pd_mul_mat_id_interleaved_shared(1, records);
}

#ifdef INTERLEAVED_KERNELS
/* 1 where every token's experts are below every record's n_expert */
static int routed_within(const int64_t *records, int64_t n) {
    const int64_t *r0 = record_at(records, 0);
    const int32_t *ids = (const int32_t *)(intptr_t)r0[MMID_IDS];
    int64_t fewest = r0[MMID_N_EXPERT];
    for (int64_t i = 1; i < n; i++)
        fewest = record_at(records, i)[MMID_N_EXPERT] < fewest
                     ? record_at(records, i)[MMID_N_EXPERT] : fewest;
    for (int64_t t = 0; t < r0[MMID_N_TOKENS]; t++)
        for (int64_t u = 0; u < r0[MMID_N_USED]; u++) {
            const int64_t e = ids[t * r0[MMID_IDS_STRIDE] + u];
            if (e < 0 || e >= fewest) return 0;
        }
    return 1;
}
#endif

/* The MUL_MAT_ID products of one activation and one routing (a mixture's gate and up
 * experts): `n_products` records of pd_mul_mat_id_interleaved (at the addresses in `records`)
 * whose b, n_b, ids, ids_stride, n_tokens, n_used, K, n_threads and bits are the same and
 * whose types have blocks of one size, as one call: the pairs sorted, their rows gathered
 * and quantized once, and one parallel region over every product's experts in use
 * (run_products). Returns as pd_mul_mat_id_interleaved does; 1 also where the records do not
 * share their activations and routing (nothing written then). */
int pd_mul_mat_id_interleaved_shared(int64_t n_products, const int64_t *records) {
#ifdef INTERLEAVED_KERNELS
    if (n_products < 1 || n_products > SHARED_MAX
        || !records_share(records, n_products, MMID_SHARED, sizeof MMID_SHARED / sizeof(int),
                          MMID_TYPE))
        return 1;
    const int64_t *r0 = record_at(records, 0);
    const int64_t K = r0[MMID_K], n_b = r0[MMID_N_B], ids_stride = r0[MMID_IDS_STRIDE];
    const int64_t n_used = r0[MMID_N_USED], pairs = r0[MMID_N_TOKENS] * n_used;
    const int n_threads = (int)r0[MMID_N_THREADS];
    int64_t most_experts = 0, y_floats = 0;
    for (int64_t i = 0; i < n_products; i++) {
        const int64_t *r = record_at(records, i);
        if (!pd_interleaved_bytes((int)r[MMID_TYPE], r[MMID_M], K)) return 1;
        most_experts = r[MMID_N_EXPERT] > most_experts ? r[MMID_N_EXPERT] : most_experts;
        y_floats += pairs * r[MMID_M];
    }
    if (!routed_within(records, n_products)) return 3;
    const float *b = (const float *)(intptr_t)r0[MMID_B];
    const int32_t *ids = (const int32_t *)(intptr_t)r0[MMID_IDS];
    /* the pairs in expert order (a counting sort), their b rows gathered in that order */
    int64_t *start = calloc((size_t)most_experts + 1, sizeof(int64_t));
    int64_t *next = calloc((size_t)most_experts, sizeof(int64_t));
    int64_t *order = malloc(sizeof(int64_t) * pairs);
    int64_t *active = malloc(sizeof(int64_t) * most_experts);
    float *x = malloc(sizeof(float) * pairs * K), *y = malloc(sizeof(float) * y_floats);
    product *pr = malloc(sizeof(product) * most_experts * n_products);  /* experts in use */
    act_any a;
    int status = 2;
    if (start && next && order && active && x && y && pr) {
        for (int64_t i = 0; i < pairs; i++)
            start[ids[(i / n_used) * ids_stride + i % n_used] + 1]++;
        int64_t n_active = 0;
        for (int64_t e = 0; e < most_experts; e++) {
            if (start[e + 1]) active[n_active++] = e;
            start[e + 1] += start[e];
        }
        for (int64_t i = 0; i < pairs; i++) {
            const int64_t t = i / n_used, u = i % n_used, e = ids[t * ids_stride + u];
            const int64_t at = start[e] + next[e]++;
            order[at] = i;
            memcpy(x + at * K, b + (t * n_b + u % n_b) * K, sizeof(float) * K);
        }
        if (act_quantize(&a, (int)r0[MMID_TYPE], (int)r0[MMID_BITS], x, K, K, pairs,
                         n_threads)) {
            /* each record's experts in use, each a product of its rows */
            float *yi = y;
            for (int64_t i = 0, k = 0; i < n_products; i++) {
                const int64_t *r = record_at(records, i);
                const int type = (int)r[MMID_TYPE];
                const int64_t M = r[MMID_M], expert_bytes = pd_interleaved_bytes(type, M, K);
                for (int64_t j = 0; j < n_active; j++, k++) {
                    const int64_t e = active[j], first = start[e];
                    pr[k] = (product){type,
                                      (const uint8_t *)(intptr_t)r[MMID_P] + e * expert_bytes,
                                      yi + first * M, M, M / ROWS16,
                                      pd_interleaved_bytes(type, ROWS16, K), first,
                                      start[e + 1] - first};
                }
                yi += pairs * M;
            }
            status = run_products(pr, n_active * n_products, &a, K, n_threads);
            act_free(&a);
            yi = y;
            for (int64_t i = 0; i < n_products && status == 0; i++) {   /* in the pairs' order */
                const int64_t *r = record_at(records, i);
                const int64_t M = r[MMID_M];
                float *d = (float *)(intptr_t)r[MMID_D];
                for (int64_t at = 0; at < pairs; at++)
                    memcpy(d + order[at] * M, yi + at * M, sizeof(float) * M);
                yi += pairs * M;
            }
        }
    }
    free(start);
    free(next);
    free(order);
    free(active);
    free(x);
    free(y);
    free(pr);
    return status;
#else
    (void)n_products, (void)records;
    return 1;
#endif
}

int pd_mul_mat_id_interleaved_shared_packed(const int64_t *a) {
    return pd_mul_mat_id_interleaved_shared(a[0], (const int64_t *)(intptr_t)a[1]);
}

int pd_mul_mat_id_interleaved_packed(const int64_t *a) {
    return pd_mul_mat_id_interleaved((int)a[0], P_PTR(1), a[2], a[3], a[4],
                                     (const float *)(intptr_t)a[5], a[6],
                                     (const int32_t *)(intptr_t)a[7], a[8], a[9], a[10],
                                     (float *)(intptr_t)a[11], (int)a[12], (int)a[13]);
}

int pd_mul_mat_interleaved_packed(const int64_t *a) {
    return pd_mul_mat_interleaved((int)a[0], P_PTR(1), a[2], a[3], (const float *)(intptr_t)a[4],
                                  a[5], a[6], (float *)(intptr_t)a[7], a[8], (int)a[9],
                                  (int)a[10]);
}
