/* FLASH_ATTN_EXT over an fp16 KV cache: ggml's online softmax, blocked where the build has
 * AVX2, and per query row for masks that hide most cells (several sequences in one cache).
 *
 * Attention is two products per head, Q K^T and P V, with a softmax between; per row it would
 * read every K and V cell once per query. The blocked kernel takes a tile of queries with
 * every head that shares one KV head (about FA_ROWS rows: a decode step's tile is its query's
 * heads), converts a block of FA_CELLS cells of K and V to float32 once for all of them, and
 * multiplies in registers, keeping each row's running maximum, sum and output as the online
 * softmax does. Cells the mask hides (-inf) are skipped a block at a time: a causal prompt
 * computes about half of the products. A prompt's tiles hold their scores transposed (a
 * vector is one cell of several rows), which makes the softmax lane-wise.
 */
#include "blocks.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static inline float f16_dot(const float *q, const uint8_t *k, int64_t n) {
    int64_t j = 0;
    float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + 2 * j))), acc);
    sum = hsum8(acc);
#endif
    for (; j < n; j++) sum += q[j] * f16(k + 2 * j);
    return sum;
}

static inline void f16_axpy(float *y, const uint8_t *v, float a, int64_t n) {
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 va = _mm256_set1_ps(a);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(
            _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + 2 * j))), va,
            _mm256_loadu_ps(y + j)));
#endif
    for (; j < n; j++) y[j] += a * f16(v + 2 * j);
}

#define FA_THREAD_WORK (1 << 16)     /* multiply-adds from which attention runs threaded */
#define FP16_HIDDEN 0xFC00           /* fp16 -inf: a cell the mask hides */

/* The first cell from c on, below hi, that the mask row shows (hi where none): runs of hidden
 * cells are passed 16 at a time. A batch of sequences shares one cache whose cells interleave,
 * so each row sees a few hundred of a few thousand cells; checking them one by one, for every
 * head, was most of a decode step's attention (3.7 of 15.9 ms, 8 sequences, 1B-class llama). */
static inline int64_t next_shown(const uint8_t *mrow, int64_t c, int64_t hi) {
    const uint16_t *m = (const uint16_t *)mrow;
#if defined(__AVX2__)
    const __m256i hidden = _mm256_set1_epi16((short)FP16_HIDDEN);
    for (; c + 16 <= hi; c += 16) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(m + c));
        const unsigned bytes = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi16(v, hidden));
        if (bytes != 0xFFFFFFFFu) return c + __builtin_ctz(~bytes) / 2;
    }
#endif
    for (; c < hi; c++)
        if (m[c] != FP16_HIDDEN) return c;
    return hi;
}

/* FLASH_ATTN_EXT's operands as the kernels below read them (pd_flash_attn_f16 makes them
 * from its tensors). Strides are in bytes;
 * q[s][i][h] (D floats), k/v[s][h_kv][cell] (D / Dv halves), mask[s % m3][h % m2][i][cell]
 * (halves, or NULL), out[s][i][h] (Dv floats, contiguous); the cells [lo, hi) are attended;
 * slopes (ALiBi, per head) and sinks (per head) may be NULL. */
typedef struct {
    const uint8_t *q, *k, *v, *mask;
    int64_t q1, q2, q3, k1, k2, k3, v1, v2, v3, m1, m2s, m3s, m2, m3;
    float *out;
    int64_t D, Dv, n_q, n_head, n_head_kv, n_seq, lo, hi;
    float scale, softcap;
    const float *slopes, *sinks;
} fa_op;

/* FLASH_ATTN_EXT with fp16 K and V: ggml's online softmax per (sequence, query, head) over
 * the cells [lo, hi), skipping cells the mask sets to -inf as ggml does: where the build has
 * neither the blocked kernel nor the grouped one (masks per head, a head per KV head). */
static void attend_by_rows(const fa_op *op, int n_threads) {
    const uint8_t *q = op->q, *k = op->k, *v = op->v, *mask = op->mask;
    const int64_t q1 = op->q1, q2 = op->q2, q3 = op->q3, k1 = op->k1, k2 = op->k2, k3 = op->k3;
    const int64_t v1 = op->v1, v2 = op->v2, v3 = op->v3, m1 = op->m1, m2s = op->m2s;
    const int64_t m3s = op->m3s, m2 = op->m2, m3 = op->m3, D = op->D, Dv = op->Dv;
    const int64_t n_q = op->n_q, n_head = op->n_head, lo = op->lo, hi = op->hi;
    const float scale = op->scale, softcap = op->softcap, *slopes = op->slopes, *sinks = op->sinks;
    float *out = op->out;
    int64_t group = n_head / op->n_head_kv, n_work = op->n_seq * n_q * n_head;
    /* threads pay off once the products outweigh waking them (a few µs): a decode step's few
     * heads over a hundred cells already do */
    int parallel = n_threads > 1 && n_work > 1 && n_work * (hi - lo) * (D + Dv) >= FA_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t w = 0; w < n_work; w++) {
        int64_t h = w % n_head, i = (w / n_head) % n_q, s = w / (n_head * n_q);
        const float *qv = (const float *)(q + s * q3 + h * q2 + i * q1);
        const uint8_t *kh = k + s * k3 + (h / group) * k2, *vh = v + s * v3 + (h / group) * v2;
        const uint8_t *mrow = mask ? mask + (s % m3) * m3s + (h % m2) * m2s + i * m1 : 0;
        float *acc = out + ((s * n_q + i) * n_head + h) * Dv;
        float slope = slopes ? slopes[h] : 1.0f, M = -INFINITY, S = 0.0f;
        for (int64_t j = 0; j < Dv; j++) acc[j] = 0.0f;
        for (int64_t c = lo; c < hi; c++) {
            if (mrow && (c = next_shown(mrow, c, hi)) == hi) break;
            float mv = mrow ? slope * f16(mrow + 2 * c) : 0.0f;
            if (mv == -INFINITY) continue;
            float x = f16_dot(qv, kh + c * k1, D) * scale;
            if (softcap != 0.0f) x = softcap * tanhf(x);
            x += mv;
            float vs = 1.0f;
            if (x > M) {
                float ms = expf(M - x);
                for (int64_t j = 0; j < Dv; j++) acc[j] *= ms;
                S *= ms;
                M = x;
            } else {
                vs = expf(x - M);
            }
            f16_axpy(acc, vh + c * v1, vs, Dv);
            S += vs;
        }
        if (sinks) {
            float x = sinks[h], ms = 1.0f, vs = 1.0f;
            if (x > M) {
                ms = expf(M - x);
                for (int64_t j = 0; j < Dv; j++) acc[j] *= ms;
            } else {
                vs = expf(x - M);
            }
            S = S * ms + vs;
        }
        float inv = S == 0.0f ? 0.0f : 1.0f / S;
        for (int64_t j = 0; j < Dv; j++) acc[j] *= inv;
    }
}



/* --- a few query rows, the heads of a KV head together ------------------------------------- */

#define FA_GROUP_HEADS 8      /* query heads attended together: one K/V read for all of them
                                 * (and the lanes of one AVX vector in softmax_heads) */
#define FA_GROUP_MAX_D 256    /* the widest heads the grouped kernel takes (on its stack) */

/* n fp16 values to float32 */
static inline void f16_row(const uint8_t *h, float *out, int64_t n) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(out + j,
                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 2 * j))));
#endif
#if defined(__F16C__) && defined(__AVX__)
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 2 * j))));
#endif
    for (; j < n; j++) out[j] = f16(h + 2 * j);
}

/* dots[g] = q[g] . k for nh rows (nh <= FA_GROUP_HEADS): k read once, nh independent sums */
static inline void dot_heads(const float *const *q, int64_t nh, const float *k, int64_t n,
                             float *dots) {
    int64_t j = 0;
    for (int64_t g = 0; g < nh; g++) dots[g] = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc[FA_GROUP_HEADS];
    for (int64_t g = 0; g < nh; g++) acc[g] = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 kv = _mm256_loadu_ps(k + j);
        for (int64_t g = 0; g < nh; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + j), kv, acc[g]);
    }
    for (int64_t g = 0; g < nh; g++) dots[g] = hsum8(acc[g]);
