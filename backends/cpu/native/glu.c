/* The gated linear units of float32 rows: SWIGLU, silu(x) * g = x / (1 + exp(-x)) * g.
 *
 * The array kernel's numpy calls (exp, add, divide, multiply) cost more in calls than in
 * arithmetic on a decode step's row. Here the same float32 operations in the same order run
 * in one pass, exp by exp8 (blocks.h, about 1 ulp; numpy's own float32 exp is of the same
 * accuracy) and expf for the last values of a row.
 */
#include "blocks.h"

#define GLU_THREAD_WORK (1 << 16)   /* values from which SWIGLU runs threaded */

static inline float silu_times(float x, float g) { return x / (expf(-x) + 1.0f) * g; }

/* d[r] = silu(x[r]) * g[r] for n_rows rows of n; strides in floats */
void pd_swiglu_f32(const float *x, int64_t xs, const float *g, int64_t gs, float *d, int64_t ds,
                   int64_t n_rows, int64_t n, int n_threads) {
    int parallel = n_threads > 1 && n_rows > 1 && n_rows * n >= GLU_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * xs, *gr = g + r * gs;
        float *dr = d + r * ds;
        int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
        for (; j + 8 <= n; j += 8) {
            __m256 v = _mm256_loadu_ps(xr + j);
            __m256 e = _mm256_add_ps(exp8(_mm256_xor_ps(v, sign)), one);
            _mm256_storeu_ps(dr + j, _mm256_mul_ps(_mm256_div_ps(v, e), _mm256_loadu_ps(gr + j)));
        }
#endif
        for (; j < n; j++) dr[j] = silu_times(xr[j], gr[j]);
    }
}

void pd_swiglu_f32_packed(const int64_t *a) {
    pd_swiglu_f32((const float *)P_PTR(0), a[1], (const float *)P_PTR(2), a[3], (float *)P_PTR(4),
                  a[5], a[6], a[7], (int)a[8]);
}
