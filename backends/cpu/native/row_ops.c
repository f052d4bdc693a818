/* A mixture of experts' router ops on float32 rows: SOFT_MAX (scaled, without a mask), TOP_K,
 * GET_ROWS of float32 rows, SUM_ROWS and CLAMP.
 *
 * A decode step's router takes one token's row of 8 to 256 expert logits through these ops
 * between its compiled products (ffn_gate_inp before them, the experts' MUL_MAT_ID after). As
 * numpy calls each cost 5-20 µs, more than their arithmetic, and each split the layer's
 * replay run (replay.c) in three. Here each is one replayable call.
 *
 * SOFT_MAX and SUM_ROWS are ggml's CPU ops (ggml-cpu/ops.cpp): the row's maximum subtracted,
 * the exponentials summed in double, the row times the sum's inverse; SUM_ROWS in double.
 * TOP_K's indices come in numpy's stable argsort of -a order (ggml leaves the order open):
 * largest first, equal values by index, NaN after every number; k is small (a router's 1 to
 * 32: an insertion into the k kept, O(n k)). CLAMP carries NaN, as the array kernel's numpy
 * maximum and minimum do (ggml's MAX(MIN(x, hi), lo) makes it hi): the results must equal
 * the array kernels'.
 */
#include "blocks.h"

#define ROW_OPS_THREAD_WORK (1 << 16)   /* values from which an op runs threaded */

static inline int threaded(int n_threads, int64_t n_rows, int64_t n) {
    return n_threads > 1 && n_rows > 1 && n_rows * n >= ROW_OPS_THREAD_WORK;
}

/* row r of t's rows, in ggml's order (i1 fastest) */
static inline uint8_t *nth_row(const pd_tensor *t, int64_t r) {
    const int64_t ne1 = t->ne[1], ne2 = t->ne[2];
    return tensor_row(t, r % ne1, (r / ne1) % ne2, r / (ne1 * ne2));
}

static inline int64_t n_rows_of(const pd_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

/* --- SOFT_MAX ------------------------------------------------------------------------------ */

static float row_max(const float *x, int64_t n, float scale) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const float v = x[j] * scale;
        m = v > m || v != v ? v : m;     /* a NaN wins, as numpy's max keeps it */
        if (m != m) return m;
    }
    return m;
}

/* d = exp(x scale - m), returning the sum of d in double */
static double exp_row(const float *x, float *d, int64_t n, float scale, float m) {
    double sum = 0.0;
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 s = _mm256_set1_ps(scale), mv = _mm256_set1_ps(m);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), s), mv));
        _mm256_storeu_ps(d + j, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double parts[4];
    _mm256_storeu_pd(parts, _mm256_add_pd(lo, hi));
    sum = (parts[0] + parts[1]) + (parts[2] + parts[3]);
#endif
    for (; j < n; j++) {
        d[j] = expf(x[j] * scale - m);
        sum += d[j];
    }
    return sum;
}

/* each row of a scaled, then its softmax, into d (a and d may be the same memory) */
void pd_soft_max_f32(const pd_tensor *a, const pd_tensor *d, float scale, int n_threads) {
    const int64_t n = a->ne[0], n_rows = n_rows_of(a);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (threaded(n_threads, n_rows, n))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = (const float *)nth_row(a, r);
        float *y = (float *)nth_row(d, r);
        const float m = row_max(x, n, scale);
        const float inv = (float)(1.0 / exp_row(x, y, n, scale, m));
        for (int64_t j = 0; j < n; j++) y[j] *= inv;
    }
}

void pd_soft_max_f32_packed(const int64_t *a, float scale) {
    const pd_tensor x = tensor_at(a), d = tensor_at(a + TENSOR_WORDS);
    pd_soft_max_f32(&x, &d, scale, (int)a[2 * TENSOR_WORDS]);
}

/* --- TOP_K --------------------------------------------------------------------------------- */

/* whether value v (at a later index) goes before u: larger, or a number where u is NaN */
static inline int before(float v, float u) { return v > u || (u != u && v == v); }

/* the k largest of x's n values, their indices largest first into out: an insertion into the
 * k kept so far (O(n k): for a router's k, below a sort's cost) */
static void top_k_row(const float *x, int64_t n, int32_t *out, int64_t k) {
    int64_t kept = 0;
    for (int64_t j = 0; j < n; j++) {
        const float v = x[j];
        if (kept == k && !before(v, x[out[k - 1]])) continue;
        int64_t at = kept < k ? kept++ : k - 1;
        for (; at > 0 && before(v, x[out[at - 1]]); at--) out[at] = out[at - 1];
        out[at] = (int32_t)j;
    }
}

