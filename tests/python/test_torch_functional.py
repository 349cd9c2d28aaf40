"""sfmoe.torch's functional ops with autograd (router, permute, unpermute, grouped_activation):
a layer composed from them by hand, its gradients against float64 PyTorch on the same routing
(capacity drops and the load-balancing loss included), and the plain functional API's refusal of
tensors that require grad."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the torch tests need it")

import sfmoe  # noqa: E402
import sfmoe.torch as st  # noqa: E402


def mismatch(want, got):
    want, got = want.detach().double().flatten(), got.detach().double().flatten()
    return float(1 - 2 * (want * got).sum() / (want.square().sum() + got.square().sum()))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["swiglu", "squared_relu"])
@pytest.mark.parametrize("capacity", [0, 5])
def test_a_layer_composed_by_hand_matches_float64_autograd(activation, capacity, device):
    T, H, E, k, coeff = 29, 16, 6, 2, 0.01
    cols = 2 * H if activation == "swiglu" else H
    x = torch.randn(T, cols, device=device, requires_grad=True)
    logits = torch.randn(T, E, device=device, requires_grad=True)
    dy = torch.randn(T, H, device=device)
    probs, ids, counts, aux, _ = st.router(logits, k, aux_loss_coeff=coeff)
    rows, offsets, row_map, kept, dropped = st.permute(x, ids, E, alignment=8, expert_capacity=capacity)
    act = st.grouped_activation(rows, offsets, kept, activation)
    y = st.unpermute(act, row_map, offsets, kept, probs)
    ((y * dy).sum() + aux).backward()
    if capacity:
        assert int(dropped.sum()) > 0, "the capacity drops some slots"

    # The same layer in float64 PyTorch, on sfmoe's routing (ids and kept slots).
    xr = x.detach().double().requires_grad_()
    lr = logits.detach().double().requires_grad_()
    scores = torch.softmax(lr, -1)
    p = scores.gather(1, ids.long()) * (row_map >= 0)
    if activation == "swiglu":
        g, u = xr.chunk(2, -1)
        a = torch.nn.functional.silu(g) * u
    else:
        a = torch.relu(xr).square()
    yr = p.sum(1, keepdim=True) * a
    routed = torch.bincount(ids.long().flatten(), minlength=E).double()
    # (sums in float64 on the device too; the tolerance covers FP32 rounding either way)
    aux_r = coeff * E / (k * T * T) * (routed * scores.sum(0)).sum()
    ((yr * dy.double()).sum() + aux_r).backward()
    assert mismatch(yr, y) < 1e-10
    assert abs(float(aux) - float(aux_r)) < 1e-6 * abs(float(aux_r))
    assert mismatch(xr.grad, x.grad) < 1e-10, "d x"
    assert mismatch(lr.grad, logits.grad) < 1e-10, "d logits"


def test_the_plain_functional_api_refuses_a_tensor_that_requires_grad():
    x = torch.randn(8, 4, requires_grad=True)
    ids = torch.randint(0, 4, (8, 1), dtype=torch.int32)
    with pytest.raises(TypeError, match="sfmoe.torch"):
        sfmoe.permute(x, ids, 4)
    rows, *_ = st.permute(x, ids, 4)
    assert rows.requires_grad


def test_the_functional_ops_trace_without_graph_breaks():
    def layer(x, logits):
        probs, ids, _, _, _ = st.router(logits, 2)
        rows, offsets, row_map, kept, _ = st.permute(x, ids, 4)
        act = st.grouped_activation(rows, offsets, kept, "swiglu")
        return st.unpermute(act, row_map, offsets, kept, probs)

    x, logits = torch.randn(10, 8, requires_grad=True), torch.randn(10, 4, requires_grad=True)
    explanation = torch._dynamo.explain(layer)(x, logits)
    assert explanation.graph_break_count == 0, explanation.break_reasons
