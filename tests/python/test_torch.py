"""sfmoe ops on torch tensors: CUDA results bit for bit equal to the NumPy / CPU path on the same
inputs (cast, FP8 per-tensor and grouped quantization), work enqueued on torch's current stream,
CUDA graph capture, torch.float8 tensors in and out."""

import itertools

import numpy as np
import pytest
import sfmoe
from sfmoe import numerics

torch = pytest.importorskip("torch", reason="PyTorch is not installed; the torch tests need it")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="the NumPy side of the comparison needs ml_dtypes")

HAS_CUDA = torch.cuda.is_available()
SFMOE_CUDA = sfmoe.build_info()["has_cuda_backend"] and sfmoe.device_info()["device_count"] > 0
requires_cuda = pytest.mark.skipif(
    not (HAS_CUDA and SFMOE_CUDA),
    reason="needs a CUDA device visible to PyTorch and a libsfmoe built with the CUDA backend "
    f"(torch.cuda.is_available()={HAS_CUDA}, sfmoe CUDA usable={SFMOE_CUDA})",
)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SPECIALS = [
    0.0,
    -0.0,
    1e-45,
    448.0,
    -464.0,
    57344.0,
    1e38,
    float("inf"),
    float("-inf"),
    float("nan"),
    1.0625,
    3e-5,
]


def random_values(rng, shape):
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    x[: min(n, len(SPECIALS))] = SPECIALS[: min(n, len(SPECIALS))]
    rng.shuffle(x)
    return x.reshape(shape)


def codes(array):
    """Raw element codes of a torch tensor or NumPy array, as a NumPy array of unsigned ints."""
    if isinstance(array, torch.Tensor):
        t = array.detach().cpu()
        if t.element_size() == 1:
            return t.view(torch.uint8).numpy()
        return (
            t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
            .numpy()
            .view(f"u{t.element_size()}")
        )
    return array.view(f"u{array.dtype.itemsize}")


def host_copy(t):
    """The NumPy array holding the same values as tensor t (float32/float16, or bf16/fp8 as
    ml_dtypes views of the very same bits)."""
    name = str(t.dtype).split(".")[1]
    ml = {
        "bfloat16": ml_dtypes.bfloat16,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
    }
    if name in ml:
        return codes(t).view(ml[name])
    return t.detach().cpu().numpy()


def same_result(device_result, host_result, fp32=False):
    if fp32:  # NaN payloads differ between CPU and GPU arithmetic; everything else is exact
        return np.array_equal(device_result.cpu().numpy(), host_result, equal_nan=True)
    return np.array_equal(codes(device_result), codes(host_result))


@requires_cuda
@pytest.mark.parametrize("out_name", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"])
@pytest.mark.parametrize("in_name", ["fp32", "bf16", "fp16"])
def test_cuda_cast_matches_host(in_name, out_name, rng):
    x = torch.from_numpy(random_values(rng, (37, 64))).cuda().to(TORCH_DTYPE[in_name])
    scale = float(np.float32(rng.uniform(0.1, 10)))
    y = sfmoe.cast(x, out_name, scale=scale)
    torch.cuda.synchronize()
    want = sfmoe.cast(host_copy(x), out_name, scale=scale)
    assert y.device == x.device
    expected_dtype = {
        "fp8_e4m3": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
        "fp4_e2m1": torch.uint8,
    }.get(out_name, TORCH_DTYPE.get(out_name))
    assert y.dtype == expected_dtype
    assert tuple(y.shape) == want.shape
    assert same_result(y, want, fp32=out_name == "fp32")


@requires_cuda
@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [(0,), (1,), (33,), (993,), (8192,), (4, 3, 16), (2, 2, 2, 2, 8)], ids=str)
def test_cuda_quantize_dequantize_matches_host(fmt, shape, power_of_two, rng):
    x_host = random_values(rng, shape)
    x_host[~np.isfinite(x_host)] = 0.5  # current scaling of finite data
    x = torch.from_numpy(x_host).cuda()
    q = sfmoe.quantize_fp8(x, fmt=fmt, power_of_two=power_of_two)  # amax and scale on the device
    q_host = sfmoe.quantize_fp8(x_host, fmt=fmt, power_of_two=power_of_two)
    assert q.data.dtype == {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]
    assert q.scale_inv.is_cuda and q.scale_inv.dtype == torch.float32
    assert same_result(q.scale_inv, q_host.scale_inv)
    assert same_result(q.data, q_host.data)
    for out_dtype in ("fp32", "bf16"):
        y = sfmoe.dequantize(q, out_dtype)
        assert same_result(y, sfmoe.dequantize(q_host, out_dtype), fp32=out_dtype == "fp32")


@requires_cuda
def test_cuda_quantize_with_given_scale_and_float8_inputs(rng):
    x_host = random_values(rng, (16, 48))
    x = torch.from_numpy(x_host).cuda()
    q = sfmoe.quantize_fp8(x, 3.5)
    q_host = sfmoe.quantize_fp8(x_host, 3.5)
    assert same_result(q.data, q_host.data) and same_result(q.scale_inv, q_host.scale_inv)
    # torch.float8 tensors made by PyTorch are read with their own dtype
    f8 = torch.from_numpy(x_host).cuda().clamp(-448, 448).nan_to_num(0.0).to(torch.float8_e4m3fn)
    y = sfmoe.cast(f8, torch.float32, scale=0.25)
    assert same_result(y, sfmoe.cast(host_copy(f8), "fp32", scale=0.25), fp32=True)
    # a device scale tensor
    s = torch.tensor(2.0, device="cuda")
    assert same_result(sfmoe.cast(x, "e5m2", scale=s), sfmoe.cast(x_host, "e5m2", scale=2.0))


