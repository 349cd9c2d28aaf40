"""The MoE module's router gate in its tensor-core form (sfmoe.torch._gate: FP32 operands as three
BF16 terms through sfmoe's grouped GEMM) against float64: exact where one product decides a value
(one-hot tokens: the logits are the weight's FP32 values bit for bit, which two terms would miss by
their last 8 bits), FP32-close on random inputs, d x within BF16's rounding; on the CPU backend
and, where there is one, on the GPU (where the module uses it)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the torch tests need it")

from sfmoe.torch import MoE, _gate  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


def fp32_values(rng, shape, device):
    """FP32 values over many binades (1e-6 .. 10), both signs, with +-0. (Not subnormals: their
    terms underflow BF16's range, so the gate holds them only to 2^-133.)"""
    values = (
        torch.from_numpy(rng.standard_normal(shape)).float()
        * 10.0 ** torch.from_numpy(rng.integers(-6, 2, shape)).float()
    )
    flat = values.view(-1)
    flat[0], flat[-1] = 0.0, -0.0
    return values.to(device)


def shapes(rng):
    T = int(rng.choice([1, 7, 37, 300]))
    H = int(rng.choice([8, 24, 136, 520]))
    E = int(rng.choice([1, 3, 8, 13, 128]))
    return T, H, E


@pytest.mark.parametrize("device", DEVICES)
def test_one_hot_tokens_give_the_fp32_weights_and_d_weight_bit_for_bit(rng, device):
    T, H, E = shapes(rng)
    T = min(T, H)
    columns = torch.from_numpy(rng.permutation(H)[:T]).to(device)
    x = torch.zeros(T, H, device=device, dtype=torch.bfloat16)
    x[torch.arange(T, device=device), columns] = 1.0
    w = fp32_values(rng, (E, H), device)
    logits = _gate.router_gate(x, w)
    assert logits.dtype == torch.float32 and logits.shape == (T, E)
    assert torch.equal(logits, w[:, columns].t()), "logits differ from the weights they pick"
    d_logits = fp32_values(rng, (T, E), device)
    _, d_w = _gate.router_gate_backward(d_logits, x, w)
    want = torch.zeros(E, H, device=device)
    want[:, columns] = d_logits.t()
    assert d_w.dtype == torch.float32 and torch.equal(d_w, want)


@pytest.mark.parametrize("device", DEVICES)
def test_random_inputs_are_fp32_close_and_d_x_rounds_as_bf16(rng, device):
    T, H, E = shapes(rng)
    torch.manual_seed(int(rng.integers(2**31)))
    x = torch.randn(T, H, device=device).to(torch.bfloat16)
    x[0, 0] = float("-0")
    w = torch.randn(E, H, device=device) * 0.05
    w[0, -1] = 1e-40  # a subnormal weight: its terms underflow, off by at most 2^-133
    d_logits = torch.randn(T, E, device=device)
    logits = _gate.router_gate(x, w)
    d_x, d_w = _gate.router_gate_backward(d_logits, x, w)
    xd, wd, gd = x.double(), w.double(), d_logits.double()

    def relative(got, want, magnitude):
        """The error's norm over the products' magnitude (sum |a| |b|: cancellation in the value
        itself does not count against the gate, as it would not against an FP32 GEMM)."""
        return float((got.double() - want).norm() / magnitude.norm().clamp_min(1e-300))

    # FP32 accumulation over H (or T): about 1e-7 of the magnitude; BF16 operands would be ~1e-3.
    assert relative(logits, xd @ wd.t(), xd.abs() @ wd.abs().t()) < 1e-5
    assert relative(d_w, gd.t() @ xd, gd.abs().t() @ xd.abs()) < 1e-5
    # d x: a value within 2^-15 of the products' magnitude (|g| |w|: the dropped terms are below
    # 2^-16 of each product, FP32 sums of E below 2^-17) rounded once to BF16. So it is at most one
    # BF16 step beyond that from float64's value, and equal to float64's rounding wherever float64's value lies
    # further than that from a rounding boundary (a quarter step from its rounding: the step below
    # a power of two is half). BF16-only products (2^-9 of each product off) miss there.
    exact = gd @ wd
    want = exact.to(torch.bfloat16).double()
    assert d_x.dtype == torch.bfloat16
    error = 2.0**-15 * (gd.abs() @ wd.abs())
    step = torch.ldexp(torch.ones_like(want), torch.frexp(want)[1] - 8)  # BF16's step at want
    assert ((d_x.double() - exact).abs() <= 2 * step + error + 2.0**-133).all()
    clear = ((exact - want).abs() + error < step / 4) & (want.abs() >= 2.0**-100)
    assert torch.equal(d_x.double()[clear], want[clear])
    if clear.numel() >= 64:  # (most values are clear of a boundary: the check above is not empty)
        assert clear.float().mean() > 0.1


@pytest.mark.parametrize("device", DEVICES)
def test_no_tokens(device):
    x = torch.zeros(0, 16, device=device, dtype=torch.bfloat16)
    w = torch.randn(5, 16, device=device)
    assert _gate.router_gate(x, w).shape == (0, 5)
    d_x, d_w = _gate.router_gate_backward(torch.zeros(0, 5, device=device), x, w)
    assert d_x.shape == (0, 16) and torch.equal(d_w, torch.zeros_like(w))


@pytest.mark.parametrize("device", DEVICES)
def test_the_custom_ops_pass_opcheck(device):
    """torch.library.opcheck: the fake implementations' shapes, dtypes and strides, the schema,
    autograd registration, over tokens and none."""
    w = torch.randn(5, 16, device=device)
    for rows in (0, 9):
        x = torch.randn(rows, 16, device=device).to(torch.bfloat16)
        for x_grad, w_grad in ((True, True), (True, False), (False, True)):
            torch.library.opcheck(
                _gate.router_gate, (x.clone().requires_grad_(x_grad), w.clone().requires_grad_(w_grad))
            )
        torch.library.opcheck(_gate.router_gate_backward, (torch.randn(rows, 5, device=device), x, w))


def test_autograd_and_compile_go_through_the_custom_ops(rng):
    """torch.compile(fullgraph=True) traces the gate (custom ops, fake implementations), and
    autograd reaches x and the weight."""
    T, H, E = 37, 24, 5
    x = torch.randn(T, H).to(torch.bfloat16).requires_grad_(True)
    w = torch.randn(E, H, requires_grad=True)
    compiled = torch.compile(_gate.router_gate, fullgraph=True, backend="aot_eager")
    logits = compiled(x, w)
    d_logits = torch.randn(T, E)
    logits.backward(d_logits)
    assert torch.equal(logits, _gate.router_gate(x.detach(), w.detach()))
    d_x, d_w = _gate.router_gate_backward(d_logits, x.detach(), w.detach())
    assert torch.equal(x.grad, d_x) and torch.equal(w.grad, d_w)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the module uses this gate on the GPU")
def test_the_gpu_gate_agrees_with_torchs_fp32_gemm():
    module = MoE(64, 32, 8, 2, device="cuda")
    x = torch.randn(50, 64, device="cuda", dtype=torch.bfloat16)
    got = _gate.router_logits(x, module.router.weight, "bf16x3")
    want = _gate._Fp32Gate.apply(x, module.router.weight)
    assert float((got - want).norm() / want.norm()) < 1e-6


def test_the_module_with_the_bf16x3_gate_matches_the_plain_layer(rng):
    """MoE(router_gemm="bf16x3") in BF16 on the CPU backend against the float64 plain layer (the
    tolerance of the FP32 gate's BF16 module), the gate's gradient included."""
    from test_torch_moe import compare

    torch.manual_seed(int(rng.integers(2**31)))
    module = MoE(24, 16, 6, 2, dtype=torch.bfloat16, router_gemm="bf16x3")
    x = torch.randn(37, 24).to(torch.bfloat16)
    compare(module, x, torch.randn(37, 24), 3e-4)
    explanation = torch._dynamo.explain(module)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("device", DEVICES)
def test_auto_takes_the_tensor_core_gate_on_the_gpu_for_large_gates_only(monkeypatch, device):
    """The default router_gemm ("auto") runs the three-term gate on the GPU from T H E = 2^30 up,
    and never where the form does not apply (FP32 tokens, H no multiple of 8)."""
    calls = []
    three_term = _gate.router_gate
    monkeypatch.setattr(_gate, "router_gate", lambda x, w: calls.append(tuple(x.shape)) or three_term(x, w))
    monkeypatch.setattr(_gate, "_AUTO_MIN_WORK", 5 * 16 * 4)
    assert MoE(16, 8, 4, 2).router_gemm == "auto"
    w = torch.randn(4, 16, device=device)
    _gate.router_logits(torch.randn(5, 16, device=device).to(torch.bfloat16), w)
    _gate.router_logits(torch.randn(4, 16, device=device).to(torch.bfloat16), w)  # below the bound
    assert calls == ([(5, 16)] if device == "cuda" else [])
    _gate.router_logits(torch.randn(6, 16, device=device), w)  # FP32 tokens
    _gate.router_logits(torch.randn(7, 24, device=device).to(torch.bfloat16), torch.randn(4, 24, device=device))
    assert len(calls) == (2 if device == "cuda" else 0)
    _gate.router_logits(torch.randn(7, 12, device=device).to(torch.bfloat16), torch.randn(4, 12, device=device))
    assert len(calls) == (2 if device == "cuda" else 0)  # H = 12: no multiple of 8


def test_an_unknown_router_gemm_is_refused():
    with pytest.raises(ValueError, match="router_gemm"):
        MoE(16, 8, 4, 2, router_gemm="tf32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the graph test needs one")
def test_a_training_step_with_the_bf16x3_gate_captures_and_matches_the_fp32_gate():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    module = MoE(64, 32, 8, 2, device=dev, router_gemm="bf16x3")
    reference = MoE(64, 32, 8, 2, device=dev)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(128, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(128, 64, device=dev, dtype=torch.bfloat16)

    def step(m):
        m.zero_grad(set_to_none=False)
        x.grad = None
        y = m(x)
        y.backward(dy)
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(module)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = step(module)
    for _ in range(5):
        with torch.no_grad():
            x.copy_(torch.randn_like(x))
            dy.copy_(torch.randn_like(dy))
        graph.replay()
        torch.cuda.synchronize()
        replayed = [y_graph.clone(), module.router.weight.grad.clone()]
        y_eager = step(module)
        assert torch.equal(replayed[0], y_eager) and torch.equal(replayed[1], module.router.weight.grad)
        y_fp32 = step(reference)
        assert float((y_fp32.float() - y_eager.float()).norm() / y_fp32.float().norm()) < 1e-2
        d_router = (module.router.weight.grad - reference.router.weight.grad).norm()
        assert float(d_router / reference.router.weight.grad.norm()) < 1e-2
