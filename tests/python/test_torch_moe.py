"""sfmoe.torch.MoE against a plain-PyTorch MoE layer with the same weights and routing: output and
every gradient (through autograd on both sides), the auxiliary losses, expert-bias balancing,
capacity drops, torch.compile tracing, and (on a GPU) one CUDA graph of a training step."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the torch tests need it")

from sfmoe.torch import MoE, _moe  # noqa: E402


def plain_moe(module, x):
    """The layer written as a PyTorch user writes it (../shared/peers/layer_baseline.py's form),
    in float64, on module's weights; returns (y, aux)."""
    c = module.config
    wr = module.router.weight.double()
    w1 = module.experts.weight1.double()
    w2 = module.experts.weight2.double()
    x = x.double()
    logits = x @ wr.t()
    if c.score_function == "sigmoid":
        scores = torch.sigmoid(logits)
        chosen = scores + (module.expert_bias.double() if module.expert_bias is not None else 0)
        ids = chosen.topk(c.topk, -1).indices
        probs = scores.gather(-1, ids)
        if c.topk > 1:
            probs = probs / probs.sum(-1, keepdim=True)
    elif c.pre_softmax:
        probs, ids = torch.softmax(logits, -1).topk(c.topk, -1)
    else:
        values, ids = logits.topk(c.topk, -1)
        probs = torch.softmax(values, -1)
    probs = probs * c.topk_scaling_factor
    y = torch.zeros_like(x)
    capacity = c.capacity(x.shape[0])
    counts = torch.zeros(c.num_experts, dtype=torch.int64)
    for e in range(c.num_experts):
        token, slot = (ids == e).nonzero(as_tuple=True)
        order = torch.argsort(token)
        token, slot = token[order], slot[order]
        counts[e] = token.numel()
        if capacity:
            token, slot = token[:capacity], slot[:capacity]
        h = x[token] @ w1[e].t()
        if c.activation == "swiglu":
            g, u = h.chunk(2, -1)
            a = torch.nn.functional.silu(g) * u
        else:
            a = torch.relu(h).square()
        y.index_add_(0, token, (a @ w2[e].t()) * probs[token, slot, None])
    aux = None
    if c.aux_loss_coeff > 0:
        all_scores = torch.softmax(logits, -1)
        aux = (
            c.aux_loss_coeff * c.num_experts / (c.topk * x.shape[0] ** 2) * (counts.double() * all_scores.sum(0)).sum()
        )
    return y, aux


def mismatch(want, got):
    """1 - 2 sum(x y) / sum(x^2 + y^2): 0 when equal (both all zeros too: the router's gradient
    with one expert, or with k = 1 and the softmax after the top k, where every probability is 1)."""
    want, got = want.detach().double().flatten(), got.detach().double().flatten()
    energy = want.square().sum() + got.square().sum()
    if energy == 0:
        return 0.0
    return float(1 - 2 * (want * got).sum() / energy)


def grads(module, x, dy, forward):
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y = forward(x)
    y = y[0] if isinstance(y, tuple) else y
    loss = (y.double() * dy.double()).sum()
    return y, torch.autograd.grad(loss, [x, module.router.weight, module.experts.weight1, module.experts.weight2])


def compare(module, x, dy, tol, with_aux=False, router_tol=None):
    y, (dx, dwr, dw1, dw2) = grads(module, x, dy, module)
    ref_module = module

    def reference(x):
        y, aux = plain_moe(ref_module, x)
        if with_aux:
            y = y + 0 * aux  # the loss below adds aux separately
        return y, aux

    module.zero_grad(set_to_none=True)
    xr = x.clone().requires_grad_(True)
    yr, aux = plain_moe(module, xr)
    loss = (yr * dy.double()).sum() + (aux if aux is not None else 0)
    rx, rwr, rw1, rw2 = torch.autograd.grad(
        loss, [xr, module.router.weight, module.experts.weight1, module.experts.weight2]
    )
    for name, want, got in (
        ("y", yr, y),
        ("d x", rx, dx),
        ("d router", rwr, dwr),
        ("d w1", rw1, dw1),
        ("d w2", rw2, dw2),
    ):
        assert torch.isfinite(got).all(), name
        bound = router_tol if name == "d router" and router_tol else tol
        assert mismatch(want, got) < bound, f"{name}: mismatch {mismatch(want, got):.3g}"


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-9), (torch.bfloat16, 3e-4)])
def test_moe_matches_the_plain_layer(dtype, tol):
    torch.manual_seed(torch.seed() % 2**31)
    module = MoE(24, 16, 6, 2, dtype=dtype)
    x = torch.randn(37, 24).to(dtype)
    dy = torch.randn(37, 24)
    compare(module, x, dy, tol)