#endif
    for (; j < n; j++)
        for (int64_t g = 0; g < nh; g++) dots[g] += q[g][j] * k[j];
}

/* out[g] += weight[g] v for nh rows of n values (v read once per 8 values for all) */
static inline void axpy_heads(float (*out)[FA_GROUP_MAX_D], int64_t nh, const float *v,
                              const float *weight, int64_t n) {
    for (int64_t g = 0; g < nh; g++) {
        int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 a = _mm256_set1_ps(weight[g]);
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(out[g] + j, _mm256_fmadd_ps(_mm256_loadu_ps(v + j), a,
                                                         _mm256_loadu_ps(out[g] + j)));
#endif
        for (; j < n; j++) out[g][j] += weight[g] * v[j];
    }
}

/* Ask for cell c's K and V rows (where c < hi). The grouped kernel spends long enough on each
 * cell that the hardware prefetchers fall behind on a cache whose rows are strided: without
 * this it ran slower than the row kernel inside a model (0.70 against 0.55 ms a layer) though
 * faster alone on data in cache. */
#define FA_PREFETCH_CELLS 4
static inline void prefetch_cell(const uint8_t *kh, const uint8_t *vh, const fa_op *op,
                                 int64_t c) {
    if (c >= op->hi) return;
    for (int64_t b = 0; b < 2 * op->D; b += 64) __builtin_prefetch(kh + c * op->k1 + b);
    for (int64_t b = 0; b < 2 * op->Dv; b += 64) __builtin_prefetch(vh + c * op->v1 + b);
}

/* 1 where the grouped kernel takes the op: a mask shared by the heads (or none), several
 * query heads per KV head, heads no wider than its buffers */
static int groups_apply(const fa_op *op) {
    return (!op->mask || op->m2 == 1) && op->n_head / op->n_head_kv > 1
           && op->D <= FA_GROUP_MAX_D && op->Dv <= FA_GROUP_MAX_D;
}

/* One cell's step of the online softmax for nh heads: their dot products x with the cell's K
 * become scores (scaled, soft-capped, plus the slope times the mask's m where masked); a head
 * whose maximum grows has its sum and output rescaled (rare after the first cells); vs gets
 * each head's weight of the cell's V (0 where the score is -inf). */
static inline void softmax_heads(const fa_op *op, int64_t h0, int64_t nh, float *x, float m,
                                 int masked, float *M, float *S,
                                 float (*acc)[FA_GROUP_MAX_D], float *vs) {
    for (int64_t g = 0; g < nh; g++) {
        float xg = x[g] * op->scale;
        if (op->softcap != 0.0f) xg = op->softcap * tanhf(xg);
        x[g] = xg + (masked ? (op->slopes ? op->slopes[h0 + g] : 1.0f) * m : 0.0f);
    }
#if defined(__AVX2__) && defined(__FMA__)
    /* the heads as the lanes of one vector: two exp8 for all of them where the scalar code
     * called expf once per head per cell, which took most of a D = 64 layer's attention */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 used = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)nh), lane));
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 xv = _mm256_blendv_ps(ninf, _mm256_loadu_ps(x), used);
    const __m256 old = _mm256_loadu_ps(M);
    const __m256 top = _mm256_max_ps(xv, old);               /* a NaN score keeps M */
    float tops[FA_GROUP_HEADS];
    _mm256_storeu_ps(tops, top);
    int grew = _mm256_movemask_ps(_mm256_cmp_ps(top, old, _CMP_GT_OQ));
    for (; grew; grew &= grew - 1) {
        const int g = __builtin_ctz(grew);
        const float ms = expf(M[g] - tops[g]);
        for (int64_t j = 0; j < op->Dv; j++) acc[g][j] *= ms;
        S[g] *= ms;
    }
    /* a head's new maximum weighs 1 exactly, as in ggml (exp8 of inf - inf would be NaN) */
    const __m256 hidden = _mm256_cmp_ps(xv, ninf, _CMP_EQ_OQ);
    const __m256 w = _mm256_andnot_ps(hidden, _mm256_blendv_ps(
        exp8(_mm256_sub_ps(xv, top)), _mm256_set1_ps(1.0f), _mm256_cmp_ps(xv, top, _CMP_EQ_OQ)));
    _mm256_storeu_ps(M, top);
    _mm256_storeu_ps(S, _mm256_add_ps(_mm256_loadu_ps(S), w));
    _mm256_storeu_ps(vs, w);
#else
    for (int64_t g = 0; g < nh; g++) {
        const float xg = x[g];
        vs[g] = 0.0f;
        if (xg == -INFINITY) continue;
        vs[g] = 1.0f;
        if (xg > M[g]) {
            const float ms = expf(M[g] - xg);
            for (int64_t j = 0; j < op->Dv; j++) acc[g][j] *= ms;
            S[g] *= ms;
            M[g] = xg;
        } else {
            vs[g] = expf(xg - M[g]);
        }
        S[g] += vs[g];
    }
#endif
}

/* The row kernel's online softmax for up to FA_GROUP_HEADS query heads of one KV head at
 * once, for the queries of several sequences whose cells interleave in the cache (the blocked
 * kernel would compute every hidden cell of their spans): each shown cell's K and V are
 * converted once for all the heads, and their dot products are independent sums (the row
 * kernel's one chain of dependent adds per head waited on each add). On a 1B-class llama (32
 * heads over 4 KV heads, 2 Zen 4 threads) a layer's attention went from 0.52 to 0.33 ms for a
 * batch of 8 sequences over 1800 interleaved cells. */
