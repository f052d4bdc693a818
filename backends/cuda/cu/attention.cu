// FLASH_ATTN_EXT for a few query rows (decode steps, many sequences' tokens at once): one
// block of FA_THREADS threads per (query row, head, sequence) and split of the KV cells, the
// cells in tiles of FA_TILE. Where rows and heads are too few to fill the GPU (one token of
// 32 heads is 32 blocks), the cells are split among blocks that each write their running max,
// sum and unnormalized output to a scratch buffer, and flash_attn_ext_combine merges them
// (flash decoding, ggml's parallel blocks). Each warp scores one cell at a time (lanes over
// the head's channels, then a shuffle sum); the tile's weights are staged in shared memory,
// and each thread accumulates its output channels over the tile with an online softmax: a
// running max and sum, the accumulator rescaled when the max grows, as ggml's kernels do. A
// masked cell (-inf) reads neither K nor V, which keeps a cache shared by many sequences cheap
// to attend over.
// Larger batches of queries go to the batched products of the array kernels.

#define FA_THREADS 128
#define FA_TILE 128
#define FA_MAX_D 1024               // head sizes up to this: FA_MAX_D / FA_THREADS per thread
#define FA_MAX_SPLITS 64            // splits of the cells at most (binders.py's too)

__device__ __forceinline__ float kv_at(const char * row, int i, int is_f16) {
    return is_f16 ? f16_at((const u8 *) row + 2 * i) : ((const float *) row)[i];
}

// The tile's scores (scale, soft-capping, slope * mask) into p (-inf where masked).
__device__ __forceinline__ void fa_scores(TENSOR(k), const float * q, const char * mask_row,
                                          i64 mask_nb0, int t0, int n, int hk, int s,
                                          float scale, float softcap, float slope, int k_f16,
                                          float * p) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
#pragma unroll 4
    for (int jj = warp; jj < n; jj += n_warps) {      // a warp's cells: the same for its lanes
        int j = t0 + jj;
        float bias = mask_row ? slope * f16_at((const u8 *) (mask_row + j * mask_nb0)) : 0.0f;
        float score = NEG_INF;
        if (bias != NEG_INF) {
            const char * row = ROW(k, j, hk, s);
            float dot = 0.0f;
            for (int d = lane; d < k_ne0; d += 32) dot += q[d] * kv_at(row, d, k_f16);
            dot = warp_sum(dot);
            score = dot * scale;
            if (softcap != 0.0f) score = softcap * tanhf(score);
            score += bias;
        }
        if (lane == 0) p[jj] = score;
    }
}

// The partial result of split `split` of (row iq, head h, sequence s): m, l, then v_ne0 values.
__device__ __forceinline__ float * fa_partial(float * partial, int n_splits, int d, int iq,
                                              int h, int s, int n_rows, int n_heads,
                                              int split) {
    i64 block = ((i64) (s * n_heads + h) * n_rows + iq) * n_splits + split;
    return partial + block * (d + 2);
}

