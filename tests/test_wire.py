"""autograder.wire: values cross the process boundary unchanged."""

from __future__ import annotations

import pytest
import torch

from autograder import wire


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape", [(), (1,), (0,), (2, 3), (2, 0, 4)])
def test_wire_tensor_round_trip(dtype, shape):
    """Every sendable dtype and shape, 0-dim tensors (a scalar loss) included, comes back bit for bit."""
    t = (torch.arange(max(1, torch.Size(shape).numel())) % 3).reshape(-1)[: torch.Size(shape).numel()]
    t = t.reshape(shape).to(dtype)
    back = wire.decode_value(wire.encode_value({"out": t, "pair": (t, 1.5)}))
    assert back["out"].dtype == dtype and back["out"].shape == t.shape
    assert torch.equal(back["out"], t) and torch.equal(back["pair"][0], t) and back["pair"][1] == 1.5