static void attend_row_groups(const fa_op *op, int n_threads) {
    const int64_t G = op->n_head / op->n_head_kv;
    const int64_t chunks = (G + FA_GROUP_HEADS - 1) / FA_GROUP_HEADS;
    const int64_t n_work = op->n_seq * op->n_q * op->n_head_kv * chunks, D = op->D, Dv = op->Dv;
    int parallel = n_threads > 1 && n_work > 1
                   && n_work * FA_GROUP_HEADS * (op->hi - op->lo) * (D + Dv) >= FA_THREAD_WORK;
#pragma omp parallel for num_threads(n_threads) schedule(static) if (parallel)
    for (int64_t w = 0; w < n_work; w++) {
        const int64_t chunk = w % chunks, hk = (w / chunks) % op->n_head_kv;
        const int64_t i = (w / (chunks * op->n_head_kv)) % op->n_q;
        const int64_t s = w / (chunks * op->n_head_kv * op->n_q);
        const int64_t h0 = hk * G + chunk * FA_GROUP_HEADS;
        const int64_t left = G - chunk * FA_GROUP_HEADS;
        const int64_t nh = left < FA_GROUP_HEADS ? left : FA_GROUP_HEADS;
        const uint8_t *kh = op->k + s * op->k3 + hk * op->k2;
        const uint8_t *vh = op->v + s * op->v3 + hk * op->v2;
        const uint8_t *mrow = op->mask ? op->mask + (s % op->m3) * op->m3s + i * op->m1 : 0;
        const float *q[FA_GROUP_HEADS];
        float kf[FA_GROUP_MAX_D], vf[FA_GROUP_MAX_D], acc[FA_GROUP_HEADS][FA_GROUP_MAX_D];
        float M[FA_GROUP_HEADS], S[FA_GROUP_HEADS], x[FA_GROUP_HEADS], vs[FA_GROUP_HEADS];
        for (int64_t g = 0; g < FA_GROUP_HEADS; g++) {    /* every lane: softmax_heads' vectors */
            M[g] = -INFINITY;
            S[g] = x[g] = vs[g] = 0.0f;
        }
        for (int64_t g = 0; g < nh; g++) {
            q[g] = (const float *)(op->q + s * op->q3 + (h0 + g) * op->q2 + i * op->q1);
            for (int64_t j = 0; j < Dv; j++) acc[g][j] = 0.0f;
        }
        for (int64_t c = op->lo; c < op->hi; c++) {
            if (mrow && (c = next_shown(mrow, c, op->hi)) == op->hi) break;
            prefetch_cell(kh, vh, op, c + FA_PREFETCH_CELLS);
            f16_row(kh + c * op->k1, kf, D);
            dot_heads(q, nh, kf, D, x);
            softmax_heads(op, h0, nh, x, mrow ? f16(mrow + 2 * c) : 0.0f, mrow != 0, M, S, acc,
                          vs);
            f16_row(vh + c * op->v1, vf, Dv);
            axpy_heads(acc, nh, vf, vs, Dv);
        }
        for (int64_t g = 0; g < nh; g++) {
            const int64_t h = h0 + g;
            float ms = 1.0f, sink = 0.0f;
            if (op->sinks) {                         /* a sink: a cell with no value */
                const float xs = op->sinks[h];
                if (xs > M[g]) {
                    ms = expf(M[g] - xs);
                    sink = 1.0f;
                } else {
                    sink = expf(xs - M[g]);
                }
            }
            const float total = S[g] * ms + sink, f = total == 0.0f ? 0.0f : ms / total;
            float *out = op->out + ((s * op->n_q + i) * op->n_head + h) * Dv;
            for (int64_t j = 0; j < Dv; j++) out[j] = acc[g][j] * f;
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BLOCKED_ATTENTION 1
#define FA_CELLS 64          /* KV cells converted and multiplied at a time */
/* query rows per tile, about: queries x the heads of a KV head. Each block of K and V is
 * converted once per tile, so a larger tile converts less per product: 32 rows took 17.8 ms
 * where 64 take 14.6 (SmolLM2's heads, the last 512 of 4096 prompt tokens, 2 Zen 5 threads,
 * with 8 rows per multiply-add pass). 128 were 1-5% faster still there, but skip a causal
 * prompt's hidden cells more coarsely and give a short prompt fewer tiles for the threads. */
#define FA_ROWS 64
#define FA_SPARSE_RATIO 3    /* ... unless its rows see fewer than a third of their spans */


/* one thread's memory for a tile of `rows` rows (RP of them padded, padded_rows) */
typedef struct {
    float *Q;                /* [rows][D]: the tile's query rows */
    float *Qt;               /* [D][RP]: the same transposed (the transposed kernel's) */
    float *Kt;               /* [D][FA_CELLS]: a block of K, transposed; the transposed
                              * kernel's [FA_CELLS][D]: K as the cache has it */
    float *V;                /* [FA_CELLS][Dv]: a block of V */
    float *S;                /* [rows][FA_CELLS]: scores, then their exp; the transposed
                              * kernel's [FA_CELLS][RP] */
    float *maskT;            /* [FA_CELLS][RP]: the transposed kernel's block of the mask */
    float *O;                /* [rows][Dv]: each row's output so far */
    float *M, *L;            /* [RP]: each row's running maximum and sum */
    int64_t *first, *last;   /* [rows]: the first and last cell the mask shows each row */
    const uint8_t **mask;    /* [rows]: each row's mask row, or NULL */
} fa_scratch;

/* the tile's rows as the transposed kernel's vectors hold them: whole products of columns */
static int64_t padded_rows(int64_t rows);

static size_t fa_scratch_floats(int64_t rows, int64_t D, int64_t Dv) {
    const int64_t RP = padded_rows(rows);
    const int64_t floats = rows * D + D * RP + D * FA_CELLS + FA_CELLS * Dv + 2 * FA_CELLS * RP
                           + rows * Dv + 2 * RP;
    return (size_t)((floats + 15) / 16 * 16);            /* the integers after: aligned */
}

static size_t fa_scratch_bytes(int64_t rows, int64_t D, int64_t Dv) {
    return sizeof(float) * fa_scratch_floats(rows, D, Dv) + sizeof(int64_t) * 2 * rows
           + sizeof(void *) * rows;
}

static fa_scratch fa_scratch_at(void *mem, int64_t rows, int64_t D, int64_t Dv) {
    const int64_t RP = padded_rows(rows);
    fa_scratch t;
    t.Q = mem;
    t.Qt = t.Q + rows * D;
    t.Kt = t.Qt + D * RP;
    t.V = t.Kt + D * FA_CELLS;
    t.S = t.V + FA_CELLS * Dv;
    t.maskT = t.S + FA_CELLS * RP;
    t.O = t.maskT + FA_CELLS * RP;
    t.M = t.O + rows * Dv;
    t.L = t.M + RP;
    t.first = (int64_t *)((float *)mem + fa_scratch_floats(rows, D, Dv));
    t.last = t.first + rows;
    t.mask = (const uint8_t **)(t.last + rows);
    return t;
}

/* rows multiplied at a time: each row's sums take two vector registers, of 32 with AVX-512
 * and 16 with AVX2. With AVX-512, 8 rows make the loads of B one per 8 multiply-adds (4 rows:
 * one per 4): SmolLM2's prompt attention above went from 17.8 to 15.5 ms (32-row tiles), and
 * a tile's two products alone run at 486 GFLOP/s on 2 Zen 5 threads, about the multiply-add
 * peak; the softmax and converting K and V take the rest (a third). */
#if defined(__AVX512F__)
#define MAC_ROWS 8
#else
#define MAC_ROWS 4
#endif

/* C[r][0:16] = (C[r][0:16] where `accumulate`, else 0) + sum_i A[r][i] B[i][0:16] for R rows
 * (a constant of each inlined copy, so the 2 R sums stay in registers), A[r][i] at
 * A + r a_row + i a_step; strides in floats. Both products of a tile: Q K^T (A = Q, B = K
 * transposed; or A = K, B = Q transposed) and P V (A = P, or P transposed; B = V). */
static inline __attribute__((always_inline)) void mac16_rows(
        const float *A, int64_t a_row, int64_t a_step, const float *B, int64_t b_stride,
        int64_t n, float *C, int64_t c_stride, int accumulate, const int R) {
    __m256 acc[8][2];                 /* R <= 8: the remainders of 8-row passes too */
    for (int r = 0; r < R; r++) {
        acc[r][0] = accumulate ? _mm256_loadu_ps(C + r * c_stride) : _mm256_setzero_ps();
        acc[r][1] = accumulate ? _mm256_loadu_ps(C + r * c_stride + 8) : _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n; i++) {
        __m256 b0 = _mm256_loadu_ps(B + i * b_stride), b1 = _mm256_loadu_ps(B + i * b_stride + 8);
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * a_row + i * a_step);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(C + r * c_stride, acc[r][0]);
        _mm256_storeu_ps(C + r * c_stride + 8, acc[r][1]);
    }
}

#if defined(__AVX512F__)
/* mac16_rows for 32 columns, in two 16-float registers per row: the same multiply-adds in
 * the same order (so the same results) in half the instructions. A prompt's attention over
 * 4096 cells is most of its time (83% of SmolLM2's last 512 tokens), and the 8-float form
 * gave AVX-512 hosts half their multiply-add width. */
static inline __attribute__((always_inline)) void mac32_rows(
        const float *A, int64_t a_row, int64_t a_step, const float *B, int64_t b_stride,
        int64_t n, float *C, int64_t c_stride, int accumulate, const int R) {
    __m512 acc[MAC_ROWS][2];
    for (int r = 0; r < R; r++) {
        acc[r][0] = accumulate ? _mm512_loadu_ps(C + r * c_stride) : _mm512_setzero_ps();
        acc[r][1] = accumulate ? _mm512_loadu_ps(C + r * c_stride + 16) : _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < n; i++) {
        __m512 b0 = _mm512_loadu_ps(B + i * b_stride), b1 = _mm512_loadu_ps(B + i * b_stride + 16);
        for (int r = 0; r < R; r++) {
            __m512 a = _mm512_set1_ps(A[r * a_row + i * a_step]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(C + r * c_stride, acc[r][0]);
        _mm512_storeu_ps(C + r * c_stride + 16, acc[r][1]);
    }
}
#define MAC_COLUMNS 32
#define mac_rows mac32_rows
#else
#define MAC_COLUMNS 16
#define mac_rows mac16_rows
#endif
_Static_assert(FA_CELLS % MAC_COLUMNS == 0, "a block's cells are whole products of columns");

/* S[r][0:FA_CELLS] = Q[r] . Kt for R rows */
static inline __attribute__((always_inline)) void qk_rows(const float *Q, int64_t D,
                                                          const float *Kt, float *S, const int R) {
    for (int c0 = 0; c0 < FA_CELLS; c0 += MAC_COLUMNS)
        mac_rows(Q, D, 1, Kt + c0, FA_CELLS, D, S + c0, FA_CELLS, 0, R);
}

/* O[r] += sum_c P[r][c] V[c] over n cells, for R rows; P[r][c] at P + r p_row + c p_cell */
static inline __attribute__((always_inline)) void pv_rows(const float *P, int64_t p_row,
                                                          int64_t p_cell, const float *V,
                                                          int64_t n, int64_t Dv, float *O,
                                                          const int R) {
    int64_t j0 = 0;
    for (; j0 + MAC_COLUMNS <= Dv; j0 += MAC_COLUMNS)
        mac_rows(P, p_row, p_cell, V + j0, Dv, n, O + j0, Dv, 1, R);
    for (; j0 + 16 <= Dv; j0 += 16)
        mac16_rows(P, p_row, p_cell, V + j0, Dv, n, O + j0, Dv, 1, R);
    for (; j0 < Dv; j0++)
        for (int r = 0; r < R; r++) {
            float sum = O[r * Dv + j0];
            for (int64_t c = 0; c < n; c++) sum += P[r * p_row + c * p_cell] * V[c * Dv + j0];
            O[r * Dv + j0] = sum;
        }
}

/* CALL(r, R) for the rows [0, rows): MAC_ROWS at a time, then the rest in one pass (a row
 * alone: twice the loads per multiply-add); R a constant in each call */
#define BY_ROW_BLOCKS(rows, CALL)                                                           \
    do {                                                                                    \
        int64_t r_ = 0;                                                                     \
        for (; r_ + MAC_ROWS <= (rows); r_ += MAC_ROWS) CALL(r_, MAC_ROWS);                 \
        switch ((rows) - r_) {                                                              \
        case 7: CALL(r_, 7); break;                                                         \
        case 6: CALL(r_, 6); break;                                                         \
        case 5: CALL(r_, 5); break;                                                         \
        case 4: CALL(r_, 4); break;                                                         \
        case 3: CALL(r_, 3); break;                                                         \
        case 2: CALL(r_, 2); break;                                                         \
        case 1: CALL(r_, 1); break;                                                         \
        }                                                                                   \
    } while (0)

/* S[r] = Q[r] . Kt for the tile's rows */
static void qk_tile(const float *Q, int64_t D, const float *Kt, float *S, int64_t rows) {
#define QK_AT(r, R) qk_rows(Q + (r) * D, D, Kt, S + (r) * FA_CELLS, R)
    BY_ROW_BLOCKS(rows, QK_AT);
#undef QK_AT
}

/* O[r] += P[r] V over n cells for the tile's rows */
static void pv_tile(const float *P, const float *V, int64_t n, int64_t Dv, float *O,
                    int64_t rows) {
#define PV_AT(r, R) pv_rows(P + (r) * FA_CELLS, FA_CELLS, 1, V, n, Dv, O + (r) * Dv, R)
    BY_ROW_BLOCKS(rows, PV_AT);
#undef PV_AT
}

/* the cells [first, last] of a mask row that are not -inf within [lo, hi); first > last when
 * it hides them all */
static void visible_cells(const uint8_t *mrow, int64_t lo, int64_t hi, int64_t *first,
                          int64_t *last) {
    const uint16_t *m = (const uint16_t *)mrow, hidden = FP16_HIDDEN;
    int64_t a = lo, b = hi - 1;
    while (a < hi && m[a] == hidden) a++;
    while (b >= a && m[b] == hidden) b--;
    *first = a;
    *last = b;
}

/* the tile's rows: their queries, mask rows and visible cells; returns the cells to visit */
static void tile_rows(const fa_op *op, int64_t s, int64_t hk, int64_t i0, int64_t nq,
                      fa_scratch *t, int64_t *lo, int64_t *hi) {
    const int64_t G = op->n_head / op->n_head_kv;
    *lo = op->hi;
    *hi = op->lo;
    for (int64_t qi = 0; qi < nq; qi++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t row = qi * G + g, i = i0 + qi, h = hk * G + g;
            const float *qv = (const float *)(op->q + s * op->q3 + h * op->q2 + i * op->q1);
            memcpy(t->Q + row * op->D, qv, sizeof(float) * op->D);
            t->M[row] = -INFINITY;
            t->L[row] = 0.0f;
            memset(t->O + row * op->Dv, 0, sizeof(float) * op->Dv);
            t->first[row] = op->lo;
            t->last[row] = op->hi - 1;
            t->mask[row] = op->mask ? op->mask + (s % op->m3) * op->m3s + (h % op->m2) * op->m2s
                                      + i * op->m1 : 0;
            if (t->mask[row]) {
                if (g > 0 && op->m2 == 1) {          /* the heads share the query's mask row */
                    t->first[row] = t->first[row - 1];
                    t->last[row] = t->last[row - 1];
                } else {
                    visible_cells(t->mask[row], op->lo, op->hi, t->first + row, t->last + row);
                }
            }
            if (t->first[row] < *lo) *lo = t->first[row];
            if (t->last[row] + 1 > *hi) *hi = t->last[row] + 1;
        }
}

/* rows[0..7] (8 floats each) transposed: column j of the 8 x 8 block to out + j * stride */
static inline __attribute__((always_inline)) void store_transposed8(__m256 *rows, float *out,
                                                                    int64_t stride) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
        b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
        b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
        b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_ps(out + j * stride, _mm256_permute2f128_ps(b[j], b[j + 4], 0x20));
        _mm256_storeu_ps(out + (j + 4) * stride, _mm256_permute2f128_ps(b[j], b[j + 4], 0x31));
    }
}

/* K and V cells [c0, c0 + n) of KV head hk to float32: K transposed, the unused columns 0 */
static void load_block(const fa_op *op, int64_t s, int64_t hk, int64_t c0, int64_t n,
                       fa_scratch *t) {
    const uint8_t *kh = op->k + s * op->k3 + hk * op->k2, *vh = op->v + s * op->v3 + hk * op->v2;
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {            /* 8 cells at a time: 8 x 8 blocks transposed */
        int64_t d = 0;
        for (; d + 8 <= op->D; d += 8) {
            __m256 rows[8];
            for (int i = 0; i < 8; i++)
                rows[i] = _mm256_cvtph_ps(_mm_loadu_si128(
                    (const __m128i *)(kh + (c0 + c + i) * op->k1 + 2 * d)));
            store_transposed8(rows, t->Kt + d * FA_CELLS + c, FA_CELLS);
        }
        for (; d < op->D; d++)
            for (int i = 0; i < 8; i++)
                t->Kt[d * FA_CELLS + c + i] = f16(kh + (c0 + c + i) * op->k1 + 2 * d);
    }
    for (; c < n; c++)
        for (int64_t d = 0; d < op->D; d++)
            t->Kt[d * FA_CELLS + c] = f16(kh + (c0 + c) * op->k1 + 2 * d);
    for (c = 0; c < n; c++) {
        const uint8_t *vc = vh + (c0 + c) * op->v1;
        int64_t d = 0;
        for (; d + 8 <= op->Dv; d += 8)
            _mm256_storeu_ps(t->V + c * op->Dv + d,
                             _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vc + 2 * d))));
        for (; d < op->Dv; d++) t->V[c * op->Dv + d] = f16(vc + 2 * d);
    }
    if (n < FA_CELLS)
        for (int64_t d = 0; d < op->D; d++)
            memset(t->Kt + d * FA_CELLS + n, 0, sizeof(float) * (FA_CELLS - n));
}

