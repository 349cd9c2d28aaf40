"""Trains a small MoE language model whose FFNs are sfmoe.torch.MoE, once per recipe, and writes
the loss curves (PNG), a results table and JSON (docs/demo.md).

The task is synthetic but learnable: each sequence follows one of eight affine rules
x[i + 1] = (a x[i] + b) mod V, except that with probability 0.1 the next token is drawn uniformly
instead. The next token is a function of the current one and of the rule, which the model must
infer from the context; the noise sets a floor under the loss (NOISE_FLOOR nats, the entropy of
the next token given the rule), so that the recipes' final losses compare at a level the noise
of training does not swamp. Chance is log V.

On a GPU the layer runs its CUDA kernels (MXFP8 and NVFP4 emulated on Hopper); without one, the
CPU backend (a smaller model, the same code). Usage:
python tools/train_demo.py [--steps N] [--out DIR] [--device cpu|cuda] [--recipes bf16,nvfp4,...]
"""

import argparse
import json
import math
import os
import time

import torch
from sfmoe.torch import MoE
from tqdm import tqdm

VOCAB = 64
RULES = [(a, b) for a in (3, 5, 7, 11) for b in (1, 17)]  # a odd: each rule a bijection mod 64
NOISE = 0.1
# The next token's entropy given the rule: the rule's token with 1 - NOISE + NOISE / V, each other
# token with NOISE / V.
_RIGHT, _OTHER = 1 - NOISE + NOISE / VOCAB, NOISE / VOCAB
NOISE_FLOOR = -(_RIGHT * math.log(_RIGHT) + (VOCAB - 1) * _OTHER * math.log(_OTHER))
# The recipes (sfmoe.torch.MoEConfig.recipe), each trained with the layer's BF16 rows.
RECIPES = ["bf16", "tensorwise", "blockwise", "mxfp8", "nvfp4"]


def batch(generator, size, length, device):
    """`size` sequences of `length` tokens, each under a random rule from RULES."""
    rule = torch.randint(len(RULES), (size,), generator=generator)
    a = torch.tensor([RULES[r][0] for r in rule])
    b = torch.tensor([RULES[r][1] for r in rule])
    tokens = torch.empty(size, length, dtype=torch.int64)
    tokens[:, 0] = torch.randint(VOCAB, (size,), generator=generator)
    noise = torch.rand(size, length, generator=generator) < NOISE
    random = torch.randint(VOCAB, (size, length), generator=generator)
    for i in range(1, length):
        tokens[:, i] = torch.where(noise[:, i], random[:, i], (a * tokens[:, i - 1] + b) % VOCAB)
    return tokens.to(device)


class Block(torch.nn.Module):
    def __init__(self, width, heads, moe):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.norm2 = torch.nn.RMSNorm(width)
        self.moe = moe

    def forward(self, x):
        B, L, W = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, W // self.heads).transpose(1, 3).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, W))
        h = self.norm2(x)
        return x + self.moe(h.to(self.moe.experts.weight1.dtype)).to(x.dtype)


