"""sfmoe.torch.MoE with an ep_group: the layer over the NCCL transport (docs/ep.md), on the one GPU
a process has here: a torch.distributed group of one rank, the NCCL communicator made from the id
rank 0 shares. Against the module without expert parallelism on the same weights and tokens: the
output and every gradient bit for bit (one rank keeps every row); a training step captured in one
CUDA graph with NCCL's collectives in it, replayed on new tokens, equal to the eager step each
replay. The configuration's errors are checked on any machine."""

import pytest
import torch
import torch.distributed as dist
from sfmoe.torch import MoE


def _nccl_usable():
    if not torch.cuda.is_available():
        return False
    try:
        from sfmoe import _C

        _C.ep_nccl_unique_id()
        return True
    except Exception:
        return False


needs_nccl = pytest.mark.skipif(not _nccl_usable(), reason="no CUDA device or no NCCL: the EP module needs both")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("dist") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD


def _pair(group, **options):
    torch.manual_seed(3)
    dev = torch.device("cuda")
    ep = MoE(128, 64, 8, 2, device=dev, ep_group=group, max_tokens_per_rank=300, **options)
    plain = MoE(128, 64, 8, 2, device=dev, **{k: v for k, v in options.items() if not k.startswith("ep_")})
    plain.load_state_dict(ep.state_dict())
    return ep, plain


@needs_nccl
@pytest.mark.parametrize("tokens", [257, 1, 0, 300])
def test_one_rank_group_gives_the_plain_modules_bits(group, tokens):
    ep, plain = _pair(group)
    assert ep.experts.weight1.shape == (8, 128, 128)
    x = torch.randn(tokens, 128, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    outs = []
    for module in (ep, plain):
        xi = x.clone().requires_grad_(True)
        y = module(xi)
        y.backward(dy)
        outs.append((y, xi.grad, module.router.weight.grad, module.experts.weight1.grad, module.experts.weight2.grad))
    for name, a, b in zip(("y", "d x", "d router", "d w1", "d w2"), *outs):
        assert torch.equal(a, b), name
    assert torch.equal(ep.tokens_per_expert, plain.tokens_per_expert)


@needs_nccl
def test_spill_with_a_small_capacity_keeps_every_token(group):
    # a first round of 40 rows, the rest in the second: nothing dropped, the plain module's output
    ep, plain = _pair(group, ep_capacity_factor=40 / 600, ep_overflow="spill", gradient_accumulation_fusion=True)
    x = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(ep(x), plain(x))
    assert int(ep.dropped_per_expert.sum()) == 0


@needs_nccl
def test_a_training_step_with_nccl_captures_in_one_cuda_graph(group):
    ep, plain = _pair(group)
    optimizer = torch.optim.SGD(ep.parameters(), lr=0.0)
    x = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)

    def step(module):
        module.zero_grad(set_to_none=False)
        y = module(x)
        y.backward(dy)
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step(ep)
            optimizer.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_graph = step(ep)
    for _ in range(4):
        x.copy_(torch.randn_like(x))
        dy.copy_(torch.randn_like(dy))
        graph.replay()
        torch.cuda.synchronize()
        y_plain = step(plain)
        assert torch.equal(y_graph, y_plain)
        assert torch.equal(ep.experts.weight1.grad, plain.experts.weight1.grad)


def test_expert_parallel_options_are_checked():
    with pytest.raises(ValueError, match="ep_group too"):
        MoE(16, 8, 4, 2, dtype=torch.float32, max_tokens_per_rank=10)
    with pytest.raises(ValueError, match="ep_overflow"):
        MoE(16, 8, 4, 2, dtype=torch.float32, ep_overflow="wait")
    with pytest.raises(ValueError, match="multiple"):
        MoE(16, 8, 6, 2, dtype=torch.float32, ep_size=4, max_tokens_per_rank=10)
    with pytest.raises(ValueError, match="capacity_factor must be None"):
        MoE(16, 8, 4, 2, dtype=torch.float32, ep_size=2, max_tokens_per_rank=10, capacity_factor=1.0)


@needs_nccl
def test_more_tokens_than_the_bound_is_refused(group):
    ep, _ = _pair(group)
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        ep(torch.randn(301, 128, device="cuda", dtype=torch.bfloat16))
