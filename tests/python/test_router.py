"""sfmoe.router / router_backward on NumPy arrays (the CPU backend): selections, probabilities,
counts and losses against a NumPy rendering of docs/router.md, the z-loss gradient against its
closed form, BF16 logits, and argument errors. Fresh random inputs each run (see conftest.py)."""

import numpy as np
import pytest
import sfmoe


def numpy_route(x, k, *, sigmoid, bias=None, groups=0, group_topk=0, group_score_topk=2, normalize=False, scale=1.0):
    """ids and probabilities per docs/router.md, in float64 (selections compared exactly, so the
    test draws logits without near ties)."""
    t_count, e_count = x.shape
    x = x.astype(np.float64)
    if sigmoid:
        s = 1.0 / (1.0 + np.exp(-x))
    else:
        z = np.exp(x - x.max(axis=1, keepdims=True))
        s = z / z.sum(axis=1, keepdims=True)
    q = s + (bias.astype(np.float64) if bias is not None else 0.0)
    ids = np.empty((t_count, k), np.int64)
    probs = np.empty((t_count, k))
    for t in range(t_count):
        allowed = np.ones(e_count, bool)
        if groups > 1:
            per = e_count // groups
            gscore = np.sort(q[t].reshape(groups, per), axis=1)[:, ::-1][:, :group_score_topk].sum(axis=1)
            kept = np.lexsort((np.arange(groups), -gscore))[:group_topk]
            allowed[:] = False
            for g in kept:
                allowed[g * per : (g + 1) * per] = True
        candidates = np.where(allowed)[0]
        order = candidates[np.lexsort((candidates, -q[t, candidates]))][:k]
        ids[t] = order
        p = s[t, order]
        if normalize:
            p = p / p.sum()
        probs[t] = p * scale
    return ids, probs


def well_separated_logits(rng, tokens, experts):
    # Distinct values per row, at least 1e-3 apart: no near ties between any two scores.
    x = np.stack([rng.permutation(experts) for _ in range(tokens)]).astype(np.float32) * 0.05
    return x + rng.uniform(-1e-4, 1e-4, size=x.shape).astype(np.float32)


@pytest.mark.parametrize("sigmoid", [False, True])
def test_router_matches_numpy(rng, sigmoid):
    tokens, experts, k = 97, 32, 4
    x = well_separated_logits(rng, tokens, experts)
    r = sfmoe.router(
        x,
        k,
        score="sigmoid" if sigmoid else "softmax",
        normalize=True,
        scaling_factor=2.5,
        aux_loss_coeff=0.01,
        z_loss_coeff=0.001,
    )
    ids, probs = numpy_route(x, k, sigmoid=sigmoid, normalize=True, scale=2.5)
    np.testing.assert_array_equal(r.topk_ids, ids)
    np.testing.assert_allclose(r.probs, probs, rtol=1e-5)
    counts = np.bincount(ids.ravel(), minlength=experts)
    np.testing.assert_array_equal(r.tokens_per_expert, counts)
    x64 = x.astype(np.float64)
    if sigmoid:
        sg = 1.0 / (1.0 + np.exp(-x64))
        a = sg / sg.sum(axis=1, keepdims=True)
    else:
        a = np.exp(x64 - x64.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
    aux = 0.01 * experts / (k * tokens * tokens) * (counts * a.sum(axis=0)).sum()
    lse = np.log(np.exp(x64).sum(axis=1))
    np.testing.assert_allclose(r.aux_loss[0], aux, rtol=1e-5)
    np.testing.assert_allclose(r.z_loss[0], 0.001 * (lse**2).mean(), rtol=1e-5)


def test_group_limited_routing_with_bias(rng):
    tokens, experts, k = 64, 64, 6
    x = well_separated_logits(rng, tokens, experts)
    bias = (rng.permutation(experts) * 1e-3).astype(np.float32)
    r = sfmoe.router(x, k, score="sigmoid", num_groups=8, group_topk=3, expert_bias=bias, normalize=True)
    ids, probs = numpy_route(x, k, sigmoid=True, bias=bias, groups=8, group_topk=3, normalize=True)
    np.testing.assert_array_equal(r.topk_ids, ids)
    np.testing.assert_allclose(r.probs, probs, rtol=1e-5)
    assert r.aux_loss is None and r.z_loss is None


def test_z_loss_gradient_has_its_closed_form(rng):
    tokens, experts = 33, 16
    x = rng.normal(size=(tokens, experts)).astype(np.float32)
    r = sfmoe.router(x, 2, z_loss_coeff=0.01)
    d = sfmoe.router_backward(x, r, None, d_aux_loss=0.0, d_z_loss=1.0)
    x64 = x.astype(np.float64)
    soft = np.exp(x64 - x64.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    lse = np.log(np.exp(x64).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(d, 2 * 0.01 / tokens * lse * soft, rtol=1e-4, atol=1e-9)


def test_bf16_logits_route_like_their_fp32_values(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = rng.normal(size=(40, 16)).astype(ml_dtypes.bfloat16)
    a = sfmoe.router(x, 3)
    b = sfmoe.router(x.astype(np.float32), 3)
    np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
    np.testing.assert_array_equal(a.probs, b.probs)


def test_router_errors(rng):
    x = rng.normal(size=(8, 16)).astype(np.float32)
    with pytest.raises(sfmoe.Error, match="top_k"):
        sfmoe.router(x, 0)
    with pytest.raises(sfmoe.Error, match="does not divide"):
        sfmoe.router(x, 2, num_groups=5, group_topk=1)
    with pytest.raises(sfmoe.Error, match="softmax_after_topk"):
        sfmoe.router(x, 2, score="sigmoid", softmax_after_topk=True)
    with pytest.raises(ValueError, match="score"):
        sfmoe.router(x, 2, score="relu")
    with pytest.raises(ValueError, match="2-D"):
        sfmoe.router(x[0], 2)


def test_no_tokens():
    r = sfmoe.router(np.zeros((0, 8), np.float32), 2, aux_loss_coeff=0.1, z_loss_coeff=0.1)
    assert r.topk_ids.shape == (0, 2) and r.probs.shape == (0, 2)
    np.testing.assert_array_equal(r.tokens_per_expert, np.zeros(8, np.int64))
    assert r.aux_loss[0] == 0.0 and r.z_loss[0] == 0.0
    assert sfmoe.router_backward(np.zeros((0, 8), np.float32), r).shape == (0, 8)


def test_float_arguments_must_be_float32(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)
    with pytest.raises(TypeError, match="expert_bias"):
        sfmoe.router(x, 2, score="sigmoid", expert_bias=np.zeros(8, np.int32))
    r = sfmoe.router(x, 2)
    with pytest.raises(TypeError, match="d_probs"):
        sfmoe.router_backward(x, r, np.ones((4, 2), np.int32))


def test_non_finite_logits_follow_the_limits():
    x = np.array([[np.nan, 1.0, 5.0], [1.0, 0.0, np.inf], [-np.inf, -np.inf, -np.inf]], np.float32)
    r = sfmoe.router(x, 1)
    np.testing.assert_array_equal(r.topk_ids[:, 0], [2, 2, 0])
    np.testing.assert_allclose(r.probs[:, 0], [1 / (1 + np.exp(-4.0)), 1.0, 1 / 3], rtol=1e-6)
