"""sfmoe.torch.MoE checkpoints: round trips through every layout (bitwise-identical parameters,
outputs and optimizer state), foreign layouts loading through load_state_dict and training on,
safetensors files, and the shape checks that refuse transposed or missing tensors."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the torch tests need it")

from sfmoe.torch import MoE  # noqa: E402
from sfmoe.torch._checkpoint import LAYOUTS  # noqa: E402


def make(**options):
    torch.manual_seed(torch.seed() % 2**31)
    return MoE(24, 12, 4, 2, dtype=torch.float32, **options)


def trained_adam(module, steps=2):
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        module(torch.randn(16, 24)).square().sum().backward()
        optimizer.step()
    return optimizer


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_through_each_layout_is_bitwise(layout, tmp_path):
    source = make(expert_bias=True, score_function="sigmoid")
    with torch.no_grad():
        source.expert_bias.copy_(torch.randn(4))
    x = torch.randn(9, 24)
    target = make(expert_bias=True, score_function="sigmoid")
    target.load_checkpoint(source.checkpoint(layout), layout=layout)
    for (name, a), (_, b) in zip(source.state_dict().items(), target.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(source(x), target(x))
    path = tmp_path / f"moe-{layout}.safetensors"
    source.save_checkpoint(path, layout)
    again = make(expert_bias=True, score_function="sigmoid")
    again.load_checkpoint(path)  # the layout recognized from the file's keys
    assert torch.equal(source(x), again(x))


@pytest.mark.parametrize("layout", ["hf", "mixtral", "megatron", "te"])
def test_a_foreign_state_dict_loads_through_load_state_dict_and_trains_on(layout):
    source = make()
    model = torch.nn.Sequential(torch.nn.Linear(24, 24), make())
    foreign = {f"1.{k}": v for k, v in source.checkpoint(layout).items()}
    foreign.update({f"0.{k}": v for k, v in model[0].state_dict().items()})
    foreign["1.shared_expert.weight"] = torch.zeros(1)  # not the layout's: left to the caller
    with pytest.raises(RuntimeError, match="shared_expert"):
        model.load_state_dict(foreign)  # strict: the unknown key is reported, not swallowed
    del foreign["1.shared_expert.weight"]
    model.load_state_dict(foreign)
    assert torch.equal(model[1].experts.weight1, source.experts.weight1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model[1].experts.weight2.clone()
    model(torch.randn(8, 24)).square().sum().backward()
    optimizer.step()
    assert not torch.equal(before, model[1].experts.weight2)


@pytest.mark.parametrize("layout", ["sfmoe", "hf", "megatron"])
def test_optimizer_state_moves_with_the_parameters(layout):
    source = make()
    optimizer = trained_adam(source)
    names = dict((id(p), n) for n, p in source.named_parameters())
    own = {names[id(p)]: s for p, s in optimizer.state.items()}
    # The state as the other layout names it: each moment converted as its parameter is.
    as_params = {}
    for field in ("exp_avg", "exp_avg_sq"):
        converted = source_layout_of({n: s[field] for n, s in own.items()}, source, layout)
        for name, value in converted.items():
            as_params.setdefault(name, {"step": own["router.weight"]["step"]})[field] = value
    target = make()
    target.load_checkpoint(source.checkpoint(layout), layout=layout)
    target_optimizer = torch.optim.Adam(target.parameters(), lr=1e-2)
    target.load_optimizer_state(target_optimizer, as_params, layout=layout)
    for (_, a), (_, b) in zip(source.named_parameters(), target.named_parameters()):
        for field in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[a][field], target_optimizer.state[b][field])
    x = torch.randn(16, 24)
    for opt, module in ((optimizer, source), (target_optimizer, target)):
        opt.zero_grad()
        module(x).square().sum().backward()
        opt.step()
    for (name, a), (_, b) in zip(source.named_parameters(), target.named_parameters()):
        assert torch.equal(a, b), name


def source_layout_of(sfmoe_named, module, layout):
    from sfmoe.torch._checkpoint import from_sfmoe

    return from_sfmoe(sfmoe_named, module.config, layout)


def test_shapes_are_checked_before_anything_is_copied():
    module = make()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    state = module.checkpoint("hf")
    state["experts.2.down_proj.weight"] = state["experts.2.down_proj.weight"].t().contiguous()
    with pytest.raises(ValueError, match="transposed"):
        module.load_checkpoint(state)
    del state["experts.2.down_proj.weight"]
    with pytest.raises(KeyError, match="experts.2.down_proj.weight"):
        module.load_checkpoint(state, layout="hf")
    for k, v in module.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="safetensors"):
        module.load_checkpoint("model.pt")
