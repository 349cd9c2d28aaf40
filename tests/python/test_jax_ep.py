"""sfmoe.jax with expert parallelism (docs/jax.md, "Expert parallelism"): the layer's EXTERNAL
stages with XLA's all-gathers and all-to-alls between them, one rank a call. Under
``jax.vmap(axis_name=...)`` on one device (the ranks emulated, as on the one H200) and inside
``jax.shard_map`` over CPU devices (a subprocess with --xla_force_host_platform_device_count, also
composed with a data axis): equal to the single-device layer on the whole batch bit for bit
(output and every gradient, FP32; the FP8 per-tensor, FP8 blockwise and MXFP8 recipes too, NVFP4's
output); the overflow counts (DROP beyond a capacity) equal to the
counts the routing implies; SPILL equal to an unlimited capacity (the weight gradients, summed
over two rounds, within FP32 rounding); misuse refused."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
sfmoe_jax = pytest.importorskip("sfmoe.jax")
from sfmoe.jax import MoEConfig, moe_layer  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


_GPU = [d for d in jax.devices() if d.platform == "gpu"]


@pytest.fixture(autouse=True)
def on_the_cpu(request):
    """On JAX's CPU device (the CPU backend), but for the GPU test, which chooses its own."""
    if "gpu" in request.keywords:
        yield
        return
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _problem(rng, R, T, H, F, E):
    x = jnp.asarray(rng.standard_normal((R * T, H)), jnp.float32)
    logits = jnp.asarray(rng.standard_normal((R * T, E)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((E, 2 * F, H)) / np.sqrt(H), jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((E, H, F)) / np.sqrt(F), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((R * T, H)), jnp.float32)
    return x, logits, w1, w2, dy


def _single(x, logits, w1, w2, dy, c):
    """The single-device layer on the whole batch: y, its gradients, its counts."""

    def loss(x, logits, w1, w2):
        y, counts = moe_layer(x, logits, w1, w2, c)
        return (y * dy).sum(), (y, counts)

    grads, (y, counts) = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, logits, w1, w2)
    return y, grads, counts


def _ranks(x, logits, w1, w2, dy, c, R):
    """The same batch over R ranks under vmap(axis_name="ep"): rank r holds tokens
    [r T, (r + 1) T) and experts [r E_l, (r + 1) E_l)."""
    T, E = x.shape[0] // R, w1.shape[0]

    def rank(x, logits, w1, w2, dy):
        def loss(x, logits, w1, w2):
            y, counts = moe_layer(x, logits, w1, w2, c, ep_axis="ep")
            return (y * dy).sum(), (y, counts)

        return jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, logits, w1, w2)

    split = lambda a, n: a.reshape(R, n, *a.shape[1:])  # noqa: E731
    grads, (y, counts) = jax.jit(jax.vmap(rank, axis_name="ep"))(
        split(x, T), split(logits, T), split(w1, E // R), split(w2, E // R), split(dy, T)
    )
    merge = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731
    return merge(y), tuple(merge(g) for g in grads), counts


def _ep_config(H, F, E, k, R, T, **ep):
    return MoEConfig(H, F, E, k, row_alignment=8, ep_size=R, max_tokens_per_rank=T, **ep)


def _expect_same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, what
    differ = int((a.view(np.uint32) != b.view(np.uint32)).sum())
    assert differ == 0, f"{what}: {differ} of {a.size} values differ"


@pytest.mark.parametrize("R", [1, 2, 4])
def test_ranks_under_vmap_equal_the_single_layer_bit_for_bit(rng, R):
    T, H, F, E, k = 13, 24, 16, 8, 2
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    single = MoEConfig(H, F, E, k, row_alignment=8)
    y, grads, counts = _single(x, logits, w1, w2, dy, single)
    y_ep, grads_ep, counts_ep = _ranks(x, logits, w1, w2, dy, _ep_config(H, F, E, k, R, T), R)
    _expect_same(y, y_ep, "y")
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), grads, grads_ep):
        _expect_same(a, b, name)
    # every rank's experts kept what the single layer's did; nothing dropped
    assert np.array_equal(np.asarray(counts_ep["tokens_per_expert"]).reshape(-1), counts["tokens_per_expert"])
    assert int(np.asarray(counts_ep["dropped_per_expert"]).sum()) == 0
    assert np.array_equal(np.asarray(counts_ep["routed_per_expert"]).sum(0), counts["routed_per_expert"])


