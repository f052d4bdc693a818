"""MUL_MAT_ID: the mixture-of-experts matmul, grouped by expert.

Each (token, slot) pair picks one expert's matrix. The pairs are sorted by expert once per
call, so each expert used runs one matrix product over all the rows routed to it: a handful
of BLAS calls (the experts in use), never a loop over tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from polydev.tensor import Tensor

from .movement import check_indices


def expert_groups(xp, experts: Any) -> Iterator[tuple[int, Any]]:
    """(expert, the positions of its pairs in ``experts``) for each expert in use, in order:
    the pairs are sorted by expert once."""
    order = xp.argsort(experts, kind="stable")
    sorted_experts = experts[order]
    used = xp.unique(sorted_experts)
    bounds = xp.searchsorted(sorted_experts, used, side="right").tolist()
    start = 0
    for expert, stop in zip(used.tolist(), bounds):
        yield expert, order[start:stop]
        start = stop


def bind_mul_mat_id(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    as_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    weights = env.weight_f32(as_t)                      # (1, n_expert, M, K)
    n_expert = as_t.ne[2]
    b = env.view(b_t)[0]                                # (n_tokens, n_b, K)
    ids = env.view(ids_t)[0, 0]                         # (n_tokens, n_used)
    d = env.view(node)[0].reshape(-1, node.ne[0])       # (n_tokens * n_used, M), contiguous
    n_tokens, n_b, k = b.shape
    n_used = ids.shape[1]
    # the b row of pair (t, e) is row t * n_b + e % n_b of b's rows
    b_row = xp.asarray((xp.arange(n_tokens)[:, None] * n_b
                        + xp.arange(n_used)[None, :] % n_b).reshape(-1))

    def run() -> None:
        experts = ids.reshape(-1)
        check_indices(xp, experts, n_expert, "mul_mat_id")
        rows = b.reshape(-1, k)
        if rows.dtype != xp.float32:
            rows = rows.astype(xp.float32)
        w = weights()[0]
        for expert, pairs in expert_groups(xp, experts):
            d[pairs] = rows[b_row[pairs]] @ w[expert].T
    return run
