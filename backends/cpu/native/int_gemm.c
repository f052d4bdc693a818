/* Products of many activation rows (a prompt) with K-quant weights, in int16 (int16.h).
 *
 * The decode-step kernels (int_dot.c) unpack each weight block for at most four activation
 * rows at a time; a prompt has hundreds. Here a panel of weight rows is unpacked once into
 * int16, each sub-block's values times its scale as int_dot.c has them, and every activation
 * row multiplies it from there: TILE_R activation rows by TILE_C weight rows at a time, their
 * int32 sums in registers, so each 16 values take TILE_R + TILE_C loads for TILE_R x TILE_C
 * multiply-adds. A block's sums are scaled in float once per 256 values (128 for Q6_K), with
 * the same bounds as int_dot.c's, so the result is the decode-step kernels' up to the order
 * of the float sums.
 */
#include "int16.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef INT16_KERNELS

#ifndef PANEL
#define PANEL 64               /* weight rows unpacked at a time, per thread */
#endif
#ifndef TILE_R
#define TILE_R 4
#endif
#ifndef TILE_C
#if defined(__AVX512F__)
#define TILE_C 4               /* 32 vector registers: 16 sums, 4 activations (4 x 3 with the
                                * float sums in registers too ran 1.3x slower on Zen 4) */
#else
#define TILE_C 2               /* 16: 8 sums, 4 activations (the float sums spill) */
#endif
#endif

typedef struct {
    int16_t *w;                /* [PANEL][K]: the weights times their sub-block scales */
    float *d;                  /* [PANEL][K / 256]: each block's d */
    float *mins;               /* [PANEL][K / 32]: -dmin m of each 32 values (Q4_K, Q5_K) */
} panel;

/* what the GEMM needs to know of a K-quant */
typedef struct {
    int bytes;                 /* of a block */
    int flush;                 /* values whose int32 sums may add before they are scaled */
    int has_min;
} k_type;

static int k_type_of(int type, k_type *t) {
    switch (type) {
    case T_Q4_K: *t = (k_type){144, 256, 1}; return 1;
    case T_Q5_K: *t = (k_type){176, 256, 1}; return 1;
    case T_Q6_K: *t = (k_type){210, 128, 0}; return 1;
    }
    return 0;
}

#define UNPACK_BLOCK(SCALES, WEIGHTS)                                                        \
    do {                                                                                    \
        const k_scales k = SCALES(block);                                                   \
        p->d[i * nb + b] = k.d;                                                             \
        _mm256_storeu_ps(p->mins + i * (K / 32) + 8 * b, k.mins);                           \
        int16_t *out = p->w + i * K + QK_K * b;                                             \
        for (int g = 0; g < 8; g++) {                                                       \
            const w32 w = WEIGHTS(block, k.scales, g);                                      \
            memcpy(out + 32 * g, &w, sizeof w);                                             \
        }                                                                                   \
    } while (0)

static void unpack_panel(int type, const k_type *t, const uint8_t *w, int64_t w_stride,
                         int64_t n, int64_t K, panel *p) {
    const int64_t nb = K / QK_K;
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = w + i * w_stride + b * t->bytes;
            switch (type) {
            case T_Q4_K: UNPACK_BLOCK(scales_k4, w_q4_k); break;
            case T_Q5_K: UNPACK_BLOCK(scales_k4, w_q5_k); break;
            case T_Q6_K: UNPACK_BLOCK(scales_q6_k, w_q6_k); break;
            }
        }
}

/* y[r, c] for R activation rows from r0 and C panel rows from c0 (constants of each inlined
 * copy, so the sums stay in registers) */
