"""sfmoe.jax: the MoE layer through XLA FFI (docs/jax.md), on JAX's CPU backend here and on the GPU
where one is present. Against a pure-JAX reference MoE written below from docs/router.md and
docs/moe_layer.md (softmax after or before the top-k, sigmoid with normalization, group-limited
top-k, expert bias; SwiGLU and GELU experts): the output and the gradients of x, the logits (so
the gate) and both weights, FP32 within rounding and BF16 within its bound; the aux and z losses'
gradients; the torch module's output and gradients on the same weights; jit without recompiling on
new routings, jax.checkpoint, eval_shape, every token on one expert and empty experts; vmap
refused."""

import dataclasses

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
sfmoe_jax = pytest.importorskip("sfmoe.jax")
from sfmoe.jax import MoEConfig, moe_block, moe_layer  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
_GPU = [d for d in jax.devices() if d.platform == "gpu"]


@pytest.fixture(autouse=True)
def on_the_cpu(request):
    """The FP32 tests on JAX's CPU device (the CPU backend; the device layer is BF16), whatever
    the default device; the GPU test chooses its own."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _route(logits, bias, c):
    """Token ids [T, k] and probabilities [T, k] as docs/router.md defines them."""
    E, k = c.num_experts, c.topk
    if c.score_function == "sigmoid":
        scores = jax.nn.sigmoid(logits)
    elif c.pre_softmax:
        scores = jax.nn.softmax(logits, -1)
    else:
        scores = logits  # softmax after the top-k: select on the logits
    select = scores if bias is None else scores + bias
    if c.num_groups > 1:
        G = c.num_groups
        grouped = select.reshape(-1, G, E // G)
        group_score = jax.lax.top_k(grouped, 2)[0].sum(-1)
        kept = jax.lax.top_k(group_score, c.group_topk)[1]
        mask = jnp.zeros(group_score.shape, bool).at[jnp.arange(logits.shape[0])[:, None], kept].set(True)
        select = jnp.where(jnp.repeat(mask, E // G, axis=-1), select, -jnp.inf)
    _, ids = jax.lax.top_k(select, k)
    picked = jnp.take_along_axis(scores, ids, -1)
    if c.score_function == "softmax" and not c.pre_softmax:
        probs = jax.nn.softmax(picked, -1)
    elif c.score_function == "sigmoid" and k > 1:
        probs = picked / picked.sum(-1, keepdims=True)
    else:
        probs = picked
    return ids, probs * c.topk_scaling_factor


def _reference(x, logits, w1, w2, c, bias=None):
    """The layer densely: every expert on every token, the selected ones weighted."""
    ids, probs = _route(logits, bias, c)
    F = c.ffn_hidden_size
    h = jnp.einsum("th,efh->tef", x, w1)
    if c.activation == "swiglu":
        act = jax.nn.silu(h[..., :F]) * h[..., F:]
    else:  # gelu, the tanh form (docs/activations.md)
        act = jax.nn.gelu(h, approximate=True)
    out = jnp.einsum("tef,ehf->teh", act, w2)
    chosen = jnp.take_along_axis(out, ids[..., None], 1)
    return (probs[..., None] * chosen).sum(1)


def _problem(rng, T, H, F, E, c, dtype=jnp.float32):
    fc1 = 2 * F if c.activation == "swiglu" else F
    x = jnp.asarray(rng.standard_normal((T, H)), dtype)
    logits = jnp.asarray(rng.standard_normal((T, E)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((E, fc1, H)) / np.sqrt(H), dtype)
    w2 = jnp.asarray(rng.standard_normal((E, H, F)) / np.sqrt(F), dtype)
    dy = jnp.asarray(rng.standard_normal((T, H)), jnp.float32)
    return x, logits, w1, w2, dy


def _closeness(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    denominator = (a * a + b * b).sum()
    return 0.0 if denominator == 0 else 1.0 - 2.0 * (a * b).sum() / denominator


CONFIGS = [
    dict(),  # softmax after the top-k (Mixtral, Qwen3)
    dict(pre_softmax=True),
    dict(score_function="sigmoid", topk_scaling_factor=2.5),  # DeepSeek-V3 style
    dict(score_function="sigmoid", num_groups=4, group_topk=2),
    dict(activation="gelu"),
]


@pytest.mark.parametrize("options", CONFIGS, ids=["softmax-after", "pre-softmax", "sigmoid", "groups", "gelu"])
def test_layer_and_its_gradients_equal_the_reference(rng, options):
    T, H, F, E, k = 37, 24, 16, 8, 3
    c = MoEConfig(H, F, E, k, **options)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)

    def ours(x, logits, w1, w2):
        return (moe_layer(x, logits, w1, w2, c)[0] * dy).sum()

    def theirs(x, logits, w1, w2):
        return (_reference(x, logits, w1, w2, c) * dy).sum()

    y, counts = moe_layer(x, logits, w1, w2, c)
    want = _reference(x, logits, w1, w2, c)
    assert np.allclose(y, want, rtol=1e-5, atol=1e-5), np.abs(np.asarray(y) - np.asarray(want)).max()
    assert int(counts["tokens_per_expert"].sum()) == T * k
    got = jax.grad(ours, argnums=(0, 1, 2, 3))(x, logits, w1, w2)
    ref = jax.grad(theirs, argnums=(0, 1, 2, 3))(x, logits, w1, w2)
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), got, ref):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-5), (name, np.abs(np.asarray(a) - np.asarray(b)).max())


def test_expert_bias_steers_the_selection_only(rng):
    T, H, F, E, k = 40, 16, 8, 8, 2
    c = MoEConfig(H, F, E, k, score_function="sigmoid", expert_bias=True)
    x, logits, w1, w2, _ = _problem(rng, T, H, F, E, c)
    bias = jnp.asarray(rng.standard_normal(E), jnp.float32)
    y, _ = moe_layer(x, logits, w1, w2, c, expert_bias=bias)
    assert np.allclose(y, _reference(x, logits, w1, w2, c, bias), rtol=1e-5, atol=1e-5)
    y_plain, _ = moe_layer(x, logits, w1, w2, c)
    assert not np.allclose(y, y_plain)  # the bias changed the routing


def test_bf16_within_its_bound(rng):
    T, H, F, E, k = 64, 32, 16, 8, 2
    c = MoEConfig(H, F, E, k)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)
    y, _ = moe_layer(x.astype(jnp.bfloat16), logits, w1.astype(jnp.bfloat16), w2.astype(jnp.bfloat16), c)
    assert y.dtype == jnp.bfloat16
    assert _closeness(y, _reference(x, logits, w1, w2, c)) < 2e-4


def test_the_block_the_losses_and_maxtext_weights(rng):
    T, H, F, E, k = 30, 16, 8, 4, 2
    c = MoEConfig(H, F, E, k, aux_loss_coeff=1e-2, z_loss_coeff=1e-3)
    gate = jnp.asarray(rng.standard_normal((H, E)), jnp.float32)
    wi = jnp.asarray(rng.standard_normal((E, H, 2 * F)) / 4, jnp.float32)
    wo = jnp.asarray(rng.standard_normal((E, F, H)) / 3, jnp.float32)
    x = jnp.asarray(rng.standard_normal((2, 15, H)), jnp.float32)

    def loss(x, gate, wi, wo):
        y, aux, _ = moe_block(x, gate, wi, wo, c)
        return (y * y).sum() + aux

    def reference(x, gate, wi, wo):
        t = x.reshape(-1, H)
        logits = t @ gate
        y = _reference(t, logits, jnp.swapaxes(wi, 1, 2), jnp.swapaxes(wo, 1, 2), c)
        ids, _ = _route(logits, None, c)
        routed = jax.lax.stop_gradient(jnp.zeros(E).at[ids.reshape(-1)].add(1.0))
        scores = jax.nn.softmax(logits, -1)
        aux = c.aux_loss_coeff * E / (k * T * T) * (routed * scores.sum(0)).sum()
        z = c.z_loss_coeff / T * jnp.square(jax.nn.logsumexp(logits, -1)).sum()
        return (y * y).sum() + aux + z

    assert np.isclose(loss(x, gate, wi, wo), reference(x, gate, wi, wo), rtol=1e-5)
    got = jax.grad(loss, argnums=(0, 1, 2, 3))(x, gate, wi, wo)
    ref = jax.grad(reference, argnums=(0, 1, 2, 3))(x, gate, wi, wo)
    for name, a, b in zip(("d x", "d gate", "d wi", "d wo"), got, ref):
        # (FP32 sums with cancellation in other orders: an element's error scales with the
        # gradient's magnitude, not its own; seen 1.5e-4 on -0.376 of a d gate as large as 6.8)
        assert np.allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max())), name
    # split wi_0 / wi_1 give the fused wi's result
    y_split = moe_block(x, gate, (wi[..., :F], wi[..., F:]), wo, c)[0]
    assert np.array_equal(y_split, moe_block(x, gate, wi, wo, c)[0])


def test_jit_does_not_recompile_on_new_routings_and_edge_routings_work(rng):
    T, H, F, E, k = 48, 16, 8, 8, 2
    c = MoEConfig(H, F, E, k)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)

    @jax.jit
    def step(x, logits, w1, w2):
        def loss(x, logits, w1, w2):
            return (moe_layer(x, logits, w1, w2, c)[0] * dy).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, logits, w1, w2)

    cases = {
        "random": logits,
        "every token on experts 0 and 1": logits.at[:, :2].add(100.0),  # the others empty
        "one expert empty": logits.at[:, 5].add(-100.0),
    }
    for name, routed in cases.items():
        value, grads = step(x, routed, w1, w2)
        terms = np.asarray(_reference(x, routed, w1, w2, c) * dy, np.float64)
        # (the loss sums terms of both signs: its error is bounded by their magnitudes' sum, not
        # by the sum itself, which cancellation can make small)
        assert abs(float(value) - terms.sum()) <= 1e-5 * np.abs(terms).sum(), name
        assert all(bool(jnp.isfinite(g).all()) for g in grads), name
    assert step._cache_size() == 1
    counts = moe_layer(x, cases["every token on experts 0 and 1"], w1, w2, c)[1]["tokens_per_expert"]
    assert np.array_equal(counts, [T, T, 0, 0, 0, 0, 0, 0])


def test_checkpoint_eval_shape_and_vmap(rng):
    T, H, F, E, k = 20, 16, 8, 4, 2
    c = MoEConfig(H, F, E, k)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)

    def loss(x, logits, w1, w2):
        return (moe_layer(x, logits, w1, w2, c)[0] * dy).sum()

    plain = jax.grad(loss, argnums=(0, 2))(x, logits, w1, w2)
    remat = jax.grad(jax.checkpoint(loss), argnums=(0, 2))(x, logits, w1, w2)
    for a, b in zip(plain, remat):
        assert np.array_equal(a, b)
    shapes = jax.eval_shape(lambda *a: moe_layer(*a, c), x, logits, w1, w2)
    assert shapes[0].shape == (T, H) and shapes[1]["tokens_per_expert"].shape == (E,)
    with pytest.raises(Exception, match="sfmoe_moe_forward|vmap|batch"):
        jax.vmap(lambda x, g: moe_layer(x, g, w1, w2, c)[0])(x[None], logits[None])


def test_the_torch_modules_output_and_gradients(rng):
    torch = pytest.importorskip("torch")
    from sfmoe.torch import MoE

    T, H, F, E, k = 33, 16, 8, 4, 2
    module = MoE(H, F, E, k, dtype=torch.float32)
    c = module.config
    x = rng.standard_normal((T, H)).astype(np.float32)
    dy = rng.standard_normal((T, H)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    y_torch = module(xt)
    y_torch.backward(torch.tensor(dy))
    gate = jnp.asarray(module.router.weight.detach().numpy().T)
    w1 = jnp.asarray(module.experts.weight1.detach().numpy())
    w2 = jnp.asarray(module.experts.weight2.detach().numpy())
    wi, wo = jnp.swapaxes(w1, 1, 2), jnp.swapaxes(w2, 1, 2)

    def loss(x, gate, wi, wo):
        return (moe_block(x, gate, wi, wo, c)[0] * dy).sum()

    y = moe_block(jnp.asarray(x), gate, wi, wo, c)[0]
    assert np.allclose(y, y_torch.detach().numpy(), rtol=1e-5, atol=1e-6)
    d_x, d_gate, d_wi, d_wo = jax.grad(loss, argnums=(0, 1, 2, 3))(jnp.asarray(x), gate, wi, wo)
    assert np.allclose(d_x, xt.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert np.allclose(d_gate.T, module.router.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert np.allclose(jnp.swapaxes(d_wi, 1, 2), module.experts.weight1.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert np.allclose(jnp.swapaxes(d_wo, 1, 2), module.experts.weight2.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_bad_configurations_are_refused():
    with pytest.raises(TypeError, match="MoEConfig"):
        moe_layer(jnp.zeros((2, 8)), jnp.zeros((2, 4)), jnp.zeros((4, 8, 8)), jnp.zeros((4, 8, 4)), dict())
    c = MoEConfig(8, 4, 4, 2)
    with pytest.raises(Exception, match="w1"):  # weights of the wrong shape: the layer's message
        moe_layer(jnp.zeros((2, 8)), jnp.zeros((2, 4)), jnp.zeros((4, 8, 6)), jnp.zeros((4, 8, 4)), c)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        moe_layer(jnp.zeros((2, 8), jnp.float16), jnp.zeros((2, 4)), jnp.zeros((4, 8, 8)), jnp.zeros((4, 8, 4)), c)
    for x in (jnp.zeros((8,)), jnp.zeros((1, 2, 8)), jnp.zeros((2, 7))):  # named as such, not as a token bound
        with pytest.raises(ValueError, match=r"x must be \[T, 8\] \(hidden_size\)"):
            moe_layer(x, jnp.zeros((2, 4)), jnp.zeros((4, 8, 8)), jnp.zeros((4, 8, 4)), c)
    for alignment in (0, -16, 2.0):
        with pytest.raises(ValueError, match="row_alignment must be a positive integer"):
            MoEConfig(8, 4, 4, 2, row_alignment=alignment)
    for size in (0, -2):
        with pytest.raises(ValueError, match="ep_size must be a positive integer"):
            MoEConfig(8, 4, 4, 2, ep_size=size, max_tokens_per_rank=8)
    for name in ("capacity_factor", "ep_capacity_factor"):
        with pytest.raises(ValueError, match=f"{name} must be positive and finite"):
            MoEConfig(8, 4, 4, 2, **{name: float("inf")})


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no GPU for JAX: the device handlers need one")
def test_on_the_gpu_bf16_within_its_bound_and_one_compilation(rng):
    T, H, F, E, k = 300, 64, 32, 8, 2
    c = MoEConfig(H, F, E, k)
    with jax.default_device(jax.devices("cpu")[0]):
        x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)

        def reference(x, logits, w1, w2):
            return (_reference(x, logits, w1, w2, c) * dy).sum()

        want = jax.value_and_grad(reference, argnums=(0, 1, 2, 3))(x, logits, w1, w2)
        # the loss is a random sum with cancellation: compared within the magnitude of its terms
        terms = float(jnp.abs(_reference(x, logits, w1, w2, c) * dy).sum())
    gpu = _GPU[0]
    args = [
        jax.device_put(a, gpu)
        for a in (x.astype(jnp.bfloat16), logits, w1.astype(jnp.bfloat16), w2.astype(jnp.bfloat16))
    ]
    dy_gpu = jax.device_put(dy, gpu)

    @jax.jit
    def step(x, logits, w1, w2):
        def loss(x, logits, w1, w2):
            return (moe_layer(x, logits, w1, w2, c)[0].astype(jnp.float32) * dy_gpu).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, logits, w1, w2)

    value, grads = step(*args)
    assert grads[0].devices() == {gpu}
    assert abs(float(value) - float(want[0])) < 1e-2 * terms
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), grads, want[1]):
        assert _closeness(a.astype(jnp.float32), b) < 2e-4, name
    for shift in range(3):  # new routings: the same executable
        step(args[0], args[1] + shift * jnp.arange(E, dtype=jnp.float32), args[2], args[3])
    assert step._cache_size() == 1


def test_the_jitted_training_step_holds_only_sfmoe_calls_and_xla_ops(rng):
    """The lowered and the compiled step (value_and_grad of moe_block and an SGD update): the only
    custom calls are sfmoe's two, and there is no host callback, infeed / outfeed or send / recv."""
    import re

    T, H, F, E, k = 32, 16, 8, 4, 2
    c = MoEConfig(H, F, E, k, aux_loss_coeff=1e-2)
    x = jnp.asarray(rng.standard_normal((T, H)), jnp.float32)
    params = dict(
        gate=jnp.asarray(rng.standard_normal((H, E)), jnp.float32),
        wi=jnp.asarray(rng.standard_normal((E, H, 2 * F)) / 4, jnp.float32),
        wo=jnp.asarray(rng.standard_normal((E, F, H)) / 3, jnp.float32),
    )

    def step(params, x):
        def loss(p):
            y, aux, _ = moe_block(x, p["gate"], p["wi"], p["wo"], c)
            return (y * y).mean() + aux

        value, grads = jax.value_and_grad(loss)(params)
        return value, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)

    lowered = jax.jit(step).lower(params, x)
    mlir = lowered.as_text()
    assert set(re.findall(r"stablehlo\.custom_call @(\w+)", mlir)) == {"sfmoe_moe_forward", "sfmoe_moe_backward"}
    for op in ("stablehlo.send", "stablehlo.recv", "stablehlo.infeed", "stablehlo.outfeed"):
        assert op not in mlir, op
    hlo = lowered.compile().as_text()
    assert set(re.findall(r'custom_call_target="([^"]+)"', hlo)) == {"sfmoe_moe_forward", "sfmoe_moe_backward"}


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "nvfp4"])
def test_every_quantized_recipe_gives_the_torch_modules_bits(rng, recipe):
    """The quantized recipes through XLA give the torch module's bits for the same recipe on the
    same backend (MXFP8 and NVFP4 emulated, as on the CPU backend and Hopper), and differ from the
    BF16 recipe: the recipe is in effect."""
    torch = pytest.importorskip("torch")
    from sfmoe.torch import MoE, _moe

    T, H, F, E, k = 37, 128, 128, 4, 2  # the 128x128 weight blocks need H, F multiples of 128
    # Dyadic tokens and gate weights: every logit is exact in FP32 whatever order XLA and torch
    # sum in, so both give the layer the same logits (and the same routing).
    x = (rng.integers(-16, 17, (T, H)) / 8).astype(np.float32)
    router = torch.tensor(rng.integers(-16, 17, (E, H)) / 16, dtype=torch.float32)
    dy = rng.standard_normal((T, H)).astype(np.float32)
    module = MoE(H, F, E, k, dtype=torch.float32, recipe=recipe)
    with torch.no_grad():
        module.router.weight.copy_(router)
    c = module.config
    xt = torch.tensor(x, requires_grad=True)
    y_torch = module(xt)
    # NVFP4's stochastic rounding: the module advances the Philox offset each backward; its next
    # one rounds with offset 7, which the JAX block is given as a traced step counter.
    if recipe == "nvfp4":
        _moe._rng_offset(module._key, xt.device).fill_(6)
    y_torch.backward(torch.tensor(dy))
    gate = jnp.asarray(router.numpy().T)
    wi = jnp.swapaxes(jnp.asarray(module.experts.weight1.detach().numpy()), 1, 2)
    wo = jnp.swapaxes(jnp.asarray(module.experts.weight2.detach().numpy()), 1, 2)

    def run(config, rng_offset=7):
        def loss(x, gate, wi, wo, offset):
            return (moe_block(x, gate, wi, wo, config, rng_offset=offset)[0] * dy).sum()

        y = jax.jit(lambda *a: moe_block(*a, config)[0])(jnp.asarray(x), gate, wi, wo)
        offset = jnp.uint32(rng_offset)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(jnp.asarray(x), gate, wi, wo, offset)
        return [np.asarray(y)] + [np.asarray(g) for g in grads]

    got = run(c)
    if recipe == "nvfp4":  # another step's stream rounds the gradients otherwise
        other = run(c, 8)
        assert not (np.array_equal(other[3], got[3]) and np.array_equal(other[4], got[4])), "offset ignored"
    bf16 = run(dataclasses.replace(c, recipe="bf16"))
    want = [
        y_torch.detach().numpy(),
        xt.grad.numpy(),
        module.router.weight.grad.numpy().T,
        np.swapaxes(module.experts.weight1.grad.numpy(), 1, 2),
        np.swapaxes(module.experts.weight2.grad.numpy(), 1, 2),
    ]
    # y and the weights' gradients come from the layer alone (the JAX side only transposes): the
    # module's bits. d x and d gate add the gate's product, which XLA and torch sum in their own
    # orders. (XLA's CPU threads flush subnormals to zero; the CPU backend computes in IEEE
    # arithmetic whatever its caller's mode, so the bits agree.)
    for name, g, w, b in zip(("y", "d x", "d gate", "d wi", "d wo"), got, want, bf16):
        norm = np.linalg.norm(w)
        assert np.isfinite(g).all() and norm > 0, name
        if name in ("y", "d wi", "d wo"):
            assert np.array_equal(g, w), f"{name}: not the torch module's {recipe} bits"
        else:
            assert np.linalg.norm(g - w) <= 1e-5 * norm, f"{name}: not the torch module's {recipe}"
        assert np.linalg.norm(g - b) >= 5e-3 * norm, f"{name}: no different from the bf16 recipe"


