/* ADD, SUB, MUL and DIV of float32 tensors with ggml's repeat: b's every dimension divides
 * a's, and b's row (i1 % ne11, i2 % ne12, i3 % ne13) meets a's row (i1, i2, i3), its value
 * j % ne10 a's value j (ggml_compute_forward_add and its siblings).
 *
 * A decode step adds its residuals, multiplies its norms' weights and, in a mixture of
 * experts, scales the experts' rows by their router weights: rows of one token, where a numpy
 * call costs more than the arithmetic, and where, between two compiled calls, it would split
 * a plan's replay (replay.c) in two. The float32 operations are numpy's, so results are
 * equal.
 */
#include "blocks.h"

#define BINARY_THREAD_WORK (1 << 16)   /* values from which the op runs threaded */

enum { BINARY_ADD = 0, BINARY_SUB = 1, BINARY_MUL = 2, BINARY_DIV = 3 };

#define ROW_LOOP(EXPR)                                                                      \
    do {                                                                                    \
        if (bn == n)                                                                       \
            for (int64_t j = 0; j < n; j++) { const float y = br[j]; dr[j] = (EXPR); }      \
        else if (bn == 1)                                                                  \
            for (int64_t j = 0; j < n; j++) { const float y = br[0]; dr[j] = (EXPR); }      \
        else                                                                                \
            for (int64_t j = 0; j < n; j++) { const float y = br[j % bn]; dr[j] = (EXPR); } \
    } while (0)

/* d = a op b (BINARY_*); a and d have unit element stride, b too or one value per row (its
 * ne0 1); d is a, b, or apart from both */
void pd_binary_f32(const pd_tensor *a, const pd_tensor *b, const pd_tensor *d, int op,
                   int n_threads) {
    const int64_t n = a->ne[0], ne1 = a->ne[1], ne2 = a->ne[2];
    const int64_t n_rows = ne1 * ne2 * a->ne[3], bn = b->ne[0];
    int parallel = n_threads > 1 && n_rows > 1 && n_rows * n >= BINARY_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / (ne1 * ne2);
        const float *ar = (const float *)tensor_row(a, i1, i2, i3);
        const float *br = (const float *)tensor_row(b, i1 % b->ne[1], i2 % b->ne[2],
                                                    i3 % b->ne[3]);
        float *dr = (float *)tensor_row(d, i1, i2, i3);
        switch (op) {
        case BINARY_ADD: ROW_LOOP(ar[j] + y); break;
        case BINARY_SUB: ROW_LOOP(ar[j] - y); break;
        case BINARY_MUL: ROW_LOOP(ar[j] * y); break;
        default: ROW_LOOP(ar[j] / y); break;
        }
    }
}

void pd_binary_f32_packed(const int64_t *a) {
    const pd_tensor x = tensor_at(a), y = tensor_at(a + TENSOR_WORDS);
    const pd_tensor d = tensor_at(a + 2 * TENSOR_WORDS);
    const int64_t *p = a + 3 * TENSOR_WORDS;
    pd_binary_f32(&x, &y, &d, (int)p[0], (int)p[1]);
}