/* the indices of each row's d->ne[0] largest values of a, largest first */
void pd_top_k_f32(const pd_tensor *a, const pd_tensor *d, int n_threads) {
    const int64_t n = a->ne[0], k = d->ne[0], n_rows = n_rows_of(a);
    const int parallel = threaded(n_threads, n_rows, n * k);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t r = 0; r < n_rows; r++)
        top_k_row((const float *)nth_row(a, r), n, (int32_t *)nth_row(d, r), k);
}

void pd_top_k_f32_packed(const int64_t *a) {
    const pd_tensor x = tensor_at(a), d = tensor_at(a + TENSOR_WORDS);
    pd_top_k_f32(&x, &d, (int)a[2 * TENSOR_WORDS]);
}

/* --- GET_ROWS of float32 rows -------------------------------------------------------------- */

/* d's row (i, i1, i2) is a's row (idx[i, i1, i2], i1, i2) (ggml's batched GET_ROWS). Every
 * index is checked first: 1, with nothing written, where one is outside a's rows, else 0. */
int pd_get_f32_rows(const pd_tensor *a, const pd_tensor *idx, const pd_tensor *d) {
    const int64_t n = d->ne[0], n_idx = idx->ne[0], m = idx->ne[1] * idx->ne[2];
    for (int64_t r = 0; r < m; r++) {
        const uint8_t *row = tensor_row(idx, r % idx->ne[1], r / idx->ne[1], 0);
        for (int64_t i = 0; i < n_idx; i++) {
            const int32_t v = *(const int32_t *)(row + i * idx->nb[0]);
            if (v < 0 || v >= a->ne[1]) return 1;
        }
    }
    for (int64_t r = 0; r < m; r++) {
        const int64_t i1 = r % idx->ne[1], i2 = r / idx->ne[1];
        const uint8_t *row = tensor_row(idx, i1, i2, 0);
        for (int64_t i = 0; i < n_idx; i++) {
            const int32_t v = *(const int32_t *)(row + i * idx->nb[0]);
            memmove(tensor_row(d, i, i1, i2), tensor_row(a, v, i1, i2), (size_t)n * 4);
        }
    }
    return 0;
}

int pd_get_f32_rows_packed(const int64_t *a) {
    const pd_tensor x = tensor_at(a), idx = tensor_at(a + TENSOR_WORDS);
    const pd_tensor d = tensor_at(a + 2 * TENSOR_WORDS);
    return pd_get_f32_rows(&x, &idx, &d);
}

/* --- SUM_ROWS and CLAMP -------------------------------------------------------------------- */

/* d's one value per row: the sum of a's row, in double */
void pd_sum_rows_f32(const pd_tensor *a, const pd_tensor *d, int n_threads) {
    const int64_t n = a->ne[0], n_rows = n_rows_of(a);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (threaded(n_threads, n_rows, n))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = (const float *)nth_row(a, r);
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += x[j];
        *(float *)nth_row(d, r) = (float)sum;
    }
}

void pd_sum_rows_f32_packed(const int64_t *a) {
    const pd_tensor x = tensor_at(a), d = tensor_at(a + TENSOR_WORDS);
    pd_sum_rows_f32(&x, &d, (int)a[2 * TENSOR_WORDS]);
}

/* d = a held within [lo, hi]; NaN stays NaN (a and d may be the same memory) */
void pd_clamp_f32(const pd_tensor *a, const pd_tensor *d, float lo, float hi, int n_threads) {
    const int64_t n = a->ne[0], n_rows = n_rows_of(a);
#pragma omp parallel for num_threads(n_threads) schedule(static) if (threaded(n_threads, n_rows, n))
    for (int64_t r = 0; r < n_rows; r++) {
        const float *x = (const float *)nth_row(a, r);
        float *y = (float *)nth_row(d, r);
        for (int64_t j = 0; j < n; j++) {
            const float v = x[j] < lo ? lo : x[j];
            y[j] = v > hi ? hi : v;
        }
    }
}

void pd_clamp_f32_packed(const int64_t *a, float lo, float hi) {
    const pd_tensor x = tensor_at(a), d = tensor_at(a + TENSOR_WORDS);
    pd_clamp_f32(&x, &d, lo, hi, (int)a[2 * TENSOR_WORDS]);
}
