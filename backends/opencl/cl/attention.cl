// FLASH_ATTN_EXT: softmax(softcap(scale * q.k) + slope * mask) @ v with an online softmax.
// One work-group of LS work-items per (query row, head, sequence): NDRange (LS, n_q,
// n_head * n_seq). Each kv position's score is a group-wide dot product; each work-item
// keeps the running output of the value dimensions d = lid, lid + LS, ... (Dv <= DV_MAX).
// K and V are read through KV_AT: f32/f16 (SRC1_T) or a block format (QUANT_T).

#define DV_MAX 1024
#define DV_PER_ITEM (DV_MAX / LS)      // value dimensions per work-item

#ifdef QUANT_T
#define KV_AT(t, d, j, h, s) DEQ((const global uchar *) ROW(t, j, h, s), d)
#else
#define KV_AT(t, d, j, h, s) LOAD1(ADDR(t, d, j, h, s))
#endif

// One step of the online softmax: a new score joins the running max *m and sum *total; the
// running outputs are to be scaled by the returned factor, and the score's weight is *w.
inline float online_softmax(float score, float * m, float * total, float * w) {
    float m_new = fmax(*m, score);
    float correction = exp(*m - m_new);
    *w = exp(score - m_new);
    *total = *total * correction + *w;
    *m = m_new;
    return correction;
}

kernel void flash_attn(TENSOR(q), TENSOR(k), TENSOR(v), TENSOR(mask), TENSOR(sinks), TENSOR(dst),
                       float scale, float softcap, float max_bias, float m0, float m1,
                       int n_head_log2, int has_mask, int has_sinks) {
    local float buf[LS];
    int lid = get_local_id(0), iq = get_global_id(1), hs = get_global_id(2);
    int n_head = q_ne2, h = hs % n_head, s = hs / n_head;
    int hk = h / (n_head / k_ne2), hv = h / (n_head / v_ne2);
    float slope = alibi_slope(h, max_bias, m0, m1, n_head_log2);
    float acc[DV_PER_ITEM];
    for (int i = 0; i < DV_PER_ITEM; i++) acc[i] = 0.0f;
    float m = -INFINITY, total = 0.0f;
    for (int j = 0; j < k_ne1; j++) {
        float mv = has_mask ? load_f16(ADDR(mask, j, iq, h % mask_ne2, s % mask_ne3)) : 0.0f;
        // a masked position still takes part in the reduction: every work-item must reach
        // every barrier (PoCL miscompiles a loop that skips one, even uniformly)
        bool masked = mv == -INFINITY;
        float part = 0.0f;
        for (int d = lid; d < q_ne0 && !masked; d += LS) {
            part += load_f32(ADDR(q, d, iq, h, s)) * KV_AT(k, d, j, hk, s);
        }
        float score = group_sum(buf, part) * scale;
        if (masked) continue;
        if (softcap != 0.0f) score = softcap * tanh(score);
        score += slope * mv;
        float w, correction = online_softmax(score, &m, &total, &w);
        for (int i = 0, d = lid; d < v_ne0; i++, d += LS) {
            acc[i] = acc[i] * correction + w * KV_AT(v, d, j, hv, s);
        }
    }
    if (has_sinks) {
        float w, correction = online_softmax(load_f32(ADDR(sinks, h, 0, 0, 0)), &m, &total, &w);
        for (int i = 0, d = lid; d < v_ne0; i++, d += LS) acc[i] *= correction;
    }
    float inv = total > 0.0f ? 1.0f / total : 0.0f;     // a fully masked row gives 0
    for (int i = 0, d = lid; d < v_ne0; i++, d += LS) {
        *(global float *) ADDR(dst, d, h, iq, s) = acc[i] * inv;
    }
}

// The same on a CPU device, without barriers: one work-item per (query row, head, sequence)
// walks the kv positions, skips the masked ones, and keeps all Dv (<= DV_ROWS_MAX) running
// outputs itself. NDRange (n_q, n_head * n_seq). Dk <= DV_ROWS_MAX too (q is kept in private
// memory). With -D KV_F16X16 (fp16 K and V rows of whole 16-value chunks, the usual KV cache)
// rows are read and multiplied 16 lanes at a time; element by element, each half converted
// alone, was most of the time. As ggml's CPU kernel, a position costs one exp: the running
// outputs are rescaled only when a score raises the running max.
#define DV_ROWS_MAX 512
#ifdef QUANT_T
#define KV_ROW_AT(row, t, d) DEQ((const global uchar *) (row), d)
#else
#define KV_ROW_AT(row, t, d) LOAD1((row) + (d) * t##_nb0)
#endif

