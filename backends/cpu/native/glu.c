/* The gated linear units of float32 rows: SWIGLU, silu(x) * g = x / (1 + exp(-x)) * g, and
 * GEGLU, gelu(x) * g with ggml's tanh form of GELU.
 *
 * The array kernel's numpy calls (exp, add, divide, multiply; GELU's nine) cost more in calls
 * than in arithmetic on a decode step's row. Here the same float32 operations in the same
 * order run in one pass (SWIGLU's; GEGLU's apart from its tanh), exp by exp8 (blocks.h, about
 * 1 ulp; numpy's own float32 exp is of the same accuracy) and expf for the last values of a
 * row. GELU's 1 + tanh(u) is computed as 2 / (1 + exp(-2 u)), equal in exact arithmetic
 * (numpy's tanh then adding 1 rounds 1 + tanh(u) to 0 below u = -9; this keeps it, down to
 * where exp(-2 u) overflows: 0 there, as numpy's, so -inf gives NaN as numpy's does).
 */
#include "blocks.h"

#define GLU_THREAD_WORK (1 << 16)   /* values from which a GLU runs threaded */

enum { GLU_SWIGLU = 0, GLU_GEGLU = 1 };

#define SQRT_2_OVER_PI 0.79788456080286535588f
#define GELU_COEF_A 0.044715f

static inline float silu_times(float x, float g) { return x / (expf(-x) + 1.0f) * g; }

static inline float gelu_times(float x, float g) {
    const float u = (x * x * GELU_COEF_A + 1.0f) * x * SQRT_2_OVER_PI;
    return x * (2.0f / (expf(-2.0f * u) + 1.0f) * 0.5f) * g;
}

static void swiglu_row(const float *x, const float *g, float *d, int64_t n) {
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256 e = _mm256_add_ps(exp8(_mm256_xor_ps(v, sign)), one);
        _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_div_ps(v, e), _mm256_loadu_ps(g + j)));
    }
#endif
    for (; j < n; j++) d[j] = silu_times(x[j], g[j]);
}

static void geglu_row(const float *x, const float *g, float *d, int64_t n) {
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 half = _mm256_set1_ps(0.5f), minus_two = _mm256_set1_ps(-2.0f);
    const __m256 a = _mm256_set1_ps(GELU_COEF_A), s = _mm256_set1_ps(SQRT_2_OVER_PI);
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256 u = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(
            _mm256_mul_ps(_mm256_mul_ps(v, v), a), one), v), s);
        __m256 m2u = _mm256_mul_ps(minus_two, u);
        __m256 e = _mm256_add_ps(exp8(m2u), one);
        /* exp8 saturates at exp(88) where expf overflows to inf (2 / inf: 0) */
        __m256 over = _mm256_cmp_ps(m2u, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
        __m256 t = _mm256_andnot_ps(over, _mm256_mul_ps(_mm256_div_ps(two, e), half));
        _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_mul_ps(v, t), _mm256_loadu_ps(g + j)));
    }
#endif
    for (; j < n; j++) d[j] = gelu_times(x[j], g[j]);
}

/* d[r] = act(x[r]) * g[r] for n_rows rows of n, act by fn (GLU_*); strides in floats */
void pd_glu_f32(int fn, const float *x, int64_t xs, const float *g, int64_t gs, float *d,
                int64_t ds, int64_t n_rows, int64_t n, int n_threads) {
    int parallel = n_threads > 1 && n_rows > 1 && n_rows * n >= GLU_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < n_rows; r++) {
        if (fn == GLU_GEGLU)
            geglu_row(x + r * xs, g + r * gs, d + r * ds, n);
        else
            swiglu_row(x + r * xs, g + r * gs, d + r * ds, n);
    }
}

void pd_glu_f32_packed(const int64_t *a) {
    pd_glu_f32((int)a[0], (const float *)P_PTR(1), a[2], (const float *)P_PTR(3), a[4],
               (float *)P_PTR(5), a[6], a[7], a[8], (int)a[9]);
}
