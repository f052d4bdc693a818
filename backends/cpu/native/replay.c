/* A plan's bound calls replayed in one call from Python.
 *
 * A CPU plan binds each node's kernel once (its arguments packed in a record, arguments.py)
 * and replays the calls every step. From Python each call costs about 1.5 µs of interpreter
 * and ctypes time, which on a decode step of a 1B-class model (some 230 calls) was 5% of the
 * step, and more of a smaller model's. Here a run of bound calls is an array of pd_call, one
 * per call, each naming its kernel by a code (never a function pointer from Python) and
 * carrying its record's address and the float arguments its entry point takes beside the
 * record. The caller rewrites a record's words in place when they change (an interleaved copy
 * made again).
 */
#include <stdint.h>

typedef struct {
    int64_t op;          /* PD_CALL_* */
    int64_t args;        /* the record's address */
    float f0, f1;        /* float arguments beside the record */
} pd_call;

enum {
    PD_CALL_MUL_MAT = 0,
    PD_CALL_MUL_MAT_INT16 = 1,
    PD_CALL_MUL_MAT_INTERLEAVED = 2,
    PD_CALL_MUL_MAT_ID_INTERLEAVED = 3,
    PD_CALL_ROPE = 4,
    PD_CALL_RMS_NORM = 5,
    PD_CALL_SET_ROWS = 6,
    PD_CALL_FLASH_ATTN = 7,
    PD_CALL_GLU = 8,
    PD_CALL_BINARY = 9,
    PD_CALL_SOFT_MAX = 10,
    PD_CALL_TOP_K = 11,
    PD_CALL_SUM_ROWS = 12,
    PD_CALL_CLAMP = 13,
    PD_CALL_GET_F32_ROWS = 14,
    PD_CALL_GET_ROWS = 15,
    PD_CALL_MUL_MAT_INTERLEAVED_SHARED = 16,
    PD_CALL_MUL_MAT_ID_INTERLEAVED_SHARED = 17,
};

void pd_mul_mat_packed(const int64_t *a);
int pd_mul_mat_int16_packed(const int64_t *a);
int pd_mul_mat_interleaved_packed(const int64_t *a);
int pd_mul_mat_id_interleaved_packed(const int64_t *a);
void pd_rope_f32_packed(const int64_t *a);
void pd_rms_norm_f32_packed(const int64_t *a, float eps);
int pd_set_rows_f32_packed(const int64_t *a);
void pd_flash_attn_f16_packed(const int64_t *a, float scale, float softcap);
void pd_glu_f32_packed(const int64_t *a);
void pd_binary_f32_packed(const int64_t *a);
void pd_soft_max_f32_packed(const int64_t *a, float scale);
void pd_top_k_f32_packed(const int64_t *a);
void pd_sum_rows_f32_packed(const int64_t *a);
void pd_clamp_f32_packed(const int64_t *a, float lo, float hi);
int pd_get_f32_rows_packed(const int64_t *a);
int pd_get_rows_f32_packed(const int64_t *a);
int pd_mul_mat_interleaved_shared_packed(const int64_t *a);
int pd_mul_mat_id_interleaved_shared_packed(const int64_t *a);

/* one call's status: 0, or its entry point's nonzero status (the caller's Python call then
 * redoes it and raises the error that status stands for); -1 for an unknown code */
static int run_call(const pd_call *c) {
    const int64_t *a = (const int64_t *)(intptr_t)c->args;
    switch (c->op) {
    case PD_CALL_MUL_MAT: pd_mul_mat_packed(a); return 0;
    case PD_CALL_MUL_MAT_INT16: return pd_mul_mat_int16_packed(a);
    case PD_CALL_MUL_MAT_INTERLEAVED: return pd_mul_mat_interleaved_packed(a);
    case PD_CALL_MUL_MAT_ID_INTERLEAVED: return pd_mul_mat_id_interleaved_packed(a);
    case PD_CALL_ROPE: pd_rope_f32_packed(a); return 0;
    case PD_CALL_RMS_NORM: pd_rms_norm_f32_packed(a, c->f0); return 0;
    case PD_CALL_SET_ROWS: return pd_set_rows_f32_packed(a);
    case PD_CALL_FLASH_ATTN: pd_flash_attn_f16_packed(a, c->f0, c->f1); return 0;
    case PD_CALL_GLU: pd_glu_f32_packed(a); return 0;
    case PD_CALL_BINARY: pd_binary_f32_packed(a); return 0;
    case PD_CALL_SOFT_MAX: pd_soft_max_f32_packed(a, c->f0); return 0;
    case PD_CALL_TOP_K: pd_top_k_f32_packed(a); return 0;
    case PD_CALL_SUM_ROWS: pd_sum_rows_f32_packed(a); return 0;
    case PD_CALL_CLAMP: pd_clamp_f32_packed(a, c->f0, c->f1); return 0;
    case PD_CALL_GET_F32_ROWS: return pd_get_f32_rows_packed(a);
    case PD_CALL_GET_ROWS: return pd_get_rows_f32_packed(a);
    case PD_CALL_MUL_MAT_INTERLEAVED_SHARED: return pd_mul_mat_interleaved_shared_packed(a);
    case PD_CALL_MUL_MAT_ID_INTERLEAVED_SHARED: return pd_mul_mat_id_interleaved_shared_packed(a);
    default: return -1;
    }
}

/* Run calls[start], calls[start + 1], ... up to calls[n - 1] (each entry the address of a
 * pd_call). Returns n, or the index of the first call whose status was not 0 (the calls after
 * it have not run). */
int64_t pd_replay(const int64_t *calls, int64_t start, int64_t n) {
    for (int64_t i = start; i < n; i++)
        if (run_call((const pd_call *)(intptr_t)calls[i]) != 0) return i;
    return n;
}