# Shapes no benchmark names, fresh each run: H and F odd or below a tile, one expert, k = 1 and k
# = E, a token or none, every score function, capacity drops and row alignments; FP32 on the CPU
# backend against the float64 plain layer.
@pytest.mark.parametrize("case", range(6))
def test_random_odd_shapes_match_the_plain_layer(rng, case):
    H, F = (int(rng.choice(v)) for v in ([1, 3, 8, 37, 130], [1, 5, 13, 33]))
    E = int(rng.choice([1, 2, 3, 5, 9]))
    k = int(rng.integers(1, min(E, 4) + 1))
    T = int(rng.choice([0, 1, 2, 17, 129]))
    options = dict(activation=str(rng.choice(["swiglu", "squared_relu"])), row_alignment=int(rng.choice([1, 8, 128])))
    scoring = str(rng.choice(["softmax", "sigmoid", "pre_softmax"]))
    if scoring == "sigmoid":
        options["score_function"] = "sigmoid"
    elif scoring == "pre_softmax":
        options["pre_softmax"] = True
    if rng.random() < 0.4:
        options["capacity_factor"] = float(rng.choice([0.5, 1.0, 1.5]))
    if rng.random() < 0.3:
        options["topk_scaling_factor"] = 2.5
    torch.manual_seed(int(rng.integers(2**31)))
    module = MoE(H, F, E, k, dtype=torch.float32, **options)
    x, dy = torch.randn(T, H), torch.randn(T, H)
    if T == 0:
        y = module(x.requires_grad_(True))
        y.sum().backward()
        assert y.shape == (0, H) and x.grad.shape == (0, H)
        assert not module.experts.weight1.grad.any() and not module.experts.weight2.grad.any()
        return
    compare(module, x, dy, 1e-9)


# The quantized recipes (the GEMM operands quantized from the BF16 rows and weights) within
# their tolerances of the float64 plain layer, as in the C++ tests; a recipe that silently ran
# in BF16 would sit far below them, so each must also show some quantization error.
@pytest.mark.parametrize("recipe, tol", [("tensorwise", 1e-2), ("blockwise", 5e-3), ("mxfp8", 5e-3), ("nvfp4", 1e-1)])
def test_quantized_recipes_stay_within_their_tolerances(recipe, tol):
    module = MoE(256, 128, 4, 2, dtype=torch.bfloat16, recipe=recipe)
    x = torch.randn(70, 256).to(torch.bfloat16)
    dy = torch.randn(70, 256)
    compare(module, x, dy, tol, router_tol=10 * tol)
    y = module(x)
    bf16 = MoE(256, 128, 4, 2, dtype=torch.bfloat16)
    bf16.load_state_dict(module.state_dict())
    assert mismatch(bf16(x), y) > 1e-5, "no quantization error at all"


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))],
)
def test_nvfp4_rounding_offset_is_counted_on_the_device(device):
    """NVFP4's gradient rounding follows a counter the module advances on the device (one per
    backward, so a captured graph advances it on every replay): each backward rounds with a new
    stream, and setting the counter back repeats a backward's gradients bit for bit (on the CPU
    backend and in the CUDA tile quantizer, which reads the counter on the device)."""
    from sfmoe.torch import _moe

    module = MoE(256, 128, 4, 2, dtype=torch.bfloat16, recipe="nvfp4", device=device)
    x = torch.randn(70, 256, device=device).to(torch.bfloat16)
    dy = torch.randn(70, 256, device=device).to(torch.bfloat16)

    def grads():
        module.zero_grad(set_to_none=True)
        module(x).backward(dy)
        return module.experts.weight1.grad.clone(), module.experts.weight2.grad.clone()

    counter = _moe._rng_offset(module._key, x.device)
    start = int(counter)
    first = grads()
    assert int(counter) == start + 1
    second = grads()
    assert int(counter) == start + 2
    assert not all(torch.equal(a, b) for a, b in zip(first, second)), "a new stream each backward"
    counter.fill_(start)
    again = grads()
    assert all(torch.equal(a, b) for a, b in zip(first, again)), "the counter drives the rounding"


