/* ADD and MUL of float32 rows, b either as many rows as a or one row repeated over a's.
 *
 * A decode step adds its residuals and multiplies its norms' weights twice per layer: one
 * row each, where numpy's call costs more than the arithmetic and, between two compiled
 * calls, keeps a plan's replay (replay.c) from running them as one. The operations are the
 * same float32 ones, so results equal numpy's.
 */
#include "blocks.h"

#define BINARY_THREAD_WORK (1 << 16)   /* values from which the op runs threaded */

enum { BINARY_ADD = 0, BINARY_MUL = 1 };

/* d[r] = a[r] op b[r * b_stride != 0] for n_rows rows of n; strides in floats (b_stride 0:
 * b is one row for all) */
void pd_binary_f32(int op, const float *a, int64_t a_stride, const float *b, int64_t b_stride,
                   float *d, int64_t d_stride, int64_t n_rows, int64_t n, int n_threads) {
    int parallel = n_threads > 1 && n_rows > 1 && n_rows * n >= BINARY_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *ar = a + r * a_stride, *br = b + r * b_stride;
        float *dr = d + r * d_stride;
        if (op == BINARY_ADD)
            for (int64_t j = 0; j < n; j++) dr[j] = ar[j] + br[j];
        else
            for (int64_t j = 0; j < n; j++) dr[j] = ar[j] * br[j];
    }
}

void pd_binary_f32_packed(const int64_t *a) {
    pd_binary_f32((int)a[0], (const float *)P_PTR(1), a[2], (const float *)P_PTR(3), a[4],
                  (float *)P_PTR(5), a[6], a[7], a[8], (int)a[9]);
}
