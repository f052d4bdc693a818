/* Weights with 16 rows interleaved: the layout that interleaved.c makes and multiplies with
 * int16 activations, and interleaved_int8.c with int8 ones.
 *
 * In a weight's own layout each row's blocks are contiguous, so a mat-vec multiplies one row
 * at a time: its int16 sums spread over vector lanes that must be added across, and every
 * 32-value group pays for its own sub-block scale (a multiply per weight) and its block's
 * float epilogue. Here rows 16 G .. 16 G + 15 are interleaved value pair by value pair: one
 * 32-byte chunk holds two consecutive values of each of the 16 rows, so a vpdpwssd of the
 * chunk (widened to int16) with the activation pair broadcast adds one product pair to each
 * row's own int32 lane. A row's sub-block scale then applies to its lane once per 32 values,
 * the block's scales to 16 rows at once, and the 16 results are stored without a horizontal
 * sum: about 2.5 vector operations per 32 weights where the row-by-row kernels need 7, which
 * turns a decode step's products from compute-bound into memory-bound.
 *
 * The layout, per group of 16 rows and per block (bytes; r the row in the group, i 0 or 1):
 *   Q4_K  d[16] dmin[16] (fp16), scale[8][16] min[8][16] (the 6-bit values as bytes), then
 *         per sub-block g and chunk j (0-7) 32 bytes: byte 2 r + i = value 32 g + 2 j + i in
 *         the low nibble, value 32 g + 16 + 2 j + i in the high one             2368 (2304)
 *   Q5_K  as Q4_K, each sub-block's 256 bytes followed by two 32-byte planes of fifth bits:
 *         bit j of byte 2 r + i of the first is the fifth bit of chunk j's low nibble there,
 *         of the second its high one's (so that with AVX2 a shift and an and put a chunk's
 *         fifth bits in place: 32-bit masks per chunk took 6 operations; and beside their
 *         nibbles: at the block's end, a decode step read memory at half the speed)
 *                                                                                  2880 (2816)
 *   Q6_K  d[16], scale[16][16] (int8), then per sub-block g of 32 values 256 bytes of
 *         nibbles as Q4_K's (the values' low 4 bits) and 4 of 32 bytes of high bits: byte
 *         2 r + i of vector c holds the top 2 bits of chunk c's two values in bits 0-3 and of
 *         chunk c + 4's in bits 4-7                                               3360 (3360)
 *   Q4_0  d[16], then per chunk j (0-7): byte 2 r + i = values 2 j + i (low nibble) and
 *         16 + 2 j + i (high)                                                      288 (288)
 *   Q4_1  d[16] m[16], then Q4_0's chunks                                         320 (320)
 *   Q5_0  d[16], Q4_0's chunks, then their two planes of fifth bits as Q5_K's     352 (352)
 *   Q5_1  d[16] m[16], then Q5_0's chunks and planes                              384 (384)
 *   Q8_0  d[16], then per chunk j (0-15): byte 2 r + i = value 2 j + i             544 (544)
 * (in brackets: the 16 rows' bytes in their own layout). Built wherever the int16 kernels are
 * (AVX2 and FMA): the 16 rows' int32 lanes are one register with AVX-512 BW and VNNI, two
 * halves of 8 with AVX2 (rows16.h), where one pair of chunk bytes costs a vpmaddwd and an add
 * per activation row (a vpdpwssd with AVX-VNNI) instead of half a vpdpwssd. Activations are
 * those of int_dot.c (int16 with one scale per block), so the results equal its results up to
 * float32 rounding.
 */
#ifndef POLYDEV_INTERLEAVED_H
#define POLYDEV_INTERLEAVED_H

#include "rows16.h"

#if defined(ROWS16_KERNELS)
#define INTERLEAVED_KERNELS 1

#define ROWS16 16

/* bytes of one group's block, and the header before its values */
#define Q4_K_X16 2368
#define Q5_K_X16 2880
#define Q6_K_X16 3360
#define Q4_0_X16 288
#define Q4_1_X16 320
#define Q5_0_X16 352
#define Q5_1_X16 384
#define Q8_0_X16 544
#define K4_HEADER 320

/* bytes of one sub-block's values (Q5_K: its nibbles, then its masks) */
static inline int k4_group_bytes(int type) { return type == T_Q5_K ? 320 : 256; }

static inline int64_t group_block_bytes(int type) {
    switch (type) {
    case T_Q4_K: return Q4_K_X16;
    case T_Q5_K: return Q5_K_X16;
    case T_Q6_K: return Q6_K_X16;
    case T_Q4_0: return Q4_0_X16;
    case T_Q4_1: return Q4_1_X16;
    case T_Q5_0: return Q5_0_X16;
    case T_Q5_1: return Q5_1_X16;
    case T_Q8_0: return Q8_0_X16;
    default: return 0;
    }
}