#ifdef KV_F16X16
inline float row_dot(const float * qv, const global char * krow, int n) {
    float16 s = 0.0f;
    for (int c = 0; c < n / 16; c++)
        s += ((const float16 *) qv)[c] * load_f16x16((const global half *) krow, c);
    return sum16(s);
}

inline void row_axpy(float * acc, const global char * vrow, float w, int n) {
    for (int c = 0; c < n / 16; c++)
        ((float16 *) acc)[c] += w * load_f16x16((const global half *) vrow, c);
}
#define ROW_DOT(qv, krow) row_dot(qv, krow, q_ne0)
#define ROW_AXPY(acc, vrow, w) row_axpy(acc, vrow, w, v_ne0)
#else
#define ROW_DOT(qv, krow) row_dot_any(qv, krow, q_ne0, k_nb0)
#define ROW_AXPY(acc, vrow, w) row_axpy_any(acc, vrow, w, v_ne0, v_nb0)
inline float row_dot_any(const float * qv, const global char * krow, int n, int k_nb0) {
    float score = 0.0f;
    for (int d = 0; d < n; d++) score += qv[d] * KV_ROW_AT(krow, k, d);
    return score;
}

inline void row_axpy_any(float * acc, const global char * vrow, float w, int n, int v_nb0) {
    for (int d = 0; d < n; d++) acc[d] += w * KV_ROW_AT(vrow, v, d);
}
#endif

kernel void flash_attn_rows(TENSOR(q), TENSOR(k), TENSOR(v), TENSOR(mask), TENSOR(sinks),
                            TENSOR(dst), float scale, float softcap, float max_bias, float m0,
                            float m1, int n_head_log2, int has_mask, int has_sinks) {
    int iq = get_global_id(0), hs = get_global_id(1);
    if (iq >= q_ne1) return;
    int n_head = q_ne2, h = hs % n_head, s = hs / n_head;
    int hk = h / (n_head / k_ne2), hv = h / (n_head / v_ne2);
    float slope = alibi_slope(h, max_bias, m0, m1, n_head_log2);
    float16 acc16[DV_ROWS_MAX / 16], q16[DV_ROWS_MAX / 16];     // 16-lane aligned rows
    float * acc = (float *) acc16, * qv = (float *) q16;
    for (int d = 0; d < v_ne0; d++) acc[d] = 0.0f;
    for (int d = 0; d < q_ne0; d++) qv[d] = load_f32(ADDR(q, d, iq, h, s));
    const global char * mask_row = has_mask ? ADDR(mask, 0, iq, h % mask_ne2, s % mask_ne3) : 0;
    float m = -INFINITY, total = 0.0f;
    for (int j = 0; j < k_ne1; j++) {
        float mv = has_mask ? load_f16(mask_row + j * mask_nb0) : 0.0f;
        if (mv == -INFINITY) continue;
        float score = ROW_DOT(qv, ROW(k, j, hk, s)) * scale;
        if (softcap != 0.0f) score = softcap * tanh(score);
        score += slope * mv;
        float w = 1.0f;
        if (score > m) {                    // a new max: rescale what came before
            float correction = exp(m - score);
            for (int d = 0; d < v_ne0; d++) acc[d] *= correction;
            total *= correction;
            m = score;
        } else {
            w = exp(score - m);
        }
        ROW_AXPY(acc, ROW(v, j, hv, s), w);
        total += w;
    }
    if (has_sinks) {
        float w, correction = online_softmax(load_f32(ADDR(sinks, h, 0, 0, 0)), &m, &total, &w);
        for (int d = 0; d < v_ne0; d++) acc[d] *= correction;
    }
    float inv = total > 0.0f ? 1.0f / total : 0.0f;     // a fully masked row gives 0
    for (int d = 0; d < v_ne0; d++) *(global float *) ADDR(dst, d, h, iq, s) = acc[d] * inv;
}
