"""``python -m solutions.train translate``: English → German number words, end to end.

Adam (β = 0.9, 0.98, ε = 1e-9) with the Noam schedule, label smoothing 0.1,
gradient clipping at 1.0, teacher forcing; then greedy decoding of the held-out
test numbers, scored by exact match and corpus BLEU (sacrebleu). With
``--data FILE`` it trains on your ``source<TAB>target`` file instead, with a
random held-out split.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import sacrebleu
import torch
from tqdm.auto import tqdm

from solutions.data.translation import TranslationData, Vocab, load_numbers, load_tsv, pad_batch, split_pairs
from solutions.decoding import greedy_decode
from solutions.losses import label_smoothed_cross_entropy
from solutions.schedule import noam_scheduler
from solutions.transformer import Transformer, TransformerConfig, teacher_forcing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "--data FILE: a UTF-8 text file with one 'source<TAB>target' pair per line, each side "
        "tokenised on whitespace; 10%% of the lines are held out for the test."
    )
    g = parser.add_argument_group("training")
    g.add_argument("--steps", type=int, default=1500, help="optimizer steps (default: 1500)")
    g.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop training after this many seconds even if --steps are not done (default: no limit)")
    g.add_argument("--batch-size", type=int, default=64, help="sentence pairs per step (default: 64)")
    g.add_argument("--warmup", type=int, default=200, help="Noam warm-up steps (default: 200)")
    g.add_argument("--lr-factor", type=float, default=2.0,
                   help="Noam factor: peak lr = factor · (d_model · warmup)^-0.5 (default: 2.0)")
    g.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing ε (default: 0.1)")
    g.add_argument("--clip-norm", type=float, default=1.0, help="gradient clipping max norm (default: 1.0)")
    g.add_argument("--train-size", type=int, default=20_000,
                   help="generated training pairs of the embedded data set (default: 20000)")
    g.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default: 1; the default model's matrices are too small for more "
                        "threads to pay off, and one thread stays fast on a busy machine)")
    m = parser.add_argument_group("model")
    m.add_argument("--d-model", type=int, default=64, help="model width (default: 64)")
    m.add_argument("--n-heads", type=int, default=4, help="attention heads (default: 4)")
    m.add_argument("--n-layers", type=int, default=2, help="encoder and decoder layers each (default: 2)")
    m.add_argument("--d-ff", type=int, default=128, help="feed-forward hidden width (default: 128)")
    m.add_argument("--dropout", type=float, default=0.1, help="dropout (default: 0.1)")
    m.add_argument("--norm-first", action="store_true", help="pre-norm layers instead of the paper's post-norm")


def _check_args(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "warmup", "train_size", "d_model", "n_heads", "n_layers", "d_ff"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise ValueError(f"--time-budget must be > 0 seconds; got {args.time_budget}")
    if not 0 <= args.label_smoothing < 1:
        raise ValueError(f"--label-smoothing must be in [0, 1); got {args.label_smoothing}")
    if args.clip_norm <= 0 or args.lr_factor <= 0:
        raise ValueError("--clip-norm and --lr-factor must be > 0")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1; got {args.threads}")


def encode_pairs(pairs, src_vocab: Vocab, tgt_vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids and target ids (no BOS/EOS), each right-padded to a tensor."""
    return (pad_batch([src_vocab.encode(s) for s, _ in pairs]), pad_batch([tgt_vocab.encode(t) for _, t in pairs]))


@torch.inference_mode()
def evaluate(model: Transformer, pairs, src_vocab: Vocab, tgt_vocab: Vocab, device: torch.device,
             batch_size: int = 500) -> dict:
    """Greedy-decode every source; exact match = fraction of outputs equal to the reference."""
    hypotheses, references = [], []
    max_len = min(model.config.max_len - 1, max(len(t) for _, t in pairs) + 10)
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        src = pad_batch([src_vocab.encode(s) for s, _ in chunk]).to(device)
        out = greedy_decode(model, src, max_len, tgt_vocab.bos_id, tgt_vocab.eos_id)
        hypotheses += [tgt_vocab.decode(ids) for ids in out]
        references += [t for _, t in chunk]
    exact = sum(h == r for h, r in zip(hypotheses, references)) / len(pairs)
    # BLEU over the tokens joined by spaces (for the number data, the German pieces).
    bleu = sacrebleu.corpus_bleu([" ".join(h) for h in hypotheses], [[" ".join(r) for r in references]]).score
    return {"exact_match": exact, "bleu": bleu}