/* row `row`'s scores of cells [c0, c0 + n) to exp(score - new maximum), with its running
 * maximum, sum and output rescaled; all 0 where the row sees none of these cells */
/* score c of a row: scaled, soft-capped, masked; -inf outside the cells the row sees */
static inline float masked_score(const fa_op *op, const fa_scratch *t, int64_t row, float slope,
                                 float x, int64_t cell) {
    float v = x * op->scale;
    if (op->softcap != 0.0f) v = op->softcap * tanhf(v);
    if (cell < t->first[row] || cell > t->last[row]) return -INFINITY;
    if (!t->mask[row]) return v;
    const float m = slope * f16(t->mask[row] + 2 * cell);
    return m == -INFINITY ? m : v + m;           /* hidden whatever its score (NaN too) */
}

/* the row's scores of cells [c0, c0 + n) as masked_score makes them, 8 at a time where there
 * is no soft-capping (the same float operations); returns their maximum, NaN if one is NaN */
static float mask_scores(const fa_op *op, const fa_scratch *t, int64_t row, float slope,
                         float *x, int64_t c0, int64_t n) {
    const uint8_t *mrow = t->mask[row];
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i first = _mm256_set1_epi32((int)(t->first[row] - c0));
    const __m256i last = _mm256_set1_epi32((int)(t->last[row] - c0));
    __m256 vmax = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t c = 0;
    if (op->softcap == 0.0f && t->first[row] - c0 > INT32_MIN && t->last[row] - c0 < INT32_MAX)
        for (; c + 8 <= n; c += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + c), _mm256_set1_ps(op->scale));
            if (mrow) {            /* a hidden cell is -inf whatever its score (NaN too) */
                __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mrow + 2 * (c0 + c))));
                m = _mm256_mul_ps(_mm256_set1_ps(slope), m);
                v = _mm256_blendv_ps(_mm256_add_ps(v, m), _mm256_set1_ps(-INFINITY),
                                     _mm256_cmp_ps(m, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
            }
            __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)c), lanes);
            __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi32(first, idx),
                                              _mm256_cmpgt_epi32(idx, last));
            v = _mm256_blendv_ps(v, _mm256_set1_ps(-INFINITY), _mm256_castsi256_ps(outside));
            _mm256_storeu_ps(x + c, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            vmax = _mm256_max_ps(vmax, v);
        }
    float m_block = _mm256_movemask_ps(nan) ? NAN : hmax8(vmax);
    for (; c < n; c++) {
        const float v = masked_score(op, t, row, slope, x[c], c0 + c);
        x[c] = v;
        if (v != v) m_block = v;                           /* NaN stays NaN */
        else if (v > m_block && m_block == m_block) m_block = v;
    }
    return m_block;
}

