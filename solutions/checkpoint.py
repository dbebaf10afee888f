"""One checkpoint format for every trainer of ``python -m solutions.train``.

A training run's ``--out DIR`` holds ``DIR/model.pt``: one ``torch.save``d
dictionary of plain Python values and tensors (so it loads with
``weights_only=True``, which never runs pickled code):

    format      "transformer-deep-dive checkpoint"   what the file is
    version     FORMAT_VERSION                        bumped when a field changes meaning
    kind        "translate" | "vit" | "gpt"           which trainer made it
    config      dict                                  the model's constructor arguments
    state_dict  dict of tensors                       the trained weights
    vocab       dict                                  tokenizers (translate, gpt) or class names (vit)
    metrics     dict                                  the held-out metrics printed at the end of training,
                                                      with world_size (processes under torchrun; 1 without)
    data        dict                                  where the data came from and how it was split

Each trainer rebuilds its model with ``build_model(config)``; the readers
(``solutions.translate``, ``solutions.generate``) call ``load_checkpoint(path,
kind=...)``, which refuses a file of another kind or version with a message
saying what it found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FORMAT = "transformer-deep-dive checkpoint"
FORMAT_VERSION = 1
FILENAME = "model.pt"
KINDS = ("translate", "vit", "gpt")
# Names changed since checkpoints were first written (one name per concept across the models): per kind, the config
# keys renamed (old -> new) and the state-dict keys renamed (pattern -> replacement). A file written before keeps
# loading: load_checkpoint renames what it finds.
RENAMED: dict[str, tuple[dict[str, str], tuple[tuple[str, str], ...]]] = {
    "vit": ({"d_mlp": "d_ff"}, (
        (r"^blocks\.(\d+)\.norm_attention\.", r"layers.\1.norm1."),
        (r"^blocks\.(\d+)\.attention\.", r"layers.\1.self_attn."),
        (r"^blocks\.(\d+)\.norm_mlp\.", r"layers.\1.norm2."),
        (r"^blocks\.(\d+)\.mlp\.up\.", r"layers.\1.feed_forward.linear1."),
        (r"^blocks\.(\d+)\.mlp\.down\.", r"layers.\1.feed_forward.linear2."),
    )),
    "gpt": ({}, (
        (r"^blocks\.", "layers."),
        (r"\.attn\.", ".self_attn."),
        (r"\.mlp\.up\.", ".feed_forward.linear1."),
        (r"\.mlp\.down\.", ".feed_forward.linear2."),
    )),
}


def renamed_keys(kind: str, state_dict: dict) -> dict:
    """``state_dict`` with the state-dict keys of :data:`RENAMED` ``[kind]`` brought up to date."""
    return _renamed(kind, {}, state_dict)[1]


@dataclass(frozen=True)
class Checkpoint:
    kind: str  # the trainer that wrote it: one of KINDS
    config: dict  # keyword arguments that rebuild the model (the trainer's build_model(config))
    state_dict: dict  # parameter name → tensor
    vocab: dict  # translate: {"source", "target"} tokenizers; gpt: {"tokenizer"}; vit: {"classes"}
    metrics: dict  # held-out metrics of the run
    data: dict  # the data source and split sizes, as printed by the run
    path: Path  # the file it was read from (or written to)


def checkpoint_file(path: str | Path) -> Path:
    """``model.pt`` inside a run's ``--out`` directory, or ``path`` itself when it is a file."""
    path = Path(path)
    return path / FILENAME if path.is_dir() else path


def save_checkpoint(
    out_dir: str | Path,
    *,
    kind: str,
    config: dict,
    model: nn.Module,
    vocab: dict,
    metrics: dict,
    data: dict | None = None,
) -> Path:
    """Write ``out_dir/model.pt`` in the shared format; returns its path. A model wrapped in
    ``DistributedDataParallel`` is saved as the model inside (no ``module.`` prefix), so that one process loads it."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    if isinstance(model, DistributedDataParallel):
        model = model.module
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    torch.save({
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "kind": kind,
        "config": dict(config),
        "state_dict": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "vocab": dict(vocab),
        "metrics": dict(metrics),
        "data": dict(data or {}),
    }, path)
    return path


def load_checkpoint(path: str | Path, kind: str) -> Checkpoint:
    """Read a checkpoint written by ``python -m solutions.train KIND --out DIR`` (``path`` = DIR or DIR/model.pt).

    Raises ValueError naming what was found when the file is missing, is not a
    checkpoint of this library, has another format version, or another kind.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    made_by = f"the --out directory of `python -m solutions.train {kind}`"
    file = checkpoint_file(path)
    if not file.is_file():
        raise ValueError(f"{path}: no checkpoint there (expected {made_by}, which holds {FILENAME})")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many types on foreign files (KeyError, EOFError, UnpicklingError…)
        raise ValueError(
            f"{file}: not a checkpoint of this library (torch.load with weights_only=True failed: "
            f"{type(err).__name__}); expected {made_by}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            f"{file}: not a checkpoint of this library (no '{FORMAT}' header; it may come from an older "
            f"version or another program); retrain with `python -m solutions.train {kind} --out DIR`"
        )
    if state.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{file}: checkpoint format version {state.get('version')!r}, but this library reads version "
            f"{FORMAT_VERSION}; retrain with `python -m solutions.train {kind} --out DIR` or use the matching "
            "library version"
        )
    if state.get("kind") != kind:
        raise ValueError(
            f"{file}: a {state.get('kind')!r} checkpoint, but a {kind!r} one is needed "
            f"(made by `python -m solutions.train {kind} --out DIR`)"
        )
    missing = [key for key in ("config", "state_dict", "vocab", "metrics", "data") if key not in state]
    if missing:
        raise ValueError(f"{file}: the checkpoint is incomplete, missing {missing}; retrain to write it again")
    config, state_dict = _renamed(kind, state["config"], state["state_dict"])
    return Checkpoint(kind, config, state_dict, state["vocab"], state["metrics"], state["data"], file)


def _renamed(kind: str, config: dict, state_dict: dict) -> tuple[dict, dict]:
    """``config`` and ``state_dict`` with the names of :data:`RENAMED` brought up to date (a no-op for new files)."""
    config_names, key_patterns = RENAMED.get(kind, ({}, ()))
    config = {config_names.get(key, key): value for key, value in config.items()}
    renamed = {}
    for key, value in state_dict.items():
        for pattern, replacement in key_patterns:
            key = re.sub(pattern, replacement, key)
        renamed[key] = value
    return config, renamed