@pytest.mark.parametrize("recipe", ["bf16", "tensorwise"])
def test_the_three_part_backward_gives_the_same_bits_in_less_memory(rng, monkeypatch, recipe):
    """The backward in three calls (FC2's dgrad, the FC1 part, FC2's wgrad: docs/moe_layer.md,
    "Backward in parts") gives the one call's gradients bit for bit (FP8 per-tensor too: its amax
    kept across the parts), and at Mixtral-8x7B's proportions (2F >> H, E H = 2 T k), where the
    plan chooses it, XLA's buffer assignment (the CPU compilation's temporaries) holds less: the
    saved state's buffer is free before d w2 is made."""
    T, H, F, E, k = 128, 64, 224, 8, 2
    c = MoEConfig(H, F, E, k, recipe=recipe)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)
    if recipe == "tensorwise":  # (FP8 recipes run on BF16 rows and weights)
        x, w1, w2 = (a.astype(jnp.bfloat16) for a in (x, w1, w2))
    else:
        assert sfmoe_jax._three_part_backward(c, T, x.dtype.name)

    def loss(x, logits, w1, w2):
        return (moe_layer(x, logits, w1, w2, c)[0].astype(jnp.float32) * dy).sum()

    def step(x, logits, w1, w2):
        grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, logits, w1, w2)
        # (a training step uses its gradients in the same program, as an optimizer does: here
        # they are temporaries, whose lifetimes the buffer assignment packs)
        return grads, [(g.astype(jnp.float32) ** 2).sum() for g in grads]

    results, temporaries = [], []
    for three in (True, False):
        monkeypatch.setattr(sfmoe_jax, "_three_part_backward", lambda *args, three=three: three)
        jax.clear_caches()  # (a new trace for each order)
        lowered = jax.jit(lambda *a: step(*a)[0]).lower(x, logits, w1, w2)
        assert ("sfmoe_moe_backward_part" in lowered.as_text()) == three
        results.append([np.asarray(g) for g in lowered.compile()(x, logits, w1, w2)])
        used = jax.jit(lambda *a: step(*a)[1]).lower(x, logits, w1, w2).compile()
        temporaries.append(used.memory_analysis().temp_size_in_bytes)
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), *results):
        assert np.array_equal(a, b), name
    if recipe == "bf16":
        assert temporaries[0] < temporaries[1], temporaries
        print(f"temporaries: three parts {temporaries[0]} bytes, one call {temporaries[1]}")


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "nvfp4"])
def test_the_weight_cache_gives_the_same_bits_and_quantizes_no_weight(rng, monkeypatch, recipe):
    """Gradient accumulation (docs/jax.md): fill_weight_cache's copies passed to every micro-batch
    give the bits of calls without a cache (output and every gradient, the backward in one call
    and in three); a cache filled from other weights changes the output and the weights'
    gradients, so the calls read it instead of quantizing w1 and w2; BF16 needs none; a cache of
    the wrong size or type is refused (expert parallelism: test_jax_ep.py)."""
    T, H, F, E, k = 37, 128, 128, 4, 2  # (whole 128x128 weight blocks)
    c = MoEConfig(H, F, E, k, recipe=recipe)
    x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)
    cache = jax.jit(lambda w1, w2: sfmoe_jax.fill_weight_cache(w1, w2, c))(w1, w2)
    assert cache.dtype == jnp.uint8 and cache.shape == (sfmoe_jax.plan(c, T, x.dtype)["weight_cache_bytes"],)
    assert cache.shape[0] > 0

    def run(weight_cache):
        def loss(x, logits, w1, w2):
            return (moe_layer(x, logits, w1, w2, c, rng_offset=3, weight_cache=weight_cache)[0] * dy).sum()

        y = jax.jit(lambda *a: moe_layer(*a, c, rng_offset=3, weight_cache=weight_cache)[0])(x, logits, w1, w2)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, logits, w1, w2)
        return [np.asarray(y)] + [np.asarray(g) for g in grads]

    names = ("y", "d x", "d logits", "d w1", "d w2")
    without = run(None)
    for three in (False, True):
        monkeypatch.setattr(sfmoe_jax, "_three_part_backward", lambda *args, three=three: three)
        jax.clear_caches()
        for name, a, b in zip(names, run(cache), without):
            assert np.isfinite(a).all() and np.array_equal(a, b), f"{name} (three parts: {three})"
    # Another weights' copies: what the calls read is the cache.
    other = sfmoe_jax.fill_weight_cache(w1 * 2, w2 * 2, c)
    stale = run(other)
    for name in ("y", "d w1", "d w2"):
        a, b = stale[names.index(name)], without[names.index(name)]
        assert not np.array_equal(a, b), f"{name}: the cache was not read"
    # BF16 quantizes nothing: an empty cache, taken and ignored.
    plain = MoEConfig(H, F, E, k)
    empty = sfmoe_jax.fill_weight_cache(w1, w2, plain)
    assert empty.shape == (0,)
    y_plain = moe_layer(x, logits, w1, w2, plain, weight_cache=empty)[0]
    assert np.array_equal(np.asarray(y_plain), np.asarray(moe_layer(x, logits, w1, w2, plain)[0]))
    for bad in (cache[:-1], cache.astype(jnp.int32), cache.reshape(1, -1)):
        with pytest.raises(ValueError, match="weight_cache must be fill_weight_cache's uint8 array"):
            moe_layer(x, logits, w1, w2, c, weight_cache=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no GPU for JAX: the device handlers need one")
@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_on_the_gpu_the_weight_cache_gives_the_same_bits(rng, recipe):
    """The CUDA handlers' weight cache (the fill and the calls that read it): BF16 tokens and
    weights on the GPU, the output and every gradient the bits of calls without a cache; a cache
    filled from other weights changes the output."""
    T, H, F, E, k = 300, 256, 128, 8, 2
    c = MoEConfig(H, F, E, k, recipe=recipe)
    with jax.default_device(jax.devices("cpu")[0]):
        x, logits, w1, w2, dy = _problem(rng, T, H, F, E, c)
    gpu = _GPU[0]
    x, w1, w2 = (jax.device_put(a.astype(jnp.bfloat16), gpu) for a in (x, w1, w2))
    logits, dy = jax.device_put(logits, gpu), jax.device_put(dy, gpu)

    def run(weight_cache):
        def loss(x, logits, w1, w2):
            y = moe_layer(x, logits, w1, w2, c, weight_cache=weight_cache)[0]
            return (y.astype(jnp.float32) * dy).sum(), y

        grads, y = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(x, logits, w1, w2)
        return [np.asarray(y.astype(jnp.float32))] + [np.asarray(g.astype(jnp.float32)) for g in grads]

    fill = jax.jit(lambda w1, w2: sfmoe_jax.fill_weight_cache(w1, w2, c))
    without, cached = run(None), run(fill(w1, w2))
    for name, a, b in zip(("y", "d x", "d logits", "d w1", "d w2"), cached, without):
        assert np.isfinite(a).all() and np.array_equal(a, b), f"{name} ({recipe})"
    stale = run(fill(w1 * 2, w2 * 2))
    assert not np.array_equal(stale[0], without[0]), "the calls did not read the cache"