/* the 32-value types: whether a block has a minimum m, fifth bits, and its values' offset */
static inline int has_min_32(int type) { return type == T_Q4_1 || type == T_Q5_1; }
static inline int has_fifth_32(int type) { return type == T_Q5_0 || type == T_Q5_1; }
static inline int header_32(int type) { return has_min_32(type) ? 64 : 32; }

/* Ask for a block's bytes PREFETCH_BYTES ahead of where the kernel reads. Every product
 * streams its weight once, and with more than one activation row a block takes long enough to
 * multiply that the hardware prefetchers fall behind: a 52 MB Q4_K weight times 8 rows ran at
 * 172 GMAC/s against 330 for one that fits the caches; with this, 340 (2 threads, Zen 4). 8 KiB
 * ahead was best of 2 to 16 (Q8_0 needs the most). */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 8192
#endif
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p,
                                                                 int64_t bytes) {
    for (int64_t c = 0; PREFETCH_BYTES > 0 && c < bytes; c += 64)     /* 0: none */
        __builtin_prefetch(p + PREFETCH_BYTES + c, 0, 3);
}

/* prefetch_block for a kernel of `rows` activation rows: none for one row (a decode step).
 * One row streams the weight as fast as the hardware prefetchers fetch it, and a block's
 * prefetch instructions (37 for Q4_K, 53 for Q6_K) stalled it: a Zen 4's Q4_K mat-vec chain
 * over 370 MB of weights read 16-22 GB/s with them against 23-29 without, one thread 14
 * against 23.5 (its read loop's 23). The commit that added them measured one row 10-25%
 * faster on its host, with the kernels of then; bench/products.py checks a host. */
static inline __attribute__((always_inline)) void prefetch_rows_block(const uint8_t *p,
                                                                      int64_t bytes, int rows) {
    if (rows > 1) prefetch_block(p, bytes);
}

/* A group kernel's passes over the rows of `a` (the enclosing function's; results at Y, rows
 * y_stride apart): TILE_ROWS rows at a time, then TILE_ROWS / 2, then one by one, each pass
 * BODY(TYPE, P, NB, AT(a, r0, rows, V0), rows, y, y_stride, W, ACCUMULATE) */
#define ROW_TILES_OF(BODY, AT, TILE_ROWS, TYPE, P, NB, V0, Y, W, ACCUMULATE)                  \
    do {                                                                                    \
        int64_t r0 = 0;                                                                     \
        for (; r0 + TILE_ROWS <= a->n_rows; r0 += TILE_ROWS)                                \
            BODY(TYPE, P, NB, AT(a, r0, TILE_ROWS, V0), TILE_ROWS, Y + r0 * y_stride,       \
                 y_stride, W, ACCUMULATE);                                                  \
        for (; r0 + TILE_ROWS / 2 <= a->n_rows; r0 += TILE_ROWS / 2)                        \
            BODY(TYPE, P, NB, AT(a, r0, TILE_ROWS / 2, V0), TILE_ROWS / 2,                  \
                 Y + r0 * y_stride, y_stride, W, ACCUMULATE);                               \
        for (; r0 < a->n_rows; r0++)                                                        \
            BODY(TYPE, P, NB, AT(a, r0, 1, V0), 1, Y + r0 * y_stride, y_stride, W,          \
                 ACCUMULATE);                                                               \
    } while (0)

/* activation rows quantized to int8 with a scale per 32 values (interleaved_int8.c) */
typedef struct {
    int8_t *q;           /* [n_rows][K] */
    float *e;            /* [n_rows][K / 32]: each 32 values' scale */
    float *sums;         /* [n_rows][K / 32]: their sum as quantized (e times the integers') */
    int32_t *isums;      /* [n_rows][K / 16]: each 16 values' integer sum */
    int64_t K, n_rows;
} int8_rows;

#if IVEC == 32
#define INT8_KERNELS 1
/* room for n_rows rows of K values; its q is 0 where there was no memory (nothing held) */
int8_rows int8_rows_new(int64_t K, int64_t n_rows);
void int8_rows_free(int8_rows *a);
void pd_quantize_rows_int8(const float *x, int64_t x_stride, int8_rows *a, int n_threads);
/* group G's 16 results (y + 16 G) for every row of a, from the weight's interleaved copy p */
typedef void (*group_kernel8)(const uint8_t *p, int64_t G, const int8_rows *a, float *y,
                              int64_t y_stride);
group_kernel8 group_kernel8_of(int type);
#endif

#endif
/* the joined calls of interleaved.c (each plain product is the one-record case of its) */
int pd_mul_mat_interleaved_shared(int64_t n_products, const int64_t *records);
int pd_mul_mat_id_interleaved_shared(int64_t n_products, const int64_t *records);
#endif
