"""Checks for chapter 5, the Vision Transformer (the reference is :mod:`solutions.vit`).

Each judge compares with an independent reference — image blocks cut with
``Tensor.unfold`` (patchify), ``F.conv2d`` (the patch embedding), torchvision's
``VisionTransformer`` with the same weights (the forward pass and the parameter
count), torchvision's ``interpolate_embeddings`` (a new image size) and the attention
rollout written out — and,
when the answer is wrong, names the usual mistake whose output it is. What the checks
compute themselves (the patches, the conv's weight as a Linear's, [CLS] and positions)
and every mistake one edit away from an answer are computed in ``@core.recorded``
functions of the case inputs, called before the early return: a student edition that
withholds chapter 5 replays their results and holds no code computing them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn
from torchvision.models import vision_transformer as tv

from autograder.checks import core
from autograder.checks.core import (Case, Check, CheckFailed, expect, expect_close, expect_value_error, fail, rand_int,
                                    same)
reference = core.reference("solutions.vit")  # in a student edition: replayed from a recording


def _no_error(outputs: dict) -> None:
    error = outputs.get("error")
    if error is not None:
        fail(f"your code raised {error['type']}: {error['message']}")


# --- patchify --------------------------------------------------------------------------------------


@core.recorded
def _blocks(images: Tensor, p: int) -> Tensor:
    """The reference patches, cut with Tensor.unfold: (batch, h·w, p·p·channels), row-major, (p1 p2 channels)."""
    batch, channels = images.shape[:2]
    blocks = images.unfold(2, p, p).unfold(3, p, p)  # (batch, channels, h, w, p1, p2)
    return blocks.permute(0, 2, 3, 4, 5, 1).reshape(batch, -1, p * p * channels)


def _patch_inputs(gen: torch.Generator, *, channels=(2, 3), grid=(2, 4), patch=(2, 4), square=False,
                  dtype=torch.float32, batch=(1, 3)) -> dict:
    c, p = rand_int(gen, *channels), rand_int(gen, *patch)
    h = rand_int(gen, *grid)
    w = h if square else rand_int(gen, *grid)
    if not square and w == h and grid[1] > grid[0]:  # keep row-major and column-major apart
        w = grid[0] if h != grid[0] else grid[1]
    images = torch.randn(rand_int(gen, *batch), c, h * p, w * p, generator=gen, dtype=dtype)
    return {"args": (images, p)}


@core.recorded
def _patchify_mistakes(images: Tensor, p: int) -> dict[str, Any]:
    """The patches of each mistake of _patchify_hints (stacked)."""
    batch, c, height, width = images.shape
    h, w = height // p, width // p
    grid = images.reshape(batch, c, h, p, w, p)
    return core.stacked({"channels_first": images.unfold(2, p, p).unfold(3, p, p).reshape(batch, h * w, p * p * c),
                         "memory_runs": images.reshape(batch, h * w, p * p * c),
                         "channels_inside": rearrange(grid, "batch c h p1 w p2 -> batch (h w) (c p1 p2)"),
                         "column_major": rearrange(grid, "batch c h p1 w p2 -> batch (w h) (p1 p2 c)"),
                         "transposed": rearrange(grid, "batch c h p1 w p2 -> batch (h w) (p2 p1 c)")})


def _patchify_hints(c: int) -> dict[str, str]:
    return {
        "channels_first": f"your 'patch' 0 holds {c} different image blocks of channel 0, not one block with its {c} "
        "channels: after unfold (or a reshape to (batch, channels, h, w, p1, p2)) the channel axis is still first, so "
        "a view/reshape to (batch, patches, values) mixes channels and blocks. Move channels last before flattening "
        "(einops: 'batch channels (h p1) (w p2) -> batch (h w) (p1 p2 channels)')",
        "memory_runs": "your patches are consecutive runs of the image's memory, not p×p blocks: a plain view/reshape "
        "of (batch, channels, height, width) cannot cut blocks. Split height and width into (h p1) and (w p2) and "
        "move the axes (einops: 'batch channels (h p1) (w p2) -> batch (h w) (p1 p2 channels)')",
        "channels_inside": "each patch holds the right pixels, flattened as (channels p1 p2) (what F.unfold and a "
        "reshape of the conv weight give); the documented order is (p1 p2 channels): pixel by pixel, the channels of "
        "a pixel together",
        "column_major": "your patches are in column-major order: number them row by row, (h w), so patch 1 is the "
        "block right of patch 0",
        "transposed": "each patch is transposed: flatten it row by row, (p1 p2), p1 being the row inside the patch",
    }


def _judge_patchify(inputs: dict, outputs: dict) -> None:
    images, p = inputs["args"]
    batch, c, height, width = images.shape
    h, w = height // p, width // p
    expected, mistakes = _blocks(images, p), core.unstacked(_patchify_mistakes(images, p))
    out = outputs["out"]
    if same(out, expected):
        return
    for bug, message in _patchify_hints(c).items():
        if same(out, mistakes[bug]):
            fail(message)
    if isinstance(out, Tensor) and tuple(out.shape) == tuple(expected.shape):
        bad = (out.to(expected.dtype) - expected).abs().flatten(2).amax(-1).amax(0) > 1e-5
        if bad.any():
            k = int(bad.nonzero()[0])
            fail(f"patch {k} must be the block at row {k // w}, column {k % w} of the {h}×{w} grid, i.e. "
                 f"images[:, :, {k // w * p}:{k // w * p + p}, {k % w * p}:{k % w * p + p}], flattened as "
                 "(p1 p2 channels); yours is not")
    expect_close(out, expected, f"expected (batch, {h * w}, {p * p * c}) patches in row-major order, each flattened "
                                "as (p1 p2 channels)")


def _indivisible_inputs(gen: torch.Generator, *, only_height: bool = False) -> dict:
    p = rand_int(gen, 3, 4)
    height = p * rand_int(gen, 2, 3) + rand_int(gen, 1, p - 1)
    width = p * rand_int(gen, 2, 3) + (0 if only_height else rand_int(gen, 1, p - 1))
    return {"args": (torch.randn(1, 2, height, width, generator=gen), p)}


def _judge_indivisible(inputs: dict, outputs: dict) -> None:
    images, p = inputs["args"]
    height, width = images.shape[-2:]
    what = f"a {height}×{width} image cannot be cut into {p}×{p} patches"
    if outputs["error"] is None:
        fail(f"{what}, but your code returned patches (cropping the image, or a wrong reshape): silently dropping "
             "pixels hides a bug; raise ValueError naming patch_size and the sizes that divide the image")
    expect_value_error(outputs["error"], what, "patch_size", word=False)


# --- patch_embedding_from_conv -----------------------------------------------------------------------


def _conv_inputs(gen: torch.Generator, *, bias: bool = True, dtype=torch.float32, channels=(2, 3), stride=None,
                 habits: bool = False) -> dict:
    """A patch conv and images; ``habits``: made as PyTorch users often write it, kernel and stride as tuples and
    ``padding="valid"`` (the same conv)."""
    c, p = rand_int(gen, *channels), rand_int(gen, 2, 3)
    d_model = rand_int(gen, 3, 8)
    h, w = rand_int(gen, 1, 3), rand_int(gen, 1, 3)
    images = torch.randn(rand_int(gen, 1, 2), c, h * p, w * p, generator=gen, dtype=dtype)
    weight = 0.5 * torch.randn(d_model, c, p, p, generator=gen, dtype=dtype)
    conv = {"kernel_size": p, "stride": p if stride is None else stride}
    if habits:
        conv = {"kernel_size": (p, p), "stride": (p, p), "padding": "valid"}
    return {"weight": weight, "bias": 0.5 * torch.randn(d_model, generator=gen, dtype=dtype) if bias else None,
            "conv": conv, "images": images, "patches": _blocks(images, p)}


@core.recorded
def _conv_weights(weight: Tensor, bias: Tensor | None, patches: Tensor) -> dict[str, Any]:
    """The Linear's right weight ("weight"), and the outputs of the mistakes of _CONV_MISTAKES these inputs allow
    ("mistakes", stacked)."""
    d_model = weight.shape[0]
    right = rearrange(weight, "d c p1 p2 -> d (p1 p2 c)")
    mistakes = {"reshaped": F.linear(patches, weight.reshape(d_model, -1), bias),
                "transposed": F.linear(patches, rearrange(weight, "d c p1 p2 -> d (p2 p1 c)"), bias)}
    if bias is not None:
        mistakes["no_bias"] = F.linear(patches, right)
    return {"weight": right, "mistakes": core.stacked(mistakes)}


_CONV_MISTAKES = {
    "reshaped": "conv.weight.reshape(d_model, -1) flattens each kernel as (channels p1 p2), but patchify flattens a "
    "patch as (p1 p2 channels): the weights then meet the wrong pixels. Rearrange the weight "
    "'d_model channels p1 p2 -> d_model (p1 p2 channels)'",
    "transposed": "your weight rows are transposed inside the kernel: flatten it as (p1 p2 channels), p1 the kernel "
    "row",
    "no_bias": "the bias is missing: copy conv.bias into the Linear's bias",
}


def _judge_conv(inputs: dict, outputs: dict) -> None:
    error = outputs.get("error")
    if error is not None and inputs["conv"].get("padding") == "valid":
        fail(f"a Conv2d made with kernel_size={inputs['conv']['kernel_size']}, stride={inputs['conv']['stride']} and "
             "padding='valid' — how PyTorch users often write the same patch conv (conv.padding is then the string "
             f"'valid', not (0, 0)) — must be accepted; your code raised {error['type']}: {error['message'][:150]}")
    _no_error(outputs)
    if not outputs["is_linear"]:
        fail("return an nn.Linear (in_features = p·p·channels, out_features = d_model) with the conv's weights")
    weight, bias, images, patches = inputs["weight"], inputs["bias"], inputs["images"], inputs["patches"]
    p = weight.shape[-1]
    conv_out = F.conv2d(images, weight, bias, stride=p)
    expected = rearrange(conv_out, "batch d_model h w -> batch (h w) d_model")
    found = _conv_weights(weight, bias, patches)
    out = outputs["out"]
    if same(out, expected, 1e-4):
        return
    if isinstance(out, Tensor) and out.dtype != expected.dtype:
        fail(f"the conv is {expected.dtype}; your Linear gives {out.dtype}: create it with the conv's dtype and device")
    if bias is None and outputs["bias"] is not None and torch.any(outputs["bias"] != 0):
        fail("this conv has no bias, but your Linear adds one (a random initial bias): use bias=conv.bias is not None")
    if bias is not None and same(outputs["weight"], found["weight"], 1e-6) and not same(outputs["bias"], bias, 1e-6):
        fail("the weight is right but the bias is not the conv's: copy conv.bias into the Linear's bias (a new "
             "nn.Linear starts with a random one)")
    outputs_of = core.unstacked(found["mistakes"])
    mistakes = [(outputs_of[bug], message) for bug, message in _CONV_MISTAKES.items() if bug in outputs_of]
    expect(out, expected, "linear(patchify(images)) must equal conv(images) laid out as (batch, patches, d_model)",
           mistakes, atol=1e-4)


def _judge_conv_not_patches(inputs: dict, outputs: dict) -> None:
    p, stride = inputs["conv"]["kernel_size"], inputs["conv"]["stride"]
    expect_value_error(outputs["error"], f"a Conv2d with kernel_size={p} and stride={stride} overlaps its patches, so "
                       "no Linear on patchify's patches equals it", "stride", word=False)


# --- add_cls_and_positions ----------------------------------------------------------------------------


def _cls_inputs(gen: torch.Generator, *, batch=(2, 4), positions_off_by: int = 0) -> dict:
    b, n, d = rand_int(gen, *batch), rand_int(gen, 2, 9), rand_int(gen, 2, 8)
    return {"args": (torch.randn(b, n, d, generator=gen), torch.randn(1, 1, d, generator=gen),
                     torch.randn(1, n + 1 + positions_off_by, d, generator=gen))}


@core.recorded
def _cls_outputs(tokens: Tensor, cls: Tensor, positions: Tensor) -> dict[str, Any]:
    """The right output ("expected"), and the output of each mistake of _CLS_MISTAKES (stacked)."""
    batch, n = tokens.shape[:2]
    cls_batch = cls.expand(batch, 1, -1)
    return core.stacked({"expected": torch.cat([cls_batch, tokens], dim=1) + positions,
                         "positions_first": torch.cat([cls_batch, tokens + positions[:, :n]], dim=1),
                         "cls_unplaced": torch.cat([cls_batch, tokens + positions[:, 1:]], dim=1),
                         "cls_last": torch.cat([tokens, cls_batch], dim=1) + positions,
                         "no_positions": torch.cat([cls_batch, tokens], dim=1)})


_CLS_MISTAKES = {
    "positions_first": "you added the positions before prepending [CLS]: [CLS] got none and each patch got its left "
    "neighbour's row. Prepend [CLS] first, then add all 1 + n_patches rows",
    "cls_unplaced": "[CLS] got no position vector: prepend it first, then add the whole position_embedding, whose row "
    "0 is [CLS]'s",
    "cls_last": "[CLS] goes first (position 0), not after the patches",
    "no_positions": "the position embeddings are missing: add position_embedding to the sequence",
}


def _judge_cls(inputs: dict, outputs: dict) -> None:
    tokens, cls, positions = inputs["args"]
    batch = tokens.shape[0]
    error = outputs.get("error")
    if error is not None:
        if batch > 1 and "size" in error["message"].lower():
            fail(f"your code raised {error['type']} with a batch of {batch}: cls_token is (1, 1, d_model), one token "
                 "for the whole batch; expand it over the batch (einops.repeat or .expand(batch, -1, -1)) before "
                 f"concatenating. ({error['message'][:120]})")
        _no_error(outputs)
    found = core.unstacked(_cls_outputs(tokens, cls, positions))
    expect(outputs["out"], found["expected"], "the output must be [CLS] followed by the patches, plus one position "
            "vector per token (row 0 for [CLS])", [(found[bug], message) for bug, message in _CLS_MISTAKES.items()])


def _cls_grad_inputs(gen: torch.Generator) -> dict:
    inputs = _cls_inputs(gen)
    tokens, cls, positions = inputs["args"]
    cotangent = torch.randn(tokens.shape[0], tokens.shape[1] + 1, tokens.shape[2], generator=gen)
    return {**inputs, "grad_args": [1, 2], "cotangent": cotangent}


def _judge_cls_grad(inputs: dict, outputs: dict) -> None:
    cotangent = inputs["cotangent"]
    grad_cls, grad_positions = outputs["grads"]
    if grad_cls is None:
        fail("no gradient reaches cls_token: do not detach it, use .data or copy its values into a new tensor — "
             "the [CLS] token could never be learned")
    if grad_positions is None:
        fail("no gradient reaches position_embedding: do not detach it or copy its values — the positions could "
             "never be learned")
    expect_close(grad_cls, cotangent[:, :1].sum(0, keepdim=True),
                 "the gradient of cls_token must be the sum over the batch of the gradients at position 0")
    expect_close(grad_positions, cotangent.sum(0, keepdim=True),
                 "the gradient of position_embedding must be the sum over the batch of every position's gradient")


def _judge_cls_wrong_positions(inputs: dict, outputs: dict) -> None:
    tokens, _, positions = inputs["args"]
    what = (f"{tokens.shape[1]} patches need 1 + {tokens.shape[1]} position vectors, and position_embedding has "
            f"{positions.shape[1]} (a model trained at another image size)")
    if outputs["error"] is None and positions.shape[1] > tokens.shape[1] + 1:
        fail(f"{what}: your code used the first rows and dropped the rest. A longer table belongs to another grid of "
             "patches, whose row k is not this grid's patch k: raise ValueError naming position_embedding (the "
             "model then says to interpolate the positions)")
    expect_value_error(outputs["error"], what, "position_embedding", word=False)


# --- VisionTransformer ------------------------------------------------------------------------------


@core.recorded
def _vit_state_shapes(config: tuple) -> list[tuple[str, tuple[int, ...]]]:
    """The reference model's state: (name, shape) in order."""
    return [(name, tuple(value.shape)) for name, value in reference.VisionTransformer(*config).state_dict().items()]


