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


def test_moe_backward_composes(rng):
    """The layer's backward from the ops (unpermute_backward -> FC2 dgrad/wgrad -> SwiGLU backward
    -> FC1 dgrad/wgrad -> permute backward, and router_backward for the logits) against central
    differences of a dense float64 rendering with the routing held fixed."""
    tokens, hidden, experts, k, ffn = 24, 8, 6, 2, 4
    x = rng.normal(size=(tokens, hidden)).astype(np.float32)
    logits = rng.normal(size=(tokens, experts)).astype(np.float32)
    w1 = (rng.normal(size=(experts, 2 * ffn, hidden)) / 3).astype(np.float32)
    w2 = (rng.normal(size=(experts, hidden, ffn)) / 2).astype(np.float32)
    g_out = rng.normal(size=(tokens, hidden)).astype(np.float32)  # dL/d out for L = sum(out * g_out)

    r = sfmoe.router(logits, k, score="sigmoid", normalize=True)
    p = sfmoe.permute(x, r.topk_ids, experts, alignment=8)
    h = sfmoe.grouped_gemm("fprop", p.rows, w1, p.group_offsets)
    a = sfmoe.grouped_activation(h, p.group_offsets, p.tokens_per_expert, "swiglu")
    y = sfmoe.grouped_gemm("fprop", a, w2, p.group_offsets)
    d_y, d_probs = sfmoe.unpermute_backward(g_out, y, p, r.probs)
    d_a = sfmoe.grouped_gemm("dgrad", d_y, w2, p.group_offsets)
    d_w2 = sfmoe.grouped_gemm("wgrad", d_y, a, p.group_offsets)
    d_h = sfmoe.grouped_activation_backward(h, d_a, p.group_offsets, p.tokens_per_expert, "swiglu")
    d_rows = sfmoe.grouped_gemm("dgrad", d_h, w1, p.group_offsets)
    d_w1 = sfmoe.grouped_gemm("wgrad", d_h, p.rows, p.group_offsets)
    d_x = sfmoe.unpermute(d_rows, p)  # permute's backward
    d_logits = sfmoe.router_backward(logits, r, d_probs)

    ids = r.topk_ids

    def loss(x_, logits_, w1_, w2_):
        s = 1.0 / (1.0 + np.exp(-logits_))
        total = 0.0
        for t in range(tokens):
            sel = s[t, ids[t]]
            probs = sel / sel.sum()
            for i, e in enumerate(ids[t]):
                hh = w1_[e] @ x_[t]
                act = hh[:ffn] / (1.0 + np.exp(-hh[:ffn])) * hh[ffn:]
                total += probs[i] * (w2_[e] @ act) @ g_out[t]
        return total

    args = [x.astype(np.float64), logits.astype(np.float64), w1.astype(np.float64), w2.astype(np.float64)]
    for which, grad in ((0, d_x), (1, d_logits), (2, d_w1), (3, d_w2)):
        flat = args[which].reshape(-1)
        for index in rng.choice(flat.size, size=12, replace=False):
            saved = flat[index]
            flat[index] = saved + 1e-6
            plus = loss(*args)
            flat[index] = saved - 1e-6
            minus = loss(*args)
            flat[index] = saved
            fd = (plus - minus) / 2e-6
            got = np.asarray(grad).reshape(-1)[index]
            assert abs(got - fd) <= 1e-3 * abs(fd) + 1e-4, (which, index, got, fd)