#if defined(__AVX512F__)
#define SOFTMAX_LANES 16
/* mask_scores 16 at a time: the same float operations lane for lane, the same maximum */
static float mask_scores16(const fa_op *op, const fa_scratch *t, int64_t row, float slope,
                           float *x, int64_t c0, int64_t n) {
    const uint8_t *mrow = t->mask[row];
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                            15);
    const __m512i first = _mm512_set1_epi32((int)(t->first[row] - c0));
    const __m512i last = _mm512_set1_epi32((int)(t->last[row] - c0));
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 vmax = ninf;
    __mmask16 nan = 0;
    int64_t c = 0;
    if (op->softcap == 0.0f && t->first[row] - c0 > INT32_MIN && t->last[row] - c0 < INT32_MAX)
        for (; c + 16 <= n; c += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + c), _mm512_set1_ps(op->scale));
            if (mrow) {            /* a hidden cell is -inf whatever its score (NaN too) */
                __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(
                    (const __m256i *)(mrow + 2 * (c0 + c))));
                m = _mm512_mul_ps(_mm512_set1_ps(slope), m);
                v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_EQ_OQ),
                                         _mm512_add_ps(v, m), ninf);
            }
            __m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)c), lanes);
            __mmask16 outside = _mm512_cmpgt_epi32_mask(first, idx)
                                | _mm512_cmpgt_epi32_mask(idx, last);
            v = _mm512_mask_blend_ps(outside, v, ninf);
            _mm512_storeu_ps(x + c, v);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vmax = _mm512_max_ps(vmax, v);
        }
    float m_block = nan ? NAN : _mm512_reduce_max_ps(vmax);
    for (; c < n; c++) {
        const float v = masked_score(op, t, row, slope, x[c], c0 + c);
        x[c] = v;
        if (v != v) m_block = v;                           /* NaN stays NaN */
        else if (v > m_block && m_block == m_block) m_block = v;
    }
    return m_block;
}
#endif

/* row `row`'s scores of the block's cells [c0, c0 + n) to their weights exp(score - M), with
 * its running maximum M, sum L and output rescaled; 16 lanes at a time where the build has
 * AVX-512 (about a quarter of a prompt's attention was this, 8 lanes at a time) */
static void softmax_block(const fa_op *op, fa_scratch *t, int64_t row, int64_t h, int64_t c0,
                          int64_t n) {
    float *x = t->S + row * FA_CELLS;
    const float slope = op->slopes ? op->slopes[h] : 1.0f;
#ifdef SOFTMAX_LANES
    const float m_block = mask_scores16(op, t, row, slope, x, c0, n);
#else
    const float m_block = mask_scores(op, t, row, slope, x, c0, n);
#endif
    if (m_block == -INFINITY) {
        memset(x, 0, sizeof(float) * FA_CELLS);
        return;
    }
    const float m_new = t->M[row] > m_block ? t->M[row] : m_block;    /* NaN: m_block */
    const float alpha = t->M[row] == -INFINITY ? 0.0f : expf(t->M[row] - m_new);
#ifdef SOFTMAX_LANES
    __m512 sum16 = _mm512_setzero_ps(), mv16 = _mm512_set1_ps(m_new);
    for (int64_t c = 0; c < FA_CELLS; c += 16) {
        /* the cells past the block: 0 */
        const __mmask16 in = c + 16 <= n ? (__mmask16)0xFFFF
                             : c >= n ? (__mmask16)0 : (__mmask16)((1u << (n - c)) - 1);
        __m512 p = _mm512_maskz_mov_ps(in, exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), mv16)));
        _mm512_storeu_ps(x + c, p);
        sum16 = _mm512_add_ps(sum16, p);
    }
    t->L[row] = t->L[row] * alpha + _mm512_reduce_add_ps(sum16);
#else
    __m256 sum = _mm256_setzero_ps(), mv = _mm256_set1_ps(m_new);
    for (int64_t c = 0; c < FA_CELLS; c += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv));
        if (c + 8 > n) {                                   /* the cells past the block: 0 */
            __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)c),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            p = _mm256_and_ps(p, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32((int)n), idx)));
        }
        _mm256_storeu_ps(x + c, p);
        sum = _mm256_add_ps(sum, p);
    }
    t->L[row] = t->L[row] * alpha + hsum8(sum);
#endif
    if (alpha != 1.0f)
        for (int64_t j = 0; j < op->Dv; j++) t->O[row * op->Dv + j] *= alpha;
    t->M[row] = m_new;
}

