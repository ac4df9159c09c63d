"""A second start of Generator.from_pretrained that builds no model.

A first start of a checkpoint stores, beside its two programs (program_cache.py), what a
start needs that only the built model knew: a StartRecord. A later start with the same
checkpoint and arguments finds it under a key made from the files alone and goes straight to
the programs and the weights: transformers is not imported and no model is built (on the
TinyLlama shape that was 1.6 s of a warm start and 0.2 GB of its peak memory: docs/memory.md).

The key digests config.json and generation_config.json (their bytes), each shard's
safetensors header (every tensor's name, dtype and shape, not its values), from_pretrained's
arguments and options, the machine and the instruction set the C is built for (an AVX2
build's choices are not an AVX-512 one's), the versions of Python, torch and transformers (the
installed one, read without importing it) and eqsat_llm's own source. A model whose code is
edited in place, with no new transformers version, is not seen: `EQSAT_PROGRAM_CACHE=0` turns
this off with the program cache."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import platform
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch

from ..cache import cache_dir, load_pickled, store_verified
from .checkpoint import Checkpoint

_FORMAT = 1  # bumped when what a record holds changes


@dataclass
class StartRecord:
    """What a start of a checkpoint's Generator needs beyond the checkpoint's files."""

    programs: dict[int, str]  # tokens per call (1: the decode step) -> program cache key
    backend: str
    caches: list[tuple[str, tuple[int, ...], torch.dtype]]  # the KV cache buffers
    key_of: dict[str, str]  # parameter name -> the checkpoint tensor it reads (tied: one)
    buffers: dict[str, torch.Tensor]  # buffers the model computes from its config (rotary)
    eos_token_id: Any  # the model's generation defaults
    pad_token_id: Any


def key(ckpt: Checkpoint, arguments: dict[str, Any]) -> str | None:
    """The record's name for a start of `ckpt` with from_pretrained's `arguments` (None
    where the program cache is off)."""
    if os.environ.get("EQSAT_PROGRAM_CACHE", "1") == "0":
        return None
    from ..codegen.c.build import isa_fingerprint
    from ..extraction.costmodel import CostModel
    from .program_cache import _describe, _library_digest

    h = hashlib.sha256()

    def add(*parts: Any) -> None:
        for p in parts:
            h.update(p if isinstance(p, bytes) else str(p).encode())
            h.update(b"\0")

    add(_FORMAT, platform.python_version(), torch.__version__, _installed("transformers"),
        _library_digest(), repr(CostModel().machine), isa_fingerprint())
    for name in ("config.json", "generation_config.json"):
        path = ckpt.path / name
        add(name, path.read_bytes() if path.is_file() else b"-")
    for shard, header in ckpt.headers():
        add(shard, header)
    for name in sorted(arguments):
        if name != "progress":
            add(name, _describe(arguments[name]))
    return h.hexdigest()


def facts(ckpt: Checkpoint, model: Any, step: Any, graphs: list[Any]) -> dict[str, Any]:
    """A StartRecord's fields but the programs, read off the meta-device `model`, its
    CachedStep `step` and the programs' `graphs`: the buffers kept are those the graphs
    read (CheckpointWeights resolves each name as a load would)."""
    from ..weights.lazy_weights import source_names

    source = ckpt.weight_source(model)
    for name in sorted(set().union(*(source_names(g.constants) for g in graphs))):
        if source.key(name) is None:
            source(name)  # a buffer: computed from the config, noted in buffers_read
    config = getattr(model, "generation_config", None)
    return {"caches": [(n, tuple(c.shape), c.dtype)
                       for n, c in zip(step.cache_names(), step.caches())],
            "key_of": source.key_of, "buffers": dict(source.buffers_read),
            "eos_token_id": getattr(config, "eos_token_id", None),
            "pad_token_id": getattr(config, "pad_token_id", None)}


def store_part(name: str, tokens: int, program: Any, fields: dict[str, Any]) -> None:
    """What a parallel start's child knows of the record `name`: its program (`tokens` per
    call) and the model's facts; the parent joins the parts (join_parts)."""
    buf = io.BytesIO()
    pickle.dump((program.cached_as, program._backend, fields), buf,
                protocol=pickle.HIGHEST_PROTOCOL)
    store_verified(cache_dir("starts") / f"{name}.{tokens}.part", buf.getvalue())


def join_parts(name: str, tokens: list[int]) -> StartRecord | None:
    """The record `name` from its children's parts (each removed), stored; None when one is
    missing or they disagree."""
    parts = []
    for t in tokens:
        path = cache_dir("starts") / f"{name}.{t}.part"
        parts.append(load_pickled(path, "start record part"))
        path.unlink(missing_ok=True)
    if None in parts or any(p[0] is None for p in parts) or \
            len({p[1] for p in parts}) != 1 or len({repr(p[2]["caches"]) for p in parts}) != 1:
        return None
    buffers = {k: v for p in parts for k, v in p[2]["buffers"].items()}  # each graph's
    record = StartRecord(programs={t: p[0] for t, p in zip(tokens, parts)},
                         backend=parts[0][1], **(parts[0][2] | {"buffers": buffers}))
    store(name, record)
    return record


def load(name: str) -> StartRecord | None:
    """The record stored under `name`, or None (absent; unreadable: warned, then rebuilt)."""
    record = load_pickled(cache_dir("starts") / f"{name}.pkl", "start record")
    return record if isinstance(record, StartRecord) else None


def store(name: str, record: StartRecord) -> None:
    buf = io.BytesIO()
    pickle.dump(record, buf, protocol=pickle.HIGHEST_PROTOCOL)
    store_verified(cache_dir("starts") / f"{name}.pkl", buf.getvalue())


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"
