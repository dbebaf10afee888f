"""Train the chapter 6 character-level GPT on the embedded text (or ``--data FILE``).

    python -m solutions.train gpt                       # ~2-3 min on 2 CPU cores
    python -m solutions.train gpt --data my_text.txt --steps 3000 --out runs/gpt
    python -m solutions.generate runs/gpt --prompt "The "       # sample from the saved run

AdamW with linear warmup then cosine decay, no weight decay on biases, norms
and embeddings, gradient clipping at 1.0. The held-out metric is the mean
cross-entropy per character on the last 10% of the text (nats), printed next
to the unigram baseline (the entropy of the character distribution: what a
model that ignores context achieves). Samples are drawn with the KV cache.
With ``--tokenizer bpe`` the tokens are BPE sub-words learnt from the training
part of the text only, and the losses are per token.

Same names as the other trainers: ``KIND``, ``add_arguments``, ``build_model``,
``evaluate``, ``run``.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from solutions import distributed
from solutions.checkpoint import save_checkpoint
from solutions.data.text import get_batch, load_text_dataset
from solutions.data.tokenizer import DEFAULT_BPE_VOCAB
from solutions.gpt import GPT, GPTConfig, generate

KIND = "gpt"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "--data FILE: any UTF-8 text file (optionally .gz); the last 10% is held out and never trained on. "
        "Tokens are characters, or BPE sub-words with --tokenizer bpe. --out DIR saves DIR/model.pt; sample "
        "from it with `python -m solutions.generate DIR --prompt TEXT`."
    )
    t = parser.add_argument_group("tokens")
    t.add_argument("--tokenizer", choices=("char", "bpe"), default="char",
                   help="char = one token per character (default); bpe = sub-words learnt from the training "
                        "part of the text (sentencepiece); the losses are then per token, not per character")
    t.add_argument("--vocab-size", type=int, default=DEFAULT_BPE_VOCAB,
                   help=f"most BPE pieces with --tokenizer bpe (default: {DEFAULT_BPE_VOCAB})")
    g = parser.add_argument_group("training (stops at --steps or --time-budget, whichever comes first)")
    g.add_argument("--steps", type=int, default=1000, help="optimizer steps (default: 1000)")
    g.add_argument("--time-budget", type=float, default=160.0,
                   help="stop training after this many seconds; the learning-rate schedule follows whichever of "
                        "steps or time runs out first (default: 160)")
    g.add_argument("--batch-size", type=int, default=48, help="sequences per step (default: 48)")
    g.add_argument("--block-size", type=int, default=96, help="context length in characters while training; "
                   "also the model's max_len (default: 96)")
    g.add_argument("--lr", type=float, default=4e-3, help="peak learning rate (default: 4e-3)")
    g.add_argument("--warmup", type=int, default=50, help="linear warmup steps (default: 50)")
    g.add_argument("--weight-decay", type=float, default=0.1,
                   help="AdamW weight decay on weight matrices only (default: 0.1)")
    m = parser.add_argument_group("model")
    m.add_argument("--d-model", type=int, default=96, help="width of the residual stream (default: 96)")
    m.add_argument("--n-heads", type=int, default=4, help="query heads (default: 4)")
    m.add_argument("--n-kv-heads", type=int, default=None,
                   help="key/value heads: fewer than --n-heads = GQA, 1 = MQA (default: = --n-heads)")
    m.add_argument("--n-layers", type=int, default=3, help="decoder blocks (default: 3)")
    m.add_argument("--dropout", type=float, default=0.0, help="dropout (default: 0.0; the model underfits)")
    s = parser.add_argument_group("evaluation and samples")
    s.add_argument("--val-fraction", type=float, default=0.1, help="held-out tail of the text (default: 0.1)")
    s.add_argument("--eval-chars", type=int, default=40_000,
                   help="tokens (characters with --tokenizer char) of the held-out text scored for val_loss "
                        "(default: 40000; 0 = all)")
    s.add_argument("--sample-tokens", type=int, default=90,
                   help="characters per printed sample, at most --block-size minus the 1-character prompt (default: 90)")
    s.add_argument("--samples", type=int, default=2, help="number of printed samples (default: 2; 0 = none)")
    s.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: 0.8)")
    s.add_argument("--top-k", type=int, default=None, help="sample from the k most likely characters only")


def parameter_groups(model: GPT, weight_decay: float) -> list[dict]:
    """Weight decay on the matrices of Linear layers only: not on biases, LayerNorm or embeddings."""
    decay, no_decay = [], []
    embeddings = {id(p) for mod in model.modules() if isinstance(mod, torch.nn.Embedding) for p in mod.parameters()}
    for name, param in model.named_parameters():
        (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lr_factor(progress: float, step: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to 0.1 over the progress ∈ [0, 1]."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


@torch.inference_mode()
def evaluate(model: GPT, data: torch.Tensor, block_size: int, max_chars: int, batch_size: int = 64) -> float:
    """Mean next-character cross-entropy (nats) over consecutive non-overlapping windows of ``data``."""
    model.eval()
    if max_chars:
        data = data[: max_chars + 1]
    n_windows = (len(data) - 1) // block_size
    x = data[: n_windows * block_size].view(n_windows, block_size)
    y = data[1 : n_windows * block_size + 1].view(n_windows, block_size)
    device = next(model.parameters()).device
    total = 0.0
    for i in range(0, n_windows, batch_size):
        logits = model(x[i : i + batch_size].to(device))
        total += F.cross_entropy(logits.flatten(0, 1), y[i : i + batch_size].flatten().to(device), reduction="sum").item()
    model.train()
    return total / (n_windows * block_size)


def _check_args(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "block_size", "d_model", "n_heads", "n_layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    for name in ("sample_tokens", "samples", "warmup", "eval_chars"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0; got {getattr(args, name)}")
    if args.time_budget <= 0:
        raise ValueError(f"--time-budget must be > 0 seconds; got {args.time_budget}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0; got {args.lr}")


def model_config(args: argparse.Namespace, vocab: int) -> dict:
    """The GPT's config dict (what the checkpoint stores). Its context is the training block."""
    return asdict(GPTConfig(vocab=vocab, max_len=args.block_size, d_model=args.d_model, n_heads=args.n_heads,
                            n_layers=args.n_layers, n_kv_heads=args.n_kv_heads, dropout=args.dropout))