/* Ask for the K and V rows of the cells [c0, c0 + FA_CELLS) below hi of KV head hk, while
 * the block before them is multiplied. In a model the cache comes from memory (a step's
 * weights pass through the caches between two layers' attention), its rows are strided (a
 * cell's KV heads side by side), and the hardware prefetchers fell behind: a decode step of the
 * 1B-class llama over 1500 cells took 9.26 ms without, 8.46 ms with (one block ahead; two:
 * 8.56), against 9.15 ms for the grouped row kernel. */
static void prefetch_block(const fa_op *op, int64_t s, int64_t hk, int64_t c0, int64_t hi) {
    const uint8_t *kh = op->k + s * op->k3 + hk * op->k2, *vh = op->v + s * op->v3 + hk * op->v2;
    const int64_t end = c0 + FA_CELLS < hi ? c0 + FA_CELLS : hi;
    for (int64_t c = c0; c < end; c++) {
        for (int64_t b = 0; b < 2 * op->D; b += 64) __builtin_prefetch(kh + c * op->k1 + b);
        for (int64_t b = 0; b < 2 * op->Dv; b += 64) __builtin_prefetch(vh + c * op->v1 + b);
    }
}

/* --- a prompt's tiles with their scores transposed --------------------------------------- */

/* The row kernel above works on the scores S[row][cell]: per block each row's maximum and sum
 * are reductions across a vector, and its rescale factor a scalar exp, chains of dependent
 * operations that made the softmax a quarter of a prompt's attention for a tenth of its
 * arithmetic; and Q K^T needs K transposed, an 8 x 8 shuffle per 64 values of every block.
 * Here the scores are transposed, St[cell][row]: a vector holds one cell of SOFTMAX_WIDTH rows,
 * so the maxima, sums and rescale factors are lane-wise over the cells, with no reduction;
 * K multiplies as the cache stores it, and Q is transposed once per tile instead. The scores
 * and the products are the row kernel's (the same multiply-adds in the same order); a row's
 * sum adds its weights in another order, and the factor that rescales a row whose maximum
 * grew comes from the vector exp (exp16 or exp8, about an ulp from expf). It takes tiles of
 * TRANSPOSED_ROWS rows or more (a prompt's, or a decode step's where 32 or more query heads
 * share a KV head), as a vector holds whole columns of rows; a decode step's usual tile (one
 * query's few heads) stays with the row kernel, as do soft-capped scores (tanh is scalar). On
 * SmolLM2's heads (the last 512 of 4096 prompt tokens, 2 Zen 5 threads) the softmax went from
 * 3.4 to 2.2 ms of a layer's 14.6, now 13.9 (AVX2: 27.0 to 25.7). */
#define TRANSPOSED_ROWS 32

#if defined(__AVX512F__)
#define SOFTMAX_WIDTH 16
typedef __m512 fvec;
typedef __mmask16 fmask;
#define fv_load _mm512_loadu_ps
#define fv_store _mm512_storeu_ps
#define fv_set1 _mm512_set1_ps
#define fv_zero _mm512_setzero_ps
#define fv_add _mm512_add_ps
#define fv_sub _mm512_sub_ps
#define fv_mul _mm512_mul_ps
#define fv_max _mm512_max_ps
#define fv_exp exp16
#define fv_cmp(a, b, op) _mm512_cmp_ps_mask(a, b, op)
#define fv_blend(m, a, b) _mm512_mask_blend_ps(m, a, b)       /* m ? b : a */
#define fm_bits(m) ((unsigned)(m))
#else
#define SOFTMAX_WIDTH 8
typedef __m256 fvec;
typedef __m256 fmask;
#define fv_load _mm256_loadu_ps
#define fv_store _mm256_storeu_ps
#define fv_set1 _mm256_set1_ps
#define fv_zero _mm256_setzero_ps
#define fv_add _mm256_add_ps
#define fv_sub _mm256_sub_ps
#define fv_mul _mm256_mul_ps
#define fv_max _mm256_max_ps
#define fv_exp exp8
#define fv_cmp(a, b, op) _mm256_cmp_ps(a, b, op)
#define fv_blend(m, a, b) _mm256_blendv_ps(a, b, m)
#define fm_bits(m) ((unsigned)_mm256_movemask_ps(m))
#endif

static int64_t padded_rows(int64_t rows) {
    return (rows + MAC_COLUMNS - 1) / MAC_COLUMNS * MAC_COLUMNS;
}

static int transposed_applies(const fa_op *op, int64_t rows) {
    return op->softcap == 0.0f && rows >= TRANSPOSED_ROWS;
}

/* Qt = the tile's Q transposed, its padding rows 0; their running maxima and sums set as the
 * real rows' are (they are computed and never read) */
static void transpose_queries(fa_scratch *t, int64_t rows, int64_t D) {
    const int64_t RP = padded_rows(rows);
    for (int64_t d = 0; d < D; d++) {
        float *out = t->Qt + d * RP;
        for (int64_t r = 0; r < rows; r++) out[r] = t->Q[r * D + d];
        for (int64_t r = rows; r < RP; r++) out[r] = 0.0f;
    }
    for (int64_t r = rows; r < RP; r++) {
        t->M[r] = -INFINITY;
        t->L[r] = 0.0f;
    }
}

/* K and V cells [c0, c0 + n) of KV head hk to float32 as the cache stores them */
static void load_block_rows(const fa_op *op, int64_t s, int64_t hk, int64_t c0, int64_t n,
                            fa_scratch *t) {
    const uint8_t *kh = op->k + s * op->k3 + hk * op->k2, *vh = op->v + s * op->v3 + hk * op->v2;
    for (int64_t c = 0; c < n; c++) {
        f16_row(kh + (c0 + c) * op->k1, t->Kt + c * op->D, op->D);
        f16_row(vh + (c0 + c) * op->v1, t->V + c * op->Dv, op->Dv);
    }
}

/* 1 where a mask row shows values other than 0 among n cells (-0 counts as 0) */
static int mask_has_values(const uint8_t *mrow, int64_t n) {
    const uint16_t *m = (const uint16_t *)mrow;
    int64_t c = 0;
    const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
    for (; c + 16 <= n; c += 16)
        if (!_mm256_testz_si256(_mm256_loadu_si256((const __m256i *)(m + c)), magnitude))
            return 1;
    for (; c < n; c++)
        if (m[c] & 0x7FFF) return 1;
    return 0;
}

/* maskT[c][r] = row r's mask at cell c0 + c (times the row's slope) for the block's n cells;
 * returns 0, with maskT untouched, where every row's mask is 0 there (the usual block of a
 * causal prompt: only those on its diagonal take the mask) */
static int transpose_mask(const fa_op *op, fa_scratch *t, int64_t rows, int64_t hk,
                          int64_t c0, int64_t n) {
    const int64_t G = op->n_head / op->n_head_kv, RP = padded_rows(rows);
    int any = 0;
    for (int64_t r = 0; r < rows && !any; r++)
        if (t->mask[r] && (r == 0 || t->mask[r] != t->mask[r - 1]))
            any = mask_has_values(t->mask[r] + 2 * c0, n);
    if (!any) return 0;
    for (int64_t r = 0; r < RP; r++) {
        const uint8_t *m = r < rows && t->mask[r] ? t->mask[r] + 2 * c0 : 0;
        const float slope = r < rows && op->slopes ? op->slopes[hk * G + r % G] : 1.0f;
        for (int64_t c = 0; c < n; c++)
            t->maskT[c * RP + r] = !m               ? 0.0f
                                   : op->slopes ? slope * f16(m + 2 * c) : f16(m + 2 * c);
    }
    return 1;
}

/* St[c][0:RP] = K[c] . Qt for the block's n cells */
static void qk_transposed(const fa_scratch *t, int64_t D, int64_t RP, int64_t n) {
#define QKT(c, R) mac_rows(t->Kt + (c) * D, D, 1, t->Qt + j0, RP, D, t->S + (c) * RP + j0, RP, \
                           0, R)
    for (int64_t j0 = 0; j0 < RP; j0 += MAC_COLUMNS) BY_ROW_BLOCKS(n, QKT);
