"""solutions.checkpoint: one format for every trainer; a file of another kind, version or origin is refused clearly."""

from __future__ import annotations

import pytest
import torch

from solutions.checkpoint import FORMAT, FORMAT_VERSION, load_checkpoint, save_checkpoint


def save_linear(path, kind: str = "vit"):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    save_checkpoint(path, kind=kind, config={"in": 3}, model=model, vocab={"classes": ["a", "b"]},
                    metrics={"accuracy": 0.5}, data={"source": "test"})
    return model


def test_checkpoint_round_trip_and_fields(tmp_path):
    model = save_linear(tmp_path / "run")
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)  # plain data: loads without pickled code
    assert (saved["format"], saved["version"], saved["kind"]) == (FORMAT, FORMAT_VERSION, "vit")
    for path in (tmp_path / "run", tmp_path / "run" / "model.pt"):  # the --out directory or the file
        checkpoint = load_checkpoint(path, kind="vit")
        assert checkpoint.config == {"in": 3} and checkpoint.vocab == {"classes": ["a", "b"]}
        assert checkpoint.metrics == {"accuracy": 0.5} and checkpoint.data == {"source": "test"}
        assert checkpoint.state_dict.keys() == model.state_dict().keys()
        torch.testing.assert_close(checkpoint.state_dict["weight"], model.weight.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("change, message", [
    ({"kind": "gpt"}, r"a 'gpt' checkpoint, but a 'vit' one is needed \(made by `python -m solutions.train vit"),
    ({"version": FORMAT_VERSION + 1}, rf"format version {FORMAT_VERSION + 1}, but this library reads version "
                                      rf"{FORMAT_VERSION}"),
    ({"format": None}, "not a checkpoint of this library"),
])
def test_load_checkpoint_refuses_other_kinds_versions_and_files(tmp_path, change, message):
    save_linear(tmp_path)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    state.update(change)
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tmp_path, kind="vit")


def test_load_checkpoint_missing_or_foreign_file(tmp_path):
    with pytest.raises(ValueError, match=r"nowhere: no checkpoint there \(expected the --out directory"):
        load_checkpoint(tmp_path / "nowhere", kind="translate")
    (tmp_path / "model.pt").write_text("hello\n")
    with pytest.raises(ValueError, match="not a checkpoint of this library"):
        load_checkpoint(tmp_path, kind="translate")
    with pytest.raises(ValueError, match="kind must be one of"):
        load_checkpoint(tmp_path, kind="bert")


def test_checkpoint_of_a_ddp_wrapped_model_loads_into_the_plain_model(tmp_path):
    """What rank 0 of a torchrun training saves: the model inside DistributedDataParallel, no 'module.' prefix."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        wrapped = DistributedDataParallel(torch.nn.Linear(3, 2))
        assert next(iter(wrapped.state_dict())).startswith("module.")  # what saving the wrapper would write
        save_checkpoint(tmp_path, kind="gpt", config={}, model=wrapped, vocab={}, metrics={"world_size": 2})
    finally:
        dist.destroy_process_group()
    checkpoint = load_checkpoint(tmp_path, kind="gpt")
    plain = torch.nn.Linear(3, 2)
    plain.load_state_dict(checkpoint.state_dict)  # strict: the keys are the plain model's
    torch.testing.assert_close(plain.weight, wrapped.module.weight.detach(), rtol=0, atol=0)
    assert checkpoint.metrics["world_size"] == 2
