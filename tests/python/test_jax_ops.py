"""sfmoe.jax's ops through XLA FFI (docs/jax.md, "Ops"): the router, permute / unpermute, the grouped
GEMM and the grouped activation, forward and backward, bit for bit against the same ops on NumPy
arrays (the CPU reference), with special values (signed zeros, subnormals, Inf, NaN), odd sizes,
empty experts and a capacity that drops; a MoE layer composed from them equal to
sfmoe.jax.moe_layer (the output bit for bit; the gradients, which the layer rounds in another
order, within 1e-5 in FP32 and 2e-4 in BF16 of 1 - 2 sum(xy) / sum(x^2 + y^2)); jit without recompiling on new routings, the same bits on a second run, eval_shape,
vmap refused; on the GPU (where JAX has one) the same composition against the CPU's."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
sfmoe_jax = pytest.importorskip("sfmoe.jax")
import sfmoe  # noqa: E402
from sfmoe.jax import (  # noqa: E402
    MoEConfig,
    grouped_activation,
    grouped_gemm,
    grouped_linear,
    moe_layer,
    permute,
    router,
    unpermute,
)

_GPU = [d for d in jax.devices() if d.platform == "gpu"]
_CPU = jax.devices("cpu")[0]


@pytest.fixture(autouse=True)
def on_the_cpu(request):
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(_CPU):
        yield


def _bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)
        return
    differ = np.flatnonzero(_bits(got.astype(want.dtype)) != _bits(want))
    assert differ.size == 0, f"{what}: {differ.size} elements differ, first at {differ[:5]}"


def _special(rng, shape, dtype):
    """Normal values with signed zeros, subnormals, large values, Inf and NaN mixed in."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
    specials = np.array([0.0, -0.0, 1e-39, -3e-40, np.inf, -np.inf, np.nan, 3e38, -1e-45, 65504.0, 1e-8, -0.0])
    flat[picks] = specials[: picks.size].astype(np.float32)
    return x.astype(dtype)


def _ids(rng, T, E, k, used):
    """[T, k] distinct experts per token drawn from `used` (the others stay empty)."""
    return np.stack([rng.choice(used, size=k, replace=False) for _ in range(T)]).astype(np.int32)


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(softmax_after_topk=True),
        dict(score="sigmoid", normalize=True, scaling_factor=2.5),
        dict(num_groups=4, group_topk=2),
    ],
)
def test_router_equals_the_reference_bit_for_bit(rng, options):
    T, E, k = 203, 16, 4
    logits = rng.standard_normal((T, E)).astype(np.float32)
    logits[3] = 0.5  # ties: the lowest id first
    logits[7, ::2] = -0.0
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    want = sfmoe.router(logits, k, expert_bias=bias, **options)
    ids, probs, kept = router(jnp.asarray(logits), k, expert_bias=jnp.asarray(bias), **options)
    _same(ids, want.topk_ids, "topk_ids")
    _same(probs, want.probs, "probs")
    _same(kept, want.tokens_per_expert, "tokens_per_expert")

    d_probs = rng.standard_normal((T, k)).astype(np.float32)
    want_d = sfmoe.router_backward(logits, want, d_probs, d_aux_loss=0.0, d_z_loss=0.0)

    def loss(logits):
        return (router(logits, k, expert_bias=jnp.asarray(bias), **options)[1] * d_probs).sum()

    _, vjp = jax.vjp(lambda lg: router(lg, k, expert_bias=jnp.asarray(bias), **options)[1], jnp.asarray(logits))
    _same(vjp(jnp.asarray(d_probs))[0], want_d, "d_logits")
    assert np.isfinite(float(jax.grad(loss)(jnp.asarray(logits)).sum()))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