#undef QKT
}

/* O[r] += sum_c St[c][r] V[c] over the block's n cells, for the tile's rows */
static void pv_transposed(fa_scratch *t, int64_t rows, int64_t RP, int64_t n, int64_t Dv) {
#define PVT(r, R) pv_rows(t->S + (r), 1, RP, t->V, n, Dv, t->O + (r) * Dv, R)
    BY_ROW_BLOCKS(rows, PVT);
#undef PVT
}

/* The block's scores St[c][r] (c < n) to their weights exp(score - M), with each row's running
 * maximum M, sum L and output rescaled, SOFTMAX_WIDTH rows at a time: softmax_block's
 * operations lane for lane, but for the order of a row's sum and the vector exp of its
 * rescale factor. `masked`: maskT holds the block's mask (transpose_mask), else no cell of it
 * is masked. */
static void softmax_transposed(const fa_op *op, fa_scratch *t, int64_t rows, int64_t n,
                               int masked) {
    const int64_t RP = padded_rows(rows);
    const fvec ninf = fv_set1(-INFINITY), scale = fv_set1(op->scale), one = fv_set1(1.0f);
    for (int64_t r0 = 0; r0 < RP; r0 += SOFTMAX_WIDTH) {
        fvec vmax = ninf, nan = fv_zero();
        for (int64_t c = 0; c < n; c++) {
            float *x = t->S + c * RP + r0;
            fvec v = fv_mul(fv_load(x), scale);
            if (masked) {          /* a hidden cell is -inf whatever its score (NaN too) */
                const fvec m = fv_load(t->maskT + c * RP + r0);
                v = fv_blend(fv_cmp(m, ninf, _CMP_EQ_OQ), fv_add(v, m), ninf);
            }
            fv_store(x, v);
#if defined(__AVX512F__)
            nan = _mm512_mask_blend_ps(fv_cmp(v, v, _CMP_UNORD_Q), nan, v);
#else
            nan = _mm256_or_ps(nan, fv_cmp(v, v, _CMP_UNORD_Q));
#endif
            vmax = fv_max(vmax, v);
        }
        /* a NaN score makes the block's maximum NaN, as in softmax_block */
        const fvec m_block = fv_blend(fv_cmp(nan, nan, _CMP_UNORD_Q), vmax, fv_set1(NAN));
        const fvec M = fv_load(t->M + r0);
        /* rows that see none of these cells keep their state; their weights exp(-inf - 0) */
        const fmask none = fv_cmp(m_block, ninf, _CMP_EQ_OQ);
        const fvec m_new = fv_blend(none, fv_max(M, m_block), M);     /* NaN: m_block */
        const fvec alpha = fv_blend(none, fv_blend(fv_cmp(M, ninf, _CMP_EQ_OQ),
                                                   fv_exp(fv_sub(M, m_new)), fv_zero()), one);
        const fvec mv = fv_blend(none, m_new, fv_zero());
        fvec sum = fv_zero();
        for (int64_t c = 0; c < n; c++) {
            float *x = t->S + c * RP + r0;
            const fvec p = fv_exp(fv_sub(fv_load(x), mv));
            fv_store(x, p);
            sum = fv_add(sum, p);
        }
        fv_store(t->L + r0, fv_add(fv_mul(fv_load(t->L + r0), alpha), sum));
        fv_store(t->M + r0, m_new);
        float a[SOFTMAX_WIDTH];
        fv_store(a, alpha);
        for (unsigned bits = fm_bits(fv_cmp(alpha, one, _CMP_NEQ_UQ)); bits; bits &= bits - 1) {
            const int64_t r = r0 + __builtin_ctz(bits);
            if (r < rows)
                for (int64_t j = 0; j < op->Dv; j++) t->O[r * op->Dv + j] *= a[r - r0];
        }
    }
}

/* the transposed kernel's pass over the tile's cells [lo, hi) (attend_tile_span's) */
static void attend_span_transposed(const fa_op *op, int64_t s, int64_t hk, fa_scratch *t,
                                   int64_t rows, int64_t lo, int64_t hi) {
    const int64_t RP = padded_rows(rows);
    transpose_queries(t, rows, op->D);
    prefetch_block(op, s, hk, lo, hi);
    for (int64_t c0 = lo; c0 < hi; c0 += FA_CELLS) {
        const int64_t n = hi - c0 < FA_CELLS ? hi - c0 : FA_CELLS;
        load_block_rows(op, s, hk, c0, n, t);
        prefetch_block(op, s, hk, c0 + FA_CELLS, hi);
        const int masked = transpose_mask(op, t, rows, hk, c0, n);
        qk_transposed(t, op->D, RP, n);
        softmax_transposed(op, t, rows, n, masked);
        pv_transposed(t, rows, RP, n, op->Dv);
    }
}

/* queries [i0, i0 + nq) of sequence s with the heads of KV head hk, over span `part` of
 * `parts` of the cells they see (whole blocks each, so the parts' blocks are the single
 * pass's): the tile's running maxima, sums and outputs left in t (unscaled) */
static void attend_tile_span(const fa_op *op, int64_t s, int64_t hk, int64_t i0, int64_t nq,
                             fa_scratch *t, int64_t part, int64_t parts) {
    const int64_t G = op->n_head / op->n_head_kv, rows = nq * G;
    int64_t lo, hi;
    tile_rows(op, s, hk, i0, nq, t, &lo, &hi);
    if (parts > 1 && hi > lo) {                /* blocks p B / parts .. (p + 1) B / parts */
        const int64_t blocks = (hi - lo + FA_CELLS - 1) / FA_CELLS;
        const int64_t from = lo + part * blocks / parts * FA_CELLS;
        const int64_t to = lo + (part + 1) * blocks / parts * FA_CELLS;
        lo = from;
        hi = to < hi ? to : hi;
    }
    if (transposed_applies(op, rows)) {
        attend_span_transposed(op, s, hk, t, rows, lo, hi);
        return;
    }
    prefetch_block(op, s, hk, lo, hi);
    for (int64_t c0 = lo; c0 < hi; c0 += FA_CELLS) {
        const int64_t n = hi - c0 < FA_CELLS ? hi - c0 : FA_CELLS;
        load_block(op, s, hk, c0, n, t);
        prefetch_block(op, s, hk, c0 + FA_CELLS, hi);
        qk_tile(t->Q, op->D, t->Kt, t->S, rows);
        for (int64_t r = 0; r < rows; r++) softmax_block(op, t, r, hk * G + r % G, c0, n);
        pv_tile(t->S, t->V, n, op->Dv, t->O, rows);
    }
}

/* the tile's outputs from t: its sinks, then 1 / sum */
static void finish_tile(const fa_op *op, int64_t s, int64_t hk, int64_t i0, int64_t nq,
                        const fa_scratch *t) {
    const int64_t G = op->n_head / op->n_head_kv, rows = nq * G;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = hk * G + r % G, i = i0 + r / G;
        float S = t->L[r], ms = 1.0f;
        if (op->sinks) {
            float x = op->sinks[h], M = t->M[r], vs = 1.0f;
            if (x > M) ms = expf(M - x);
            else vs = expf(x - M);
            S = S * ms + vs;
        }
        const float f = S == 0.0f ? 0.0f : ms / S;
        float *out = op->out + ((s * op->n_q + i) * op->n_head + h) * op->Dv;
        for (int64_t j = 0; j < op->Dv; j++) out[j] = t->O[r * op->Dv + j] * f;
    }
}

/* queries [i0, i0 + nq) of sequence s with the heads of KV head hk */
static void attend_tile(const fa_op *op, int64_t s, int64_t hk, int64_t i0, int64_t nq,
                        fa_scratch *t) {
    attend_tile_span(op, s, hk, i0, nq, t, 0, 1);
    finish_tile(op, s, hk, i0, nq, t);
}