def build_model(data: TranslationData, args: argparse.Namespace) -> Transformer:
    max_src, max_tgt = data.max_lengths()
    config = TransformerConfig(
        src_vocab=len(data.src_vocab), tgt_vocab=len(data.tgt_vocab), d_model=args.d_model,
        n_heads=args.n_heads, n_layers=args.n_layers, d_ff=args.d_ff, dropout=args.dropout,
        max_len=max(max_src, max_tgt) + 16, pad_id=Vocab.pad_id, norm_first=args.norm_first,
    )
    return Transformer(config)


def save_checkpoint(path: Path, model: Transformer, src_vocab: Vocab, tgt_vocab: Vocab, metrics: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "config": dataclasses.asdict(model.config),
        "state_dict": model.state_dict(),
        "src_vocab": src_vocab.to_dict(),
        "tgt_vocab": tgt_vocab.to_dict(),
        "metrics": metrics,
    }, path)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[Transformer, Vocab, Vocab]:
    """The trained model (in eval mode) and its source and target vocabularies."""
    state = torch.load(path, map_location=device, weights_only=True)
    model = Transformer(TransformerConfig(**state["config"])).to(device)
    model.load_state_dict(state["state_dict"])
    return model.eval(), Vocab.from_dict(state["src_vocab"]), Vocab.from_dict(state["tgt_vocab"])


def run(args: argparse.Namespace) -> dict:
    _check_args(args)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device) if not isinstance(args.device, torch.device) else args.device
    if args.data is not None:
        data = split_pairs(load_tsv(args.data), seed=args.seed)
    else:
        data = load_numbers(n_train=args.train_size, seed=args.seed)
    src_vocab, tgt_vocab = data.src_vocab, data.tgt_vocab
    model = build_model(data, args).to(device)
    src_all, tgt_all = encode_pairs(data.train, src_vocab, tgt_vocab)
    tgt_in_all, labels_all = teacher_forcing(tgt_all, tgt_vocab.bos_id, tgt_vocab.eos_id, tgt_vocab.pad_id)
    src_all, tgt_in_all, labels_all = src_all.to(device), tgt_in_all.to(device), labels_all.to(device)

    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = noam_scheduler(optimizer, args.d_model, args.warmup, args.lr_factor)
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    start = time.perf_counter()
    progress = tqdm(range(args.steps), desc="translate", disable=args.quiet)
    for step in progress:
        index = torch.randint(len(data.train), (args.batch_size,), generator=generator).to(device)
        src, tgt_in, labels = src_all[index], tgt_in_all[index], labels_all[index]
        # Trim the columns that are padding in the whole batch: less work, same loss.
        src = src[:, : int((src != Vocab.pad_id).sum(1).max())]
        width = int((labels != Vocab.pad_id).sum(1).max())
        tgt_in, labels = tgt_in[:, :width], labels[:, :width]
        logits = model(src, tgt_in)
        loss = label_smoothed_cross_entropy(logits, labels, args.label_smoothing, ignore_index=Vocab.pad_id)
        if not math.isfinite(loss.item()):
            raise ValueError(f"the loss became {loss.item()} at step {step}; lower --lr-factor or raise --warmup")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        optimizer.step()
        scheduler.step()
        if step % 50 == 0:
            progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if args.time_budget is not None and time.perf_counter() - start > args.time_budget:
            break
    progress.close()
    train_seconds = time.perf_counter() - start

    model.eval()
    metrics = evaluate(model, data.test, src_vocab, tgt_vocab, device)
    print(f"trained {step + 1} steps in {train_seconds:.0f} s; held-out test ({len(data.test)} pairs): "
          f"exact match {metrics['exact_match']:.1%}, BLEU {metrics['bleu']:.1f}")
    if args.out is not None:
        save_checkpoint(Path(args.out) / "model.pt", model, src_vocab, tgt_vocab, metrics)
    return metrics