@pytest.mark.parametrize("alignment,capacity", [(1, 0), (16, 0), (8, 23)])
def test_permute_and_unpermute_equal_the_reference_bit_for_bit(rng, dtype, alignment, capacity):
    T, H, E, k = 157, 37, 9, 3
    x = _special(rng, (T, H), dtype)
    ids = _ids(rng, T, E, k, used=[0, 2, 3, 5, 8])  # experts 1, 4, 6, 7 empty
    probs = rng.random((T, k)).astype(np.float32)
    want = sfmoe.permute(x, ids, E, alignment=alignment, expert_capacity=capacity)
    got = permute(jnp.asarray(x), jnp.asarray(ids), E, alignment=alignment, expert_capacity=capacity)
    end = int(want.group_offsets[-1])
    _same(got.group_offsets, want.group_offsets, "group_offsets")
    _same(got.row_map, want.row_map, "row_map")
    _same(got.tokens_per_expert, want.tokens_per_expert, "tokens_per_expert")
    _same(got.dropped_per_expert, want.dropped_per_expert, "dropped_per_expert")
    _same(np.asarray(got.rows)[:end], np.asarray(want.rows)[:end], "rows")
    assert (int(np.asarray(got.dropped_per_expert).sum()) > 0) == (capacity > 0)

    rows = _special(rng, np.asarray(want.rows).shape, dtype)
    out = unpermute(jnp.asarray(rows), got, jnp.asarray(probs))
    _same(out, sfmoe.unpermute(rows, want, probs), "unpermute")
    _same(unpermute(jnp.asarray(rows), got), sfmoe.unpermute(rows, want), "unpermute without weights")

    d_out = _special(rng, (T, H), dtype)
    want_rows, want_probs = sfmoe.unpermute_backward(d_out, rows, want, probs, out_dtype=dtype)
    _, vjp = jax.vjp(lambda r, p: unpermute(r, got, p), jnp.asarray(rows), jnp.asarray(probs))
    d_rows, d_probs = vjp(jnp.asarray(d_out))
    _same(np.asarray(d_rows)[:end], np.asarray(want_rows)[:end], "d_rows")
    _same(d_probs, want_probs, "d_probs")

    # permute's backward: each token's d rows summed over its kept slots
    d_permuted = _special(rng, np.asarray(want.rows).shape, dtype)
    d_permuted[end:] = 0
    _, vjp = jax.vjp(
        lambda v: permute(v, jnp.asarray(ids), E, alignment=alignment, expert_capacity=capacity).rows, jnp.asarray(x)
    )
    _same(vjp(jnp.asarray(d_permuted))[0], sfmoe.unpermute(d_permuted, want, out_dtype=dtype), "d_x")


def _offsets(rng, groups, rows):
    """Random group offsets over `rows` rows, some groups empty, one of a single row."""
    cuts = np.sort(rng.integers(0, rows + 1, size=groups - 1))
    cuts[0] = 0  # group 0 empty
    if groups > 3:
        cuts[2] = cuts[1] + 1 if cuts[1] < rows else cuts[1]  # group 2 of one row at most
        cuts = np.sort(cuts)
    return np.concatenate([[0], cuts, [rows]]).astype(np.int64)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_grouped_gemm_forms_and_grouped_linear_equal_the_reference(rng, dtype):
    G, R, N, K = 6, 91, 23, 45
    offsets = _offsets(rng, G, R - 4)  # the last 4 rows belong to no group
    x = rng.standard_normal((R, K)).astype(dtype)
    w = rng.standard_normal((G, N, K)).astype(dtype)
    dy = rng.standard_normal((R, N)).astype(dtype)
    end = int(offsets[-1])
    off = jnp.asarray(offsets.astype(np.int32))
    for form, a, b, rows in (("fprop", x, w, True), ("dgrad", dy, w, True), ("wgrad", dy, x, False)):
        want = sfmoe.grouped_gemm(form, a, b, offsets)
        got = grouped_gemm(form, jnp.asarray(a), jnp.asarray(b), off, out_dtype=jnp.float32)
        _same(np.asarray(got)[:end] if rows else got, np.asarray(want)[:end] if rows else want, form)

    y, vjp = jax.vjp(lambda a, b: grouped_linear(a, b, off), jnp.asarray(x), jnp.asarray(w))
    _same(np.asarray(y)[:end], sfmoe.grouped_gemm("fprop", x, w, offsets, out_dtype=dtype)[:end], "grouped_linear")
    d_x, d_w = vjp(jnp.asarray(dy))
    _same(np.asarray(d_x)[:end], sfmoe.grouped_gemm("dgrad", dy, w, offsets, out_dtype=dtype)[:end], "d_x")
    _same(d_w, sfmoe.grouped_gemm("wgrad", dy, x, offsets, out_dtype=dtype), "d_w")


