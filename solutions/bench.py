"""Benchmarks against the COURSE.md budgets, in one run.

    python -m solutions.bench                 # full run (several minutes: it trains three models)
    python -m solutions.bench --quick         # a few seconds: small sizes, no training
    python -m solutions.bench --skip-training --seqs 256 1024 --json bench.json

1. Attention: our backends (einsum, sdpa, auto) against ``F.scaled_dot_product_attention``
   and a plain-PyTorch implementation, batch 1, 8 heads, d_head 64, float32, causal and
   not. Repeats are interleaved (one call of each implementation per round, in a shuffled order) so that a
   noisy machine slows them all alike; the figure is the median. Peak memory is
   the peak resident set (``VmHWM``) after one call minus the resident set just
   before it, in a fresh process: CPU tensors are not tracked by
   ``torch.cuda.max_memory_allocated``, and a new process is the only way to reset
   the peak. A call that stays below the peak left by importing torch (small
   sequences) cannot be measured this way and is shown as such.
2. KV cache: greedy generation with the cache vs recomputing the whole prefix at
   each step, for 128…1024 new tokens, on a fixed model, with the cached decoding's
   time per new token and tokens per second (one thread by default); the cache's bytes for
   MHA, GQA and MQA; and the preallocated cache vs one grown by ``torch.cat``.
   Then the encoder-decoder (chapter 4's model at the translation trainer's default
   sizes): greedy and beam decoding of test sentences in one batch, with and without
   the decoder cache: a row is ok when the outputs are identical and the cache is faster.
3. Training: each ``python -m solutions.train TASK --quiet`` run as a subprocess,
   timed from start to exit (interpreter start, data, training, evaluation), its
   held-out metric read from ``--metrics-json``, against its goal: translate ≥ 95%
   exact match in ≤ 180 s and vit ≥ 98% test accuracy in ≤ 120 s on 2 cores;
   ``--training vit`` runs that row alone. The row records the machine's load
   average before the run: a busy machine makes every time longer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from solutions.attention import attention
from solutions.data.translation import Vocab, load_numbers, pad_batch
from solutions.decoding import beam_search, greedy_decode
from solutions.gpt import GPT, GPTConfig, KVCache, generate, kv_cache_bytes
from solutions.transformer import Transformer, TransformerConfig

HEADS, D_HEAD = 8, 64
IMPLS = ("einsum", "sdpa", "auto", "torch_sdpa", "plain")
# The model of section 2: the size of the chapter's char-level model, with room for 1,024 new tokens.
CACHE_MODEL = dict(vocab=128, max_len=1024 + 16, d_model=128, n_heads=8, n_layers=4)
# The encoder-decoder of section 2: the default sizes of `python -m solutions.train translate`.
TRANSLATION_MODEL = dict(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.1)
TRAININGS = {  # task: (metric, target, seconds) from COURSE.md (vit: the 98% of issue 29); gpt's: its unigram baseline
    "translate": ("exact_match", 0.95, 180.0),
    "vit": ("accuracy", 0.98, 120.0),
    "gpt": ("val_loss", None, 180.0),
}


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """What one would write without a library: the reference for the einsum path."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _impl(name: str, causal: bool):
    if name == "torch_sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "plain":
        return lambda q, k, v: plain_attention(q, k, v, causal)
    return lambda q, k, v: attention(q, k, v, is_causal=causal, backend=name)


def _inputs(seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seq)
    return tuple(torch.randn(1, HEADS, seq, D_HEAD, generator=g) for _ in range(3))  # type: ignore[return-value]


