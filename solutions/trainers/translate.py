"""``python -m solutions.train translate``: English → German number words (or your pairs), end to end.

Adam (β = 0.9, 0.98, ε = 1e-9) with the Noam schedule, label smoothing 0.1,
gradient clipping at 1.0, teacher forcing; then greedy decoding of the held-out
test pairs, scored by exact match, corpus BLEU and chrF (sacrebleu, signatures
printed). With ``--data FILE`` it trains on your ``source<TAB>target`` file
instead: duplicate lines are dropped, 10% of the distinct sources (with all
their targets), drawn at random, are held out for the test and never trained
on, and the tokenizer (BPE by default, one vocabulary shared by source and
target as in the paper) is learnt from the training pairs only. There is no
validation split: nothing is tuned on held-out data, and the printed metrics
are the test split's.

Same names as the other trainers: ``KIND``, ``add_arguments``, ``build_model``,
``evaluate``, ``run``. Use a saved run with :mod:`solutions.translate`.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU, CHRF
from tqdm.auto import tqdm

from solutions import distributed
from solutions.checkpoint import save_checkpoint
from solutions.data.tokenizer import (DEFAULT_BPE_VOCAB, TOKENIZER_KINDS, Tokenizer, tokenizer_from_dict,
                                     train_tokenizer)
from solutions.data.translation import TextPair, TextSplits, number_text_splits, pad_batch, read_tsv, split_text_pairs
from solutions.losses import label_smoothed_cross_entropy
from solutions.schedule import noam_scheduler
from solutions.transformer import Transformer, TransformerConfig, teacher_forcing
from solutions.translate import Translator

KIND = "translate"
PREDICTIONS_FILE = "test_predictions.tsv"  # source, reference, prediction of every held-out pair, in --out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "--data FILE: a UTF-8 text file (or .gz) with one 'source<TAB>target' pair per line. Duplicate lines are "
        "dropped; 10% of the distinct sources, with all their targets, drawn at random (--seed), are held out for "
        "the test and never trained on, and the metrics printed are the test's; the tokenizer is learnt from "
        "the training pairs only. With --out DIR the run saves DIR/model.pt (model, config, tokenizers, metrics) "
        f"and DIR/{PREDICTIONS_FILE}; translate more text with `python -m solutions.translate DIR`."
    )
    t = parser.add_argument_group("tokens")
    t.add_argument("--tokenizer", choices=TOKENIZER_KINDS, default=None,
                   help="bpe = sub-words learnt from your training lines, one vocabulary shared by source and "
                        "target (sentencepiece); char = characters; word = split on whitespace (useless when a "
                        "side has no spaces). Default: bpe with --data, word for the embedded numbers "
                        "(already split into words)")
    t.add_argument("--vocab-size", type=int, default=DEFAULT_BPE_VOCAB,
                   help=f"most BPE pieces, specials included (default: {DEFAULT_BPE_VOCAB}; small data gets fewer)")
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


def load_splits(args: argparse.Namespace) -> TextSplits:
    """Your ``--data`` pairs, deduplicated and split at random by source, or the embedded numbers (held-out numbers
    never in training)."""
    if args.data is not None:
        return split_text_pairs(read_tsv(args.data), seed=args.seed, source=str(args.data))
    return number_text_splits(n_train=args.train_size, seed=args.seed)


def make_tokenizers(kind: str, train: list[TextPair], vocab_size: int) -> tuple[Tokenizer, Tokenizer]:
    """Source and target tokenizers learnt from the training pairs only; BPE is one shared vocabulary."""
    if kind == "bpe":
        shared = train_tokenizer("bpe", [s for s, _ in train] + [t for _, t in train], vocab_size)
        return shared, shared
    return train_tokenizer(kind, [s for s, _ in train]), train_tokenizer(kind, [t for _, t in train])


def encode_pairs(pairs: list[TextPair], src_tok: Tokenizer, tgt_tok: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids and target ids (no BOS/EOS), each right-padded to a tensor."""
    return (pad_batch([src_tok.encode(s) for s, _ in pairs], src_tok.pad_id),
            pad_batch([tgt_tok.encode(t) for _, t in pairs], tgt_tok.pad_id))


