"""The MoE module's state-dict layout and the common alternatives it loads and saves (docs/torch.md,
"Checkpoints").

sfmoe's layout, defined once: ``router.weight`` [E, H]; ``experts.weight1`` [E, fc1_cols, H] with
the gate rows first and the up rows after them (gated activations); ``experts.weight2`` [E, H, F];
``expert_bias`` [E] when enabled. The others, named by their keys:

- ``hf``: Hugging Face Qwen3-MoE / DeepSeek-V3 style: ``gate.weight`` [E, H],
  ``experts.{i}.gate_proj.weight`` [F, H], ``experts.{i}.up_proj.weight`` [F, H],
  ``experts.{i}.down_proj.weight`` [H, F], ``gate.e_score_correction_bias`` [E];
- ``mixtral``: ``gate.weight``, ``experts.{i}.w1.weight`` (gate) / ``w3.weight`` (up) [F, H],
  ``experts.{i}.w2.weight`` [H, F];
- ``megatron``: Megatron-Core GroupedMLP: ``router.weight`` [E, H], ``experts.weight1``
  [H, E * fc1_cols] (each expert's [H, fc1_cols] block, gate columns first),
  ``experts.weight2`` [E * F, H], ``router.expert_bias``;
- ``te``: Megatron-Core TEGroupedMLP (Transformer Engine GroupedLinear):
  ``experts.linear_fc1.weight{i}`` [fc1_cols, H], ``experts.linear_fc2.weight{i}`` [H, F].

Every tensor's shape is checked against the layout before anything is copied; a tensor in the
other orientation is refused with its expected shape. Layouts are recognized by their key names
only, never guessed from shapes (a square [H, H] block reads the same either way).
"""

import re

import torch

LAYOUTS = ("sfmoe", "hf", "mixtral", "megatron", "te")

# The keys each layout owns (below the MoE block's prefix): what loading it consumes.
KEY_PATTERNS = {
    "sfmoe": r"router\.weight|experts\.weight[12]|expert_bias",
    "hf": r"gate\.weight|gate\.e_score_correction_bias|experts\.\d+\.(gate|up|down)_proj\.weight",
    "mixtral": r"gate\.weight|gate\.e_score_correction_bias|experts\.\d+\.w[123]\.weight",
    "megatron": r"router\.weight|router\.expert_bias|experts\.weight[12]",
    "te": r"router\.weight|router\.expert_bias|experts\.linear_fc[12]\.weight\d+",
}


def owned_keys(state, layout, prefix=""):
    """The keys of `state` under `prefix` that `layout` owns."""
    pattern = re.compile(KEY_PATTERNS[layout])
    return [k for k in state if k.startswith(prefix) and pattern.fullmatch(k[len(prefix) :])]


def _shapes(config):
    E, H, F, C = config.num_experts, config.hidden_size, config.ffn_hidden_size, config.fc1_cols
    return E, H, F, C


def _expect(state, key, shape):
    if key not in state:
        raise KeyError(f"checkpoint: {key!r} is missing")
    t = state[key]
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"checkpoint: {key!r} has shape {tuple(t.shape)}, expected {tuple(shape)}"
            + (" (it looks transposed)" if tuple(t.shape) == tuple(shape)[::-1] else "")
        )
    return t


def detect_layout(state, prefix=""):
    """The layout of `state`'s keys under `prefix`; ValueError when none matches."""
    keys = {k[len(prefix) :] for k in state if k.startswith(prefix)}
    if "experts.weight1" in keys and "router.weight" in keys:
        w = state[prefix + "experts.weight1"]
        return "sfmoe" if w.dim() == 3 else "megatron"
    if any(re.fullmatch(r"experts\.\d+\.gate_proj\.weight", k) for k in keys):
        return "hf"
    if any(re.fullmatch(r"experts\.\d+\.w1\.weight", k) for k in keys):
        return "mixtral"
    if any(re.fullmatch(r"experts\.linear_fc1\.weight\d+", k) for k in keys):
        return "te"
    raise ValueError(f"checkpoint: no known MoE layout under prefix {prefix!r} (keys: {sorted(keys)[:6]} ...)")