@torch.inference_mode()
def time_attention(seq: int, causal: bool, repeats: int) -> dict[str, float]:
    """Median seconds per call of each implementation, repeats interleaved."""
    q, k, v = _inputs(seq)
    fns = {name: _impl(name, causal) for name in IMPLS}
    times: dict[str, list[float]] = {name: [] for name in IMPLS}
    for fn in fns.values():
        fn(q, k, v)  # warm-up
    order = random.Random(seq)
    for _ in range(repeats):
        # A fixed order biases the call after the largest one (allocator, caches): shuffle it.
        for name, fn in order.sample(list(fns.items()), len(fns)):
            start = time.perf_counter()
            fn(q, k, v)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _vm_hwm() -> int:
    """Peak resident set of this process image, bytes. Not ``ru_maxrss``: that one is
    kept across fork and exec, so a child would start from its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _memory_case(impl: str, seq: int, causal: bool) -> None:
    """Child process: print how much one call raises the peak RSS, in bytes."""
    q, k, v = _inputs(seq)
    fn = _impl(impl, causal)
    with torch.inference_mode():
        fn(q[..., :8, :], k[..., :8, :], v[..., :8, :])  # load kernels before the baseline
        peak_before = _vm_hwm()
        current = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
        fn(q, k, v)
        peak_after = _vm_hwm()
    # The peak only moves if the call went above the peak left by importing torch;
    # if it did not, the call's memory is unknown (-1) but below that headroom.
    print(peak_after - current if peak_after > peak_before else -1)


def peak_memory(impl: str, seq: int, causal: bool) -> int | None:
    cmd = [sys.executable, "-m", "solutions.bench", "--_memory-case", f"{impl},{seq},{int(causal)}",
           "--threads", str(torch.get_num_threads())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    value = int(proc.stdout.split()[-1]) if proc.returncode == 0 and proc.stdout.strip() else -1
    return value if value >= 0 else None


class CatKVCache(KVCache):
    """The alternative we measured against: grow each layer's K/V with ``torch.cat`` (copies every step)."""

    def __init__(self, n_layers: int, batch: int, kv_heads: int, max_len: int, d_head: int, **_: object) -> None:
        self.k, self.v = [None] * n_layers, [None] * n_layers  # type: ignore[list-item]
        self.batch, self.max_len, self.length = batch, max_len, 0

    def write(self, layer, k, v):  # type: ignore[override]
        if self.k[layer] is not None:
            k, v = torch.cat((self.k[layer], k), dim=2), torch.cat((self.v[layer], v), dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v


def time_generation(model: GPT, n_new: int, use_cache: bool, cache_cls: type | None = None) -> float:
    prompt = torch.randint(0, model.config.vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    original = model.new_cache
    if cache_cls is not None:
        c = model.config
        model.new_cache = lambda batch=1: cache_cls(c.n_layers, batch, c.resolved_n_kv_heads, c.max_len, c.d_head)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        generate(model, prompt, n_new, use_cache=use_cache, temperature=0)
        return time.perf_counter() - start
    finally:
        model.new_cache = original  # type: ignore[method-assign]


def run_training(task: str, timeout: float, trainer_args: tuple[str, ...] = ()) -> dict:
    """``python -m solutions.train TASK --quiet`` with ``trainer_args``: its wall time and metrics, or an error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metrics.json"
        cmd = [sys.executable, "-m", "solutions.train", task, "--metrics-json", str(out), "--quiet", *trainer_args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"task": task, "error": f"did not finish within {timeout:.0f} s"}
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not out.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            return {"task": task, "error": f"not available (exit {proc.returncode}): {lines[-1] if lines else ''}"}
        metrics = json.loads(out.read_text())
    return {"task": task, "seconds": seconds, "metrics": metrics}


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, section: str, case: str, measured: str, budget: str = "", ok: bool | None = None, **data) -> None:
        self.rows.append(dict(section=section, case=case, measured=measured, budget=budget, ok=ok, **data))
        if not data.get("quiet_row"):
            mark = "" if ok is None else ("ok" if ok else "MISS")
            print(f"{section:<10} {case:<34} {measured:<30} {budget:<22} {mark}", flush=True)


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "below import peak"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def bench_attention(table: Table, seqs: list[int], repeats: int, memory: bool) -> None:
    print(f"\n## 1. attention, batch 1, {HEADS} heads, d_head {D_HEAD}, float32, {torch.get_num_threads()} threads; "
          f"median of {repeats} interleaved repeats; ratio = time / F.scaled_dot_product_attention")
    for seq in seqs:
        for causal in (False, True):
            t = time_attention(seq, causal, repeats)
            tag = f"seq {seq} {'causal' if causal else 'full'}"
            ref = t["torch_sdpa"]
            for name in IMPLS:
                budget, ok = "", None
                if name == "auto":
                    budget, ok = "<= 1.10 x SDPA", t[name] / ref <= 1.10
                elif name == "einsum":
                    budget, ok = "<= 1.20 x plain", t[name] / t["plain"] <= 1.20
                extra = f" ({t[name] / t['plain']:.2f}x plain)" if name == "einsum" else ""
                table.add("attention", f"{tag} {name}", f"{t[name] * 1e3:8.2f} ms {t[name] / ref:5.2f}x{extra}",
                          budget, ok, seq=seq, causal=causal, impl=name, seconds=t[name], ratio_sdpa=t[name] / ref)
    if memory:
        print("\n## 1b. peak memory of one causal call (growth of peak RSS in a fresh process)")
        for seq in seqs:
            for name in IMPLS:
                peak = peak_memory(name, seq, True)
                scores = HEADS * seq * seq * 4
                table.add("memory", f"seq {seq} causal {name}", f"{_fmt_bytes(peak):>10}",
                          f"(scores matrix {_fmt_bytes(scores)})", None, seq=seq, impl=name, peak_bytes=peak)


def bench_cache(table: Table, lengths: list[int], repeats: int, d_model: int | None = None) -> None:
    spec = dict(CACHE_MODEL, **({"d_model": d_model} if d_model else {}))
    spec["max_len"] = max(lengths) + 16
    torch.manual_seed(0)
    model = GPT(GPTConfig(**spec)).eval()
    print(f"\n## 2. KV cache: greedy generation after a 16-token prompt, model {spec}, {torch.get_num_threads()} "
          f"threads; cached time vs recomputation, then the cached time per new token")
    for n in lengths:
        cached = statistics.median(time_generation(model, n, True) for _ in range(repeats))
        recompute = time_generation(model, n, False)
        ratio = recompute / cached
        budget, ok = ("cache >= 10x faster", ratio >= 10) if n == 1024 else ("", None)
        # Per new token with the cache: the whole call (the prompt's one pass included) over the tokens it made.
        per_token = cached / n
        table.add("kv-cache", f"{n} new tokens",
                  f"{cached:6.2f} s vs {recompute:6.2f} s = {ratio:5.1f}x  {per_token * 1e3:5.2f} ms/token "
                  f"= {1 / per_token:5.0f} tokens/s", budget, ok, new_tokens=n, cached_s=cached, recompute_s=recompute,
                  speedup=ratio, ms_per_token=per_token * 1e3, tokens_per_s=1 / per_token)
    n = max(lengths)
    pre = statistics.median(time_generation(model, n, True) for _ in range(repeats))
    cat = statistics.median(time_generation(model, n, True, CatKVCache) for _ in range(repeats))
    table.add("kv-cache", f"{n} tokens: preallocated vs cat", f"{pre:6.2f} s vs {cat:6.2f} s = {cat / pre:4.2f}x",
              "", None, preallocated_s=pre, cat_s=cat)
    c = GPTConfig(**spec)
    for label, kv in (("MHA", c.n_heads), ("GQA", 2), ("MQA", 1)):
        size = kv_cache_bytes(c.n_layers, kv, c.d_head, n)
        table.add("kv-memory", f"{label} {kv} kv heads, {n} tokens", _fmt_bytes(size),
                  f"MHA / {c.n_heads // kv}", None, kv_heads=kv, bytes=size)


def bench_decoder_cache(table: Table, sentences: int, repeats: int, long_outputs: int | None = None) -> None:
    """Greedy and beam decoding of ``sentences`` test sources in one batch, with and without the decoder cache, up
    to the longest reference + 2 tokens and (optionally) up to ``long_outputs``. Random weights: no row emits EOS,
    so every output runs to the length asked, the same number of steps on both paths."""
    data = load_numbers(n_test=sentences)
    max_src, max_tgt = data.max_lengths()
    lengths = [max_tgt + 2] + ([long_outputs] if long_outputs else [])
    config = TransformerConfig(src_vocab=len(data.src_vocab), tgt_vocab=len(data.tgt_vocab),
                               max_len=max(max_src, max(lengths)) + 1, pad_id=Vocab.pad_id, **TRANSLATION_MODEL)
    torch.manual_seed(0)
    model = Transformer(config).eval()
    src = pad_batch([data.src_vocab.encode(s) for s, _ in data.test])
    print(f"\n## 2b. encoder-decoder cache: {sentences} test sentences in one batch (longest reference {max_tgt} "
          f"tokens), chapter 4's model {TRANSLATION_MODEL}, random weights; median of {repeats}")
    for n in lengths:
        decoders = {
            "greedy": lambda use_cache: greedy_decode(model, src, n, Vocab.bos_id, Vocab.eos_id, use_cache=use_cache),
            "beam 4": lambda use_cache: beam_search(model, src, 4, n, Vocab.bos_id, Vocab.eos_id,
                                                    use_cache=use_cache),
        }
        for name, decode in decoders.items():
            outputs = {use_cache: decode(use_cache) for use_cache in (True, False)}  # also the warm-up
            same = outputs[True] == outputs[False]
            seconds = {}
            for use_cache in (True, False):
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    decode(use_cache)
                    times.append(time.perf_counter() - start)
                seconds[use_cache] = statistics.median(times)
            ratio = seconds[False] / seconds[True]
            mean_len = statistics.mean(len(o) for o in outputs[True])
            table.add("enc-dec", f"{name}, {mean_len:.0f} tokens per sentence",
                      f"{seconds[True]:6.2f} s vs {seconds[False]:6.2f} s = {ratio:5.1f}x",
                      "identical, faster", same and ratio > 1, decoder=name, max_tokens=n, identical=same,
                      cached_s=seconds[True], recompute_s=seconds[False], speedup=ratio)


def bench_training(table: Table, timeout: float, tasks: tuple[str, ...] = tuple(TRAININGS),
                   trainer_args: dict[str, tuple[str, ...]] | None = None) -> None:
    """One row per task: its held-out metric and wall time against its goal. ``trainer_args`` (per task) are added
    to the command: the tests give tiny runs."""
    print(f"\n## 3. training to target: python -m solutions.train TASK --quiet ({os.cpu_count()} CPUs; wall time "
          "from start to exit)")
    for task in tasks:
        metric, target, budget = TRAININGS[task]
        load = os.getloadavg()[0]  # the machine's load before the run: a busy machine makes every time longer
        result = run_training(task, timeout, (trainer_args or {}).get(task, ()))
        goal = dict(task=task, metric=metric, target=target, budget_s=budget, cpus=os.cpu_count(), load_before=load)
        if "error" in result:
            table.add("training", task, result["error"][:60], "", False, **goal, error=result["error"])
            continue
        m, seconds = result["metrics"], result["seconds"]
        value = m.get(metric)
        if value is None:
            table.add("training", task, f"no {metric} in metrics {sorted(m)}", "", False, **goal, seconds=seconds,
                      metrics=m)
            continue
        if task == "gpt":
            unigram = m.get("unigram_loss", float("nan"))
            ok = value < unigram and seconds <= budget
            table.add("training", task, f"val_loss {value:.3f} (unigram {unigram:.3f}) in {seconds:.0f} s",
                      f"< unigram, <= {budget:.0f} s", ok, **goal, value=value, seconds=seconds, metrics=m)
        else:
            fraction = value / 100 if value > 1 else value
            ok = fraction >= target and seconds <= budget
            epochs = f", {m['epochs']:g} epochs" if "epochs" in m else ""
            table.add("training", task, f"{metric} {fraction:.1%} in {seconds:.0f} s{epochs} (load {load:.1f})",
                      f">= {target:.0%} in <= {budget:.0f} s", ok, **goal, value=fraction, seconds=seconds, metrics=m)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m solutions.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and no training: a smoke test in seconds")
    p.add_argument("--skip-training", action="store_true", help="leave out section 3 (the three trainings)")
    p.add_argument("--training", choices=tuple(TRAININGS), nargs="+", default=None, metavar="TASK",
                   help="only section 3, for these trainings (e.g. --training vit: ViT >= 98%% in <= 120 s)")
    p.add_argument("--seqs", type=int, nargs="+", default=None,
                   help="attention sequence lengths (default: 256 512 1024 2048 4096; --quick: 64 128)")
    p.add_argument("--repeats", type=int, default=None, help="timing repeats (default: 15; --quick: 3)")
    p.add_argument("--no-memory", action="store_true", help="skip the per-case memory subprocesses")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads for sections 1-2 (default: 1: stable on a shared machine, and what Binder "
                        "gives; 0 = torch's default)")
    p.add_argument("--json", type=Path, default=None, help="also write every row to this JSON file")
    p.add_argument("--_memory-case", dest="memory_case", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.memory_case:
        torch.set_num_threads(args.threads or torch.get_num_threads())
        impl, seq, causal = args.memory_case.split(",")
        _memory_case(impl, int(seq), bool(int(causal)))
        return []
    seqs = args.seqs or ([64, 128] if args.quick else [256, 512, 1024, 2048, 4096])
    if any(s < 1 for s in seqs):
        raise SystemExit(f"error: --seqs must be positive; got {seqs}")
    repeats = args.repeats or (3 if args.quick else 15)
    if args.threads:
        torch.set_num_threads(args.threads)
    table = Table()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.training:
        bench_training(table, timeout=900, tasks=tuple(args.training))
        return _finish(table, args.json)
    bench_attention(table, seqs, repeats, memory=not args.no_memory and not args.quick)
    if args.quick:
        bench_cache(table, [16, 32], 1, d_model=32)
        bench_decoder_cache(table, sentences=20, repeats=1)
    else:
        bench_cache(table, [128, 256, 512, 1024], 3)
        bench_decoder_cache(table, sentences=100, repeats=3, long_outputs=64)
    if args.quick or args.skip_training:
        print("\n## 3. training: skipped (--quick or --skip-training)")
    else:
        bench_training(table, timeout=900)
    return _finish(table, args.json)


def _finish(table: Table, json_path: Path | None) -> list[dict]:
    """Print the misses and write the rows to ``json_path``."""
    misses = [r for r in table.rows if r["ok"] is False]
    print(f"\n{len(misses)} budget(s) missed" + (": " + ", ".join(f"{r['section']} {r['case']}" for r in misses)
                                                 if misses else ""))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(table.rows, indent=2, default=str) + "\n")
    return table.rows


if __name__ == "__main__":
    main(sys.argv[1:])