def _vit_inputs(gen: torch.Generator, *, channels: int = 3, batch=(2, 3), layers=(1, 2), wrong_size: bool = False,
                pool: str = "cls", dropout: float = 0.0) -> dict:
    p, grid = rand_int(gen, 2, 3), rand_int(gen, 2, 3)
    n_heads = [1, 2, 4][rand_int(gen, 0, 2)]
    d_model = n_heads * rand_int(gen, 2, 4)
    config = (grid * p, p, channels, rand_int(gen, 3, 6), d_model, rand_int(gen, *layers), n_heads, 2 * d_model)
    state = {}
    for name, shape in _vit_state_shapes(config):
        noise = torch.randn(shape, generator=gen)
        # LayerNorm scales near 1, everything else random: [CLS], positions and the head are not zero.
        state[name] = 1.0 + 0.2 * noise if "norm" in name and name.endswith("weight") else 0.3 * noise
    size = grid * p + (1 if wrong_size else 0)
    n_images = rand_int(gen, *batch)
    images = torch.randn(n_images, channels, size, size, generator=gen)
    inputs = {"init_args": config, "init_kwargs": {"pool": pool}, "state": state, "args": (images,)}
    if dropout:
        # Training mode: the embeddings' dropout gets this fixed mask, the layers' dropouts (given code) none.
        config = (*config, dropout)
        inputs["init_args"] = config
        mask = (torch.rand(n_images, grid * grid + 1, d_model, generator=gen) >= dropout).float() / (1 - dropout)
        inputs["masks"] = {"dropout": mask, **{f"layers.{i}.{name}": None for i in range(config[5])
                                               for name in ("dropout", "feed_forward.dropout")}}
    return inputs


