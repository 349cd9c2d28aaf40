"""Runs the router, permute, unpermute and SwiGLU once each at the benchmark's shapes (T = 8192,
E = 256, k = 8, H = 7168, F = 2048), after a warm-up, for a profiler to look at, e.g.

  ncu --kernel-name regex:'router|permute|activation' --launch-skip 6 python3 profile_moe_ops.py

With SFMOE_PROFILE_ROUTER=sigmoid only the router runs, in the sigmoid top-8 normalized
configuration of the benchmark (DeepSeek-V3's otherwise).
"""

import os

import sfmoe
import torch

T, E, K, H, FFN = 8192, 256, 8, 7168, 2048


def main():
    dev = torch.device("cuda")
    logits = torch.randn(T, E, device=dev)
    bias = 0.01 * torch.randn(E, device=dev)
    tokens = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
    if os.environ.get("SFMOE_PROFILE_ROUTER") == "sigmoid":
        for _ in range(2):
            sfmoe.router(logits, K, score="sigmoid", normalize=True)
        torch.cuda.synchronize()
        return
    for round_ in range(2):  # the first round warms up
        routed = sfmoe.router(
            logits, K, score="sigmoid", normalize=True, num_groups=8, group_topk=4, scaling_factor=2.5, expert_bias=bias
        )
        p = sfmoe.permute(tokens, routed.topk_ids, E, alignment=16)
        sfmoe.unpermute(p.rows, p, routed.probs)
        h = torch.empty(p.rows.shape[0], 2 * FFN, device=dev, dtype=torch.bfloat16).normal_()
        sfmoe.grouped_activation(h, p.group_offsets, p.tokens_per_expert, "swiglu")
        torch.cuda.synchronize()
        del p, h


if __name__ == "__main__":
    main()