def test_sigmoid_routing_with_capacity_and_the_aux_loss():
    module = MoE(
        16, 8, 5, 3, dtype=torch.float32, score_function="sigmoid", capacity_factor=0.75, activation="squared_relu"
    )
    x, dy = torch.randn(41, 16), torch.randn(41, 16)
    compare(module, x, dy, 1e-9)
    module(x)
    assert int(module.dropped_per_expert.sum()) > 0, "capacity 0.75 drops some slots"
    module = MoE(16, 8, 5, 2, dtype=torch.float32, aux_loss_coeff=0.01)
    compare(module, torch.randn(33, 16), torch.randn(33, 16), 1e-9, with_aux=True)
    assert module.aux_loss is not None and float(module.aux_loss) > 0


def test_an_input_of_another_width_is_refused_by_name():
    module = MoE(16, 8, 4, 2, dtype=torch.float32)
    before = [p.detach().clone() for p in module.parameters()]
    for bad in (torch.randn(10, 15), torch.randn(3, 4, 17), torch.tensor(1.0)):
        with pytest.raises(ValueError, match=r"x must be \[\.\.\., 16\] \(hidden_size\)"):
            module(bad)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
    assert module(torch.randn(2, 3, 16)).shape == (2, 3, 16)


def test_the_output_takes_the_input_dtype_and_non_float_inputs_are_refused():
    module = MoE(16, 8, 4, 2, dtype=torch.bfloat16)
    x = torch.randn(5, 16)
    y = module(x)
    assert y.dtype == torch.float32 and y.shape == (5, 16)
    # computed in the weights' dtype: the same values as the bf16 input's output
    assert torch.equal(y, module(x.to(torch.bfloat16)).float())
    y.sum().backward()
    assert module.experts.weight1.grad is not None
    for bad in (torch.ones(5, 16, dtype=torch.int64), torch.ones(5, 16, dtype=torch.complex64)):
        with pytest.raises(TypeError, match="floating-point"):
            module(bad)


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8", "nvfp4"])
def test_micro_batches_over_the_weight_cache_give_the_bits_of_quantizing_each_step(recipe):
    # Gradient accumulation: the first micro-batch fills the weight cache, the others read it; the
    # outputs and accumulated gradients are those of steps that quantize the weights each time.
    torch.manual_seed(0)
    module = MoE(128, 128, 4, 2, dtype=torch.bfloat16, recipe=recipe)
    batches = [(torch.randn(33, 128), torch.randn(33, 128)) for _ in range(3)]

    def run(flags):
        module.zero_grad(set_to_none=True)
        _moe._RNG_OFFSETS.clear()  # (nvfp4: each run's gradients rounded by the same streams)
        ys = []
        for (x, dy), flag in zip(batches, flags):
            y = module(x.to(torch.bfloat16), is_first_microbatch=flag)
            y.backward(dy.to(torch.bfloat16))
            ys.append(y.detach())
        return ys, [p.grad.clone() for p in (module.experts.weight1, module.experts.weight2, module.router.weight)]

    plain = run([None, None, None])
    cached = run([True, False, False])
    assert all(torch.equal(a, b) for a, b in zip(plain[0], cached[0]))
    assert all(torch.equal(a, b) for a, b in zip(plain[1], cached[1]))
    # A step that reads the cache uses the copies there: new weights unseen until the next True.
    with torch.no_grad():
        module.experts.weight2.mul_(2)
    x = batches[0][0].to(torch.bfloat16)
    stale = module(x, is_first_microbatch=False)
    assert torch.equal(stale, plain[0][0])
    assert not torch.equal(module(x, is_first_microbatch=True), plain[0][0])
    module.drop_weight_cache()
    with pytest.raises(ValueError, match="is_first_microbatch=True fills"):
        module(x, is_first_microbatch=False)