def _torchvision_model(inputs: dict) -> nn.Module:
    """torchvision's VisionTransformer (3 channels) with the inputs' weights, mapped name by name."""
    image_size, p, channels, n_classes, d_model, n_layers, n_heads, d_ff = inputs["init_args"]
    state = inputs["state"]
    theirs: OrderedDict[str, Tensor] = OrderedDict()
    theirs["class_token"] = state["cls_token"]
    theirs["conv_proj.weight"] = rearrange(state["patch_embedding.weight"], "d (p1 p2 c) -> d c p1 p2", p1=p, p2=p)
    theirs["conv_proj.bias"] = state["patch_embedding.bias"]
    theirs["encoder.pos_embedding"] = state["position_embedding"]
    names = {"norm1": "ln_1", "norm2": "ln_2", "feed_forward.linear1": "mlp.0", "feed_forward.linear2": "mlp.3",
             "self_attn.in_proj.weight": "self_attention.in_proj_weight",
             "self_attn.in_proj.bias": "self_attention.in_proj_bias",
             "self_attn.out_proj": "self_attention.out_proj"}
    for i in range(n_layers):
        for ours, their in names.items():
            for key, value in state.items():
                if key.startswith(f"layers.{i}.{ours}"):
                    theirs[key.replace(f"layers.{i}.{ours}", f"encoder.layers.encoder_layer_{i}.{their}")] = value
    theirs["encoder.ln.weight"], theirs["encoder.ln.bias"] = state["norm.weight"], state["norm.bias"]
    theirs["heads.head.weight"], theirs["heads.head.bias"] = state["head.weight"], state["head.bias"]
    model = tv.VisionTransformer(image_size, p, n_layers, n_heads, d_model, d_ff, num_classes=n_classes)
    model.load_state_dict(theirs, strict=True)
    return model.eval()