def build_model(config: dict) -> GPT:
    """The decoder-only model of a config dict from :func:`model_config`."""
    return GPT(GPTConfig(**config))


def fit(model: GPT, train: torch.Tensor, args: argparse.Namespace, device: torch.device) -> tuple[list[float], float]:
    """AdamW with warmup + cosine (over steps or the time budget, whichever ends first), clipping; (the loss of
    every step, seconds). Every process draws the same windows and trains on its micro-batches of them."""
    world = args.world
    optimizer = torch.optim.AdamW(parameter_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(args.seed)
    pieces = world.micro_batches(args.batch_size, args.accumulation_steps)
    trained = world.wrap(model)
    start = time.perf_counter()
    bar = tqdm(total=args.steps, disable=args.quiet, desc="gpt", unit="step")
    losses: list[float] = []
    elapsed, smoothed = 0.0, None  # elapsed: the processes' mean, the same number on every process
    while len(losses) < args.steps and elapsed <= args.time_budget:
        step = len(losses)
        progress = max(step / args.steps, elapsed / args.time_budget)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_factor(progress, step, args.warmup)
        x, y = get_batch(train, args.batch_size, args.block_size, generator)
        optimizer.zero_grad(set_to_none=True)
        mine = 0.0
        for i, rows in enumerate(pieces):
            with world.gradient_sync(trained, sync=i == len(pieces) - 1):
                loss = F.cross_entropy(trained(x[rows].to(device)).flatten(0, 1), y[rows].flatten().to(device))
                (loss / len(pieces)).backward()  # equal micro-batches: each is 1/len(pieces) of this process's
            mine += loss.item() / (len(pieces) * world.size)
        batch_loss, elapsed = world.sum(mine, time.perf_counter() - start)
        elapsed /= world.size
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(batch_loss)
        smoothed = batch_loss if smoothed is None else 0.95 * smoothed + 0.05 * batch_loss
        bar.update(1)
        bar.set_postfix(loss=f"{smoothed:.3f}")
    bar.close()
    return losses, time.perf_counter() - start


def print_samples(model: GPT, data, args: argparse.Namespace, device: torch.device) -> None:
    """``--samples`` continuations of the held-out text's first token, with the KV cache."""
    for i in range(args.samples):
        # The token itself, not its text: a BPE piece such as "▁" decodes to text that encodes to no token at all.
        prompt = data.val[None, :1].to(device)
        n_new = min(args.sample_tokens, model.config.max_len - prompt.shape[1])
        out = generate(model, prompt, n_new, temperature=args.temperature, top_k=args.top_k,
                       generator=torch.Generator(device=device).manual_seed(args.seed + i))
        print(f"--- sample {i + 1} ---\n{data.vocab.decode(out[0])}")


def run(args: argparse.Namespace) -> dict:
    _check_args(args)
    world, device = args.world, args.world.device
    data = load_text_dataset(args.data, args.val_fraction, args.block_size + 1, args.tokenizer, args.vocab_size)
    world.check_same("training text", data.train)
    model = build_model(model_config(args, len(data.vocab))).to(device)
    distributed.reseed(world, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    unit = "characters" if args.tokenizer == "char" else "BPE tokens"
    if not args.quiet:
        print(f"{len(data.train):,} training / {len(data.val):,} held-out {unit} (the held-out tail is never "
              f"trained on), vocab {len(data.vocab)}, {n_params:,} parameters")
    losses, train_seconds = fit(model, data.train, args, device)
    if not world.is_main:
        return {}  # rank 0 evaluates, samples and writes

    val_loss = evaluate(model, data.val, args.block_size, args.eval_chars)
    per = "char" if args.tokenizer == "char" else "token"
    print(f"val_loss {val_loss:.3f} nats/{per} (unigram baseline {data.unigram_loss:.3f}) "
          f"after {len(losses)} steps in {train_seconds:.0f} s"
          + (f" on {world.size} processes" if world.size > 1 else ""))
    print_samples(model, data, args, device)
    metrics = {"val_loss": val_loss, "unigram_loss": data.unigram_loss, "steps": len(losses),
               "train_seconds": round(train_seconds, 1), "tokenizer": args.tokenizer, "world_size": world.size,
               "accumulation_steps": args.accumulation_steps}
    if args.loss_log is not None:
        args.loss_log.parent.mkdir(parents=True, exist_ok=True)
        args.loss_log.write_text("".join(f"{loss!r}\n" for loss in losses))
    if args.out is not None:
        source = "the embedded text" if args.data is None else str(args.data)
        path = save_checkpoint(args.out, kind=KIND, config=asdict(model.config), model=model, metrics=metrics,
                               vocab={"tokenizer": data.vocab.to_dict()},
                               data={"source": source, "train_tokens": len(data.train), "val_tokens": len(data.val),
                                     "val_fraction": args.val_fraction})
        if not args.quiet:
            print(f"checkpoint: {path}; sample from it with `python -m solutions.generate {args.out} --prompt ...`")
    return metrics