def test_the_weight_cache_is_nothing_under_bf16():
    module = MoE(16, 8, 4, 2, dtype=torch.float32)
    x = torch.randn(5, 16)
    assert torch.equal(module(x, is_first_microbatch=True), module(x, is_first_microbatch=False))
    assert module._weight_cache is None


@pytest.mark.parametrize("field", ["aux_loss_coeff", "z_loss_coeff"])
@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf")])
def test_a_loss_coefficient_that_is_negative_or_not_finite_is_refused(field, value):
    with pytest.raises(ValueError, match=f"{field} must be finite and >= 0"):
        MoE(16, 8, 4, 2, dtype=torch.float32, **{field: value})


@pytest.mark.parametrize("three_parts", [False, True])
def test_a_second_backward_through_one_forward_is_refused(monkeypatch, three_parts):
    # The layer's backward writes FC1's gradient over its saved output; the op declares the
    # mutation, so autograd's version check stops a retained graph's second backward (also after
    # the three-part backward has let the saved state's memory go).
    from sfmoe.torch import _moe

    monkeypatch.setattr(_moe, "_three_part_backward", lambda *args: three_parts)
    module = MoE(16, 8, 4, 2, dtype=torch.float32)
    x = torch.randn(12, 16, requires_grad=True)
    y = module(x).square().sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("three_parts", [False, True])
def test_saved_tensor_hooks_see_the_saved_state(monkeypatch, three_parts):
    """Saved-tensor hooks (what non-reentrant activation checkpointing and save_on_cpu build on)
    see the layer's saved state as any activation; under torch.utils.checkpoint (the state
    dropped after the forward, recomputed for the backward) the gradients are the same bits."""
    from sfmoe.torch import _moe

    monkeypatch.setattr(_moe, "_three_part_backward", lambda *args: three_parts)
    module = MoE(24, 16, 5, 2, dtype=torch.float32)
    x, dy = torch.randn(30, 24), torch.randn(30, 24)
    packed = []

    def pack(t):
        packed.append((t.dtype, t.numel()))
        return t

    results = []
    for how in ("plain", "hooked", "checkpointed"):
        module.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        if how == "hooked":
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = module(xi)
        elif how == "checkpointed":
            y = torch.utils.checkpoint.checkpoint(module, xi, use_reentrant=False)
        else:
            y = module(xi)
        y.backward(dy)
        results.append([xi.grad] + [p.grad for p in module.parameters()])
    saved_bytes = _moe._saved_bytes(module._key, 30, torch.float32, torch.device("cpu"))
    assert (torch.uint8, saved_bytes) in packed
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


def test_the_three_part_backward_is_chosen_where_it_lowers_the_peak():
    """_three_part_backward (from the plan alone: no weights made): FC1's rows far wider than the
    hidden rows (2F >> H: Mixtral) take the three-part order; Qwen3's and DeepSeek-V3's experts
    keep two parts, where the peak it saves is less than the d y rows it gathers again; so do
    main gradients (no new gradients to make room for)."""
    from sfmoe._moe_config import MoEConfig
    from sfmoe.torch import _moe

    def chosen(H, F, E, k, T, **options):
        key = _moe._register(MoEConfig(H, F, E, k, **options))
        return _moe._three_part_backward(key, T, torch.bfloat16, torch.device("cpu"))

    assert chosen(4096, 14336, 8, 2, 8192)  # Mixtral-8x7B
    assert not chosen(2048, 768, 128, 8, 8192)  # Qwen3-30B-A3B
    assert not chosen(7168, 2048, 32, 8, 4096)  # DeepSeek-V3 EP8-local
    assert not chosen(4096, 14336, 8, 2, 8192, gradient_accumulation_fusion=True)


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))],
)
@pytest.mark.parametrize("recipe", ["bf16", "tensorwise", "blockwise", "nvfp4"])
def test_the_three_part_backward_gives_the_two_part_bits(monkeypatch, device, recipe):
    """The backward's order (two parts, or three with d y gathered again) changes no bit of any
    gradient, on odd shapes with empty experts; NVFP4's rounding streams are the GEMMs'."""
    from sfmoe.torch import _moe

    torch.manual_seed(torch.seed() % 2**31)
    H, F = {"bf16": (40, 24), "tensorwise": (48, 32), "blockwise": (256, 128), "nvfp4": (48, 32)}[recipe]
    module = MoE(H, F, 7, 2, dtype=torch.bfloat16, device=device, recipe=recipe)
    x = torch.randn(45, H, device=device).to(torch.bfloat16)
    x[::3] = 0  # (ties in the router: some experts left empty)
    dy = torch.randn(45, H, device=device).to(torch.bfloat16)
    results = []
    for three in (False, True):
        monkeypatch.setattr(_moe, "_three_part_backward", lambda *args, three=three: three)
        if recipe == "nvfp4":
            _moe._rng_offset(module._key, x.device).fill_(3)
        module.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        module(xi).backward(dy)
        results.append([xi.grad, module.router.weight.grad] + [p.grad for p in module.experts.parameters()])
    for name, a, b in zip(("d x", "d router", "d w1", "d w2"), *results):
        assert a is not None and torch.equal(a, b), name