def model_config(args: argparse.Namespace, src_tok: Tokenizer, tgt_tok: Tokenizer, train: list[TextPair]) -> dict:
    """The Transformer's config: sizes from the options, vocabularies and room for twice the longest training pair."""
    longest = max(max(len(src_tok.encode(s)), len(tgt_tok.encode(t))) for s, t in train)
    return {"src_vocab": len(src_tok), "tgt_vocab": len(tgt_tok), "d_model": args.d_model, "n_heads": args.n_heads,
            "n_layers": args.n_layers, "d_ff": args.d_ff, "dropout": args.dropout, "max_len": 2 * longest + 16,
            "pad_id": src_tok.pad_id, "norm_first": args.norm_first}


def build_model(config: dict) -> Transformer:
    """The encoder-decoder of a config dict (as :func:`model_config` makes and the checkpoint stores)."""
    return Transformer(TransformerConfig(**config))


def score(hypotheses: list[str], references: list[str]) -> dict:
    """Exact match, corpus BLEU and chrF (sacrebleu defaults) with their signatures."""
    bleu, chrf = BLEU(), CHRF()
    return {
        "exact_match": sum(h == r for h, r in zip(hypotheses, references)) / len(references),
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "test_pairs": len(references),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def evaluate(translator: Translator, pairs: list[TextPair], beam: int = 1) -> tuple[dict, list[str]]:
    """Decode every source (greedy by default) and score against the references: (metrics, predictions)."""
    predictions = translator.translate([s for s, _ in pairs], beam=beam)
    return score(predictions, [t for _, t in pairs]), predictions


def train_steps(model: Transformer, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], args: argparse.Namespace,
                pad_id: int) -> tuple[list[float], float]:
    """The training loop; returns (the loss of every step, seconds).

    Every process draws the same global batch and trains on its micro-batches of it (all of it in a world of one).
    The loss is a mean over target tokens, so each micro-batch's loss is weighted by its share of the global
    batch's tokens: the weighted losses of all processes add up to the loss of the global batch.
    """
    world = args.world
    src_all, tgt_in_all, labels_all = data
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = noam_scheduler(optimizer, args.d_model, args.warmup, args.lr_factor)
    generator = torch.Generator().manual_seed(args.seed)
    pieces = world.micro_batches(args.batch_size, args.accumulation_steps)
    trained = world.wrap(model)
    trained.train()
    start, losses = time.perf_counter(), []
    progress = tqdm(range(args.steps), desc="translate", disable=args.quiet)
    for step in progress:
        index = torch.randint(len(src_all), (args.batch_size,), generator=generator).to(src_all.device)
        tokens = int((labels_all[index] != pad_id).sum())
        optimizer.zero_grad(set_to_none=True)
        mine = 0.0
        for i, rows in enumerate(pieces):
            src, tgt_in, labels = src_all[index[rows]], tgt_in_all[index[rows]], labels_all[index[rows]]
            # Trim the columns that are padding in the whole micro-batch: less work, same loss.
            src = src[:, : int((src != pad_id).sum(1).max())]
            width = int((labels != pad_id).sum(1).max())
            tgt_in, labels = tgt_in[:, :width], labels[:, :width]
            share = int((labels != pad_id).sum()) / tokens
            with world.gradient_sync(trained, sync=i == len(pieces) - 1):
                loss = label_smoothed_cross_entropy(trained(src, tgt_in), labels, args.label_smoothing,
                                                    ignore_index=pad_id)
                # DistributedDataParallel averages the processes' gradients: undo its division by their number.
                (loss * (share * world.size)).backward()
            mine += loss.item() * share
        batch_loss, elapsed = world.sum(mine, time.perf_counter() - start)
        if not math.isfinite(batch_loss):
            raise ValueError(f"the loss became {batch_loss} at step {step}; lower --lr-factor or raise --warmup")
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        optimizer.step()
        scheduler.step()
        losses.append(batch_loss)
        if step % 50 == 0:
            progress.set_postfix(loss=f"{batch_loss:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        # Every process stops at the same step: the time is the processes' mean, known to all of them.
        if args.time_budget is not None and elapsed / world.size > args.time_budget:
            break
    progress.close()
    return losses, time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    _check_args(args)
    torch.set_num_threads(args.threads)
    world, device = args.world, args.world.device
    splits = load_splits(args)
    kind = args.tokenizer or ("bpe" if args.data is not None else "word")
    if world.is_main:
        src_tok, tgt_tok = make_tokenizers(kind, splits.train, args.vocab_size)
    # Every process needs rank 0's vocabularies (and the model's sizes that follow from them).
    saved = world.broadcast([src_tok.to_dict(), tgt_tok.to_dict()] if world.is_main else None)
    if not world.is_main:
        src_tok, tgt_tok = (tokenizer_from_dict(state) for state in saved)
    vocab = (f"{len(src_tok)} pieces shared by source and target" if src_tok is tgt_tok
             else f"{len(src_tok)} source / {len(tgt_tok)} target tokens")
    if not args.quiet:
        print(f"data: {splits.description}\ntokenizer: {kind}, {vocab} (learnt from the training pairs only)")
    config = model_config(args, src_tok, tgt_tok, splits.train)
    model = build_model(config).to(device)
    distributed.reseed(world, args.seed)
    src_all, tgt_all = encode_pairs(splits.train, src_tok, tgt_tok)
    world.check_same("training pairs", src_all, tgt_all)
    tgt_in_all, labels_all = teacher_forcing(tgt_all, tgt_tok.bos_id, tgt_tok.eos_id, tgt_tok.pad_id)
    losses, train_seconds = train_steps(model, (src_all.to(device), tgt_in_all.to(device), labels_all.to(device)),
                                        args, tgt_tok.pad_id)
    if not world.is_main:
        return {}  # rank 0 evaluates and writes

    translator = Translator(model, src_tok, tgt_tok)
    metrics, predictions = evaluate(translator, splits.test)
    metrics.update(steps=len(losses), train_seconds=round(train_seconds, 1), world_size=world.size,
                   accumulation_steps=args.accumulation_steps)
    print(f"trained {len(losses)} steps in {train_seconds:.0f} s"
          + (f" on {world.size} processes" if world.size > 1 else "")
          + f"; held-out test ({len(splits.test)} pairs, never trained on): exact match "
            f"{metrics['exact_match']:.1%}, BLEU {metrics['bleu']:.1f}, chrF {metrics['chrf']:.1f}")
    if not args.quiet:
        print(f"BLEU signature: {metrics['bleu_signature']}\nchrF signature: {metrics['chrf_signature']}")
    if args.loss_log is not None:
        args.loss_log.parent.mkdir(parents=True, exist_ok=True)
        args.loss_log.write_text("".join(f"{loss!r}\n" for loss in losses))
    if args.out is not None:
        data = {"source": str(args.data) if args.data is not None else "embedded numbers", "tokenizer": kind,
                "description": splits.description, "seed": args.seed, "train_pairs": len(splits.train),
                "test_pairs": len(splits.test), "duplicates_dropped": splits.duplicates}
        path = save_checkpoint(args.out, kind=KIND, config=config, model=model, metrics=metrics, data=data,
                               vocab={"source": src_tok.to_dict(), "target": tgt_tok.to_dict()})
        Path(args.out, PREDICTIONS_FILE).write_text(
            "".join(f"{s}\t{t}\t{p}\n" for (s, t), p in zip(splits.test, predictions)), encoding="utf-8")
        if not args.quiet:
            print(f"checkpoint: {path}; held-out predictions: {Path(args.out, PREDICTIONS_FILE)}; "
                  f"use it with `python -m solutions.translate {args.out}`")
    return metrics
