"""An MoE FFN forward composed from the library's ops on the CPU backend (router -> permute ->
grouped FC1 -> SwiGLU -> grouped FC2 -> unpermute), against a dense per-token float64
computation of the same layer. Checks that the ops' layouts fit together: padded blocks, row
maps, [gate | up] columns, real-row counts, grouped GEMM operands."""

import numpy as np

import sfmoe


def test_moe_forward_composes(rng):
    tokens, hidden, experts, k, ffn = 64, 16, 8, 2, 8
    x = rng.normal(size=(tokens, hidden)).astype(np.float32)
    w_router = rng.normal(size=(hidden, experts)).astype(np.float32)
    w1 = (rng.normal(size=(experts, 2 * ffn, hidden)) / 4).astype(np.float32)  # [W_gate; W_up]
    w2 = (rng.normal(size=(experts, hidden, ffn)) / 3).astype(np.float32)

    r = sfmoe.router(x @ w_router, k, score="sigmoid", normalize=True)
    p = sfmoe.permute(x, r.topk_ids, experts, alignment=8)
    h = sfmoe.grouped_gemm("fprop", p.rows, w1, p.group_offsets)  # FC1: [R, 2F]
    a = sfmoe.grouped_activation(h, p.group_offsets, p.tokens_per_expert, "swiglu")
    y = sfmoe.grouped_gemm("fprop", a, w2, p.group_offsets)  # FC2: [R, H]
    out = sfmoe.unpermute(y, p, r.probs)

    want = np.zeros((tokens, hidden))
    x64 = x.astype(np.float64)
    for t in range(tokens):
        for i in range(k):
            e = r.topk_ids[t, i]
            hh = w1[e].astype(np.float64) @ x64[t]
            gate, up = hh[:ffn], hh[ffn:]
            act = gate / (1.0 + np.exp(-gate)) * up
            want[t] += float(r.probs[t, i]) * (w2[e].astype(np.float64) @ act)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