@requires_cuda
def test_cuda_layouts_and_out(rng):
    x_host = random_values(rng, (24, 40))
    x = torch.from_numpy(x_host).cuda().requires_grad_(True)
    want = sfmoe.cast(x_host, "e4m3")
    with pytest.raises(TypeError, match="requires grad"):
        sfmoe.cast(x, "e4m3")  # a functional op records no autograd: refused, not detached
    with torch.no_grad():
        assert same_result(sfmoe.cast(x, "e4m3"), want)
    assert same_result(sfmoe.cast(x.detach().t(), "e4m3"), np.ascontiguousarray(want.T))
    flat = x.detach().reshape(-1)
    assert same_result(sfmoe.cast(flat[1:], "e4m3"), want.reshape(-1)[1:])  # misaligned view
    out = torch.empty((24, 40), dtype=torch.float8_e4m3fn, device="cuda")
    x = x.detach()
    assert sfmoe.cast(x, "e4m3", out=out) is out and same_result(out, want)
    with pytest.raises(sfmoe.Error) as error_info:
        sfmoe.cast(x, "e4m3", out=torch.empty(7, dtype=torch.uint8, device="cuda"))
    assert error_info.value.status == "SFMOE_ERROR_SHAPE_MISMATCH"
    assert str(error_info.value) == sfmoe.last_error()
    with pytest.raises(TypeError, match="same kind of array"):
        sfmoe.cast(x, "e4m3", out=np.zeros((24, 40), np.uint8))
    with pytest.raises(ValueError, match="scale is on"):
        sfmoe.cast(x, "e4m3", scale=torch.tensor(1.0))
    with pytest.raises(sfmoe.Error) as error_info:  # host input, CUDA output
        sfmoe._C.cast(x_host, 0, sfmoe._arrays.adapt(out, "out")[0].for_binding(out), 3)
    assert error_info.value.status == "SFMOE_ERROR_MEMORY_SPACE"


@requires_cuda
def test_cuda_work_runs_on_the_current_stream(rng):
    x_host = random_values(rng, (1 << 20,))
    source = torch.from_numpy(x_host).cuda()
    want = sfmoe.cast(x_host, "e4m3", scale=0.5)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # keep the stream busy: a wrong-stream launch would race
        x = source * 1.0  # written on `stream` after the sleep
        y = sfmoe.cast(x, "e4m3", scale=0.5)
        q = sfmoe.quantize_fp8(x)
    stream.synchronize()
    assert same_result(y, want)
    assert same_result(q.data, sfmoe.quantize_fp8(x_host).data)


@requires_cuda
def test_cuda_graph_capture_of_quantize(rng):
    """The op path is sync-free: quantize with current scaling captures in a CUDA graph and
    replays on new data."""
    static_x = torch.zeros(4096, device="cuda")
    sfmoe.quantize_fp8(static_x)  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_q = sfmoe.quantize_fp8(static_x)
    for _ in range(3):
        x_host = random_values(rng, (4096,))
        x_host[~np.isfinite(x_host)] = 1.0
        static_x.copy_(torch.from_numpy(x_host))
        graph.replay()
        torch.cuda.synchronize()
        want = sfmoe.quantize_fp8(x_host)
        assert same_result(static_q.data, want.data)
        assert same_result(static_q.scale_inv, want.scale_inv)


def test_cpu_tensors_match_numpy(rng):
    x_host = random_values(rng, (9, 32))
    x = torch.from_numpy(x_host.copy())
    y = sfmoe.cast(x, "fp8_e5m2", scale=0.75)
    assert y.dtype == torch.float8_e5m2 and y.device.type == "cpu"
    assert same_result(y, sfmoe.cast(x_host, "fp8_e5m2", scale=0.75))
    q = sfmoe.quantize_fp8(x.nan_to_num(0.0, 1.0, -1.0))
    q_host = sfmoe.quantize_fp8(np.nan_to_num(x_host, nan=0.0, posinf=1.0, neginf=-1.0))
    assert same_result(q.data, q_host.data) and same_result(q.scale_inv, q_host.scale_inv)
    assert same_result(sfmoe.dequantize(q), sfmoe.dequantize(q_host), fp32=True)
    packed = sfmoe.cast(x.to(torch.bfloat16), "fp4_e2m1")
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (9, 16)
    bf16_host = host_copy(x.to(torch.bfloat16))
    assert np.array_equal(packed.numpy(), numerics.pack_fp4(numerics.f32_to_e2m1(bf16_host.astype(np.float32))))
    if hasattr(torch, "float4_e2m1fn_x2"):  # PyTorch's own packed FP4 type reads the same way
        back = sfmoe.cast(packed.view(torch.float4_e2m1fn_x2), "fp32")
        assert same_result(back, sfmoe.cast(packed.numpy(), "fp32", input_dtype="fp4_e2m1"), fp32=True)


# ---- grouped quantization ------------------------------------------------------------------------

BLOCK = {
    "fp8_tensor": 0,
    "fp8_block_1x128": 128,
    "fp8_block_128x128": 128,
    "mxfp8": 32,
    "nvfp4": 16,
    "nvfp4_2d": 16,
}
# Per recipe: the defaults from FP32 data, and other options from BF16 data.
VARIANTS = {
    "fp8_tensor": {"fmt": "e5m2", "power_of_two_scales": True},
    "fp8_block_1x128": {"fmt": "e5m2", "power_of_two_scales": True},
    "fp8_block_128x128": {"fmt": "e5m2", "power_of_two_scales": True},
    "mxfp8": {"fmt": "e5m2", "scale_layout": "swizzled"},
    "nvfp4": {
        "scale_layout": "swizzled",
        "stochastic_rounding": True,
        "seed": 5,
        "offset": 3,
        "hadamard": True,
    },
    "nvfp4_2d": {"stochastic_rounding": True, "seed": 5, "offset": 3},
}