@core.recorded
def _vit_variants(inputs: dict) -> dict[str, Any]:
    """The reference's logits and those of the known mistakes of the forward pass, from the reference's pieces
    (stacked); in training mode (the inputs have dropout masks), with the embeddings' dropout mask."""
    model = reference.VisionTransformer(*inputs["init_args"], **inputs["init_kwargs"])
    model.load_state_dict(inputs["state"])
    model.eval()
    (images,) = inputs["args"]
    mask = inputs.get("masks", {}).get("dropout")
    drop = (lambda x: x) if mask is None else (lambda x: x * mask)

    def encode(x: Tensor) -> Tensor:
        for layer in model.layers:
            x = layer(x)
        return x

    def pooled(h: Tensor) -> Tensor:
        return h[:, 0] if model.config.pool == "cls" else h[:, 1:].mean(1)

    with torch.no_grad():
        tokens = model.patch_embedding(reference.patchify(images, model.config.patch_size))
        with_cls = torch.cat([model.cls_token.expand(len(images), 1, -1), tokens], dim=1)
        embedded = drop(with_cls + model.position_embedding)
        h = encode(embedded)
        variants = {
            "reference": model.head(pooled(model.norm(h))),
            "last_token": model.head(model.norm(h)[:, -1]),
            "mean_all": model.head(model.norm(h).mean(1)),
            "cls_token": model.head(model.norm(h)[:, 0]),
            "mean_patches": model.head(model.norm(h)[:, 1:].mean(1)),
            "norm_after_pooling": model.head(model.norm(pooled(h))),
            "no_final_norm": model.head(pooled(h)),
            "no_positions": model.head(pooled(model.norm(encode(drop(with_cls))))),
            "no_blocks": model.head(pooled(model.norm(embedded))),
        }
        if mask is not None:
            variants["no_dropout"] = model.head(pooled(model.norm(encode(with_cls + model.position_embedding))))
            variants["dropout_before_positions"] = model.head(pooled(model.norm(encode(
                drop(with_cls) + model.position_embedding))))
        return core.stacked(variants)


_VIT_MISTAKES = {
    "last_token": "you classify from the last token: the [CLS] token is the first one, x[:, 0]",
    "mean_all": "you pool the mean of all tokens, [CLS] included: with pool='cls' the head reads the [CLS] output, "
                "x[:, 0]; with pool='mean' the mean of the patch tokens only, x[:, 1:]",
    "cls_token": "with pool='mean' the head reads the mean of the patch tokens' outputs (x[:, 1:].mean(1)), not [CLS]",
    "mean_patches": "with pool='cls' the head reads the [CLS] output, x[:, 0], not the mean of the patch tokens",
    "norm_after_pooling": "the final LayerNorm goes on every token's output before pooling (as in torchvision and "
                          "timm), not on the pooled vector",
    "no_final_norm": "the final LayerNorm is missing: head(pool(norm(x)))",
    "no_positions": "the position embeddings are missing: embed with add_cls_and_positions(tokens, self.cls_token, "
                    "self.position_embedding)",
    "no_blocks": "the encoder layers are not applied: x = layer(x) for every layer in self.layers",
    "no_dropout": "in training mode your embed drops nothing: self.dropout goes on the encoder's input, after the "
                  "positions are added",
    "dropout_before_positions": "dropout is applied before the positions are added: self.dropout goes on [CLS] + "
                                "patches + positions, the encoder's whole input",
}


