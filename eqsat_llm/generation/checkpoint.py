"""A checkpoint directory as transformers' `save_pretrained` writes it: config.json and one or
several safetensors shards (model.safetensors, or model-0000k-of-0000n.safetensors with
model.safetensors.index.json).

    ckpt = Checkpoint(path)
    model = ckpt.empty_model()             # parameters on the meta device, buffers real
    source = ckpt.weight_source(model)     # graph constant name -> tensor read from its shard

The shards are memory-mapped and read one tensor at a time (weights/lazy_weights.py makes each
prepared weight from them and drops the source bytes), so the full-precision model is never
held. An FP8 checkpoint's block-scaled weights are dequantized as they are read, as
transformers does on a CPU (fp8_checkpoint.py). Every problem is an EqsatError that names the
file or the tensor.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import EqsatError
from ..weights.meta import suffixes
from . import fp8_checkpoint
from .converted_layout import Converted, converted_tensors

INDEX = "model.safetensors.index.json"


class Checkpoint:
    def __init__(self, path: str | Path):
        self.path = path = Path(path)
        if not path.is_dir():
            raise EqsatError(f"{path}: not a checkpoint directory")
        if not (path / "config.json").is_file():
            raise EqsatError(f"{path}: no config.json (a directory as save_pretrained "
                             "writes it: config.json and model*.safetensors)")
        self._config: Any = None
        self._where = _tensor_files(path)
        self._converted: dict[str, Converted] | None = None  # (converted_layout.py)
        self.total_bytes = sum(f.stat().st_size for f in set(self._where.values()))
        self.bytes_read = 0  # of tensors read so far (tensor())
        self.on_read: Callable[[int], None] | None = None  # told bytes_read after each read

    @property
    def config(self) -> Any:
        """config.json as transformers reads it (read on first use: a warm start of
        warm_start.py never imports transformers)."""
        if self._config is None:
            self._config = _config(self.path)
        return self._config

    @property
    def quant_method(self) -> str | None:
        """config.json's quantization method (fp8_checkpoint.method_of), read from the JSON
        itself: a warm start never imports transformers."""
        raw = json.loads((self.path / "config.json").read_text())
        return fp8_checkpoint.method_of(raw.get("quantization_config"))

    def headers(self) -> list[tuple[str, bytes]]:
        """Each shard's name and safetensors header (every tensor's name, dtype, shape and
        offsets: what the checkpoint is, without its values), in name order."""
        out = []
        for file in sorted(set(self._where.values())):
            try:
                with file.open("rb") as f:
                    size = int.from_bytes(f.read(8), "little")
                    header = f.read(size)
            except OSError as exc:
                raise EqsatError(f"{file}: cannot read ({exc})") from exc
            if len(header) != size:
                raise EqsatError(f"{file}: truncated safetensors header")
            out.append((file.name, header))
        return out

    def keys(self) -> list[str]:
        return list(self._where)

    @property
    def converted(self) -> dict[str, Converted]:
        """The model's tensors made of stored ones as transformers converts them (renamed
        modules, experts stored one tensor each: converted_layout.py), by model name."""
        if self._converted is None:
            self._converted = converted_tensors(self.config, self._where)
        return self._converted

    def has(self, key: str) -> bool:
        """Whether the model's tensor `key` is stored, or made of stored ones."""
        return key in self._where or key in self.converted

    def _made(self, key: str) -> Converted | None:
        """How `key` is made of stored tensors, where it is not stored itself."""
        return None if key in self._where else self.converted.get(key)

    def shape(self, key: str) -> tuple[int, ...]:
        if made := self._made(key):
            return made.shape(self.shape)
        with self._handle(key) as f:
            return tuple(f.get_slice(key).get_shape())

    def tensor(self, key: str) -> torch.Tensor:
        """One tensor, read from its memory-mapped shard (a converted one from those it is
        made of, one at a time). The shard is mapped for this read alone: a mapping kept open
        would keep every page read through it resident."""
        if made := self._made(key):
            return made.make(self.tensor)
        t = self._stored(key)
        if scales := fp8_checkpoint.scale_key(key, self._where):
            return fp8_checkpoint.dequantized(t, self._stored(scales), t.shape[0], name=key)
        return fp8_checkpoint.unscaled(t, key, self._where[key].name)

    def as_format(self, key: str, fmt: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The float8 weight `key` with its block scales in the grouped float8 format `fmt`,
        its bytes and scales as stored (fp8_checkpoint.as_format); None for any other."""
        scales = fp8_checkpoint.scale_key(key, self._where)
        if scales is None or self._made(key):
            return None
        return fp8_checkpoint.as_format(self._stored(key), self._stored(scales), fmt, key)

    def _stored(self, key: str, start: int | None = None, stop: int | None = None
                ) -> torch.Tensor:
        """The tensor `key` as its shard stores it (rows [start, stop) when given)."""
        try:
            with self._handle(key) as f:
                t = f.get_tensor(key) if start is None else f.get_slice(key)[start:stop]
        except EqsatError:
            raise
        except Exception as exc:  # safetensors raises its own types for bad bytes
            what = f"tensor {key}" if start is None else f"rows {start}:{stop} of tensor {key}"
            raise EqsatError(f"{self._where[key].name}: cannot read {what} ({exc})") from exc
        self.bytes_read += t.numel() * t.element_size()
        if self.on_read is not None:
            self.on_read(self.bytes_read)
        return t

    def _handle(self, key: str) -> Any:
        from safetensors import safe_open

        if key not in self._where:
            raise EqsatError(f"{self.path}: the checkpoint has no tensor {key}")
        file = self._where[key]
        try:
            return safe_open(str(file), framework="pt")
        except Exception as exc:
            raise EqsatError(f"{file}: not a readable safetensors file, truncated or "
                             f"corrupt ({exc})") from exc

    def empty_model(self, dtype: torch.dtype | None = None, *, buffers: bool = False
                    ) -> nn.Module:
        """The causal LM of config.json on the meta device (no bytes); with `buffers`, its
        buffers real (rotary tables are computed from the config, not stored: the weight
        source reads them there). `dtype` defaults to the checkpoint's."""
        from transformers import AutoModelForCausalLM

        fp8_checkpoint.check_method(self.config, self.path)
        dtype = dtype or _dtype(self.config)
        try:
            with parameters_on_meta() if buffers else torch.device("meta"):
                model = AutoModelForCausalLM.from_config(self.config, dtype=dtype)
        except Exception as exc:
            raise EqsatError(f"{self.path}: cannot build {type(self.config).__name__}'s causal "
                             f"LM on the meta device ({exc})") from exc
        model.eval()
        self.check(model)
        return model

    def check(self, model: nn.Module) -> None:
        """Every parameter has a tensor of its shape in the checkpoint (tied ones once)."""
        for names in _tied_names(model).values():
            key = next((n for n in names if self.has(n)), None)
            if key is None:
                raise EqsatError(f"{self.path}: the checkpoint has no tensor {names[0]}"
                                 + _converted_layout(self.config))
            want = tuple(model.get_parameter(names[0]).shape)
            if self.shape(key) != want:
                where = self._where[key].name if key in self._where else "the checkpoint"
                raise EqsatError(f"{where}: tensor {key} has shape "
                                 f"{list(self.shape(key))}, the config's model "
                                 f"{list(want)}")

    def weight_source(self, model: nn.Module) -> CheckpointWeights:
        """Graph constant name -> tensor read from its shard (CheckpointWeights)."""
        return CheckpointWeights(self, tied_keys(self, model), lambda: self.empty_model(
            next(model.parameters()).dtype, buffers=True).named_buffers())

    def rows(self, key: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of the tensor `key` (dim 0), read alone from its shard."""
        if self._made(key):
            return self.tensor(key)[start:stop]
        t = self._stored(key, start, stop)
        if scales := fp8_checkpoint.scale_key(key, self._where):
            return fp8_checkpoint.dequantized(t, self._stored(scales), self.shape(key)[0],
                                              start, name=key)
        return fp8_checkpoint.unscaled(t, key, self._where[key].name)


def tied_keys(checkpoint: Checkpoint, model: nn.Module) -> dict[str, str]:
    """Each parameter name of `model` -> the checkpoint's tensor it reads (tied names one)."""
    key_of: dict[str, str] = {}
    for names in _tied_names(model).values():
        key = next(n for n in names if checkpoint.has(n))
        key_of.update(dict.fromkeys(names, key))
    return key_of


class MadeInForward(EqsatError):
    """The programs read tensors the model makes as it runs, which a checkpoint does not hold
    (from_pretrained then loads the model: Generator.from_pretrained)."""


class CheckpointWeights:
    """A checkpoint as a weight source (lazy_weights.WeightSource): graph constant name ->
    tensor read from its shard, by the longest suffix of the name that is a parameter name in
    `key_of` (meta.suffixes; each -> the checkpoint's tensor, tied names to one), else a buffer
    of `buffers()` (name, tensor pairs the model computes from its config: rotary tables;
    called once, when first needed). `rows` reads part of one, so that a large weight is
    prepared a slice at a time (lazy_weights.LazyConstants). `buffers_read`: those read."""

    def __init__(self, checkpoint: Checkpoint, key_of: dict[str, str],
                 buffers: Callable[[], Any]):
        self.checkpoint, self.key_of, self._make_buffers = checkpoint, key_of, buffers
        self._buffers: dict[str, torch.Tensor] = {}
        self.buffers_read: dict[str, torch.Tensor] = {}

    def __call__(self, name: str) -> torch.Tensor:
        key = self.key(name)
        if key is not None:
            return self.checkpoint.tensor(key)
        suffix = self._buffer(name)
        if suffix is None:
            raise EqsatError(f"weight {name}: no parameter or buffer of the checkpoint's "
                             "model")
        self.buffers_read[suffix] = self._buffers[suffix]
        return self._buffers[suffix]

    def _buffer(self, name: str) -> str | None:
        """The name of the model's buffer that the weight `name` is, or None."""
        if not self._buffers:  # the buffers a meta model lacks, computed once
            self._buffers.update(self._make_buffers())
        return next((s for s in suffixes(name) if s in self._buffers), None)

    def missing(self, names: Any) -> list[str]:
        """Those of `names` neither the checkpoint nor the model's buffers hold: tensors the
        model makes as it runs (lifted by export: Falcon's index constants), whose values the
        meta model the programs were planned on did not have."""
        return sorted(n for n in names if self.key(n) is None and self._buffer(n) is None)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor | None:
        """Rows [start, stop) of the weight `name`; None for a buffer (computed whole)."""
        key = self.key(name)
        return None if key is None else self.checkpoint.rows(key, start, stop)

    def as_format(self, name: str, fmt: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The transposed weight `name` as the checkpoint's own float8 bytes and scales in
        the format `fmt` (Checkpoint.as_format), or None."""
        key = self.key(name)
        return None if key is None else self.checkpoint.as_format(key, fmt)

    def key(self, name: str) -> str | None:
        """The checkpoint tensor the weight `name` reads; None for a buffer."""
        return next((self.key_of[s] for s in suffixes(name) if s in self.key_of), None)


def _converted_layout(config: Any) -> str:
    """Why a tensor may be missing: transformers converts this family's checkpoints as it
    loads them (per-expert tensors stacked into its fused experts, renamed modules), which
    this reader does not do yet; "" where transformers converts nothing."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        if not get_checkpoint_conversion_mapping(config.model_type):
            return ""
    except Exception:  # noqa: BLE001 - an older transformers: nothing to say
        return ""
    return (f" ({config.model_type} checkpoints store weights in a layout transformers "
            "converts as it loads them; from_pretrained reads its renames and experts stored "
            "one tensor each, and this checkpoint needs more: load the model with "
            "transformers and pass it to Generator(model, ...), which plans it on its meta "
            "twin the same way)")


def _config(path: Path) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise EqsatError(f"{path / 'config.json'}: not a config transformers can read "
                         f"({exc})") from exc


def _tensor_files(path: Path) -> dict[str, Path]:
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise EqsatError(f"{index}: not a safetensors index ({exc})") from exc
        where = {k: path / f for k, f in weight_map.items()}
        for file in sorted(set(where.values())):
            if not file.is_file():
                raise EqsatError(f"{file}: a shard the index names is missing")
        return where
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EqsatError(f"{path}: no *.safetensors file")
    where = {}
    for file in files:
        try:
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as f:
                where.update(dict.fromkeys(f.keys(), file))
        except Exception as exc:
            raise EqsatError(f"{file}: not a readable safetensors file, truncated or corrupt "
                             f"({exc})") from exc
    return where


def _dtype(config: Any) -> torch.dtype:
    dt = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dt, str):
        dt = getattr(torch, dt, None)
    return dt if isinstance(dt, torch.dtype) else torch.float32


def _tied_names(model: nn.Module) -> dict[int, list[str]]:
    """Each distinct parameter's names (tied ones share a tensor), in module order."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return groups


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device, their buffers where they
    are made (a rotary embedding's inv_freq is computed from the config, not stored)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]