// scale is ggml's scale already divided by softcap where softcap is not 0; m0, m1 and
// n_head_log2 are ALiBi's (max_bias > 0). With n_splits > 1, block x is row x / n_splits and
// split x % n_splits, which writes its partial result instead of dst (sinks: at the combine).
extern "C" __global__ void flash_attn_ext_vec(TENSOR(q), TENSOR(k), TENSOR(v), TENSOR(mask),
                                              TENSOR(sinks), TENSOR_OUT(dst), float scale,
                                              float softcap, float max_bias, float m0,
                                              float m1, int n_head_log2, int k_f16,
                                              int v_f16, int has_mask, int has_sinks,
                                              float * partial, int n_splits) {
    __shared__ float q_row[FA_MAX_D];
    __shared__ float p[FA_TILE];
    __shared__ float scratch[32];
    int iq = blockIdx.x / n_splits, split = blockIdx.x % n_splits, h = blockIdx.y, s = blockIdx.z;
    int hk = h / (q_ne2 / k_ne2), hv = h / (q_ne2 / v_ne2);
    int chunk = (k_ne1 + n_splits - 1) / n_splits;
    int first = split * chunk, n_kv = min(k_ne1, first + chunk);
    for (int d = threadIdx.x; d < q_ne0; d += blockDim.x) {
        q_row[d] = *(const float *) ADDR(q, d, iq, h, s);
    }
    float slope = 1.0f;
    if (max_bias > 0.0f) {
        slope = h < n_head_log2 ? powf(m0, (float) (h + 1))
                                : powf(m1, (float) (2 * (h - n_head_log2) + 1));
    }
    const char * mask_row = has_mask ? ROW(mask, iq, h % mask_ne2, s % mask_ne3) : 0;
    float acc[FA_MAX_D / FA_THREADS];
    for (int i = 0; i < FA_MAX_D / FA_THREADS; i++) acc[i] = 0.0f;
    float m = NEG_INF, l = 0.0f;           // the running max and sum of exp(score - m)
    __syncthreads();
    for (int t0 = first; t0 < n_kv; t0 += FA_TILE) {
        int n = min(FA_TILE, n_kv - t0);
        fa_scores(TENSOR_ARGS(k), q_row, mask_row, mask_nb0, t0, n, hk, s, scale, softcap,
                  slope, k_f16, p);
        __syncthreads();
        float mx = NEG_INF;
        for (int jj = threadIdx.x; jj < n; jj += blockDim.x) mx = fmaxf(mx, p[jj]);
        float m_new = fmaxf(m, block_max(mx, scratch));
        if (m_new == NEG_INF) continue;    // nothing visible yet (the same in every thread)
        float part = 0.0f;
        for (int jj = threadIdx.x; jj < n; jj += blockDim.x) {
            float e = p[jj] == NEG_INF ? 0.0f : expf(p[jj] - m_new);
            p[jj] = e;
            part += e;
        }
        part = block_sum(part, scratch);   // its barriers also publish the weights in p
        float corr = m == NEG_INF ? 0.0f : expf(m - m_new);
        l = l * corr + part;
        m = m_new;
        for (int i = 0, d = threadIdx.x; d < v_ne0; i++, d += blockDim.x) {
            float a = acc[i] * corr;
#pragma unroll 8                           // the cells' loads in flight together
            for (int jj = 0; jj < n; jj++) {
                if (p[jj] != 0.0f) a += p[jj] * kv_at(ROW(v, t0 + jj, hv, s), d, v_f16);
            }
            acc[i] = a;
        }
        __syncthreads();                   // the next tile rewrites p
    }
    if (n_splits > 1) {
        float * out = fa_partial(partial, n_splits, v_ne0, iq, h, s, q_ne1, q_ne2, split);
        if (threadIdx.x == 0) {
            out[0] = m;
            out[1] = l;
        }
        for (int i = 0, d = threadIdx.x; d < v_ne0; i++, d += blockDim.x) out[2 + d] = acc[i];
        return;
    }
    if (has_sinks) {                       // the sink's logit joins the denominator only
        float sink = *(const float *) ADDR(sinks, h, 0, 0, 0), m_new = fmaxf(m, sink);
        float corr = m == NEG_INF ? 0.0f : expf(m - m_new);
        l = l * corr + expf(sink - m_new);
        for (int i = 0; i < FA_MAX_D / FA_THREADS; i++) acc[i] *= corr;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;     // a row with every cell masked gives zeros
    for (int i = 0, d = threadIdx.x; d < v_ne0; i++, d += blockDim.x) {
        *(float *) ADDR(dst, d, h, iq, s) = acc[i] * inv;
    }
}

// The splits' partial results of (row, head, sequence) = blockIdx merged into dst: each
// split's sum and output rescaled to the largest max, the sink's logit joining the sum.
extern "C" __global__ void flash_attn_ext_combine(TENSOR(sinks), TENSOR_OUT(dst),
                                                  float * partial, int n_splits,
                                                  int has_sinks) {
    __shared__ float weight[FA_MAX_SPLITS];
    int iq = blockIdx.x, h = blockIdx.y, s = blockIdx.z, d_v = dst_ne0;
    const float * first = fa_partial(partial, n_splits, d_v, iq, h, s, gridDim.x, gridDim.y,
                                     0);
    float m = has_sinks ? *(const float *) ADDR(sinks, h, 0, 0, 0) : NEG_INF;
    for (int k = 0; k < n_splits; k++) m = fmaxf(m, first[k * (d_v + 2)]);
    float l = 0.0f;
    for (int k = 0; k < n_splits; k++) {
        float mk = first[k * (d_v + 2)];
        float w = mk == NEG_INF ? 0.0f : expf(mk - m);
        l += first[k * (d_v + 2) + 1] * w;
        if (threadIdx.x == 0) weight[k] = w;
    }
    if (has_sinks) l += expf(*(const float *) ADDR(sinks, h, 0, 0, 0) - m);
    __syncthreads();
    float inv = l > 0.0f ? 1.0f / l : 0.0f;     // a row with every cell masked gives zeros
    for (int d = threadIdx.x; d < d_v; d += blockDim.x) {
        float o = 0.0f;
        for (int k = 0; k < n_splits; k++) {
            if (weight[k] != 0.0f) o += first[k * (d_v + 2) + 2 + d] * weight[k];
        }
        *(float *) ADDR(dst, d, h, iq, s) = o * inv;
    }
}