@pytest.mark.parametrize("case", range(3))
def test_random_rank_counts_and_shapes_equal_the_single_layer(rng, case):
    """Fresh each run: 1 to 4 ranks (3 too), 1 to 3 experts a rank, k up to 4, few tokens a rank,
    row alignment 1 or 8, softmax or sigmoid scores: bit for bit as above."""
    R = int(rng.integers(1, 5))
    E = R * int(rng.integers(1, 4))
    k = int(rng.integers(1, min(E, 4) + 1))
    T, H, F = int(rng.choice([1, 2, 7, 13])), int(rng.choice([8, 24, 40])), int(rng.choice([8, 16, 24]))
    options = dict(row_alignment=int(rng.choice([1, 8])), score_function=str(rng.choice(["softmax", "sigmoid"])))
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    y, grads, counts = _single(x, logits, w1, w2, dy, MoEConfig(H, F, E, k, **options))
    ep = MoEConfig(H, F, E, k, ep_size=R, max_tokens_per_rank=T, **options)
    y_ep, grads_ep, counts_ep = _ranks(x, logits, w1, w2, dy, ep, R)
    _expect_same(y, y_ep, f"y (R {R}, E {E}, k {k}, T {T}, {options})")
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), grads, grads_ep):
        _expect_same(a, b, name)
    assert np.array_equal(np.asarray(counts_ep["tokens_per_expert"]).reshape(-1), counts["tokens_per_expert"])


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "nvfp4"])
def test_quantized_recipes_over_ranks_equal_the_single_layer(rng, recipe):
    """Each expert's rows are the same rows in the same order over the ranks, so its scales are
    too: every output and gradient bit for bit; NVFP4's gradients round stochastically by each
    element's place in its rank's buffer, so there the output only."""
    R, T, H, F, E, k = 2, 16, 128, 128, 4, 2
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    single = MoEConfig(H, F, E, k, row_alignment=128, recipe=recipe)
    ep = MoEConfig(H, F, E, k, row_alignment=128, recipe=recipe, ep_size=R, max_tokens_per_rank=T)
    y, grads, _ = _single(x, logits, w1, w2, dy, single)
    y_ep, grads_ep, _ = _ranks(x, logits, w1, w2, dy, ep, R)
    _expect_same(y, y_ep, f"y ({recipe})")
    if recipe != "nvfp4":
        for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), grads, grads_ep):
            _expect_same(a, b, f"{name} ({recipe})")


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_each_ranks_weight_cache_gives_the_same_bits(rng, recipe):
    """Gradient accumulation over ranks (docs/jax.md, "Weight cache"): each rank fills its cache
    from its local experts' weights inside the vmap and passes it to its calls; every output and
    gradient is the bits of the ranks without a cache, and a cache filled from other weights
    changes the output (the stages read it)."""
    R, T, H, F, E, k = 2, 16, 128, 128, 4, 2
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    ep = MoEConfig(H, F, E, k, row_alignment=128, recipe=recipe, ep_size=R, max_tokens_per_rank=T)
    split = lambda a, n: a.reshape(R, n, *a.shape[1:])  # noqa: E731
    args = (split(x, T), split(logits, T), split(w1, E // R), split(w2, E // R), split(dy, T))

    def run(cache_scale):
        def rank(x, logits, w1, w2, dy):
            cache = None if cache_scale is None else sfmoe_jax.fill_weight_cache(w1 * cache_scale, w2 * cache_scale, ep)

            def loss(x, logits, w1, w2):
                y, _ = moe_layer(x, logits, w1, w2, ep, ep_axis="ep", weight_cache=cache)
                return (y * dy).sum(), y

            return jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, logits, w1, w2)

        grads, y = jax.jit(jax.vmap(rank, axis_name="ep"))(*args)
        return [y, *grads]

    without, cached = run(None), run(1.0)
    for name, a, b in zip(("y", "d x", "d logits", "d w1", "d w2"), cached, without):
        _expect_same(a, b, f"{name} ({recipe}, cached)")
    stale = run(2.0)
    assert not np.array_equal(np.asarray(stale[0]), np.asarray(without[0])), "the stages did not read the cache"


def _expected_drops(ids, R, El, capacity, pair=None):
    """Each rank's dropped slots per global expert when each destination keeps its first
    `capacity` rows in (source rank, token, slot) order and each source sends each destination
    `pair` rows at most (docs/ep.md)."""
    E = R * El
    T = ids.shape[0] // R
    dropped = np.zeros((R, E), np.int64)
    received = np.zeros(R, np.int64)
    for r in range(R):
        in_pair = np.zeros(R, np.int64)
        for slot in ids[r * T : (r + 1) * T].reshape(-1):
            d = slot // El
            if received[d] >= capacity or (pair is not None and in_pair[d] >= pair):
                dropped[r, slot] += 1
            received[d] += 1
            in_pair[d] += 1
    return dropped


def test_drop_counts_are_exact_and_spill_equals_an_unlimited_capacity(rng):
    R, T, H, F, E, k = 4, 16, 16, 8, 8, 2
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    # the routing selects on the logits (softmax after the top-k): every rank's ids are known
    ids = np.asarray(jax.lax.top_k(logits, k)[1])
    unlimited = _ranks(x, logits, w1, w2, dy, _ep_config(H, F, E, k, R, T), R)
    # DROP beyond 0.5 T k rows a rank: the counts are the routing's
    capacity = int(np.ceil(0.5 * T * k))
    _, _, counts = _ranks(x, logits, w1, w2, dy, _ep_config(H, F, E, k, R, T, ep_capacity_factor=0.5), R)
    want = _expected_drops(ids, R, E // R, capacity)
    assert want.sum() > 0, "the capacity is meant to bind"
    assert np.array_equal(np.asarray(counts["dropped_per_expert"]), want)
    kept = np.asarray(counts["tokens_per_expert"]).sum(1)
    assert np.array_equal(kept, np.minimum(np.bincount(ids.reshape(-1) // (E // R), minlength=R), capacity))
    # a pair capacity of 0.5 T k / R rows: its drops too, with the receive capacity's
    pair = int(np.ceil(0.5 * T * k / R))
    paired = _ep_config(H, F, E, k, R, T, ep_capacity_factor=0.5, ep_pair_factor=0.5)
    _, _, counts = _ranks(x, logits, w1, w2, dy, paired, R)
    want = _expected_drops(ids, R, E // R, capacity, pair)
    assert want.sum() > _expected_drops(ids, R, E // R, capacity).sum(), "the pair capacity is meant to bind"
    assert np.array_equal(np.asarray(counts["dropped_per_expert"]), want)
    # SPILL (a second round for what does not fit) gives the unlimited layer's results
    spill = _ranks(x, logits, w1, w2, dy, _ep_config(H, F, E, k, R, T, ep_capacity_factor=0.5, ep_overflow="spill"), R)
    _expect_same(unlimited[0], spill[0], "y (SPILL)")
    _expect_same(unlimited[1][0], spill[1][0], "d x (SPILL)")
    _expect_same(unlimited[1][1], spill[1][1], "d logits (SPILL)")
    for name, a, b in zip(("d w1", "d w2"), unlimited[1][2:], spill[1][2:]):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max(), f"{name} (SPILL)"
    assert int(np.asarray(spill[2]["dropped_per_expert"]).sum()) == 0


def test_routing_changes_do_not_recompile_and_edge_routings_work(rng):
    R, T, H, F, E, k = 2, 8, 16, 8, 4, 2
    c = _ep_config(H, F, E, k, R, T)
    x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    traces = []

    def rank(x, logits, w1, w2):
        traces.append(1)
        return moe_layer(x, logits, w1, w2, c, ep_axis="ep")[0]

    step = jax.jit(jax.vmap(rank, axis_name="ep"))
    split = lambda a, n: a.reshape(R, n, *a.shape[1:])  # noqa: E731
    single = MoEConfig(H, F, E, k, row_alignment=8)
    for case in ("random", "one expert", "one rank's experts"):
        g = np.asarray(rng.standard_normal((R * T, E)), np.float32)
        if case == "one expert":
            g[:, 1] += 100.0  # every token on expert 1 (and its second choice elsewhere)
        elif case == "one rank's experts":
            g[:, : E // R] += 100.0  # every slot to rank 0: rank 1's experts empty
        g = jnp.asarray(g)
        y = step(split(x, T), split(g, T), split(w1, E // R), split(w2, E // R)).reshape(R * T, H)
        _expect_same(moe_layer(x, g, w1, w2, single)[0], y, f"y ({case})")
    assert len(traces) == 1, "a new routing recompiled"


def test_misuse_is_refused(rng):
    R, T, H, F, E, k = 2, 8, 16, 8, 4, 2
    c = _ep_config(H, F, E, k, R, T)
    x, logits, w1, w2, _ = _problem(rng, R, T, H, F, E)
    with pytest.raises(ValueError, match="ep_axis"):
        moe_layer(x[:T], logits[:T], w1[:2], w2[:2], c)
    with pytest.raises(ValueError, match="ep_axis"):
        moe_layer(x, logits, w1, w2, MoEConfig(H, F, E, k), ep_axis="ep")
    split = lambda a, n: a.reshape(-1, n, *a.shape[1:])  # noqa: E731
    four = _ep_config(H, F, E, k, 4, T)
    with pytest.raises(ValueError, match="ep_size"):
        jax.vmap(lambda *a: moe_layer(*a, four, ep_axis="ep")[0], axis_name="ep")(
            split(x, T), split(logits, T), split(w1, 2), split(w2, 2)
        )
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        jax.vmap(lambda *a: moe_layer(*a, _ep_config(H, F, E, k, R, T // 2), ep_axis="ep")[0], axis_name="ep")(
            split(x, T), split(logits, T), split(w1, 2), split(w2, 2)
        )


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="no GPU: the CUDA stages run on the GPU machine")
def test_on_the_gpu_loopback_ranks_under_vmap_equal_the_single_layer_bit_for_bit(rng):
    """The one H200 with the ranks emulated: each rank's stages are its own FFI calls on the GPU,
    XLA's collectives between them; BF16, bit for bit against the single layer there."""
    R, T, H, F, E, k = 4, 96, 128, 64, 16, 4
    with jax.default_device(jax.devices("cpu")[0]):
        x, logits, w1, w2, dy = _problem(rng, R, T, H, F, E)
    on = lambda a, dtype=None: jax.device_put(a if dtype is None else a.astype(dtype), _GPU[0])  # noqa: E731
    args = (on(x, jnp.bfloat16), on(logits), on(w1, jnp.bfloat16), on(w2, jnp.bfloat16), on(dy, jnp.bfloat16))
    single = MoEConfig(H, F, E, k, row_alignment=16)
    y, grads, counts = jax.jit(lambda *a: _single(*a, single))(*args)
    config = MoEConfig(H, F, E, k, row_alignment=16, ep_size=R, max_tokens_per_rank=T)
    y_ep, grads_ep, counts_ep = _ranks(*args, config, R)
    assert y_ep.devices() == {_GPU[0]}
    _expect_same(y.astype(jnp.float32), y_ep.astype(jnp.float32), "y")
    for name, a, b in zip(("d x", "d logits", "d w1", "d w2"), grads, grads_ep):
        _expect_same(a.astype(jnp.float32), b.astype(jnp.float32), name)
    assert np.array_equal(np.asarray(counts_ep["tokens_per_expert"]).reshape(-1), counts["tokens_per_expert"])


_SHARD_MAP = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    from sfmoe.jax import MoEConfig, moe_block

    jax.config.update("jax_default_matmul_precision", "highest")
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    rng = np.random.default_rng(int(sys.argv[1]))
    T, H, F, E, k = 12, 16, 8, 8, 2
    x = jnp.asarray(rng.standard_normal((4 * T, H)), jnp.float32)
    gate = jnp.asarray(rng.standard_normal((H, E)), jnp.float32)
    wi = jnp.asarray(rng.standard_normal((E, H, 2 * F)) / np.sqrt(H), jnp.float32)
    wo = jnp.asarray(rng.standard_normal((E, F, H)) / np.sqrt(F), jnp.float32)
    dy = jnp.asarray(rng.standard_normal((4 * T, H)), jnp.float32)
    single = MoEConfig(H, F, E, k, row_alignment=8)

    def loss(x, gate, wi, wo, dy, config, axis):
        y, _, _ = moe_block(x, gate, wi, wo, config, ep_axis=axis)
        return (y * dy).sum(), y

    grads, y = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, gate, wi, wo, dy, single, None)

    def check(mesh, token_axes, ep_axis, ep_size, bit_exact_weights):
        config = MoEConfig(H, F, E, k, row_alignment=8, ep_size=ep_size, max_tokens_per_rank=4 * T // mesh.size)

        def body(x, dy, gate, wi, wo):
            g, y = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(x, gate, wi, wo, dy, config, ep_axis)
            data = [a for a in mesh.axis_names if a != ep_axis]
            d_x, d_gate, d_wi, d_wo = g
            d_gate = jax.lax.psum(d_gate, mesh.axis_names)
            if data:
                d_wi, d_wo = jax.lax.psum(d_wi, data), jax.lax.psum(d_wo, data)
            return y, d_x, d_gate, d_wi, d_wo

        kwargs = dict(mesh=mesh, in_specs=(P(token_axes), P(token_axes), P(), P(ep_axis), P(ep_axis)),
                      out_specs=(P(token_axes), P(token_axes), P(), P(ep_axis), P(ep_axis)))
        try:
            f = shard_map(body, check_vma=False, **kwargs)
        except TypeError:
            f = shard_map(body, check_rep=False, **kwargs)
        y_s, d_x, d_gate, d_wi, d_wo = jax.jit(f)(x, dy, gate, wi, wo)
        same = lambda a, b: np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))
        close = lambda a, b: np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max() <= 1e-5 * np.abs(np.asarray(a)).max()
        assert same(y, y_s), "y"
        assert same(grads[0], d_x), "d x"
        assert close(grads[1], d_gate), "d gate"
        for name, a, b in (("d wi", grads[2], d_wi), ("d wo", grads[3], d_wo)):
            assert (same if bit_exact_weights else close)(a, b), name

    devices = np.array(jax.devices("cpu")[:4])
    check(Mesh(devices, ("ep",)), "ep", "ep", 4, True)
    check(Mesh(devices.reshape(2, 2), ("data", "ep")), ("data", "ep"), "ep", 2, False)
    print("shard_map ok")
    """
)


def test_inside_shard_map_over_cpu_devices_equal_the_single_device_block(rng):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    seed = int(rng.integers(0, 2**31))
    run = subprocess.run(
        [sys.executable, "-c", _SHARD_MAP, str(seed)], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0 and "shard_map ok" in run.stdout, run.stdout[-3000:] + run.stderr[-6000:]


def test_the_flax_module_over_ranks_equals_the_single_module(rng):
    """MoEBlock(ep_axis=...) holds the rank's experts: the single module's parameters split by
    expert over 2 ranks under vmap give its output bit for bit, in both weight layouts."""
    pytest.importorskip("flax.linen")
    from sfmoe.jax import MoEBlock

    R, T, H, F, E, k = 2, 12, 16, 8, 4, 2
    x = jnp.asarray(rng.standard_normal((R * T, H)), jnp.float32)
    single = MoEConfig(H, F, E, k, row_alignment=8)
    ep = MoEConfig(H, F, E, k, row_alignment=8, ep_size=R, max_tokens_per_rank=T)
    for layout in ("maxtext", "sfmoe"):
        block = MoEBlock(single, layout=layout)
        params = block.init(jax.random.PRNGKey(int(rng.integers(2**31))), x)["params"]
        y = block.apply({"params": params}, x)[0]
        experts = {name: v for name, v in params.items() if name != "gate"}
        split = {name: v.reshape(R, E // R, *v.shape[1:]) for name, v in experts.items()}
        ranked = MoEBlock(ep, layout=layout, ep_axis="ep")

        def rank(x, local):
            return ranked.apply({"params": dict(local, gate=params["gate"])}, x)[0]

        y_ep = jax.vmap(rank, axis_name="ep")(x.reshape(R, T, H), split).reshape(R * T, H)
        _expect_same(y, y_ep, f"y ({layout})")
        init = jax.vmap(lambda x: ranked.init(jax.random.PRNGKey(0), x)["params"], axis_name="ep")
        shapes = jax.eval_shape(init, x.reshape(R, T, H))
        assert all(shapes[name].shape[:2] == (R, E // R) for name in experts), "the rank's experts only"
