"""Sample text from a trained GPT checkpoint: ``python -m solutions.generate CHECKPOINT --prompt TEXT``.

    python -m solutions.train gpt --out runs/gpt
    python -m solutions.generate runs/gpt --prompt "hacker: " --max-new-tokens 80
    python -m solutions.generate runs/gpt --prompt "The " --temperature 0 # greedy

The checkpoint (the ``--out`` directory of ``python -m solutions.train gpt``)
holds the model's config and weights and its tokenizer (characters or BPE).
Generation uses the KV cache; prompt plus new tokens must fit the model's
context (``max_len``, the training block size).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from solutions.checkpoint import load_checkpoint
from solutions.data.text import TextTokenizer, text_tokenizer_from_dict
from solutions.gpt import GPT, GPTConfig, generate


def load_gpt(path: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, TextTokenizer]:
    """The model (in eval mode) and tokenizer saved by ``python -m solutions.train gpt --out DIR``."""
    checkpoint = load_checkpoint(path, kind="gpt")
    model = GPT(GPTConfig(**checkpoint.config))
    model.load_state_dict(checkpoint.state_dict)
    return model.to(device).eval(), text_tokenizer_from_dict(checkpoint.vocab["tokenizer"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m solutions.generate",
        description="Continue a prompt with a model trained by `python -m solutions.train gpt --out DIR`; "
                    "prints the prompt followed by the generated text.",
    )
    parser.add_argument("checkpoint", type=Path, help="the training run's --out directory (or its model.pt)")
    parser.add_argument("--prompt", required=True, help="the text to continue (at least one token)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens to add (default: as many as the model's context leaves after the prompt)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="sampling temperature; 0 = greedy, always the most likely token (default: 0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only")
    parser.add_argument("--samples", type=int, default=1, help="how many continuations to print (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default: 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (default: cpu)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 on success; 2 and one ``error: …`` line on a bad checkpoint, prompt or option."""
    args = build_parser().parse_args(argv)
    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda but no CUDA device is available; use --device cpu")
        if args.samples < 1:
            raise ValueError(f"--samples must be at least 1; got {args.samples}")
        model, tokenizer = load_gpt(args.checkpoint, args.device)
        ids = tokenizer.encode(args.prompt)
        room = model.config.max_len - len(ids)
        if not ids:
            raise ValueError("--prompt is empty; give at least one character")
        if room < 1:
            raise ValueError(f"--prompt has {len(ids)} tokens; this model's context is {model.config.max_len} "
                             "tokens, so shorten the prompt")
        n_new = room if args.max_new_tokens is None else args.max_new_tokens
        if not 0 <= n_new <= room:
            raise ValueError(f"--max-new-tokens must be in 0..{room} (the context of {model.config.max_len} tokens "
                             f"less the prompt's {len(ids)}); got {n_new}")
        prompt = torch.tensor([ids], device=args.device)
        for i in range(args.samples):
            generator = torch.Generator(device=args.device).manual_seed(args.seed + i)
            out = generate(model, prompt, n_new, temperature=args.temperature, top_k=args.top_k, generator=generator)
            if args.samples > 1:
                print(f"--- sample {i + 1} ---")
            print(tokenizer.decode(out[0].tolist()))
    except BrokenPipeError:  # the reader stopped early (`| head`): nothing is wrong, stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 0
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
