"""solutions.bench: the quick run prints the table with budgets; the plain reference is right."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from solutions.bench import CatKVCache, plain_attention, time_generation
from solutions.gpt import GPT, GPTConfig, generate


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [1, 7, 32])
def test_bench_plain_attention_matches_sdpa(seq: int, causal: bool) -> None:
    q, k, v = (torch.randn(2, 3, seq, 16) for _ in range(3))
    torch.testing.assert_close(plain_attention(q, k, v, causal),
                               F.scaled_dot_product_attention(q, k, v, is_causal=causal), atol=1e-5, rtol=1e-5)


def test_bench_cat_cache_gives_same_tokens_as_preallocated() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=20, max_len=40, d_model=32, n_heads=4, n_layers=2, n_kv_heads=2)).eval()
    c = model.config
    cat = CatKVCache(c.n_layers, 1, c.resolved_n_kv_heads, c.max_len, c.d_head)
    prompt = torch.zeros(1, 3, dtype=torch.long)
    # Feed the prompt and then greedy tokens through the cat-grown cache by hand.
    out, logits = prompt, model(prompt, cat)[:, -1]
    for _ in range(20):
        token = logits.argmax(-1, keepdim=True)
        out = torch.cat((out, token), 1)
        logits = model(token, cat)[:, -1]
    assert torch.equal(out, generate(model, prompt, 20, temperature=0))
    assert math.isfinite(time_generation(model, 5, True, CatKVCache))


@pytest.mark.slow
def test_bench_quick_prints_table_and_json(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "solutions.bench", "--quick", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for needle in ("## 1. attention", "<= 1.10 x SDPA", "<= 1.20 x plain", "## 2. KV cache",
                   "kv-memory", "MQA", "## 2b. encoder-decoder cache", "## 3. training: skipped", "budget(s) missed"):
        assert needle in proc.stdout
    rows = json.loads(out_json.read_text())
    impls = {r["impl"] for r in rows if r["section"] == "attention"}
    assert impls == {"einsum", "sdpa", "auto", "torch_sdpa", "plain"}
    memory = {r["kv_heads"]: r["bytes"] for r in rows if r["section"] == "kv-memory"}
    assert memory[8] == 8 * memory[1] == 4 * memory[2]
    assert all(r["speedup"] > 0 for r in rows if r["section"] == "kv-cache" and "speedup" in r)
    decoders = [r for r in rows if r["section"] == "enc-dec"]
    assert {r["decoder"] for r in decoders} == {"greedy", "beam 4"}
    assert all(r["identical"] and r["ok"] == (r["speedup"] > 1) for r in decoders)


@pytest.mark.subprocess
def test_bench_memory_case_child_reports_bytes() -> None:
    proc = subprocess.run([sys.executable, "-m", "solutions.bench", "--_memory-case", "plain,1024,1"],
                          capture_output=True, text=True, timeout=300, check=True)
    # The 8×1024×1024 float32 scores alone are 32 MiB (well above the peak left by importing torch).
    grown = int(proc.stdout.split()[-1])
    assert grown >= 32 * 2**20, f"peak RSS grew by {grown} bytes; stdout {proc.stdout!r} stderr {proc.stderr[-500:]!r}"


def test_bench_decoder_cache_rows_identical_outputs() -> None:
    from solutions.bench import Table, bench_decoder_cache

    table = Table()
    bench_decoder_cache(table, sentences=4, repeats=1)
    rows = [r for r in table.rows if r["section"] == "enc-dec"]
    assert [r["decoder"] for r in rows] == ["greedy", "beam 4"]
    assert all(r["identical"] is True and r["ok"] is (r["speedup"] > 1) for r in rows)
    assert all(r["max_tokens"] == 13 and r["cached_s"] > 0 and r["recompute_s"] > 0 for r in rows)


def test_bench_decoder_cache_row_not_ok_when_the_cache_is_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Identical outputs are not enough: the budget is "faster with identical outputs". The decoders run for real
    (identical outputs); the clock says each cached call takes 2 s and each uncached one 1 s."""
    import types

    import solutions.bench as bench

    clock = [0.0]

    def slowed(decode):
        def run(*args, use_cache: bool, **kwargs):
            clock[0] += 2.0 if use_cache else 1.0
            return decode(*args, use_cache=use_cache, **kwargs)

        return run

    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(bench, "greedy_decode", slowed(bench.greedy_decode))
    monkeypatch.setattr(bench, "beam_search", slowed(bench.beam_search))
    table = bench.Table()
    bench.bench_decoder_cache(table, sentences=2, repeats=1)
    rows = [r for r in table.rows if r["section"] == "enc-dec"]
    assert len(rows) == 2 and all(r["identical"] is True and r["speedup"] == 0.5 for r in rows)
    assert all(r["ok"] is False for r in rows)