def _judge_vit(inputs: dict, outputs: dict) -> None:
    _no_error(outputs)
    channels = inputs["init_args"][2]
    variants = core.unstacked(_vit_variants(inputs))
    if channels == 3 and inputs["init_kwargs"]["pool"] == "cls" and "masks" not in inputs:
        with torch.no_grad():
            expected = _torchvision_model(inputs)(*inputs["args"])
    else:  # torchvision has no mean pooling and no way to fix its dropout masks
        expected = variants["reference"]
    out = outputs["out"]
    if not same(out, expected, 1e-4):
        for bug, message in _VIT_MISTAKES.items():
            if bug in variants and same(out, variants[bug], 1e-4):
                fail(message)
    what = ("the logits differ from torchvision's VisionTransformer with the same weights: embed, every layer, the "
            "final norm, then the head on the [CLS] token") if inputs["init_kwargs"]["pool"] == "cls" else (
            "with pool='mean' the logits must be the head on the mean of the patch tokens' outputs after the final "
            "norm")
    expect_close(out, expected, what, atol=1e-4)


def _judge_vit_train(inputs: dict, outputs: dict) -> None:
    if outputs.get("error") is None and outputs["calls"]["dropout"] == 0:
        fail("in training mode your embed never calls self.dropout: the encoder's input is [CLS] + patches + "
             "positions, then self.dropout")
    _judge_vit(inputs, outputs)


def _judge_vit_wrong_size(inputs: dict, outputs: dict) -> None:
    size = inputs["init_args"][0]
    (images,) = inputs["args"]
    expect_value_error(outputs["error"], f"a model built for {size}×{size} images was given {images.shape[-2]}×"
                       f"{images.shape[-1]} images (call self._check_images)", "images", word=False)


# --- vit_parameter_count ------------------------------------------------------------------------------

_NAMED_SIZES = (  # (image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_ff)
    (224, 16, 3, 1000, 768, 12, 12, 3072),  # ViT-B/16
    (224, 32, 3, 1000, 768, 12, 12, 3072),  # ViT-B/32
    (224, 16, 3, 1000, 1024, 24, 16, 4096),  # ViT-L/16
    (224, 14, 3, 1000, 1280, 32, 16, 5120),  # ViT-H/14
    (384, 16, 3, 1000, 768, 12, 12, 3072),  # ViT-B/16 at 384 px
    (224, 16, 3, 1000, 192, 12, 3, 768),  # ViT-Ti/16
)


def _count_inputs(gen: torch.Generator, *, kind: str) -> dict:
    if kind == "b16":
        return {"args": _NAMED_SIZES[0]}
    if kind == "named":
        return {"args": _NAMED_SIZES[rand_int(gen, 1, len(_NAMED_SIZES) - 1)]}
    p, grid, n_heads = rand_int(gen, 2, 8), rand_int(gen, 2, 7), rand_int(gen, 1, 4)
    channels = rand_int(gen, 1, 4) if kind == "channels" else 3
    return {"args": (p * grid, p, channels, rand_int(gen, 2, 20), n_heads * rand_int(gen, 2, 16), rand_int(gen, 1, 4),
                     n_heads, rand_int(gen, 4, 64))}


@core.recorded
def _count_of(args: tuple) -> int:
    image_size, p, channels, n_classes, d_model, n_layers, n_heads, d_ff = args
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        if channels == 3:
            model = tv.VisionTransformer(image_size, p, n_layers, n_heads, d_model, d_ff, num_classes=n_classes)
        else:
            model = reference.VisionTransformer(*args)
    return sum(param.numel() for param in model.parameters())