class Model(torch.nn.Module):
    def __init__(self, width, depth, heads, ffn, experts, topk, recipe, device):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, width)
        dtype = torch.float32 if recipe == "fp32" else torch.bfloat16
        recipe = "bf16" if recipe == "fp32" else recipe
        self.blocks = torch.nn.ModuleList(
            Block(width, heads, MoE(width, ffn, experts, topk, dtype=dtype, aux_loss_coeff=1e-2, recipe=recipe))
            for _ in range(depth)
        )
        self.norm = torch.nn.RMSNorm(width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)
        self.to(device)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(recipe, args, device):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    big = device.type == "cuda"
    # (widths of whole 128-column blocks, for the blockwise recipe)
    width, depth, ffn, experts, topk = (256, 4, 512, 16, 2) if big else (128, 2, 128, 8, 2)
    model = Model(width, depth, 4, ffn, experts, topk, recipe, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    size, length = (64, 64) if big else (16, 32)
    losses = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc=f"{recipe:10s}", unit="step", dynamic_ncols=True, mininterval=2.0)
    for step in bar:
        tokens = batch(generator, size, length, device)
        logits = model(tokens[:, :-1])
        # The first two tokens of a sequence cannot be predicted (the rule is unknown before them).
        loss = torch.nn.functional.cross_entropy(logits[:, 1:].reshape(-1, VOCAB).float(), tokens[:, 2:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            value = loss.detach().item()  # (a host read every 10 steps, for the progress bar)
            losses.append((step, value))
            rate = (step + 1) * size * (length - 1) / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{rate:,.0f}")
    seconds = time.perf_counter() - start
    counts = [int(c) for c in model.blocks[0].moe.tokens_per_expert.cpu()]
    return dict(
        recipe=recipe,
        device=str(device),
        final_loss=held_out_loss(model, device, length),
        last_train_loss=losses[-1][1],
        tokens_per_s=args.steps * size * (length - 1) / seconds,
        peak_memory_mib=torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        seconds=seconds,
        losses=losses,
        first_block_tokens_per_expert=counts,
        model=dict(width=width, depth=depth, ffn=ffn, experts=experts, topk=topk, batch=size, length=length),
    )


def held_out_loss(model, device, length, sequences=256):
    """The trained model's loss on one fixed held-out set of sequences as long as the training
    ones (the same for every recipe, drawn apart from the training batches), in batches of 32: the
    figure the recipes are compared by."""
    generator = torch.Generator().manual_seed(12345)
    total, count = 0.0, 0
    with torch.no_grad():
        for _ in range(sequences // 32):
            tokens = batch(generator, 32, length, device)
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits[:, 1:].reshape(-1, VOCAB).float(), tokens[:, 2:].reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += tokens[:, 2:].numel()
    return total / count


def write_outputs(results, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [
        f"| recipe | device | held-out loss (floor {NOISE_FLOOR:.4f}) | vs bf16 | tokens/s | peak memory | time |",
        "|---|---|---|---|---|---|---|",
    ]
    base = next((r["final_loss"] for r in results if r["recipe"] == "bf16"), None)
    for r in results:
        peak = f"{r['peak_memory_mib']:.0f} MiB" if r["peak_memory_mib"] else "-"
        versus = f"{r['final_loss'] / base - 1:+.1%}" if base else "-"
        lines.append(
            f"| {r['recipe']} | {r['device']} | {r['final_loss']:.4f} | {versus} | {r['tokens_per_s']:,.0f} | {peak} "
            f"| {r['seconds']:.0f} s |"
        )
    table = "\n".join(lines)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for r in results:
        steps, values = zip(*r["losses"])
        axes.plot(steps, values, label=f"{r['recipe']} ({r['device']})")
    axes.axhline(math.log(VOCAB), color="grey", linestyle=":", label="chance (log 64)")
    axes.axhline(NOISE_FLOOR, color="black", linestyle="--", label=f"floor ({NOISE_FLOOR:.3f}, the noise)")
    axes.set_xlabel("step")
    axes.set_ylabel("cross-entropy")
    axes.set_yscale("log")
    axes.set_title("sfmoe MoE LM on affine sequences")
    axes.legend()
    figure.tight_layout()
    figure.savefig(os.path.join(out, "loss.png"), dpi=100)
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per recipe (300 on a GPU, 200 on the CPU)"
    )
    parser.add_argument("--out", default="demo-out")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--recipes", default=",".join(RECIPES), help="comma-separated: " + ", ".join(RECIPES + ["fp32"])
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.steps is None:
        args.steps = 300 if device.type == "cuda" else 200
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    recipes = args.recipes.split(",")
    for r in recipes:
        if r not in RECIPES + ["fp32"]:
            parser.error(f"unknown recipe {r!r}")
    emulated = " (mxfp8 and nvfp4 emulated on Hopper)" if device.type == "cuda" else ""
    print(
        f"sfmoe demo: a {'4' if device.type == 'cuda' else '2'}-block MoE LM on {device}, recipes "
        f"{', '.join(recipes)}{emulated}; the loss floor is {NOISE_FLOOR:.3f} nats"
    )
    results = [train(recipe, args, device) for recipe in recipes]
    table = write_outputs(results, args.out)
    print(table)
    print(f"loss curves: {os.path.join(args.out, 'loss.png')}")


if __name__ == "__main__":
    main()
