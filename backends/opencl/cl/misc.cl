// Sorting, scans, padding, generators, GROUP_NORM and SSM_CONV. Rows are addressed through
// TENSOR strides, so every source may be a view.

// ARGSORT (k == ne0) and TOP_K (k < ne0, largest first): each work-item ranks one element of
// its row by counting the elements that sort before it (ties keep index order, as a stable
// sort) and writes its index at that rank. NDRange (ne00, ne01, ne02 * ne03).
kernel void argsort(TENSOR(src0), TENSOR(dst), int descending) {
    int i = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % src0_ne2, i3 = i23 / src0_ne2;
    float x = load_f32(ADDR(src0, i, i1, i2, i3));
    int rank = 0;
    for (int j = 0; j < src0_ne0; j++) {
        float y = load_f32(ADDR(src0, j, i1, i2, i3));
        bool before = descending ? y > x : y < x;
        rank += before || (y == x && j < i);
    }
    if (rank < dst_ne0) *(global int *) ADDR(dst, rank, i1, i2, i3) = i;
}

// CUMSUM along rows, in order (as a sequential float sum). NDRange (ne01, ne02, ne03).
kernel void cumsum(TENSOR(src0), TENSOR(dst)) {
    int i1 = get_global_id(0), i2 = get_global_id(1), i3 = get_global_id(2);
    float s = 0.0f;
    for (int i0 = 0; i0 < src0_ne0; i0++) {
        s += load_f32(ADDR(src0, i0, i1, i2, i3));
        store_f32(ADDR(dst, i0, i1, i2, i3), s);
    }
}

// PAD: the source shifted by the left pads; zeros outside it, or (circular) its values
// wrapped around. NDRange over dst (ne0, ne1, ne2 * ne3).
inline int wrap(int i, int n) { int r = i % n; return r < 0 ? r + n : r; }

kernel void pad(TENSOR(src0), TENSOR(dst), int lp0, int lp1, int lp2, int lp3, int circular) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    int s0 = i0 - lp0, s1 = i1 - lp1, s2 = i2 - lp2, s3 = i3 - lp3;
    float v = 0.0f;
    if (circular) {
        v = LOAD0(ADDR(src0, wrap(s0, src0_ne0), wrap(s1, src0_ne1), wrap(s2, src0_ne2),
                       wrap(s3, src0_ne3)));
    } else if (s0 >= 0 && s0 < src0_ne0 && s1 >= 0 && s1 < src0_ne1 && s2 >= 0 &&
               s2 < src0_ne2 && s3 >= 0 && s3 < src0_ne3) {
        v = LOAD0(ADDR(src0, s0, s1, s2, s3));
    }
    STORE(ADDR(dst, i0, i1, i2, i3), v);
}

// ARANGE: start + step * i (one rounding, as the CPU backend). NDRange (ne0).
kernel void arange(TENSOR(dst), float start, float step) {
    int i = get_global_id(0);
    store_f32(ADDR(dst, i, 0, 0, 0), fma(step, (float) i, start));
}

// GROUP_NORM: per (channel group, index of dim 3), (x - mean) / sqrt(var + eps) over the
// group's channels; ggml's groups are ceil(C / G) channels. NDRange (LS, n_groups, ne3).
kernel void group_norm(TENSOR(src0), TENSOR(dst), int group_size, float eps) {
    local float buf[LS];
    int lid = get_local_id(0), g = get_global_id(1), i3 = get_global_id(2);
    int c0 = g * group_size, c1 = min(c0 + group_size, src0_ne2);
    int plane = src0_ne0 * src0_ne1;
    long n = (long) plane * max(c1 - c0, 0);
    if (n == 0) return;                                   // an empty trailing group
    float s = 0.0f;
    for (long k = lid; k < n; k += LS) {
        int c = c0 + k / plane, r = k % plane;
        s += load_f32(ADDR(src0, r % src0_ne0, r / src0_ne0, c, i3));
    }
    float mean = group_sum(buf, s) / n;
    float s2 = 0.0f;
    for (long k = lid; k < n; k += LS) {
        int c = c0 + k / plane, r = k % plane;
        float x = load_f32(ADDR(src0, r % src0_ne0, r / src0_ne0, c, i3)) - mean;
        s2 += x * x;
    }
    float scale = 1.0f / sqrt(group_sum(buf, s2) / n + eps);
    for (long k = lid; k < n; k += LS) {
        int c = c0 + k / plane, r = k % plane;
        float x = load_f32(ADDR(src0, r % src0_ne0, r / src0_ne0, c, i3));
        store_f32(ADDR(dst, r % src0_ne0, r / src0_ne0, c, i3), (x - mean) * scale);
    }
}

// SSM_CONV: dst(i1, t, s) = sum_k sx(t + k, i1, s) * c(k, i1). NDRange (d_inner, n_t, n_s).
kernel void ssm_conv(TENSOR(src0), TENSOR(src1), TENSOR(dst)) {
    int i1 = get_global_id(0), t = get_global_id(1), s = get_global_id(2);
    float acc = 0.0f;
    for (int k = 0; k < src1_ne0; k++) {
        acc += load_f32(ADDR(src0, t + k, i1, s, 0)) * load_f32(ADDR(src1, k, i1, 0, 0));
    }
    store_f32(ADDR(dst, i1, t, s, 0), acc);
}

// PAD_REFLECT_1D: rows extended by p0 / p1 mirrored values, the edge itself not repeated.
// NDRange over dst (ne0, ne1, ne2 * ne3).
kernel void pad_reflect_1d(TENSOR(src0), TENSOR(dst), int p0) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    int n = src0_ne0, s = i0 - p0;
    s = s < 0 ? -s : (s >= n ? 2 * (n - 1) - s : s);
    store_f32(ADDR(dst, i0, i1, i2, i3), load_f32(ADDR(src0, s, i1, i2, i3)));
}

// TIMESTEP_EMBEDDING: row i is [cos(t_i f_j), sin(t_i f_j)] (j < dim / 2), then a 0 when dim
// is odd; the frequencies f_j come from the host. NDRange (dst ne0, n_timesteps).
kernel void timestep_embedding(TENSOR(src0), TENSOR(src1), TENSOR(dst), int half_dim) {
    int j = get_global_id(0), i = get_global_id(1);
    float v = 0.0f;
    if (j < 2 * half_dim) {
        float arg = load_f32(ADDR(src0, i, 0, 0, 0)) * load_f32(ADDR(src1, j % half_dim, 0, 0, 0));
        v = j < half_dim ? cos(arg) : sin(arg);
    }
    store_f32(ADDR(dst, j, i, 0, 0), v);
}