def test_bench_cache_rows_give_time_per_token_and_tokens_per_second(capsys: pytest.CaptureFixture) -> None:
    from solutions.bench import Table, bench_cache

    table = Table()
    bench_cache(table, [8, 16], 1, d_model=32)
    rows = [r for r in table.rows if r["section"] == "kv-cache" and "new_tokens" in r]
    assert [r["new_tokens"] for r in rows] == [8, 16]
    for r in rows:
        assert r["ms_per_token"] == pytest.approx(1e3 * r["cached_s"] / r["new_tokens"])
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["cached_s"])
    out = capsys.readouterr().out
    assert f"{rows[-1]['ms_per_token']:5.2f} ms/token = {rows[-1]['tokens_per_s']:5.0f} tokens/s" in out


@pytest.mark.train
@pytest.mark.subprocess
def test_bench_training_row_gives_the_vit_goal_and_what_a_run_reached() -> None:
    """A real run of the command, tiny (2 epochs of a 1-layer ViT): the row holds the goal of issue 29 (>= 98% in
    <= 120 s), what the run reached, and ok only when it met both."""
    from solutions.bench import Table, bench_training

    table = Table()
    tiny = ("--epochs", "2", "--warmup-epochs", "1", "--n-layers", "1", "--d-model", "16", "--d-mlp", "32")
    bench_training(table, timeout=300, tasks=("vit",), trainer_args={"vit": tiny})
    (row,) = table.rows
    assert (row["section"], row["task"], row["metric"], row["target"], row["budget_s"]) == (
        "training", "vit", "accuracy", 0.98, 120.0)
    assert "error" not in row, row.get("error")
    assert row["value"] == row["metrics"]["accuracy"] and 0.0 <= row["value"] <= 1.0
    assert row["metrics"]["epochs"] == 2 and 0 < row["metrics"]["train_seconds"] < row["seconds"]
    assert row["ok"] is (row["value"] >= 0.98 and row["seconds"] <= 120.0)
    assert row["cpus"] == os.cpu_count() and row["load_before"] >= 0.0
    json.dumps(row)  # what --json writes


def test_bench_training_option_runs_only_that_row_and_writes_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """``--training vit --json``: sections 1-2 are left out, the row is printed with its goal and written; a run
    past 120 s is a miss however accurate (the run itself is replaced: the real one takes two minutes)."""
    import solutions.bench as bench

    calls = []

    def fake_run(task, timeout, trainer_args=()):
        calls.append(task)
        return {"task": task, "seconds": 121.0, "metrics": {"accuracy": 0.995, "epochs": 100.0}}

    monkeypatch.setattr(bench, "run_training", fake_run)
    rows = bench.main(["--training", "vit", "--json", str(tmp_path / "bench.json")])
    assert calls == ["vit"] and [r["section"] for r in rows] == ["training"]
    (row,) = json.loads((tmp_path / "bench.json").read_text())
    assert (row["task"], row["value"], row["seconds"], row["ok"]) == ("vit", 0.995, 121.0, False)
    out = capsys.readouterr().out
    assert "## 1. attention" not in out and "accuracy 99.5% in 121 s, 100 epochs" in out
    assert ">= 98% in <= 120 s" in out and "1 budget(s) missed: training vit" in out
