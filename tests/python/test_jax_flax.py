"""sfmoe.jax.MoEBlock (Flax) and its parameter-tree migrations (docs/jax.md): MaxText's names and
shapes; the module equal to moe_block on its parameters; the split (wi_0 / wi_1) and fused (wi)
layouts equal on converted parameters; parameters and an optax Adam state converted split -> fused
-> split bit for bit, and training continued after a conversion with the same losses, bit for bit,
as without it; the expert-bias collection and its balancing step."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flax")
optax = pytest.importorskip("optax")
pytest.importorskip("sfmoe.jax")
from sfmoe.jax import (  # noqa: E402
    MoEBlock,
    MoEConfig,
    fuse_wi,
    moe_block,
    split_wi,
    to_maxtext_layout,
    to_sfmoe_layout,
    update_expert_bias,
)

H, F, E, K = 16, 8, 4, 2


@pytest.fixture(autouse=True)
def on_the_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _tokens(rng, n=24):
    return jnp.asarray(rng.standard_normal((n, H)), jnp.float32)


def test_the_parameter_tree_has_maxtexts_names_and_shapes(rng):
    config = MoEConfig(H, F, E, K)
    x = _tokens(rng)
    split = MoEBlock(config).init(jax.random.PRNGKey(0), x)["params"]
    assert jax.tree_util.tree_map(jnp.shape, dict(split)) == {
        "gate": {"kernel": (H, E)},
        "wi_0": (E, H, F),
        "wi_1": (E, H, F),
        "wo": (E, F, H),
    }
    fused = MoEBlock(config, fused_wi=True).init(jax.random.PRNGKey(0), x)["params"]
    assert fused["wi"].shape == (E, H, 2 * F)
    y, aux, counts = MoEBlock(config).apply({"params": split}, x)
    want = moe_block(x, split["gate"]["kernel"], (split["wi_0"], split["wi_1"]), split["wo"], config)
    assert np.array_equal(y, want[0]) and int(counts["tokens_per_expert"].sum()) == x.shape[0] * K
    y_fused, _, _ = MoEBlock(config, fused_wi=True).apply({"params": fuse_wi(split)}, x)
    assert np.array_equal(y, y_fused)


def _train(module, params, state, optimizer, batches):
    def loss(params, x):
        y, aux, _ = module.apply({"params": params}, x)
        return (y * y).mean() + aux

    losses = []
    for x in batches:
        value, grads = jax.value_and_grad(loss)(params, x)
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(value))
    return params, state, losses


def test_adam_state_migrates_both_ways_and_training_goes_on_alike(rng):
    config = MoEConfig(H, F, E, K, aux_loss_coeff=1e-2)
    batches = [_tokens(rng) for _ in range(6)]
    split_module, fused_module = MoEBlock(config), MoEBlock(config, fused_wi=True)
    params = split_module.init(jax.random.PRNGKey(1), batches[0])["params"]
    optimizer = optax.adam(1e-2)
    params, state, _ = _train(split_module, params, optimizer.init(params), optimizer, batches[:3])
    # a checkpoint in the split layout, restored into the fused one and back: the same bits
    fused_params, fused_state = fuse_wi(params), fuse_wi(state)
    for a, b in zip(
        jax.tree_util.tree_leaves((params, state)), jax.tree_util.tree_leaves(split_wi((fused_params, fused_state)))
    ):
        assert np.array_equal(a, b)
    assert fused_state[0].mu["wi"].shape == (E, H, 2 * F)
    _, _, split_losses = _train(split_module, params, state, optimizer, batches[3:])
    _, _, fused_losses = _train(fused_module, fused_params, fused_state, optimizer, batches[3:])
    assert split_losses == fused_losses


@pytest.mark.parametrize("fused_wi", [False, True])
def test_the_sfmoe_layout_gives_the_maxtext_layouts_bits_and_migrates_both_ways(rng, fused_wi):
    """MoEBlock(layout="sfmoe") holds w1 / w2 (no transposes in the step): on the migrated
    parameters it gives the MaxText layout's output, losses and (transposed) gradients bit for bit;
    parameters and Adam state go MaxText -> sfmoe -> MaxText unchanged, and training goes on with
    the same losses in either layout."""
    config = MoEConfig(H, F, E, K, aux_loss_coeff=1e-2, z_loss_coeff=1e-3)
    batches = [_tokens(rng) for _ in range(5)]
    maxtext = MoEBlock(config, fused_wi=fused_wi)
    native = MoEBlock(config, layout="sfmoe")
    params = maxtext.init(jax.random.PRNGKey(3), batches[0])["params"]
    assert jax.tree_util.tree_map(jnp.shape, dict(native.init(jax.random.PRNGKey(3), batches[0])["params"])) == {
        "gate": {"kernel": (H, E)},
        "w1": (E, 2 * F, H),
        "w2": (E, H, F),
    }
    optimizer = optax.adam(1e-2)
    params, state, _ = _train(maxtext, params, optimizer.init(params), optimizer, batches[:2])
    moved_params, moved_state = to_sfmoe_layout(params), to_sfmoe_layout(state)
    assert moved_params["w1"].shape == (E, 2 * F, H) and moved_state[0].nu["w2"].shape == (E, H, F)
    back = to_maxtext_layout((moved_params, moved_state), fused_wi=fused_wi)
    for a, b in zip(jax.tree_util.tree_leaves((params, state)), jax.tree_util.tree_leaves(back)):
        assert np.array_equal(a, b)
    x = batches[2]
    want = maxtext.apply({"params": params}, x)
    got = native.apply({"params": moved_params}, x)
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        assert np.array_equal(a, b)

    def loss(module):
        return lambda p: (module.apply({"params": p}, x)[0] ** 2).mean() + module.apply({"params": p}, x)[1]

    for a, b in zip(
        jax.tree_util.tree_leaves(to_sfmoe_layout(jax.grad(loss(maxtext))(params))),
        jax.tree_util.tree_leaves(jax.grad(loss(native))(moved_params)),
    ):
        assert np.array_equal(a, b)
    _, _, maxtext_losses = _train(maxtext, params, state, optimizer, batches[2:])
    _, _, native_losses = _train(native, moved_params, moved_state, optimizer, batches[2:])
    assert maxtext_losses == native_losses
    with pytest.raises(ValueError, match="layout"):
        MoEBlock(config, layout="megatron").init(jax.random.PRNGKey(0), x)


def test_the_expert_bias_collection_and_its_balancing_step(rng):
    config = MoEConfig(H, F, E, K, score_function="sigmoid", expert_bias=True)
    x = _tokens(rng, 40)
    variables = MoEBlock(config).init(jax.random.PRNGKey(2), x)
    assert variables["moe"]["expert_bias"].shape == (E,)
    _, _, counts = MoEBlock(config).apply(variables, x)
    moved = update_expert_bias(variables["moe"], counts["tokens_per_expert"], 0.1)
    mean = float(counts["tokens_per_expert"].mean())
    for e in range(E):
        want = 0.1 * np.sign(mean - float(counts["tokens_per_expert"][e]))
        assert float(moved["expert_bias"][e]) == pytest.approx(want)


def test_nn_scan_over_layers_equals_the_layers_applied_in_turn(rng):
    """Two MoE blocks stacked with nn.scan (parameters with a leading layer axis, as MaxText's
    scanned layers hold them), forward and gradients, against each layer's block applied in turn."""
    import flax.linen as nn

    config = MoEConfig(H, F, E, K)

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            y, aux, _counts = MoEBlock(config)(x)
            return x + y, aux

    Stack = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
    x = _tokens(rng)
    params = Stack().init(jax.random.PRNGKey(1), x, None)["params"]
    assert params["MoEBlock_0"]["wo"].shape == (2, E, F, H)

    def scanned(params, x):
        out, aux = Stack().apply({"params": params}, x, None)
        return (out * out).sum() + aux.sum()

    def in_turn(params, x):
        total_aux = 0.0
        for layer in range(2):
            p = jax.tree_util.tree_map(lambda a: a[layer], params)
            y, aux, _ = MoEBlock(config).apply({"params": p["MoEBlock_0"]}, x)
            x, total_aux = x + y, total_aux + aux
        return (x * x).sum() + total_aux

    value, grads = jax.jit(jax.value_and_grad(scanned))(params, x)
    want_value, want_grads = jax.value_and_grad(in_turn)(params, x)
    assert np.allclose(value, want_value, rtol=1e-6)
    for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6)
        assert np.abs(got).sum() > 0
