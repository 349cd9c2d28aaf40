"""The MoE layer's options, shared by the torch module (sfmoe.torch) and the JAX block
(sfmoe.jax): one definition of the names, their checks and the C layer's fields they give."""

import dataclasses
import math
import numbers
from typing import Optional

_ACTIVATIONS = {"swiglu": 0, "geglu": 1, "silu": 2, "gelu": 3, "squared_relu": 4, "clamped_swiglu": 5}
_GATED = {"swiglu", "geglu", "clamped_swiglu"}
_SCORES = {"softmax": 0, "sigmoid": 1}
# Megatron's --fp8-recipe names (tensorwise, blockwise, mxfp8) and --fp4-recipe nvfp4; each with
# the row alignment its blocks need down an expert's rows.
_RECIPES = {"bf16": 0, "tensorwise": 1, "blockwise": 2, "mxfp8": 3, "nvfp4": 4}
_RECIPE_ALIGNMENT = {"bf16": 1, "tensorwise": 16, "blockwise": 128, "mxfp8": 32, "nvfp4": 16}
_EP_OVERFLOW = {"drop": 0, "trap": 1, "spill": 2}


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """The layer's options. Names follow Megatron-Core's MoE flags (in brackets)."""

    hidden_size: int
    ffn_hidden_size: int  # [--moe-ffn-hidden-size]
    num_experts: int  # [--num-experts]
    topk: int  # [--moe-router-topk]
    score_function: str = "softmax"  # [--moe-router-score-function] softmax or sigmoid
    pre_softmax: bool = False  # [--moe-router-pre-softmax] softmax before the top-k (else after)
    num_groups: int = 0  # [--moe-router-num-groups] group-limited routing
    group_topk: int = 0  # [--moe-router-group-topk]
    topk_scaling_factor: float = 1.0  # [--moe-router-topk-scaling-factor]
    aux_loss_coeff: float = 0.0  # [--moe-aux-loss-coeff] Switch/GShard load balancing
    z_loss_coeff: float = 0.0  # [--moe-z-loss-coeff]
    expert_bias: bool = False  # [--moe-router-enable-expert-bias] aux-loss-free balancing
    bias_update_rate: float = 1e-3  # [--moe-router-bias-update-rate]
    capacity_factor: Optional[float] = None  # [--moe-expert-capacity-factor] None: no dropping
    pad_expert_input_to_capacity: bool = False  # [--moe-pad-expert-input-to-capacity]
    token_drop_policy: str = "position"  # [--moe-token-drop-policy] only "position"
    activation: str = "swiglu"  # swiglu, geglu, silu, gelu, squared_relu, clamped_swiglu
    # each expert's rows padded to a multiple of this, raised to the recipe's need (128 for
    # blockwise, 32 for mxfp8, 16 for tensorwise and nvfp4); BF16 needs none, and padding costs
    # the layer E (a - 1) rows of every buffer
    row_alignment: int = 1
    # [--fp8-recipe / --fp4-recipe] the experts' GEMM operands: bf16, tensorwise (FP8 current
    # scaling per expert), blockwise (FP8 1x128 / 128x128), mxfp8, nvfp4 (the last two emulated
    # on Hopper)
    recipe: str = "bf16"
    seed: int = 0  # nvfp4: the key of the gradients' stochastic rounding
    # [--gradient-accumulation-fusion] the experts' weight gradients added by the layer to FP32
    # `main_grad` buffers on the weights (Megatron's DDP sets them; else the module makes them);
    # the weights' .grad stays None.
    gradient_accumulation_fusion: bool = False
    # [--moe-shared-expert-intermediate-size] a dense SwiGLU expert every token goes through
    # (DeepSeek-V3, Qwen2-MoE); 0: none. shared_expert_gate: its output scaled by
    # sigmoid(x w_g), as Qwen2-MoE does [--moe-shared-expert-gate].
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False
    # Each forward queues a copy of the experts' kept and dropped counts into pinned host memory
    # (two buffers, alternating), which expert_load() reads a step later without a sync.
    log_expert_load: bool = False
    # Expert parallelism (set by MoE from its ep_group; docs/torch.md): ep_size ranks, this one
    # ep_rank, each holding num_experts / ep_size experts and at most max_tokens_per_rank tokens a
    # forward; each rank receives at most ep_capacity_factor * max_tokens_per_rank * topk rows
    # (None: all it can be sent), and past it ep_overflow: "drop", "trap" (drop, and the status
    # word's fault) or "spill" (a second round of at most ep_spill_factor * max_tokens_per_rank *
    # topk rows; None: all that can overflow; needs gradient_accumulation_fusion and bf16).
    # ep_pair_factor: each rank sends another at most ep_pair_factor * max_tokens_per_rank * topk /
    # ep_size rows (the rest dropped as past the capacity): it bounds the fixed blocks the per-rank
    # transports move, about ep_size times smaller than the worst case at 1.0-1.5; None: no bound.
    ep_size: int = 1
    ep_rank: int = 0
    max_tokens_per_rank: int = 0
    ep_capacity_factor: Optional[float] = None
    ep_overflow: str = "drop"
    ep_spill_factor: Optional[float] = None
    ep_pair_factor: Optional[float] = None

    def __post_init__(self):
        if self.score_function not in _SCORES:
            raise ValueError(f"score_function: expected 'softmax' or 'sigmoid', got {self.score_function!r}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        if self.recipe not in _RECIPES:
            raise ValueError(f"recipe: expected one of {sorted(_RECIPES)}, got {self.recipe!r}")
        if self.pad_expert_input_to_capacity:
            raise ValueError("pad_expert_input_to_capacity is not supported: experts take their rows as routed")
        if self.token_drop_policy != "position":
            raise ValueError("token_drop_policy: only 'position' (an expert keeps its earliest tokens)")
        if self.capacity_factor is not None and not (math.isfinite(self.capacity_factor) and self.capacity_factor > 0):
            raise ValueError(f"capacity_factor must be positive and finite, got {self.capacity_factor}")
        if self.ep_overflow not in _EP_OVERFLOW:
            raise ValueError(f"ep_overflow: expected one of {sorted(_EP_OVERFLOW)}, got {self.ep_overflow!r}")
        if not (isinstance(self.ep_size, numbers.Integral) and self.ep_size >= 1):
            raise ValueError(f"ep_size must be a positive integer, got {self.ep_size!r}")
        if self.ep_size > 1 or self.max_tokens_per_rank:
            if self.num_experts % self.ep_size:
                raise ValueError(
                    f"num_experts ({self.num_experts}) must be a multiple of the ep_group's size ({self.ep_size})"
                )
            if self.max_tokens_per_rank < 1:
                raise ValueError(
                    "with an ep_group, max_tokens_per_rank (every rank's bound on a forward's tokens) is needed"
                )
            if self.capacity_factor is not None:
                raise ValueError(
                    "with an ep_group the capacity is the ranks' (ep_capacity_factor); capacity_factor must be None"
                )
        if not (isinstance(self.row_alignment, numbers.Integral) and self.row_alignment >= 1):
            raise ValueError(f"row_alignment must be a positive integer, got {self.row_alignment!r}")
        for name in ("aux_loss_coeff", "z_loss_coeff"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        for name in ("ep_capacity_factor", "ep_spill_factor", "ep_pair_factor"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be positive and finite, got {value}")

    @property
    def expert_parallel(self):
        return self.max_tokens_per_rank > 0

    @property
    def local_experts(self):
        return self.num_experts // self.ep_size

    def ep_fields(self, dtype):
        """The sfmoe_ep_config fields of this rank's NCCL group (`dtype`: an sfmoe dtype code)."""
        per_rank = self.max_tokens_per_rank * self.topk  # (what a rank receives on average)
        capacity = -1 if self.ep_capacity_factor is None else max(1, math.ceil(self.ep_capacity_factor * per_rank))
        spill = 0
        if self.ep_overflow == "spill":
            spill = -1 if self.ep_spill_factor is None else max(1, math.ceil(self.ep_spill_factor * per_rank))
        return dict(
            world_size=self.ep_size,
            rank=self.ep_rank,
            experts_per_rank=self.local_experts,
            max_tokens_per_rank=self.max_tokens_per_rank,
            top_k=self.topk,
            hidden=self.hidden_size,
            payload=dtype,
            row_alignment=max(self.row_alignment, _RECIPE_ALIGNMENT[self.recipe]),
            receive_capacity=capacity,
            overflow=_EP_OVERFLOW[self.ep_overflow],
            spill_capacity=spill,
            pair_capacity=-1
            if self.ep_pair_factor is None
            else max(1, math.ceil(self.ep_pair_factor * per_rank / self.ep_size)),
        )

    @property
    def fc1_cols(self):
        return 2 * self.ffn_hidden_size if self.activation in _GATED else self.ffn_hidden_size

    def capacity(self, tokens):
        """Tokens an expert keeps at most for a batch of `tokens` (0: no limit)."""
        if self.capacity_factor is None:
            return 0
        return max(1, math.ceil(tokens * self.topk / self.num_experts * self.capacity_factor))

    def router_fields(self):
        """The sfmoe_router_config fields. The losses are computed by the module, not the layer."""
        sigmoid = self.score_function == "sigmoid"
        return dict(
            top_k=self.topk,
            score=_SCORES[self.score_function],
            softmax_after_topk=not sigmoid and not self.pre_softmax,
            num_groups=self.num_groups,
            group_topk=self.group_topk,
            group_score_topk=2,
            scaling_factor=self.topk_scaling_factor,
            normalize=sigmoid and self.topk > 1,
            aux_loss_coeff=0.0,
            z_loss_coeff=0.0,
        )

    def layer_fields(self, tokens, dtype):
        """The sfmoe_moe_layer_config fields of the layer for `tokens` tokens of `dtype` (an sfmoe
        dtype code), expert parallelism left out."""
        return dict(
            hidden=self.hidden_size,
            ffn_hidden=self.ffn_hidden_size,
            num_experts=self.num_experts,
            max_tokens=tokens,
            router=self.router_fields(),
            activation=_ACTIVATIONS[self.activation],
            activation_limit=7.0,
            activation_alpha=1.702,
            expert_capacity=self.capacity(tokens),
            row_alignment=max(self.row_alignment, _RECIPE_ALIGNMENT[self.recipe]),
            dtype=dtype,
            recipe=_RECIPES[self.recipe],
            accumulate_weight_grads=self.gradient_accumulation_fusion,
            seed=self.seed,
        )