def random_offsets(rng, num_groups, max_rows=60):
    sizes = rng.integers(0, max_rows, num_groups)
    sizes[rng.integers(num_groups)] = 0
    sizes[rng.integers(num_groups)] = 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def written_parts(q, end):
    """The arrays of a GroupedQuantizedTensor (torch or NumPy) in the region the op writes:
    rows [0, end) of each copy (columns of the columnwise copy), their scales, amax, offsets."""
    fp4 = q.dtype == sfmoe.DType.FP4_E2M1
    B = BLOCK[q.recipe]
    two_d = q.recipe in ("fp8_block_128x128", "nvfp4_2d")
    parts = {}
    for columnwise in (False, True):
        data = q.columnwise_data if columnwise else q.data
        if data is None:
            continue
        scales = q.compact_scale_inv(columnwise)
        if columnwise:
            data = data[:, : end // 2] if fp4 else data[:, :end]
            scales = scales if q.recipe == "fp8_tensor" else scales[:, : end // B]
        else:
            data = data[:end]
            if q.recipe != "fp8_tensor":
                scales = scales[: end // B] if two_d else scales[:end]
        name = "columnwise" if columnwise else "rowwise"
        parts[name + "_data"] = data
        parts[name + "_scale_inv"] = scales
    for name in ("amax", "columnwise_amax", "group_offsets"):
        if getattr(q, name) is not None:
            parts[name] = getattr(q, name)
    return parts


def assert_same_quantized(q, q_host):
    end = int(q_host.group_offsets[-1]) if q_host.group_offsets is not None else q_host.rows
    device_parts, host_parts = written_parts(q, end), written_parts(q_host, end)
    assert device_parts.keys() == host_parts.keys()
    for name in host_parts:
        assert same_result(device_parts[name], host_parts[name]), name


@requires_cuda
@pytest.mark.parametrize("variant", ["defaults", "options"])
@pytest.mark.parametrize("recipe", list(BLOCK))
def test_cuda_grouped_quantize_matches_host(recipe, variant, rng):
    options = VARIANTS[recipe] if variant == "options" else {}
    offsets = random_offsets(rng, 6)
    x_host = random_values(rng, (int(offsets[-1]) + 5, 256))
    x = torch.from_numpy(x_host).cuda().to(torch.bfloat16 if variant == "options" else torch.float32)
    offsets_cuda = torch.from_numpy(offsets).cuda()
    q = sfmoe.quantize(x, recipe, group_offsets=offsets_cuda, columnwise=True, **options)
    q_host = sfmoe.quantize(host_copy(x), recipe, group_offsets=offsets, columnwise=True, **options)
    assert q.data.is_cuda and q.group_offsets.is_cuda and q.rows == q_host.rows
    assert (
        q.data.dtype
        == {
            sfmoe.DType.FP8_E4M3: torch.float8_e4m3fn,
            sfmoe.DType.FP8_E5M2: torch.float8_e5m2,
            sfmoe.DType.FP4_E2M1: torch.uint8,
        }[q.dtype]
    )
    torch.cuda.synchronize()
    assert_same_quantized(q, q_host)
    for source in ("rowwise", "columnwise"):
        y = sfmoe.dequantize(q, source=source)
        assert same_result(y, sfmoe.dequantize(q_host, source=source), fp32=True), source


@requires_cuda
def test_cuda_grouped_amax_swizzle_and_uniform_groups(rng):
    offsets = random_offsets(rng, 5)
    x_host = random_values(rng, (int(offsets[-1]) + 2, 96))
    x = torch.from_numpy(x_host).cuda().to(torch.float16)
    amax = sfmoe.grouped_amax(x, torch.from_numpy(offsets).cuda())
    assert amax.is_cuda and same_result(amax, sfmoe.grouped_amax(host_copy(x), offsets), fp32=True)
    compact = torch.randint(0, 256, (200, 7), dtype=torch.uint8, device="cuda")
    swizzled = sfmoe.swizzle_scales(compact, dtype="e8m0")
    swizzled_host = sfmoe.swizzle_scales(compact.cpu().numpy(), dtype="e8m0")
    assert swizzled.is_cuda and same_result(swizzled, swizzled_host)
    assert same_result(sfmoe.unswizzle_scales(swizzled, 200, 7), compact.cpu().numpy())
    weights_host = random_values(rng, (3 * 128, 256))
    weights_host[~np.isfinite(weights_host)] = 1.0
    weights = torch.from_numpy(weights_host).cuda()
    for recipe in ("fp8_block_128x128", "nvfp4_2d"):
        q = sfmoe.quantize(weights, recipe, uniform_group_rows=128, columnwise=True)
        q_host = sfmoe.quantize(weights_host, recipe, uniform_group_rows=128, columnwise=True)
        assert q.group_offsets is None
        torch.cuda.synchronize()
        assert_same_quantized(q, q_host)


@requires_cuda
def test_cuda_grouped_quantize_runs_on_the_current_stream(rng):
    offsets = random_offsets(rng, 4, max_rows=4000)
    x_host = random_values(rng, (int(offsets[-1]), 512))
    source = torch.from_numpy(x_host).cuda()
    offsets_cuda = torch.from_numpy(offsets).cuda()
    want = sfmoe.quantize(x_host, "mxfp8", group_offsets=offsets, columnwise=True)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # keep the stream busy: a wrong-stream launch would race
        x = source * 1.0  # written on `stream` after the sleep
        q = sfmoe.quantize(x, "mxfp8", group_offsets=offsets_cuda, columnwise=True)
    stream.synchronize()
    assert_same_quantized(q, want)


@requires_cuda
def test_cuda_graph_capture_of_grouped_quantize(rng):
    """sfmoe.quantize is sync-free: captured once, the graph replays on new data and new group
    sizes (the offsets live on the device)."""
    rows, cols, num_groups = 320, 256, 4
    options = dict(columnwise=True, scale_layout="swizzled", out_row_capacity=rows + 4 * 32)
    static_x = torch.zeros((rows, cols), device="cuda")
    static_offsets = torch.zeros(num_groups + 1, dtype=torch.int64, device="cuda")
    sfmoe.quantize(static_x, "mxfp8", group_offsets=static_offsets, **options)  # warm up
    sfmoe.quantize(static_x, "nvfp4")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_q = sfmoe.quantize(static_x, "mxfp8", group_offsets=static_offsets, **options)
        static_one_group = sfmoe.quantize(static_x, "nvfp4")  # offsets [0, rows] made on the device
    for _ in range(3):
        offsets = random_offsets(rng, num_groups, max_rows=rows // num_groups)
        x_host = random_values(rng, (rows, cols))
        static_x.copy_(torch.from_numpy(x_host))
        static_offsets.copy_(torch.from_numpy(offsets))
        graph.replay()
        torch.cuda.synchronize()
        want = sfmoe.quantize(x_host, "mxfp8", group_offsets=offsets, **options)
        assert_same_quantized(static_q, want)
        assert_same_quantized(static_one_group, sfmoe.quantize(x_host, "nvfp4"))


@requires_cuda
@pytest.mark.parametrize("given_scales", [False, True])
def test_cuda_status_word_records_nan_amax(rng, given_scales):
    """A NaN group amax traps once the amax is known: after the amax pass, or (given scales) after
    the codes kernel that folds it; the amax itself is NaN for that group only."""
    x_host = rng.standard_normal((64, 128)).astype(np.float32)
    x_host[40, 7] = np.nan
    x = torch.from_numpy(x_host).cuda()
    word = sfmoe.StatusWord(x)
    assert word.device == str(x.device)
    word.reset()
    offsets = torch.tensor([0, 32, 64], device="cuda")
    scales = torch.tensor([2.0, 0.5], device="cuda") if given_scales else None
    q = sfmoe.quantize(
        x, "fp8_tensor", group_offsets=offsets, trap_nan_amax=True, status_word=word, tensor_scales=scales
    )
    word.snapshot()
    torch.cuda.current_stream().synchronize()
    report = word.read()
    assert report.flags == sfmoe.Fault.NAN_AMAX and report.first_group == 1
    amax = q.amax.cpu()
    assert amax[0].item() == float(np.abs(x_host[:32]).max()) and amax[1].isnan()
    with pytest.raises(ValueError, match="the word is on"):
        sfmoe.quantize(x.cpu(), "fp8_tensor", status_word=word)


def test_cpu_tensors_grouped_quantize_match_numpy(rng):
    offsets = random_offsets(rng, 3)
    x_host = random_values(rng, (int(offsets[-1]), 64))
    x = torch.from_numpy(x_host.copy()).to(torch.bfloat16)
    q = sfmoe.quantize(x, "nvfp4", group_offsets=torch.from_numpy(offsets), columnwise=True)
    q_host = sfmoe.quantize(host_copy(x), "nvfp4", group_offsets=offsets, columnwise=True)
    assert q.data.device.type == "cpu" and q.scale_inv.dtype == torch.float8_e4m3fn
    assert_same_quantized(q, q_host)
    assert same_result(sfmoe.dequantize(q, "bf16"), sfmoe.dequantize(q_host, "bf16"))
    empty = sfmoe.quantize(torch.zeros((0, 64)), "mxfp8")  # empty arrays still get a buffer
    assert tuple(empty.data.shape) == (0, 64) and empty.group_offsets.tolist() == [0, 0]
    with pytest.raises(TypeError, match="same kind of array"):
        sfmoe.quantize(x, "mxfp8", group_offsets=offsets)


# ---- router, permute, activations: CUDA tensors give the host's results ------------------------


def _routing_logits(rng, tokens, experts):
    x = rng.standard_normal((tokens, experts)).astype(np.float32) * 2
    x[3, 5] = x[3, 6]  # an exact tie
    x[7] = 0.5  # every expert tied
    x[9, 1] = np.nan
    x[11, 2] = np.inf
    return x


@requires_cuda
@pytest.mark.parametrize(
    "config",
    [
        dict(score="sigmoid", normalize=True, num_groups=8, group_topk=4, scaling_factor=2.5, aux_loss_coeff=1e-3),
        dict(normalize=True, z_loss_coeff=1e-3),
        dict(softmax_after_topk=True),
    ],
)
def test_cuda_router_matches_host(config, rng):
    x = _routing_logits(rng, 515, 64)
    bias = (rng.standard_normal(64) * 0.01).astype(np.float32)
    use_bias = config.get("num_groups", 0) > 1
    host = sfmoe.router(torch.from_numpy(x), 6, expert_bias=torch.from_numpy(bias) if use_bias else None, **config)
    dev = sfmoe.router(
        torch.from_numpy(x).cuda(), 6, expert_bias=torch.from_numpy(bias).cuda() if use_bias else None, **config
    )
    torch.cuda.synchronize()
    assert torch.equal(dev.topk_ids.cpu(), host.topk_ids)
    assert np.array_equal(dev.probs.cpu().numpy().view(np.uint32), host.probs.numpy().view(np.uint32))
    assert torch.equal(dev.tokens_per_expert.cpu(), host.tokens_per_expert)
    for name in ("aux_loss", "z_loss"):
        if getattr(host, name) is not None:
            np.testing.assert_allclose(getattr(dev, name).cpu().numpy(), getattr(host, name).numpy(), rtol=1e-5)
    finite = torch.from_numpy(np.nan_to_num(x, nan=0.0, posinf=3.0))
    d_probs = torch.from_numpy(rng.standard_normal((515, 6)).astype(np.float32))
    host = sfmoe.router(finite, 6, expert_bias=torch.from_numpy(bias) if use_bias else None, **config)
    dev = sfmoe.router(finite.cuda(), 6, expert_bias=torch.from_numpy(bias).cuda() if use_bias else None, **config)
    g_host = sfmoe.router_backward(finite, host, d_probs)
    g_dev = sfmoe.router_backward(finite.cuda(), dev, d_probs.cuda())
    np.testing.assert_allclose(g_dev.cpu().numpy(), g_host.numpy(), rtol=1e-4, atol=1e-6)


@requires_cuda
@pytest.mark.parametrize("alignment", [1, 16, 128])
def test_cuda_permute_unpermute_activation_match_host(alignment, rng):
    tokens, experts, k, hidden = 300, 16, 4, 96
    x = torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(torch.bfloat16)
    routed = sfmoe.router(torch.from_numpy(_routing_logits(rng, tokens, experts)), k)
    ids = routed.topk_ids
    host = sfmoe.permute(x, ids, experts, alignment=alignment, amax=True)
    dev = sfmoe.permute(x.cuda(), ids.cuda(), experts, alignment=alignment, amax=True)
    torch.cuda.synchronize()
    end = int(host.group_offsets[-1])
    assert torch.equal(dev.amax.cpu().view(torch.int32), host.amax.view(torch.int32))
    # The expert amax with a NaN row and an infinite value among the rows.
    special = x.clone()
    special[3, 5], special[7, 0] = float("nan"), float("-inf")
    amax_host = sfmoe.permute(special, ids, experts, alignment=alignment, amax=True).amax
    amax_dev = sfmoe.permute(special.cuda(), ids.cuda(), experts, alignment=alignment, amax=True).amax
    assert torch.equal(amax_dev.cpu().view(torch.int32), amax_host.view(torch.int32))
    assert torch.isnan(amax_host[ids[3].long()]).all()
    only_inf = [e for e in ids[7].tolist() if e not in ids[3].tolist()]
    assert torch.isinf(amax_host[only_inf]).all()
    assert torch.equal(dev.group_offsets.cpu(), host.group_offsets)
    assert torch.equal(dev.row_map.cpu(), host.row_map)
    assert torch.equal(dev.tokens_per_expert.cpu(), host.tokens_per_expert)
    assert torch.equal(dev.rows[:end].cpu().view(torch.int16), host.rows[:end].view(torch.int16))

    probs = routed.probs
    out_host = sfmoe.unpermute(host.rows, host, probs)
    out_dev = sfmoe.unpermute(dev.rows, dev, probs.cuda())
    assert torch.equal(out_dev.cpu().view(torch.int16), out_host.view(torch.int16))

    for kind in ("swiglu", "gelu", "clamped_swiglu"):
        a_host = sfmoe.grouped_activation(host.rows, host.group_offsets, host.tokens_per_expert, kind)
        a_dev = sfmoe.grouped_activation(dev.rows, dev.group_offsets, dev.tokens_per_expert, kind)
        assert torch.equal(a_dev[:end].cpu().view(torch.int16), a_host[:end].view(torch.int16)), kind
        d = torch.ones_like(a_host)
        g_host = sfmoe.grouped_activation_backward(host.rows, d, host.group_offsets, host.tokens_per_expert, kind)
        g_dev = sfmoe.grouped_activation_backward(dev.rows, d.cuda(), dev.group_offsets, dev.tokens_per_expert, kind)
        assert torch.equal(g_dev[:end].cpu(), g_host[:end]), kind

    d_out = torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32))
    dr_host, dp_host = sfmoe.unpermute_backward(d_out, host.rows, host, probs)
    dr_dev, dp_dev = sfmoe.unpermute_backward(d_out.cuda(), dev.rows, dev, probs.cuda())
    assert torch.equal(dr_dev[:end].cpu(), dr_host[:end])
    np.testing.assert_allclose(dp_dev.cpu().numpy(), dp_host.numpy(), rtol=1e-4, atol=1e-5)
    # BF16 d rows: the same FP32 products, rounded once, on both backends.
    dr16_host, _ = sfmoe.unpermute_backward(d_out, host.rows, host, probs, out_dtype="bf16")
    dr16_dev, _ = sfmoe.unpermute_backward(d_out.cuda(), dev.rows, dev, probs.cuda(), out_dtype="bf16")
    assert dr16_dev.dtype == torch.bfloat16
    assert torch.equal(dr16_dev[:end].cpu().view(torch.int16), dr16_host[:end].view(torch.int16))
    assert torch.equal(dr16_host[:end], dr_host[:end].to(torch.bfloat16))


@requires_cuda
@pytest.mark.parametrize("recipe,layout", [("mxfp8", "swizzled"), ("mxfp8", "compact"), ("fp8_block_1x128", "compact")])
def test_cuda_fused_permute_quantization_matches_host(recipe, layout, rng):
    tokens, experts, k, hidden = 300, 16, 4, 256
    x = torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(torch.bfloat16)
    ids = sfmoe.router(torch.from_numpy(_routing_logits(rng, tokens, experts)), k).topk_ids
    host = sfmoe.permute(x, ids, experts, alignment=32, quantize=recipe, scale_layout=layout)
    dev = sfmoe.permute(x.cuda(), ids.cuda(), experts, alignment=32, quantize=recipe, scale_layout=layout)
    torch.cuda.synchronize()
    end = int(host.group_offsets[-1])
    assert torch.equal(dev.group_offsets.cpu(), host.group_offsets)
    assert torch.equal(dev.rows.data[:end].cpu().view(torch.uint8), host.rows.data[:end].view(torch.uint8))
    assert torch.equal(
        dev.rows.compact_scale_inv()[:end].cpu().view(torch.uint8),
        host.rows.compact_scale_inv()[:end].view(torch.uint8),
    )


@requires_cuda
@pytest.mark.parametrize(
    "recipe,layout",
    [("mxfp8", "swizzled"), ("fp8_block_1x128", "compact"), ("nvfp4", "swizzled"), ("nvfp4", "compact")],
)
def test_cuda_fused_activation_quantization_and_amax_match_host(recipe, layout, rng):
    rows = torch.tensor([3, 0, 40, 17, 1], dtype=torch.int64)
    offsets = torch.zeros(6, dtype=torch.int64)
    offsets[1:] = torch.cumsum((rows + 31) // 32 * 32, 0)
    capacity = int(offsets[-1]) + 8
    x = torch.from_numpy((rng.standard_normal((capacity, 256)) * 3).astype(np.float32)).to(torch.bfloat16)
    host, host_amax = sfmoe.grouped_activation(
        x, offsets, rows, "swiglu", quantize=recipe, scale_layout=layout, return_amax=True
    )
    dev, dev_amax = sfmoe.grouped_activation(
        x.cuda(), offsets.cuda(), rows.cuda(), "swiglu", quantize=recipe, scale_layout=layout, return_amax=True
    )
    torch.cuda.synchronize()
    end = int(offsets[-1])
    assert torch.equal(dev.data[:end].cpu().view(torch.uint8), host.data[:end].view(torch.uint8))
    assert torch.equal(
        dev.compact_scale_inv()[:end].cpu().view(torch.uint8), host.compact_scale_inv()[:end].view(torch.uint8)
    )
    assert torch.equal(dev_amax.cpu().view(torch.int32), host_amax.view(torch.int32))


@requires_cuda
@pytest.mark.parametrize("out_dtype", ["float32", "bf16"])
def test_cuda_grouped_gemm_bf16_matches_host_on_integers(out_dtype, rng):
    """The Hopper grouped GEMM against the CPU reference: integer-valued BF16 operands (every
    product and sum exact), groups of 0, 1 and odd sizes, all three forms."""
    offsets = torch.tensor([0, 0, 1, 18, 51, 64, 200], dtype=torch.int64)
    groups, rows, n, k = 6, 200, 24, 40
    x = torch.from_numpy(rng.integers(-4, 5, size=(rows, k)).astype(np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(rng.integers(-4, 5, size=(groups, n, k)).astype(np.float32)).to(torch.bfloat16)
    dy = torch.from_numpy(rng.integers(-4, 5, size=(rows, n)).astype(np.float32)).to(torch.bfloat16)
    for form, a, b in (("fprop", x, w), ("dgrad", dy, w), ("wgrad", dy, x)):
        host = sfmoe.grouped_gemm(form, a, b, offsets, out_dtype=out_dtype)
        dev = sfmoe.grouped_gemm(form, a.cuda(), b.cuda(), offsets.cuda(), out_dtype=out_dtype)
        torch.cuda.synchronize()
        assert torch.equal(dev.cpu().float(), host.float()), form


@requires_cuda
def test_cuda_grouped_gemm_fp8_tensor_meets_the_bound(rng):
    """FP8 per-tensor operands (per-group scales, E4M3 x E4M3 and E5M2 gradients) on the Hopper
    kernels, with the accurate and the fast accumulation: each form against float64 products of the dequantized copies it reads, groups of 0,
    1 and odd sizes (wgrad: groups starting on multiples of 16, as its TMA loads need)."""

    def measure(got, want):
        got, want = got.double(), want.double()
        return float(1 - 2 * (got * want).sum() / (got * got + want * want).sum())

    groups, n, k = 6, 48, 80
    for offsets in (torch.tensor([0, 0, 1, 18, 51, 64, 200]), torch.tensor([0, 0, 16, 48, 48, 96, 208])):
        rows = int(offsets[-1])
        off = offsets.cuda()
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) * 3
        w = torch.randn(groups * n, k, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) * 1e-3
        aligned = all(int(o) % 16 == 0 for o in offsets)
        align = 16 if aligned else None
        qx = sfmoe.quantize(x, "fp8_tensor", group_offsets=off, columnwise=True, row_alignment=align)
        qw = sfmoe.quantize(w, "fp8_tensor", uniform_group_rows=n, columnwise=True)
        qdy = sfmoe.quantize(dy, "fp8_tensor", group_offsets=off, columnwise=True, fmt="e5m2", row_alignment=align)
        xr, xc = qx.dequantize(source="rowwise"), qx.dequantize(source="columnwise")
        wr, wc = qw.dequantize(source="rowwise"), qw.dequantize(source="columnwise")
        dyr, dyc = qdy.dequantize(source="rowwise"), qdy.dequantize(source="columnwise")
        forms = [("fprop", qx, qw), ("dgrad", qdy, qw)] + ([("wgrad", qdy, qx)] if aligned else [])
        for (form, a, b), fast, out_dtype in itertools.product(forms, (False, True), ("float32", "bf16")):
            got = sfmoe.grouped_gemm(form, a, b, out_dtype=out_dtype, fast_accumulation=fast).float()
            for g in range(groups):
                r = slice(int(offsets[g]), int(offsets[g + 1]))
                wg = slice(g * n, (g + 1) * n)
                if form == "fprop":
                    want = xr[r].double() @ wr[wg].double().T
                    have = got[r]
                elif form == "dgrad":
                    want = dyr[r].double() @ wc[wg].double()
                    have = got[r]
                else:
                    want = dyc[r].double().T @ xc[r].double()
                    have = got[g]
                if want.numel() and bool(want.abs().sum() > 0):
                    bound = 1e-5 if out_dtype == "float32" and not fast else 1e-3
                    assert measure(have, want) <= bound, (form, out_dtype, fast, g)
                else:
                    assert bool((have == 0).all()), (form, out_dtype, fast, g)


@requires_cuda
def test_cuda_grouped_gemm_fp8_blockwise_matches_host(rng):
    """FP8 blockwise (1x128 rows x 128x128 weights) on the Hopper kernels, all three forms (wgrad
    reading the columnwise-transposed scales), against the host's GEMM of the same quantized
    tensors: integer inputs with power-of-two scales bit for bit."""
    groups, n, k = 4, 256, 384
    offsets = torch.tensor([0, 128, 128, 384, 512])
    rows = int(offsets[-1])

    def integers(shape):
        # The magnitude changes per 128-row block and per 64 columns, so every block gets its own
        # power-of-two scale and a block reading its neighbour's scale shows.
        r, c = np.indices(shape)
        m = 2 ** ((r // 128 * 3 + c // 64) % 4)
        values = np.round(rng.uniform(-1, 1, size=shape) * m).astype(np.float32)
        return torch.from_numpy(values).to(torch.bfloat16)

    x, w, dy = integers((rows, k)), integers((groups * n, k)), integers((rows, n))
    kw = dict(power_of_two_scales=True)
    for device in ("cpu", "cuda"):
        off = offsets.to(device)
        qx = sfmoe.quantize(
            x.to(device),
            "fp8_block_1x128",
            group_offsets=off,
            columnwise=True,
            scale_layout="columnwise_transposed",
            **kw,
        )
        qdy = sfmoe.quantize(
            dy.to(device),
            "fp8_block_1x128",
            group_offsets=off,
            columnwise=True,
            scale_layout="columnwise_transposed",
            **kw,
        )
        qw = sfmoe.quantize(w.to(device), "fp8_block_128x128", uniform_group_rows=n, columnwise=True, **kw)
        got = [
            sfmoe.grouped_gemm(form, a, b).cpu()
            for form, a, b in (("fprop", qx, qw), ("dgrad", qdy, qw), ("wgrad", qdy, qx))
        ]
        if device == "cpu":
            want = got
    torch.cuda.synchronize()
    for form, g, h in zip(("fprop", "dgrad", "wgrad"), got, want):
        assert torch.equal(g, h), form


def _relative_error(got, want):
    """1 - 2 sum(xy) / sum(x^2 + y^2), in float64."""
    x, y = got.double().flatten(), want.double().flatten()
    return float(1.0 - 2.0 * (x * y).sum() / (x * x + y * y).sum())


@requires_cuda
@pytest.mark.parametrize(
    "rows_recipe,weights_recipe,fmt,hadamard",
    [
        ("mxfp8", "mxfp8", "e4m3", False),
        ("mxfp8", "mxfp8", "e5m2", False),
        ("nvfp4", "nvfp4_2d", "e4m3", False),
        ("nvfp4", "nvfp4", "e4m3", True),
    ],
)
def test_cuda_grouped_gemm_mx_nv_emulation_meets_the_bound(rows_recipe, weights_recipe, fmt, hadamard, rng):
    """MXFP8 and NVFP4 operands on the device (dequantized to BF16, then the BF16 kernels), all
    three forms, groups of 0, 1 and odd sizes, against the host's GEMM of the same quantized
    tensors (FP32 sums of the dequantized copies each form reads). The issue's bounds are 1e-3
    (MXFP8) and 2e-2 (NVFP4); the emulation should do far better: MXFP8 values are exact in BF16,
    NVFP4 ones are rounded once."""
    groups, n, k = 5, 64, 96
    sizes = np.array([0, 1, 33, 70, 17])
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    rows = int(offsets[-1])
    x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32)).to(torch.bfloat16)
    w = torch.from_numpy(rng.standard_normal((groups * n, k)).astype(np.float32)).to(torch.bfloat16)
    dy = torch.from_numpy(rng.standard_normal((rows, n)).astype(np.float32)).to(torch.bfloat16)
    results = {}
    for device in ("cpu", "cuda"):
        off = offsets.to(device)
        kw = dict(columnwise=True, fmt=fmt if rows_recipe == "mxfp8" else "e4m3", hadamard=hadamard)
        qx = sfmoe.quantize(x.to(device), rows_recipe, group_offsets=off, row_alignment=32, **kw)
        qdy = sfmoe.quantize(dy.to(device), rows_recipe, group_offsets=off, row_alignment=32, **kw)
        # (the GEMM's Hadamard flag covers every NV_1X16 operand: W's columnwise copy carries it too)
        qw = sfmoe.quantize(
            w.to(device),
            weights_recipe,
            uniform_group_rows=n,
            columnwise=True,
            hadamard=hadamard and weights_recipe == "nvfp4",
        )
        results[device] = [
            sfmoe.grouped_gemm(form, a, b).cpu()
            for form, a, b in (("fprop", qx, qw), ("dgrad", qdy, qw), ("wgrad", qdy, qx))
        ]
    torch.cuda.synchronize()
    bound = 1e-6 if rows_recipe == "mxfp8" else 1e-4
    for form, got, want in zip(("fprop", "dgrad", "wgrad"), results["cuda"], results["cpu"]):
        assert torch.isfinite(want).all(), form
        error = _relative_error(got, want)
        assert error <= bound, (form, error)


@requires_cuda
def test_cuda_graph_of_quantize_and_emulated_gemm_replays_on_new_group_sizes(rng):
    """NVFP4 quantize of the rows, then the emulated grouped GEMM (fprop, BF16 out), captured in one
    CUDA graph and replayed on new rows and new group sizes (written into the captured offsets);
    each replay against the host's run of the same two steps."""
    groups, n, k, rows = 4, 64, 128, 160
    capacity = rows + groups * 15  # the bound quantize asks for: every group padded to 16
    w = torch.from_numpy(rng.standard_normal((groups * n, k)).astype(np.float32)).to(torch.bfloat16)
    qw = sfmoe.quantize(w.cuda(), "nvfp4_2d", uniform_group_rows=n)
    qw_host = sfmoe.quantize(w, "nvfp4_2d", uniform_group_rows=n)
    static_x = torch.zeros(rows, k, device="cuda", dtype=torch.bfloat16)
    static_offsets = torch.tensor([0, 16, 32, 48, 64], device="cuda", dtype=torch.int64)

    def step():
        q = sfmoe.quantize(static_x, "nvfp4", group_offsets=static_offsets, row_alignment=16, out_row_capacity=capacity)
        return sfmoe.grouped_gemm("fprop", q, qw, out_dtype="bf16")

    step()  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step()
    for replay in range(3):
        sizes = rng.integers(1, 40, size=groups)  # odd sizes: padded to 16 by the quantize
        sizes[replay % groups] = 0  # an empty group
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        x = rng.standard_normal((rows, k)).astype(np.float32)
        static_x.copy_(torch.from_numpy(x).to(torch.bfloat16))
        static_offsets.copy_(torch.from_numpy(offsets))
        graph.replay()
        torch.cuda.synchronize()
        q = sfmoe.quantize(
            static_x.cpu(),
            "nvfp4",
            group_offsets=torch.from_numpy(offsets),
            row_alignment=16,
            out_row_capacity=capacity,
        )
        want = sfmoe.grouped_gemm("fprop", q, qw_host, out_dtype="bf16")
        end = int(q.group_offsets[-1])  # the quantized rows' padded groups
        assert end > 0
        assert _relative_error(static_y[:end].cpu(), want[:end]) <= 1e-4, replay


@requires_cuda
def test_cuda_fused_tensor_quantization_with_given_scales_matches_host(rng):
    """fp8_tensor with given scales, fused into permute and into SwiGLU: CUDA bytes (codes,
    scale_inv, amax) equal the host's."""
    tokens, experts, k, hidden = 300, 16, 4, 264
    x = torch.from_numpy(rng.standard_normal((tokens, hidden)).astype(np.float32)).to(torch.bfloat16)
    ids = sfmoe.router(torch.from_numpy(_routing_logits(rng, tokens, experts)), k).topk_ids
    scales = torch.from_numpy(np.exp2(rng.uniform(-3, 10, size=experts)).astype(np.float32))
    host = sfmoe.permute(x, ids, experts, alignment=16, quantize="fp8_tensor", tensor_scales=scales)
    dev = sfmoe.permute(x.cuda(), ids.cuda(), experts, alignment=16, quantize="fp8_tensor", tensor_scales=scales.cuda())
    torch.cuda.synchronize()
    end = int(host.group_offsets[-1])
    assert torch.equal(dev.rows.data[:end].cpu().view(torch.uint8), host.rows.data[:end].view(torch.uint8))
    assert torch.equal(dev.rows.scale_inv.cpu(), host.rows.scale_inv)
    assert torch.equal(dev.rows.amax.cpu().view(torch.int32), host.rows.amax.view(torch.int32))
    h = torch.from_numpy(rng.standard_normal((end + 8, 2 * 64)).astype(np.float32)).to(torch.bfloat16)
    a_host = sfmoe.grouped_activation(
        h, host.group_offsets, host.tokens_per_expert, "swiglu", quantize="fp8_tensor", tensor_scales=scales
    )
    a_dev = sfmoe.grouped_activation(
        h.cuda(), dev.group_offsets, dev.tokens_per_expert, "swiglu", quantize="fp8_tensor", tensor_scales=scales.cuda()
    )
    torch.cuda.synchronize()
    assert torch.equal(a_dev.data[:end].cpu().view(torch.uint8), a_host.data[:end].view(torch.uint8))
    assert torch.equal(a_dev.scale_inv.cpu(), a_host.scale_inv)
    assert torch.equal(a_dev.amax.cpu().view(torch.int32), a_host.amax.view(torch.int32))


@requires_cuda
def test_cuda_quantize_with_given_tensor_scales_matches_host(rng):
    """The standalone grouped quantization with given scales on CUDA: the host's bytes, and the
    result dequantizes more than once (the config's scales are bound afresh for every call)."""
    x = torch.from_numpy((rng.standard_normal((300, 64)) * 3).astype(np.float32)).to(torch.bfloat16)
    offsets = torch.tensor([0, 100, 100, 300], dtype=torch.int64)
    scales = torch.tensor([4.0, float("inf"), 0.001], dtype=torch.float32)
    host = sfmoe.quantize(x, "fp8_tensor", group_offsets=offsets, tensor_scales=scales, columnwise=True)
    dev = sfmoe.quantize(
        x.cuda(), "fp8_tensor", group_offsets=offsets.cuda(), tensor_scales=scales.cuda(), columnwise=True
    )
    torch.cuda.synchronize()
    assert torch.equal(dev.data.cpu().view(torch.uint8), host.data.view(torch.uint8))
    assert torch.equal(dev.columnwise_data.cpu().view(torch.uint8), host.columnwise_data.view(torch.uint8))
    assert torch.equal(dev.scale_inv.cpu(), host.scale_inv)
    assert torch.equal(dev.amax.cpu(), host.amax)
    first = sfmoe.dequantize(dev)
    assert torch.equal(sfmoe.dequantize(dev).view(torch.int32), first.view(torch.int32))


@requires_cuda
@pytest.mark.parametrize("recipe", ["fp8_tensor", "nvfp4"])
def test_cuda_quantize_with_given_group_amax_matches_host(rng, recipe):
    """The standalone grouped quantization with a given group amax on CUDA (one pass): the
    host's bytes, the given amax (0 and Inf among them) as the result's amax."""
    x = torch.from_numpy((rng.standard_normal((300, 64)) * 3).astype(np.float32)).to(torch.bfloat16)
    offsets = torch.tensor([0, 100, 100, 300], dtype=torch.int64)
    amax = torch.tensor([2.0, float("inf"), 0.0], dtype=torch.float32)
    host = sfmoe.quantize(x, recipe, group_offsets=offsets, group_amax=amax, columnwise=True)
    dev = sfmoe.quantize(x.cuda(), recipe, group_offsets=offsets.cuda(), group_amax=amax.cuda(), columnwise=True)
    torch.cuda.synchronize()
    end = int(host.group_offsets[-1])  # rows from there on are not written
    packed = 2 if recipe == "nvfp4" else 1  # FP4 packs pairs of elements
    assert torch.equal(dev.data.cpu()[:end].view(torch.uint8), host.data[:end].view(torch.uint8))
    assert torch.equal(
        dev.columnwise_data.cpu().view(torch.uint8)[:, : end // packed],
        host.columnwise_data.view(torch.uint8)[:, : end // packed],
    )
    if recipe == "nvfp4":  # block scales [rows, cols / 16] and [cols, rows / 16]
        assert torch.equal(dev.scale_inv.cpu()[:end].view(torch.uint8), host.scale_inv[:end].view(torch.uint8))
        assert torch.equal(
            dev.columnwise_scale_inv.cpu()[:, : end // 16].view(torch.uint8),
            host.columnwise_scale_inv[:, : end // 16].view(torch.uint8),
        )
    else:
        assert torch.equal(dev.scale_inv.cpu(), host.scale_inv)
    for source in ("rowwise", "columnwise"):
        assert torch.equal(
            sfmoe.dequantize(dev, source=source).cpu().view(torch.int32),
            sfmoe.dequantize(host, source=source).view(torch.int32),
        )
    assert torch.equal(dev.amax.cpu().view(torch.int32), amax.view(torch.int32))