def _judge_count(inputs: dict, outputs: dict) -> None:
    args = inputs["args"]
    image_size, p, channels, n_classes, d_model, n_layers, n_heads, d_ff = args
    got = outputs["out"]
    if isinstance(got, bool) or not isinstance(got, int):
        fail(f"return a Python int; got {type(got).__name__}")
    expected = _count_of(args)
    if got == expected:
        return
    where = (f"image_size={image_size}, patch_size={p}, in_channels={channels}, n_classes={n_classes}, "
             f"d_model={d_model}, n_layers={n_layers}, d_ff={d_ff}")
    n_patches = (image_size // p) ** 2
    diff = expected - got
    hints = {
        d_model: f"you are one d_model short: count the [CLS] token (1 × d_model) and one position vector per token, "
                 f"1 + {n_patches} rows",
        2 * d_model: "you are 2·d_model short: the [CLS] token and [CLS]'s row of the position embeddings, or the "
                     "final LayerNorm (d_model scales, d_model shifts)",
        (4 * n_layers + 2) * d_model: "the LayerNorms are missing: two per layer and one before the head, each "
                                      "d_model scales and d_model shifts",
        d_model + n_layers * (5 * d_model + d_ff) + n_classes: "the biases of the Linear layers are missing (patch "
                                                               "embedding, in_proj, out_proj, both feed-forward "
                                                               "layers, head)",
        n_layers * (d_model * d_model + d_model): "W_O is missing: attention has four d_model × d_model projections "
                                                  "(W_Q, W_K, W_V and W_O), each with a bias",
    }
    if channels > 1:
        hints[(channels - 1) * p * p * d_model] = (f"the patch embedding maps p·p·channels numbers (here "
                                                   f"{p * p * channels}) to d_model")
    if diff in hints:
        fail(f"{where}: {hints[diff]}")
    fail(f"{where}: expected {expected:,} parameters, got {got:,} ({diff:+,} missing)")


def _count_bad_inputs(gen: torch.Generator, *, what: str) -> dict:
    if what == "patch_size":
        p = rand_int(gen, 3, 7)
        return {"args": (p * rand_int(gen, 2, 5) + 1, p, 3, 10, 64, 2, 4, 128)}
    n_heads = rand_int(gen, 5, 7)
    return {"args": (32, 8, 3, 10, n_heads * 8 + 2, 2, n_heads, 128)}


def _judge_count_bad(inputs: dict, outputs: dict, *, argument: str) -> None:
    image_size, p, *_, d_model, _, n_heads, _ = inputs["args"]
    what = (f"image_size={image_size} is not divisible by patch_size={p}" if argument == "patch_size"
            else f"d_model={d_model} is not divisible by n_heads={n_heads}")
    expect_value_error(outputs["error"], what, argument, word=False)


# --- interpolate_position_embeddings -------------------------------------------------------------------


def _interp_inputs(gen: torch.Generator, *, grow: bool | None = True, dtype=torch.float32) -> dict:
    old = rand_int(gen, 2, 4)
    if grow is None:
        new = old
    elif grow:
        new = old + rand_int(gen, 1, 3)
    else:
        old += 2
        new = rand_int(gen, 2, old - 1)
    d = rand_int(gen, 2, 6)
    return {"args": (torch.randn(1, 1 + old * old, d, generator=gen, dtype=dtype), new)}


@core.recorded
def _interp_mistakes(positions: Tensor, new: int) -> dict[str, Any]:
    """The table each mistake of _INTERP_MISTAKES gives (stacked)."""
    d = positions.shape[-1]
    old = int(round((positions.shape[1] - 1) ** 0.5))
    cls, grid = positions[:, :1], positions[:, 1:]
    image = rearrange(grid, "1 (h w) d -> 1 d h w", h=old)

    def resized(mode: str, align: bool | None, source: Tensor = image) -> Tensor:
        return F.interpolate(source, size=(new, new), mode=mode, align_corners=align)

    def back(image_: Tensor) -> Tensor:
        return torch.cat([cls, rearrange(image_, "1 d h w -> 1 (h w) d")], dim=1)

    whole = F.interpolate(positions.transpose(1, 2), size=1 + new * new, mode="linear", align_corners=True)
    viewed = resized("bicubic", True, grid.reshape(1, d, old, old))
    return core.stacked({
        "viewed": back(viewed), "viewed_both_ways": torch.cat([cls, viewed.reshape(1, new * new, d)], dim=1),
        "one_sequence": whole.transpose(1, 2), "corners": back(resized("bicubic", False)),
        "bilinear": back(resized("bilinear", True)),
        "column_major": torch.cat([cls, rearrange(resized("bicubic", True), "1 d h w -> 1 (w h) d")], dim=1)})


_SCRAMBLED = ("you reshaped between (1, n_patches, d_model) and (1, d_model, h, w) without moving the axes, which "
              "scrambles features and positions: move d_model first (rearrange '1 (h w) d_model -> 1 d_model h w') "
              "and back the same way")
_INTERP_MISTAKES = {
    "viewed": _SCRAMBLED,
    "viewed_both_ways": _SCRAMBLED,
    "one_sequence": "you interpolated the table as one 1-D sequence, [CLS] included: the patch positions are a 2-D "
    "h×w grid; keep row 0 ([CLS]) apart and resize the grid in both directions",
    "corners": "use align_corners=True (torchvision's convention for ViT checkpoints): the grid's corner positions "
    "stay exactly at the corners",
    "bilinear": "use mode='bicubic', as torchvision does for ViT checkpoints",
    "column_major": "flatten the resized grid back row by row, (h w), the order patchify numbers the patches",
}


def _judge_interp(inputs: dict, outputs: dict) -> None:
    positions, new = inputs["args"]
    d = positions.shape[-1]
    old = int(round((positions.shape[1] - 1) ** 0.5))
    # torchvision's own function, on a throw-away state dict (it edits the dict it is given).
    patch = 4
    expected = tv.interpolate_embeddings(new * patch, patch, OrderedDict({"encoder.pos_embedding": positions}))[
        "encoder.pos_embedding"]
    found = core.unstacked(_interp_mistakes(positions, new))
    out = outputs["out"]
    if same(out, expected, 1e-5):
        return
    cls = positions[:, :1]
    mistakes = [(found[bug], message) for bug, message in _INTERP_MISTAKES.items()]
    if isinstance(out, Tensor) and tuple(out.shape) == (1, new * new, d):
        fail(f"keep [CLS]'s position (row 0) in front: expected shape (1, {1 + new * new}, {d})")
    if isinstance(out, Tensor) and tuple(out.shape) == tuple(expected.shape) and not torch.allclose(
            out[:, :1].to(cls.dtype), cls):
        fail("row 0 belongs to [CLS], which has no place on the grid: keep it unchanged and resize only the patch rows")
    expect(out, expected, f"resize the {old}×{old} grid of patch positions to {new}×{new} (bicubic, corners "
                          "aligned) and keep [CLS]'s row in front", mistakes)


def _interp_bad_inputs(gen: torch.Generator) -> dict:
    side = rand_int(gen, 2, 4)
    return {"args": (torch.randn(1, 1 + side * side + rand_int(gen, 1, side), 4, generator=gen), side + 1)}


def _judge_interp_bad(inputs: dict, outputs: dict) -> None:
    positions = inputs["args"][0]
    expect_value_error(outputs["error"], f"{positions.shape[1] - 1} patch positions do not make a square grid",
                       "position_embedding", word=False)


# --- attention_rollout ------------------------------------------------------------------------------------


def _rollout_inputs(gen: torch.Generator, *, layers=(2, 3), unnormalised: bool = False, identity: bool = False,
                    dtype=torch.float32) -> dict:
    n_layers, batch, heads, seq = rand_int(gen, *layers), rand_int(gen, 1, 3), rand_int(gen, 2, 4), rand_int(gen, 3, 6)
    attentions = (2.0 * torch.randn(n_layers, batch, heads, seq, seq, generator=gen, dtype=dtype)).softmax(-1)
    if identity:
        attentions = torch.eye(seq, dtype=dtype).expand(n_layers, batch, heads, seq, seq).clone()
    if unnormalised:  # as after dropout: each row scaled, no longer summing to 1
        attentions = attentions * (0.5 + torch.rand(n_layers, batch, heads, seq, 1, generator=gen, dtype=dtype))
    return {"args": (attentions,)}


@core.recorded
def _rollouts(attentions: Tensor) -> dict[str, Any]:
    """The rollout ("expected") and what each mistake of _ROLLOUT_MISTAKES gives (stacked)."""
    seq = attentions.shape[-1]
    identity = torch.eye(seq, dtype=attentions.dtype)

    def roll(per_layer: Tensor, *, residual: bool = True, normalise: bool = True, reverse: bool = False) -> Tensor:
        out = identity.expand(per_layer.shape[1], seq, seq)
        for a in per_layer:
            mixed = 0.5 * a + 0.5 * identity if residual else a
            mixed = mixed / mixed.sum(-1, keepdim=True) if normalise else mixed
            out = out @ mixed if reverse else mixed @ out
        return out

    mean = attentions.mean(2)
    heads = attentions.shape[2]
    per_head = torch.stack([roll(attentions[:, :, h]) for h in range(heads)]).mean(0)
    return core.stacked({"expected": roll(mean), "reversed": roll(mean, reverse=True), "no_residual": roll(mean,
                         residual=False), "max_heads": roll(attentions.amax(2)), "sum_heads": roll(attentions.sum(2)),
                         "no_renormalisation": roll(mean, normalise=False), "last_layer_only": roll(mean[-1:]),
                         "per_head": per_head})


_ROLLOUT_MISTAKES = {
    "reversed": "the product is in the wrong order: each layer mixes the tokens of the layer below, so layer l's "
    "matrix multiplies from the left (rollout = mixed_l @ rollout): the last layer is the leftmost factor",
    "no_residual": "the residual connection is missing: mix each layer's mean attention half and half with the "
    "identity, 0.5·A + 0.5·I (Abnar & Zuidema), before multiplying",
    "max_heads": "the heads are combined with their max: average them (the mean over heads)",
    "sum_heads": "the heads are summed: average them (the mean over heads), so that the attention and the identity "
    "weigh half each",
    "no_renormalisation": "the rows are not renormalised: after 0.5·A + 0.5·I divide each row by its sum — attention "
    "rows that do not sum to 1 (after dropout, or a subset of heads) otherwise grow or shrink through the product",
    "last_layer_only": "that is the last layer alone: the rollout multiplies the matrices of every layer",
    "per_head": "you rolled out each head separately and averaged the results: average each layer's heads first, "
    "then multiply the layers",
}


def _judge_rollout(inputs: dict, outputs: dict) -> None:
    _no_error(outputs)
    (attentions,) = inputs["args"]
    found = core.unstacked(_rollouts(attentions))
    out = outputs["out"]
    if isinstance(out, Tensor) and tuple(out.shape) == tuple(found["expected"].shape) and out.is_floating_point() \
            and not torch.allclose(out.sum(-1).to(attentions.dtype), torch.ones(out.shape[:-1], dtype=attentions.dtype),
                                   atol=1e-4) and not same(out, found["no_renormalisation"], 1e-5, dtype="cast"):
        fail("the rows of your rollout do not sum to 1: every factor must be a row-stochastic mixing matrix "
             "(0.5·A + 0.5·I, rows renormalised)")
    mistakes = [(found[bug], message) for bug, message in _ROLLOUT_MISTAKES.items()]
    expect(out, found["expected"], "the rollout of attentions (layers, batch, heads, seq, seq) is (batch, seq, seq): "
           "per layer the heads' mean, 0.5·A + 0.5·I with rows renormalised, multiplied from the first layer to the "
           "last, each new one on the left", mistakes)


def _rollout_bad_inputs(gen: torch.Generator) -> dict:
    return {"args": (torch.rand(2, 3, 4, 5, generator=gen),)}  # no batch axis: (layers, heads, seq, seq)


def _judge_rollout_bad(inputs: dict, outputs: dict) -> None:
    expect_value_error(outputs["error"], f"attentions of shape {tuple(inputs['args'][0].shape)} is not (layers, batch, "
                       "heads, seq, seq)", "attentions", word=False)


CHECKS: dict[str, Check] = {
    "patchify": Check(
        name="patchify",
        visible=(
            Case("patch k is the image block it claims to be", _patch_inputs, "call", _judge_patchify),
            Case("an image size not divisible by patch_size", _indivisible_inputs, "call_or_error", _judge_indivisible),
        ),
        hidden=(
            Case("one channel", lambda g: _patch_inputs(g, channels=(1, 1)), "call", _judge_patchify),
            Case("patch_size 1 and a single patch", lambda g: _patch_inputs(g, patch=(1, 1), grid=(1, 3), square=True),
                 "call", _judge_patchify),
            Case("larger images, float64", lambda g: _patch_inputs(g, channels=(3, 4), grid=(3, 6), patch=(2, 5),
                                                                   dtype=torch.float64), "call", _judge_patchify),
            Case("only the height is not divisible", lambda g: _indivisible_inputs(g, only_height=True),
                 "call_or_error", _judge_indivisible),
        ),
    ),
    "patch_embedding_from_conv": Check(
        name="patch_embedding_from_conv",
        visible=(
            Case("linear(patchify(x)) equals the strided conv", _conv_inputs, "linear_from_conv", _judge_conv),
            Case("the same conv made with tuples and padding='valid' is accepted",
                 lambda g: _conv_inputs(g, habits=True), "linear_from_conv", _judge_conv),
        ),
        hidden=(
            Case("a conv without bias", lambda g: _conv_inputs(g, bias=False), "linear_from_conv", _judge_conv),
            Case("one channel, float64", lambda g: _conv_inputs(g, channels=(1, 1), dtype=torch.float64),
                 "linear_from_conv", _judge_conv),
            Case("stride smaller than the kernel", lambda g: _conv_inputs(g, stride=1), "linear_from_conv",
                 _judge_conv_not_patches),
        ),
    ),
    "add_cls_and_positions": Check(
        name="add_cls_and_positions",
        visible=(
            Case("[CLS] first, for every image of the batch, then positions", _cls_inputs, "call_or_error", _judge_cls),
            Case("a position table longer than needed (another image size) is refused",
                 lambda g: _cls_inputs(g, positions_off_by=rand_int(g, 1, 3)), "call_or_error",
                 _judge_cls_wrong_positions),
            Case("gradients reach [CLS] and the positions", _cls_grad_inputs, "call_with_grad", _judge_cls_grad),
        ),
        hidden=(
            Case("a batch of one", lambda g: _cls_inputs(g, batch=(1, 1)), "call_or_error", _judge_cls),
            Case("larger batches", lambda g: _cls_inputs(g, batch=(5, 8)), "call_or_error", _judge_cls),
            Case("position embeddings for another number of patches", lambda g: _cls_inputs(g, positions_off_by=-1),
                 "call_or_error", _judge_cls_wrong_positions),
        ),
    ),
    "VisionTransformer": Check(
        name="VisionTransformer",
        visible=(
            Case("logits equal torchvision's VisionTransformer with the same weights", _vit_inputs, "module_forward",
                 _judge_vit),
            Case("pool='mean': the head reads the mean of the patch tokens' outputs",
                 lambda g: _vit_inputs(g, pool="mean"), "module_forward", _judge_vit),
            Case("training mode: dropout on the encoder's whole input (a fixed mask)",
                 lambda g: _vit_inputs(g, dropout=0.5), "module_forward_fixed_dropout", _judge_vit_train),
        ),
        hidden=(
            Case("a batch of one, two layers", lambda g: _vit_inputs(g, batch=(1, 1), layers=(2, 2)), "module_forward",
                 _judge_vit),
            Case("grey images (one channel)", lambda g: _vit_inputs(g, channels=1), "module_forward", _judge_vit),
            Case("pool='mean', two layers, grey", lambda g: _vit_inputs(g, pool="mean", channels=1, layers=(2, 2)),
                 "module_forward", _judge_vit),
            Case("training mode, pool='mean'", lambda g: _vit_inputs(g, dropout=0.3, pool="mean"),
                 "module_forward_fixed_dropout", _judge_vit_train),
            Case("images of another size", lambda g: _vit_inputs(g, wrong_size=True), "module_forward_or_error",
                 _judge_vit_wrong_size),
        ),
    ),
    "vit_parameter_count": Check(
        name="vit_parameter_count",
        visible=(
            Case("ViT-B/16 has as many parameters as torchvision's vit_b_16", lambda g: _count_inputs(g, kind="b16"),
                 "call", _judge_count),
            Case("a small ViT", lambda g: _count_inputs(g, kind="small"), "call", _judge_count),
        ),
        hidden=(
            Case("ViT-B/32, L/16, H/14, Ti/16 and B/16 at 384 px", lambda g: _count_inputs(g, kind="named"), "call",
                 _judge_count),
            Case("1 to 4 input channels", lambda g: _count_inputs(g, kind="channels"), "call", _judge_count),
            Case("image_size not divisible by patch_size", lambda g: _count_bad_inputs(g, what="patch_size"),
                 "call_or_error", lambda i, o: _judge_count_bad(i, o, argument="patch_size")),
            Case("d_model not divisible by n_heads", lambda g: _count_bad_inputs(g, what="n_heads"), "call_or_error",
                 lambda i, o: _judge_count_bad(i, o, argument="n_heads")),
        ),
        # Building the model and counting its tensors is the reference, not the exercise: a formula needs neither.
        forbidden=("empty*", "numel"),
    ),
    "interpolate_position_embeddings": Check(
        name="interpolate_position_embeddings",
        visible=(
            Case("a larger grid equals torchvision's interpolate_embeddings", _interp_inputs, "call", _judge_interp),
        ),
        hidden=(
            Case("a smaller grid", lambda g: _interp_inputs(g, grow=False), "call", _judge_interp),
            Case("the same grid gives the table back", lambda g: _interp_inputs(g, grow=None), "call", _judge_interp),
            Case("float64", lambda g: _interp_inputs(g, dtype=torch.float64), "call", _judge_interp),
            Case("patch positions that are not a square grid", _interp_bad_inputs, "call_or_error", _judge_interp_bad),
        ),
        # torchvision's function is what the check compares with (the notebook says not to call it).
        forbidden=("torchvision.models.vision_transformer.interpolate_embeddings",),
    ),
    "attention_rollout": Check(
        name="attention_rollout",
        visible=(
            Case("equals the rollout written out (3 layers of attention that do not commute)",
                 lambda g: _rollout_inputs(g, layers=(3, 3)), "call_or_error", _judge_rollout),
            Case("attention rows that do not sum to 1 (as after dropout): the rollout's rows still do",
                 lambda g: _rollout_inputs(g, unnormalised=True), "call_or_error", _judge_rollout),
            Case("attentions that are not (layers, batch, heads, seq, seq)", _rollout_bad_inputs, "call_or_error",
                 _judge_rollout_bad),
        ),
        hidden=(
            Case("one layer", lambda g: _rollout_inputs(g, layers=(1, 1)), "call_or_error", _judge_rollout),
            Case("identity attention rolls out to the identity", lambda g: _rollout_inputs(g, identity=True),
                 "call_or_error", _judge_rollout),
            Case("float64, up to 5 layers", lambda g: _rollout_inputs(g, layers=(4, 5), dtype=torch.float64),
                 "call_or_error", _judge_rollout),
            Case("unnormalised rows again", lambda g: _rollout_inputs(g, unnormalised=True, layers=(2, 4)),
                 "call_or_error", _judge_rollout),
        ),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "run", "CheckFailed"]
