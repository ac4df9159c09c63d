"""An on-disk cache of optimized programs for models on the meta device.

A model built on the meta device (Generator.from_pretrained, or a loaded model's meta twin)
has no weight values: its optimized program (the extracted, folded graph whose weights are
recipes, the captured call structure, the report, the memory plan) depends only on what the
model is and on the options. A second start of the same model in a new process takes the
program from here and skips capture, saturation, extraction and planning; the C object is
cached apart (codegen/c/build.py), and the weights are streamed from the checkpoint as on a
first start.

The key is a SHA-256 of everything the program is made from: the model's module tree and
config, the names, shapes and dtypes of its parameters and buffers, the source files of its
module classes, the example inputs' shapes and dtypes, the options (each rule by name and
text), the cost model's machine, the instruction set the C is built for (isa_fingerprint:
the cost model prices kernels by their fast paths), the versions of Python, torch and
transformers, and the source of eqsat_llm itself. Entries live in
$XDG_CACHE_HOME/eqsat-llm/programs/ (cache.py: private, written atomically, loaded only when
their bytes match their digest); one that cannot be read back is rebuilt with a warning.
`EQSAT_PROGRAM_CACHE=0` turns it off."""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import pickle
import platform
from functools import cache
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_dir, load_pickled, store_verified
from ..codegen.c.build import isa_fingerprint
from ..weights.meta import exact_half_weights

_FORMAT = 2  # bumped when what an entry holds changes (2: the memory plan too)


def enabled(model: Any) -> bool:
    """Whether optimize() uses the cache for `model`: an nn.Module whose parameters and
    buffers are all on the meta device (nothing of a weight's values can enter an entry)."""
    if os.environ.get("EQSAT_PROGRAM_CACHE", "1") == "0" or not isinstance(model,
                                                                          torch.nn.Module):
        return False
    tensors = [*model.parameters(), *model.buffers()]
    return bool(tensors) and all(t.is_meta for t in tensors)


def key(model: torch.nn.Module, inputs: tuple, kwargs: dict | None, options: dict[str, Any],
        machine: Any) -> str:
    """The entry's name: a digest of what the optimized program depends on."""
    h = hashlib.sha256()

    def add(*parts: Any) -> None:
        for p in parts:
            h.update(str(p).encode())
            h.update(b"\0")

    add(_FORMAT, platform.python_version(), torch.__version__, _transformers_version(),
        _library_digest(), repr(machine), isa_fingerprint())
    add(type(model).__module__, type(model).__qualname__, repr(model))
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        add(name, tuple(t.shape), t.dtype, tuple(t.stride()))
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(config, "to_json_string"):
            add(config.to_json_string(use_diff=False))
    for cls in sorted({type(m) for m in model.modules()}, key=lambda c: c.__qualname__):
        add(cls.__qualname__, _source_digest(cls))
    for x in [*inputs, *sorted((kwargs or {}).items())]:
        add(_describe(x))
    for name in sorted(options):
        add(name, _describe(options[name]))
    add(exact_half_weights())  # (a meta twin's weights that its loaded model has half-exact)
    return h.hexdigest()


def load(name: str) -> tuple[Any, ...] | None:
    """The entry stored under `name`, or None (absent; unreadable: warned, then rebuilt)."""
    return load_pickled(cache_dir("programs") / f"{name}.pkl", "program cache entry")


def store(name: str, entry: tuple[Any, ...]) -> None:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(entry)
    store_verified(cache_dir("programs") / f"{name}.pkl", buf.getvalue())


class _Pickler(pickle.Pickler):
    """torch's op overloads (a fallback node's target) by their qualified name."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return _op_overload, (obj.name(),)
        return NotImplemented


def _op_overload(name: str) -> torch._ops.OpOverload:
    namespace, rest = name.split("::", 1)
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"tensor({x.dtype}, {tuple(x.shape)}, {tuple(x.stride())})"
    if isinstance(x, list | tuple):
        return "[" + ", ".join(_describe(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in sorted(x.items())) + "}"
    if hasattr(x, "command") and hasattr(x, "name"):  # a Rule: its name and its text
        return _rule_text(x)
    return repr(x)


_RULE_TEXTS: dict[int, tuple[Any, str]] = {}  # id(rule) -> (the rule, its text)


def _rule_text(rule: Any) -> str:
    """A rule's name and text, printed once per process (egglog pretty-prints a rule through
    black: about 8 ms a rule, a second a start for the default rules). One of the library's
    own rules is its name: its text is the library's source, which the key has digested."""
    if _library_rules().get(id(rule)) is rule:
        return f"library rule {rule.name}"
    kept = _RULE_TEXTS.get(id(rule))
    if kept is None or kept[0] is not rule:
        kept = _RULE_TEXTS[id(rule)] = (rule, f"rule({rule.name}, {rule.command})")
    return kept[1]


@cache
def _library_rules() -> dict[int, Any]:
    from ..rulebook import load_library

    return {id(r): r for rules in load_library().values() for r in rules}


@cache
def _library_digest() -> str:
    """A digest of eqsat_llm's own source (the package, its rules and its backends, their C
    files too)."""
    import eqsat_llm
    import eqsat_llm.codegen
    import eqsat_llm.rules

    h = hashlib.sha256()
    roots = {Path(m.__file__).parent for m in (eqsat_llm, eqsat_llm.codegen, eqsat_llm.rules)}
    for root in sorted(roots):
        for f in sorted([*root.rglob("*.py"), *root.rglob("*.c")]):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


@cache
def _source_digest(cls: type) -> str:
    try:
        return hashlib.sha256(Path(inspect.getsourcefile(cls) or "").read_bytes()).hexdigest()
    except (OSError, TypeError):
        return "no source"


def _transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "none"
    return json.dumps(transformers.__version__)