def _finite_special(rng, shape):
    """Normal values with signed zeros, subnormals and large values mixed in (no Inf or NaN: the
    FP8 per-tensor and NVFP4 scales follow the amax, which they would make Inf or NaN)."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=8, replace=False)
    flat[picks] = np.array([0.0, -0.0, 1e-39, -3e-40, 1e-45, 600.0, -2e4, 1e-8], np.float32)
    return x


_QUANTIZED = ["fp8_tensor", "fp8_block_1x128", "mxfp8", "nvfp4"]


def _quantized_problem(rng, G, N, K, R):
    offsets = _offsets(rng, G, R)
    offsets[2] = offsets[1]  # an empty group
    x = _finite_special(rng, (R, K))
    w = _finite_special(rng, (G * N, K))
    dy = _finite_special(rng, (R, N))
    return offsets, x, w, dy


@pytest.mark.parametrize("recipe", _QUANTIZED)
def test_quantize_and_the_quantized_gemm_equal_the_reference(rng, recipe):
    """sfmoe.jax.quantize gives sfmoe.quantize's codes, scales, amax and padded offsets; the
    grouped GEMM on them (each form, its copies) gives sfmoe.grouped_gemm's bits on the NumPy
    quantized operands; under jit, the tensors pass as pytrees."""
    G, N, K, R = 5, 128, 256, 200
    offsets, x, w, dy = _quantized_problem(rng, G, N, K, R)
    off = jnp.asarray(offsets.astype(np.int32))
    both = dict(rowwise=True, columnwise=True)
    qx_np = sfmoe.quantize(x, recipe, group_offsets=offsets, **both)
    qdy_np = sfmoe.quantize(dy, recipe, group_offsets=offsets, **both)
    qw_np = sfmoe.quantize(w, recipe, uniform_group_rows=N, **both)
    qx = sfmoe_jax.quantize(jnp.asarray(x), recipe, group_offsets=off, **both)
    qdy = sfmoe_jax.quantize(jnp.asarray(dy), recipe, group_offsets=off, **both)
    qw = jax.jit(lambda w: sfmoe_jax.quantize(w, recipe, uniform_group_rows=N, **both))(jnp.asarray(w))
    # the padded offsets, the rows they cover (codes and their scales), the amax
    out_offsets = np.asarray(qx.group_offsets)[..., 0] if qx.group_offsets.ndim == 2 else np.asarray(qx.group_offsets)
    np.testing.assert_array_equal(out_offsets, qx_np.group_offsets)
    end = int(qx_np.group_offsets[-1])
    fp4 = recipe == "nvfp4"
    codes = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731
    np.testing.assert_array_equal(codes(qx.data)[:end], codes(qx_np.data)[:end], err_msg="rowwise codes")
    if recipe != "fp8_tensor":
        np.testing.assert_array_equal(codes(qx.scale_inv)[:end], codes(qx_np.scale_inv)[:end], err_msg="rowwise scales")
    else:
        _same(qx.scale_inv, qx_np.scale_inv, "tensor scales")
    if qx_np.amax is not None:
        _same(qx.amax, qx_np.amax, "amax")
    assert (qx.data.shape[-1] * (2 if fp4 else 1)) == K
    qx_f = jax.jit(lambda t: t)(qx)  # (a pytree through jit)
    assert isinstance(qx_f, sfmoe.GroupedQuantizedTensor) and qx_f.recipe == recipe

    gemm = jax.jit(sfmoe_jax.grouped_gemm_quantized, static_argnums=0)
    for form, a, b, a_np, b_np, rows in (
        ("fprop", qx, qw, qx_np, qw_np, True),
        ("dgrad", qdy, qw, qdy_np, qw_np, True),
        ("wgrad", qdy, qx, qdy_np, qx_np, False),
    ):
        want = sfmoe.grouped_gemm(form, a_np, b_np)
        got = gemm(form, a, b)
        _same(np.asarray(got)[:end] if rows else got, np.asarray(want)[:end] if rows else want, f"{recipe} {form}")
    with pytest.raises(TypeError, match="quantized"):
        sfmoe_jax.grouped_gemm_quantized("fprop", jnp.asarray(x), qw)


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no GPU: the CUDA quantize and GEMM run on the GPU machine")
@pytest.mark.parametrize("recipe", _QUANTIZED)
def test_on_the_gpu_quantize_and_the_quantized_gemm_match_the_cpu(rng, recipe):
    """On the H200: the codes, scales and amax of the CUDA quantization equal the CPU's; the GEMM
    (tensor cores, another summation order; MXFP8 / NVFP4 emulated) within 1e-5 relative L2."""
    G, N, K, R = 4, 128, 256, 384
    offsets, x, w, dy = _quantized_problem(rng, G, N, K, R)
    results = {}
    for device in (_CPU, _GPU[0]):
        put = lambda a: jax.device_put(jnp.asarray(a), device)  # noqa: E731
        off = put(offsets.astype(np.int32))
        qx = sfmoe_jax.quantize(put(x), recipe, group_offsets=off, row_alignment=128)
        # (the device's blockwise GEMM takes 128x128 weights beside 1x128 rows)
        w_recipe = "fp8_block_128x128" if recipe == "fp8_block_1x128" else recipe
        qw = sfmoe_jax.quantize(put(w), w_recipe, uniform_group_rows=N)
        results[device.platform] = (qx, sfmoe_jax.grouped_gemm_quantized("fprop", qx, qw))
    (cx, cy), (gx, gy) = results["cpu"], results["gpu"]
    end = int(np.asarray(cx.group_offsets).reshape(G + 1, -1)[-1, 0])
    codes = lambda a: np.asarray(a).view(np.uint8)  # noqa: E731
    np.testing.assert_array_equal(codes(gx.data)[:end], codes(cx.data)[:end], err_msg="codes")
    if recipe == "fp8_tensor":
        _same(gx.scale_inv, cx.scale_inv, "scales")
    cy, gy = np.asarray(cy)[:end].astype(np.float64), np.asarray(gy)[:end].astype(np.float64)
    assert 1 - 2 * (cy * gy).sum() / (cy * cy + gy * gy).sum() < 1e-5


@pytest.mark.parametrize("activation", ["swiglu", "gelu", "clamped_swiglu", "squared_relu"])
def test_grouped_activation_equals_the_reference(rng, activation):
    G, R, F = 5, 70, 19
    cols = 2 * F if activation in ("swiglu", "clamped_swiglu") else F
    offsets = _offsets(rng, G, R)
    counts = np.maximum(np.diff(offsets) - rng.integers(0, 3, size=G), 0).astype(np.int64)  # padding rows
    x = _special(rng, (R, cols), jnp.bfloat16)
    want = sfmoe.grouped_activation(x, offsets, counts, activation)
    off, cnt = jnp.asarray(offsets.astype(np.int32)), jnp.asarray(counts.astype(np.int32))
    out, vjp = jax.vjp(lambda v: grouped_activation(v, off, cnt, activation), jnp.asarray(x))
    _same(out, want, activation)
    d_out = _special(rng, (R, out.shape[1]), jnp.bfloat16)
    want_d = sfmoe.grouped_activation_backward(x, d_out, offsets, counts, activation, out_dtype=jnp.bfloat16)
    _same(vjp(jnp.asarray(d_out))[0], want_d, f"{activation} backward")


def _composed(config, alignment, capacity):
    """The MoE layer from the ops: router, permute, FC1, activation, FC2, weighted unpermute."""
    rules = config.router_fields()
    options = dict(
        score="sigmoid" if rules["score"] == 1 else "softmax",
        softmax_after_topk=bool(rules["softmax_after_topk"]),
        num_groups=rules["num_groups"],
        group_topk=rules["group_topk"],
        scaling_factor=rules["scaling_factor"],
        normalize=bool(rules["normalize"]),
    )

    def layer(x, logits, w1, w2):
        ids, probs, _ = router(logits, config.topk, **options)
        p = permute(x, ids, config.num_experts, alignment=alignment, expert_capacity=capacity)
        h = grouped_linear(p.rows, w1, p.group_offsets)
        a = grouped_activation(h, p.group_offsets, p.tokens_per_expert, config.activation)
        return unpermute(grouped_linear(a, w2, p.group_offsets), p, probs)

    return layer


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("capacity_factor", [None, 0.6])
def test_composed_layer_equals_moe_layer(rng, dtype, capacity_factor):
    T, H, F, E, k = 129, 40, 24, 8, 2
    config = MoEConfig(H, F, E, k, capacity_factor=capacity_factor)
    fields = config.layer_fields(T, 1)
    layer = _composed(config, fields["row_alignment"], fields["expert_capacity"])
    x = jnp.asarray(rng.standard_normal((T, H)), dtype)
    logits = jnp.asarray(rng.standard_normal((T, E)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((E, 2 * F, H)) / np.sqrt(H), dtype)
    w2 = jnp.asarray(rng.standard_normal((E, H, F)) / np.sqrt(F), dtype)
    dy = jnp.asarray(rng.standard_normal((T, H)), dtype)

    def loss(fn):
        return lambda *a: (fn(*a).astype(jnp.float32) * dy.astype(jnp.float32)).sum()

    want_y = moe_layer(x, logits, w1, w2, config)[0]
    got_y = layer(x, logits, w1, w2)
    _same(got_y, want_y, "y")
    # The layer's backward scales the activations by the probabilities instead of d y (so d probs
    # come from FC2's dgrad, docs/moe_layer.md): the same gradients, rounded in another order.
    want = jax.grad(loss(lambda *a: moe_layer(*a, config)[0]), argnums=(0, 1, 2, 3))(x, logits, w1, w2)
    got = jax.grad(loss(layer), argnums=(0, 1, 2, 3))(x, logits, w1, w2)
    bound = 1e-5 if dtype == jnp.float32 else 2e-4
    for name, g, w in zip(("d_x", "d_logits", "d_w1", "d_w2"), got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.isfinite(g).all() and np.abs(w).max() > 0, name
        assert 1 - 2 * (g * w).sum() / (g * g + w * w).sum() < bound, name


def test_jit_compiles_once_and_vmap_is_refused(rng):
    T, H, F, E, k = 64, 16, 8, 4, 2
    config = MoEConfig(H, F, E, k)
    layer = _composed(config, 1, 0)
    traces = []

    @jax.jit
    def step(x, logits, w1, w2):
        traces.append(1)
        return jax.value_and_grad(lambda *a: layer(*a).sum(), argnums=(0, 2, 3))(x, logits, w1, w2)

    x = jnp.asarray(rng.standard_normal((T, H)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((E, 2 * F, H)), jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((E, H, F)), jnp.float32)
    for routing in range(3):
        logits = jnp.asarray(rng.standard_normal((T, E)), jnp.float32)
        if routing == 2:
            logits = logits.at[:, 1].set(50.0)  # every token on expert 1 (and one other)
        value, _ = step(x, logits, w1, w2)
        assert np.isfinite(float(value))
    assert len(traces) == 1
    first, second = step(x, logits, w1, w2), step(x, logits, w1, w2)  # deterministic
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(second)):
        _same(a, b, "second run")
    assert jax.eval_shape(layer, x, logits, w1, w2).shape == (T, H)
    with pytest.raises(Exception, match="vmap|batch"):
        jax.vmap(lambda lg: router(lg, k)[1])(jnp.stack([logits, logits]))
    with pytest.raises(ValueError, match="top_k"):
        router(logits, 0)
    with pytest.raises(ValueError, match="activation"):
        grouped_activation(x, jnp.zeros((2,), jnp.int32), jnp.zeros((1,), jnp.int32), "relu6")


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no GPU for JAX: the device handlers need one")
def test_on_the_gpu_the_composed_layer_matches_the_cpu(rng):
    T, H, F, E, k = 300, 64, 32, 8, 2
    config = MoEConfig(H, F, E, k)
    layer = _composed(config, 16, 0)
    host = [
        rng.standard_normal((T, H)),
        rng.standard_normal((T, E)),
        rng.standard_normal((E, 2 * F, H)) / 8,
        rng.standard_normal((E, H, F)) / 6,
    ]
    dtypes = (jnp.bfloat16, jnp.float32, jnp.bfloat16, jnp.bfloat16)

    def run(device):
        with jax.default_device(device):
            args = [jnp.asarray(a, d) for a, d in zip(host, dtypes)]
            ids, _, _ = router(args[1], k)
            p = permute(args[0], ids, E, alignment=16)
            y, grads = jax.jit(
                jax.value_and_grad(lambda *a: (layer(*a).astype(jnp.float32) ** 2).sum(), argnums=(0, 1, 2, 3))
            )(*args)
            return ids, p, y, grads

    c_ids, c_p, c_y, c_g = run(_CPU)
    g_ids, g_p, g_y, g_g = run(_GPU[0])
    again = run(_GPU[0])  # deterministic: the same bits on a second run
    end = int(np.asarray(g_p.group_offsets)[-1])
    _same(np.asarray(again[1].rows)[:end], np.asarray(g_p.rows)[:end], "second run: rows")
    for a, b in zip(jax.tree_util.tree_leaves((g_ids, g_y, g_g)), jax.tree_util.tree_leaves(again[:1] + again[2:])):
        _same(a, b, "second run")
    _same(g_ids, c_ids, "topk_ids")  # routing: exact across the backends
    _same(g_p.group_offsets, c_p.group_offsets, "group_offsets")
    _same(np.asarray(g_p.rows)[:end], np.asarray(c_p.rows)[:end], "permuted rows")
    np.testing.assert_allclose(float(g_y), float(c_y), rtol=2e-2)
    for name, g, c in zip(("d_x", "d_logits", "d_w1", "d_w2"), g_g, c_g):
        g, c = np.asarray(g, np.float32), np.asarray(c, np.float32)
        scale = np.abs(c).max() + 1e-30
        assert np.abs(g - c).max() <= 3e-2 * scale, name