def to_sfmoe(state, config, layout="auto", prefix="", expert_bias=False):
    """sfmoe-layout tensors (keys without `prefix`) from `state` in `layout`."""
    E, H, F, C = _shapes(config)
    gated = C == 2 * F
    layout = detect_layout(state, prefix) if layout == "auto" else layout
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS} or 'auto', got {layout!r}")
    p = prefix
    out = {}
    if layout == "sfmoe":
        out["router.weight"] = _expect(state, p + "router.weight", (E, H))
        out["experts.weight1"] = _expect(state, p + "experts.weight1", (E, C, H))
        out["experts.weight2"] = _expect(state, p + "experts.weight2", (E, H, F))
        bias_key = p + "expert_bias"
    elif layout in ("hf", "mixtral"):
        names = ("gate_proj", "up_proj", "down_proj") if layout == "hf" else ("w1", "w3", "w2")
        out["router.weight"] = _expect(state, p + "gate.weight", (E, H))
        w1, w2 = [], []
        for i in range(E):
            gate = _expect(state, f"{p}experts.{i}.{names[0]}.weight", (F, H))
            if gated:
                up = _expect(state, f"{p}experts.{i}.{names[1]}.weight", (F, H))
                w1.append(torch.cat([gate, up], 0))
            else:
                w1.append(gate)
            w2.append(_expect(state, f"{p}experts.{i}.{names[2]}.weight", (H, F)))
        out["experts.weight1"], out["experts.weight2"] = torch.stack(w1), torch.stack(w2)
        bias_key = p + "gate.e_score_correction_bias"
    elif layout == "megatron":
        out["router.weight"] = _expect(state, p + "router.weight", (E, H))
        w1 = _expect(state, p + "experts.weight1", (H, E * C))
        out["experts.weight1"] = w1.view(H, E, C).permute(1, 2, 0)
        w2 = _expect(state, p + "experts.weight2", (E * F, H))
        out["experts.weight2"] = w2.view(E, F, H).transpose(1, 2)
        bias_key = p + "router.expert_bias"
    else:  # te
        out["router.weight"] = _expect(state, p + "router.weight", (E, H))
        out["experts.weight1"] = torch.stack(
            [_expect(state, f"{p}experts.linear_fc1.weight{i}", (C, H)) for i in range(E)]
        )
        out["experts.weight2"] = torch.stack(
            [_expect(state, f"{p}experts.linear_fc2.weight{i}", (H, F)) for i in range(E)]
        )
        bias_key = p + "router.expert_bias"
    if expert_bias:
        out["expert_bias"] = _expect(state, bias_key, (E,))
    return {k: v.contiguous() for k, v in out.items()}


def from_sfmoe(state, config, layout, prefix=""):
    """`state` (sfmoe layout, keys without a prefix) in `layout`, keys under `prefix`."""
    E, H, F, C = _shapes(config)
    gated = C == 2 * F
    r, w1, w2 = state["router.weight"], state["experts.weight1"], state["experts.weight2"]
    bias = state.get("expert_bias")
    out = {}
    if layout == "sfmoe":
        out = {"router.weight": r, "experts.weight1": w1, "experts.weight2": w2}
        if bias is not None:
            out["expert_bias"] = bias
    elif layout in ("hf", "mixtral"):
        names = ("gate_proj", "up_proj", "down_proj") if layout == "hf" else ("w1", "w3", "w2")
        out["gate.weight"] = r
        for i in range(E):
            out[f"experts.{i}.{names[0]}.weight"] = w1[i, :F]
            if gated:
                out[f"experts.{i}.{names[1]}.weight"] = w1[i, F:]
            out[f"experts.{i}.{names[2]}.weight"] = w2[i]
        if bias is not None:
            out["gate.e_score_correction_bias"] = bias
    elif layout == "megatron":
        out["router.weight"] = r
        out["experts.weight1"] = w1.permute(2, 0, 1).reshape(H, E * C)
        out["experts.weight2"] = w2.transpose(1, 2).reshape(E * F, H)
        if bias is not None:
            out["router.expert_bias"] = bias
    elif layout == "te":
        out["router.weight"] = r
        for i in range(E):
            out[f"experts.linear_fc1.weight{i}"] = w1[i]
            out[f"experts.linear_fc2.weight{i}"] = w2[i]
        if bias is not None:
            out["router.expert_bias"] = bias
    else:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    # The rest (a shared expert: Hugging Face's Qwen2-MoE names in every layout) as it is.
    own = ("router.weight", "experts.weight1", "experts.weight2", "expert_bias")
    out.update({k: v for k, v in state.items() if k not in own})
    return {prefix + k: v.contiguous().clone() for k, v in out.items()}


def read_safetensors(path):
    """The tensors of a safetensors file (never a pickle)."""
    from safetensors.torch import load_file

    return load_file(path)


def write_safetensors(state, path):
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, path)