def test_expert_bias_moves_toward_balance():
    module = MoE(16, 8, 4, 1, dtype=torch.float32, score_function="sigmoid", expert_bias=True, bias_update_rate=0.1)
    with torch.no_grad():
        module.router.weight.zero_()
        module.router.weight[0] = 1.0  # expert 0 takes every token whose features sum positive
    x = torch.randn(64, 16).abs()
    module(x)
    counts = module.local_tokens_per_expert.clone()
    module.update_expert_bias()
    assert counts[0] == 64
    assert module.expert_bias[0] < 0 and (module.expert_bias[1:] > 0).all()
    assert int(module.local_tokens_per_expert.sum()) == 0


def test_torch_compile_traces_the_module_without_graph_breaks():
    module = MoE(16, 8, 4, 2, dtype=torch.float32)
    x = torch.randn(20, 16, requires_grad=True)
    explanation = torch._dynamo.explain(module)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(module, fullgraph=True)  # inductor
    y = compiled(x)
    y.sum().backward()
    assert torch.allclose(y, module(x))
    assert x.grad is not None and module.experts.weight1.grad is not None


def test_torch_compile_traces_the_weight_cache_steps_without_graph_breaks():
    module = MoE(128, 128, 4, 2, dtype=torch.bfloat16, recipe="blockwise")
    x = torch.randn(9, 128).to(torch.bfloat16)
    want = module(x)
    for first in (True, False):
        explanation = torch._dynamo.explain(module)(x, is_first_microbatch=first)
        assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(module, fullgraph=True)
    for first in (True, False):
        assert torch.equal(compiled(x, is_first_microbatch=first), want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the graph test needs one")
@pytest.mark.parametrize("three_parts", [False, True])
def test_a_training_step_captures_in_one_cuda_graph(monkeypatch, three_parts):
    # (three parts: the saved state's storage freed inside the capture, before d w2 is made)
    from sfmoe.torch import _moe

    monkeypatch.setattr(_moe, "_three_part_backward", lambda *args: three_parts)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    module = MoE(64, 32, 8, 2, device=dev)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.0)  # weights unchanged: replays comparable
    x = torch.randn(128, 64, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(128, 64, device=dev, dtype=torch.bfloat16)

    def step():
        optimizer.zero_grad(set_to_none=False)
        y = module(x)
        y.backward(dy)
        optimizer.step()
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = step()
    for _ in range(10):
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
        graph.replay()
        torch.cuda.synchronize()
        w1_graph = module.experts.weight1.grad.clone()
        y_graph_now = y_graph.clone()
        y_eager = step()
        torch.cuda.synchronize()
        assert torch.equal(y_graph_now, y_eager)
        assert torch.equal(w1_graph, module.experts.weight1.grad)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-9), (torch.bfloat16, 3e-4)])