static inline __attribute__((always_inline)) void tile(
        const int16_rows *a, int64_t r0, const int R, const panel *p, int64_t c0, const int C,
        const k_type *t, float *y, int64_t y_stride) {
    const int64_t K = a->K, nb = K / QK_K, ng = K / 32;
    fvec acc[TILE_R][TILE_C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = fv_zero();
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t h = QK_K * b; h < QK_K * (b + 1); h += t->flush) {
            ivec sum[TILE_R][TILE_C];
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) sum[r][c] = iv_zero();
            for (int64_t k = h; k < h + t->flush; k += IVEC) {
                ivec x[TILE_R];
                for (int r = 0; r < R; r++) x[r] = iv_load(a->q + (r0 + r) * K + k);
                for (int c = 0; c < C; c++) {
                    ivec w = iv_load(p->w + (c0 + c) * K + k);
                    for (int r = 0; r < R; r++) sum[r][c] = iv_madd(sum[r][c], w, x[r]);
                }
            }
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++)
                    acc[r][c] = fv_scale_add(sum[r][c], p->d[(c0 + c) * nb + b] * a->e[(r0 + r) * nb + b],
                                             acc[r][c]);
        }
        if (t->has_min)
            for (int r = 0; r < R; r++) {
                __m256 sums = _mm256_loadu_ps(a->sums + (r0 + r) * ng + 8 * b);
                for (int c = 0; c < C; c++)
                    acc[r][c] = fv_fma8(_mm256_loadu_ps(p->mins + (c0 + c) * ng + 8 * b), sums,
                                        acc[r][c]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) y[(r0 + r) * y_stride + c0 + c] = fv_total(acc[r][c]);
}

/* every activation row times the panel's n rows, into y[:, 0:n] */
static void panel_product(const int16_rows *a, const panel *p, int64_t n, const k_type *t,
                          float *y, int64_t y_stride) {
    int64_t r0 = 0;
    for (; r0 + TILE_R <= a->n_rows; r0 += TILE_R) {
        int64_t c0 = 0;
        for (; c0 + TILE_C <= n; c0 += TILE_C) tile(a, r0, TILE_R, p, c0, TILE_C, t, y, y_stride);
        for (; c0 < n; c0++) tile(a, r0, TILE_R, p, c0, 1, t, y, y_stride);
    }
    for (; r0 < a->n_rows; r0++) {
        int64_t c0 = 0;
        for (; c0 + TILE_C <= n; c0 += TILE_C) tile(a, r0, 1, p, c0, TILE_C, t, y, y_stride);
        for (; c0 < n; c0++) tile(a, r0, 1, p, c0, 1, t, y, y_stride);
    }
}

int pd_gemm_int16(int type, const uint8_t *w, int64_t w_stride, int64_t M, const int16_rows *a,
                  float *y, int64_t y_stride, int n_threads) {
    k_type t;
    if (!k_type_of(type, &t) || a->group != QK_K) return 1;
#ifndef _OPENMP
    n_threads = 1;
#endif
    /* every thread's panel, had before anything is written */
    const int64_t K = a->K, w_size = PANEL * K, d_size = PANEL * (K / QK_K), m_size = PANEL * (K / 32);
    int16_t *w_all = malloc(sizeof(int16_t) * w_size * n_threads);
    float *f_all = malloc(sizeof(float) * (d_size + m_size) * n_threads);
    int status = 2;
    if (w_all && f_all) {
        const int64_t n_panels = (M + PANEL - 1) / PANEL;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (n_threads > 1)
        for (int64_t c = 0; c < n_panels; c++) {
#ifdef _OPENMP
            const int me = omp_get_thread_num();
#else
            const int me = 0;
#endif
            panel p = {w_all + me * w_size, f_all + me * (d_size + m_size),
                       f_all + me * (d_size + m_size) + d_size};
            const int64_t i0 = c * PANEL, n = M - i0 < PANEL ? M - i0 : PANEL;
            unpack_panel(type, &t, w + i0 * w_stride, w_stride, n, K, &p);
            panel_product(a, &p, n, &t, y + i0, y_stride);
        }
        status = 0;
    }
    free(w_all);
    free(f_all);
    return status;
}

#endif

/* 1 where pd_mul_mat_int16 multiplies many rows of `type` here by the GEMM, else 0 */
int pd_int16_gemm_of(int type) {
#ifdef INT16_KERNELS
    k_type t;
    return k_type_of(type, &t);
#else
    (void)type;
    return 0;
#endif
}
