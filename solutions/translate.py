"""Translate with a trained checkpoint: ``python -m solutions.translate CHECKPOINT``.

    python -m solutions.train translate --data pairs.tsv --out runs/mine
    echo "March 3, 2021" | python -m solutions.translate runs/mine
    python -m solutions.translate runs/mine --input sources.txt --beam 4 > translations.txt

One line in, one line out (an empty line gives an empty line). In Python:

    >>> translator = load_translator("runs/mine")
    >>> translator(["March 3, 2021", "4.7.1990"])
    ['2021-03-03', '1990-07-04']

The checkpoint (the ``--out`` directory of ``python -m solutions.train
translate``) holds everything needed: the model's config and weights and the
source and target tokenizers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

import torch

from solutions.checkpoint import load_checkpoint
from solutions.data.tokenizer import Tokenizer, tokenizer_from_dict
from solutions.data.translation import pad_batch
from solutions.decoding import beam_search, greedy_decode
from solutions.transformer import Transformer, TransformerConfig


class Translator:
    """A trained encoder-decoder with its tokenizers: source texts in, target texts out."""

    def __init__(
        self, model: Transformer, source_tokenizer: Tokenizer, target_tokenizer: Tokenizer, batch_size: int = 250
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1; got {batch_size}")
        self.model, self.batch_size = model.eval(), batch_size
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer

    @property
    def max_tokens(self) -> int:
        """Longest source, and longest output, in tokens (the model's positions, less one for BOS)."""
        return self.model.config.max_len - 1

    def translate(self, sources: Sequence[str], beam: int = 1) -> list[str]:
        """One translation per source text: greedy when ``beam`` is 1, else beam search with ``beam`` beams."""
        if not isinstance(beam, int) or isinstance(beam, bool) or beam < 1:
            raise ValueError(f"beam must be a positive int; got {beam!r}")
        encoded = [self.source_tokenizer.encode(text.strip()) for text in sources]
        for number, ids in enumerate(encoded, start=1):
            if len(ids) > self.max_tokens:
                raise ValueError(f"line {number} has {len(ids)} source tokens; this model reads at most "
                                 f"{self.max_tokens}: split the line")
        outputs = ["" for _ in sources]
        todo = [i for i, ids in enumerate(encoded) if ids]  # an empty source stays an empty line
        device = next(self.model.parameters()).device
        tgt = self.target_tokenizer
        for start in range(0, len(todo), self.batch_size):
            rows = todo[start : start + self.batch_size]
            src = pad_batch([encoded[i] for i in rows], self.model.config.pad_id).to(device)
            if beam == 1:
                out = greedy_decode(self.model, src, self.max_tokens, tgt.bos_id, tgt.eos_id)
            else:
                out = beam_search(self.model, src, beam, self.max_tokens, tgt.bos_id, tgt.eos_id)
            for i, ids in zip(rows, out):
                outputs[i] = tgt.decode(ids)
        return outputs

    def __call__(self, sources: Sequence[str] | str, beam: int = 1) -> list[str] | str:
        """``translate`` for a list of texts; one text in gives one text out."""
        if isinstance(sources, str):
            return self.translate([sources], beam)[0]
        return self.translate(sources, beam)


def load_translator(path: str | Path, device: str | torch.device = "cpu", batch_size: int = 250) -> Translator:
    """The translator saved by ``python -m solutions.train translate --out DIR`` (``path`` = DIR or DIR/model.pt)."""
    checkpoint = load_checkpoint(path, kind="translate")
    model = Transformer(TransformerConfig(**checkpoint.config))
    model.load_state_dict(checkpoint.state_dict)
    source = tokenizer_from_dict(checkpoint.vocab["source"])
    target = tokenizer_from_dict(checkpoint.vocab["target"])
    return Translator(model.to(device), source, target, batch_size)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m solutions.translate",
        description="Translate lines of text with a model trained by `python -m solutions.train translate --out DIR`. "
                    "Reads one source per line (stdin or --input) and writes one translation per line to stdout.",
    )
    parser.add_argument("checkpoint", type=Path, help="the training run's --out directory (or its model.pt)")
    parser.add_argument("--input", type=Path, default=None, help="read the source lines from this UTF-8 file "
                        "instead of standard input")
    parser.add_argument("--beam", type=int, default=1, help="beam size; 1 = greedy decoding (default: 1)")
    parser.add_argument("--batch-size", type=int, default=250, help="lines decoded together (default: 250)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="where to run the model (default: cpu)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default: 1, as in training: these small models gain nothing "
                             "from more)")
    return parser


def _read_lines(path: Path | None) -> list[str]:
    if path is None:
        text = sys.stdin.read()
    elif not path.is_file():
        raise ValueError(f"--input {path}: no such file")
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"--input {path}: not UTF-8 ({err.reason} at byte {err.start}); save it as UTF-8"
            ) from None
    # Split on newlines only (str.splitlines also splits on \x1c, \u2028 …, which may be inside a line).
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 on success; 2 and one ``error: …`` line on a bad checkpoint, input or option."""
    args = build_parser().parse_args(argv)
    try:
        if args.threads < 1 or args.batch_size < 1:
            raise ValueError("--threads and --batch-size must be at least 1")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA device is available; use --device cpu")
        device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
        torch.set_num_threads(args.threads)
        translator = load_translator(args.checkpoint, device, args.batch_size)
        for line in translator.translate(_read_lines(args.input), beam=args.beam):
            print(line)
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing is wrong, stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 0
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