def test_grouped_linear_matches_per_group_linear_maps(dtype, tol):
    from sfmoe.torch import GroupedLinear

    sizes = [5, 0, 9, 3]
    offsets = torch.tensor([0, 5, 5, 14, 17], dtype=torch.int64)
    layer = GroupedLinear(4, 12, 7, dtype=dtype)
    x = torch.randn(17, 12).to(dtype).requires_grad_(True)
    dy = torch.randn(17, 7)
    y = layer(x, offsets)
    (y.double() * dy.double()).sum().backward()
    xr = x.detach().double().requires_grad_(True)
    wr = layer.weight.detach().double().requires_grad_(True)
    parts, start = [], 0
    for g, n in enumerate(sizes):
        parts.append(xr[start : start + n] @ wr[g].t())
        start += n
    yr = torch.cat(parts)
    (yr * dy.double()).sum().backward()
    for name, want, got in (("y", yr, y), ("d x", xr.grad, x.grad), ("d w", wr.grad, layer.weight.grad)):
        assert mismatch(want, got) < tol, f"{name}: {mismatch(want, got):.3g}"
    explanation = torch._dynamo.explain(lambda a: layer(a, offsets))(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_a_functional_op_refuses_a_tensor_that_requires_grad():
    import sfmoe

    x = torch.randn(8, 16, requires_grad=True)
    with pytest.raises(TypeError, match="requires grad"):
        sfmoe.cast(x, "e4m3")
    with torch.no_grad():
        sfmoe.cast(x, "e4m3")
    sfmoe.cast(x.detach(), "e4m3")


def test_gradient_accumulation_fusion_adds_into_main_grad():
    torch.manual_seed(torch.seed() % 2**31)
    fused = MoE(16, 8, 4, 2, dtype=torch.float32, gradient_accumulation_fusion=True)
    plain = MoE(16, 8, 4, 2, dtype=torch.float32)
    plain.load_state_dict(fused.state_dict())
    for step in range(2):
        x, dy = torch.randn(12, 16), torch.randn(12, 16)
        for module in (fused, plain):
            (module(x) * dy).sum().backward()
    assert fused.experts.weight1.grad is None and fused.experts.weight2.grad is None
    assert fused.router.weight.grad is not None
    assert mismatch(plain.experts.weight1.grad, fused.experts.weight1.main_grad) < 1e-12
    assert mismatch(plain.experts.weight2.grad, fused.experts.weight2.main_grad) < 1e-12


def test_the_shared_expert_adds_a_dense_swiglu_and_survives_checkpoints(tmp_path):
    torch.manual_seed(torch.seed() % 2**31)
    module = MoE(16, 8, 4, 2, dtype=torch.float32, shared_expert_ffn_hidden_size=12, shared_expert_gate=True)
    routed_only = MoE(16, 8, 4, 2, dtype=torch.float32)
    routed_only.load_state_dict({k: v for k, v in module.state_dict().items() if not k.startswith("shared")})
    x = torch.randn(10, 16)
    e = module.shared_expert
    dense = e.down_proj(torch.nn.functional.silu(e.gate_proj(x)) * e.up_proj(x))
    want = routed_only(x) + torch.sigmoid(module.shared_expert_gate(x)) * dense
    assert mismatch(want, module(x)) < 1e-12
    for layout in ("sfmoe", "hf", "megatron"):
        again = MoE(16, 8, 4, 2, dtype=torch.float32, shared_expert_ffn_hidden_size=12, shared_expert_gate=True)
        path = tmp_path / f"{layout}.safetensors"
        module.save_checkpoint(path, layout)
        again.load_checkpoint(path)
        assert torch.equal(again(x), module(x)), layout


def test_expert_load_is_read_a_step_later():
    module = MoE(16, 8, 4, 2, dtype=torch.float32, capacity_factor=0.5, log_expert_load=True)
    assert module.expert_load() is None
    x1, x2 = torch.randn(20, 16), torch.randn(20, 16)
    module(x1)
    first = (module.tokens_per_expert.clone(), module.dropped_per_expert.clone())
    assert module.expert_load() is None  # one forward: nothing a step old yet
    module(x2)
    kept, dropped = module.expert_load()
    assert torch.equal(kept, first[0]) and torch.equal(dropped, first[1])
    assert int(kept.sum() + dropped.sum()) == 20 * 2