/* part's running maxima, sums and outputs merged into into's (rows rows of Dv): the online
 * softmax of two spans of cells is their states, each rescaled to the larger maximum */
static void merge_parts(fa_scratch *into, const fa_scratch *part, int64_t rows, int64_t Dv) {
    for (int64_t r = 0; r < rows; r++) {
        const float a = into->M[r], b = part->M[r];
        if (b == -INFINITY) continue;                    /* the part saw none of its cells */
        const float m = a > b ? a : b;                   /* NaN: b */
        const float fa = a == -INFINITY ? 0.0f : expf(a - m), fb = expf(b - m);
        for (int64_t j = 0; j < Dv; j++)
            into->O[r * Dv + j] = into->O[r * Dv + j] * fa + part->O[r * Dv + j] * fb;
        into->L[r] = into->L[r] * fa + part->L[r] * fb;
        into->M[r] = a != a ? a : m;                     /* NaN stays NaN */
    }
}

/* 1 when the mask hides most cells inside the span each query row sees: the queries of many
 * sequences in one batch, whose cells interleave in the cache. The blocked kernel computes a
 * tile's rows over the whole span, while the row kernel skips each hidden cell, so there the
 * rows cost less. A causal prompt sees its whole span and stays blocked. */
static int mostly_hidden(const fa_op *op) {
    if (!op->mask) return 0;
    const uint16_t hidden = FP16_HIDDEN;
    int64_t seen = 0, spans = 0;
    for (int64_t s = 0; s < op->n_seq && s < op->m3; s++)
        for (int64_t i = 0; i < op->n_q; i++) {
            const uint16_t *m = (const uint16_t *)(op->mask + s * op->m3s + i * op->m1);
            int64_t first = -1, last = -1;
            for (int64_t c = op->lo; c < op->hi; c++)
                if (m[c] != hidden) {
                    seen++;
                    if (first < 0) first = c;
                    last = c;
                }
            spans += first < 0 ? 0 : last - first + 1;
        }
    return seen * FA_SPARSE_RATIO < spans;
}

/* A decode step of a model with fewer KV heads than threads (gemma-3's one, the tiles of a
 * few sequences) has fewer tiles than threads: each tile's cells are then split into
 * `parts` spans, one per thread, merged after (flash decoding), where the cells are at least
 * two blocks: below that a thread's wake costs more than its share. */
static int64_t parts_per_tile(const fa_op *op, int64_t n_tiles, int n_threads) {
    if (n_tiles >= n_threads) return 1;
    const int64_t wanted = (n_threads + n_tiles - 1) / n_tiles;
    const int64_t most = (op->hi - op->lo) / FA_CELLS;
    return wanted < most ? wanted : (most > 1 ? most : 1);
}

/* the blocked kernel; 0 where its memory could not be had (the caller then goes by rows) */
static int attend_blocked(const fa_op *op, int n_threads) {
    const int64_t G = op->n_head / op->n_head_kv;
    const int64_t per_tile = G >= FA_ROWS ? 1 : FA_ROWS / G;          /* queries per tile */
    const int64_t tiles_per_head = (op->n_q + per_tile - 1) / per_tile;
    const int64_t n_tiles = op->n_seq * op->n_head_kv * tiles_per_head;
#ifndef _OPENMP
    n_threads = 1;
#endif
    const int64_t parts = parts_per_tile(op, n_tiles, n_threads);
    const size_t bytes = fa_scratch_bytes(per_tile * G, op->D, op->Dv);
    /* one scratch per thread, or per (tile, part) where the parts are merged after */
    const int64_t n_scratch = parts > 1 ? n_tiles * parts : n_threads;
    char *mem = malloc(bytes * n_scratch);
    if (!mem) return 0;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1) if (n_threads > 1)
    for (int64_t w = 0; w < n_tiles * parts; w++) {
#ifdef _OPENMP
        const int me = omp_get_thread_num();
#else
        const int me = 0;
#endif
        const int64_t tile = w / parts, part = w % parts;
        fa_scratch t = fa_scratch_at(mem + bytes * (parts > 1 ? w : me), per_tile * G, op->D,
                                     op->Dv);
        const int64_t q_part = tile % tiles_per_head, hk = (tile / tiles_per_head) % op->n_head_kv;
        const int64_t s = tile / (tiles_per_head * op->n_head_kv), i0 = q_part * per_tile;
        const int64_t nq = op->n_q - i0 < per_tile ? op->n_q - i0 : per_tile;
        if (parts == 1)
            attend_tile(op, s, hk, i0, nq, &t);
        else
            attend_tile_span(op, s, hk, i0, nq, &t, part, parts);
    }
    for (int64_t tile = 0; parts > 1 && tile < n_tiles; tile++) {
        const int64_t q_part = tile % tiles_per_head, hk = (tile / tiles_per_head) % op->n_head_kv;
        const int64_t s = tile / (tiles_per_head * op->n_head_kv), i0 = q_part * per_tile;
        const int64_t nq = op->n_q - i0 < per_tile ? op->n_q - i0 : per_tile;
        fa_scratch first = fa_scratch_at(mem + bytes * tile * parts, per_tile * G, op->D, op->Dv);
        for (int64_t part = 1; part < parts; part++) {
            const fa_scratch t = fa_scratch_at(mem + bytes * (tile * parts + part), per_tile * G,
                                               op->D, op->Dv);
            merge_parts(&first, &t, nq * G, op->Dv);
        }
        finish_tile(op, s, hk, i0, nq, &first);
    }
    free(mem);
    return 1;
}
#endif

/* FLASH_ATTN_EXT with fp16 K and V over the cells [lo, hi): q [n_seq][n_head][n_q][D]
 * float32, k and v [n_seq][n_head_kv][cells][D or Dv] fp16, mask [.][.][n_q][cells] fp16
 * (broadcast over heads and sequences; its data NULL for none), out [n_seq][n_q][n_head][Dv]
 * float32 and contiguous; slopes (ALiBi) and sinks per head, or NULL. */
void pd_flash_attn_f16(const pd_tensor *q, const pd_tensor *k, const pd_tensor *v,
                       const pd_tensor *mask, const pd_tensor *out, int64_t lo, int64_t hi,
                       float scale, float softcap, const float *slopes, const float *sinks,
                       int n_threads) {
    const fa_op op = {q->data, k->data, v->data, mask->data,
                      q->nb[1], q->nb[2], q->nb[3], k->nb[1], k->nb[2], k->nb[3],
                      v->nb[1], v->nb[2], v->nb[3], mask->nb[1], mask->nb[2], mask->nb[3],
                      mask->ne[2], mask->ne[3], (float *)out->data, q->ne[0], v->ne[0],
                      q->ne[1], q->ne[2], k->ne[2], q->ne[3], lo, hi, scale, softcap, slopes,
                      sinks};
#ifdef BLOCKED_ATTENTION
    if (!mostly_hidden(&op) && attend_blocked(&op, n_threads))
        return;
#endif
    if (groups_apply(&op)) {
        attend_row_groups(&op, n_threads);
        return;
    }
    attend_by_rows(&op, n_threads);
}

void pd_flash_attn_f16_packed(const int64_t *a, float scale, float softcap) {
    const pd_tensor q = tensor_at(a), k = tensor_at(a + TENSOR_WORDS);
    const pd_tensor v = tensor_at(a + 2 * TENSOR_WORDS), mask = tensor_at(a + 3 * TENSOR_WORDS);
    const pd_tensor out = tensor_at(a + 4 * TENSOR_WORDS);
    const int64_t *p = a + 5 * TENSOR_WORDS;
    pd_flash_attn_f16(&q, &k, &v, &mask, &out, p[0], p[1], scale, softcap,
                      (const float *)(intptr_t)p[2], (const float *)(intptr_t)p[3], (int)p[4]);
}
