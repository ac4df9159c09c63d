"""Checkpoints in the layout transformers converts as it loads them (its conversion mapping,
`transformers.conversion_mapping`): modules renamed since the checkpoint was written
(Mixtral's `block_sparse_moe` is now `mlp`), and a mixture's experts stored one tensor per
expert (`experts.3.w1.weight`), which the model holds stacked (`experts.gate_up_proj`
[E, 2F, D]: each expert's w1 and w3 joined, the experts stacked).

`converted_tensors(config, keys)` reads the mapping once and says, for each of the model's
tensor names the checkpoint does not store as such, which stored tensors make it and how:
renamed (one tensor read as it is), or stacked along `stack_dim` per source pattern and
those stacks joined along `cat_dim` (transformers' MergeModulelist and Concatenate, the two
operations its MoE conversions use). A mapping with any other operation, or a pattern that
is not a plain name with `*` for the expert's number, converts nothing here: the tensors it
makes stay missing, and the checkpoint reader says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Converted:
    """A model tensor made of stored ones: `parts` per source pattern, the stored keys of
    experts 0, 1, ... (a rename: one part of one key, read as it is)."""
    parts: tuple[tuple[str, ...], ...]
    stack_dim: int | None = None  # None: a rename
    cat_dim: int | None = None  # None: one part

    def shape(self, shape_of: Callable[[str], tuple[int, ...]]) -> tuple[int, ...]:
        one = list(shape_of(self.parts[0][0]))
        if self.stack_dim is None:
            return tuple(one)
        one.insert(self.stack_dim, len(self.parts[0]))
        if self.cat_dim is not None:
            one[self.cat_dim] = sum(shape_of(p[0])[self.cat_dim - (self.cat_dim > self.stack_dim)]
                                    for p in self.parts)
        return tuple(one)

    def make(self, read: Callable[[str], torch.Tensor]) -> torch.Tensor:
        """The tensor, each stored one read once (its stack written in place: no list of
        them held beside it)."""
        if self.stack_dim is None:
            return read(self.parts[0][0])
        stacks = []
        for keys in self.parts:
            first = read(keys[0])
            out = torch.empty((len(keys), *first.shape), dtype=first.dtype).movedim(
                0, self.stack_dim)
            out.select(self.stack_dim, 0).copy_(first)
            for e, key in enumerate(keys[1:], 1):
                out.select(self.stack_dim, e).copy_(read(key))
            stacks.append(out)
        return stacks[0] if self.cat_dim is None else torch.cat(stacks, self.cat_dim)


def converted_tensors(config: Any, keys: Iterable[str]) -> dict[str, Converted]:
    """The model's tensor names that the stored `keys` make through transformers' conversion
    mapping for this config's model type (renames and stacked experts); {} where it has none
    or uses what this reader does not follow."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return {}
    mapping = get_checkpoint_conversion_mapping(config.model_type) or []
    renames, converters = [], []
    for t in mapping:
        sources, targets = _patterns(t.source_patterns), _patterns(t.target_patterns)
        if sources is None or targets is None or len(targets) != 1:
            return {}
        ops = [type(op).__name__ for op in getattr(t, "operations", None) or []]
        if not ops and all("*" not in s for s in sources) and len(sources) == 1:
            renames.append((sources[0], targets[0]))
        elif ops in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]) and \
                all(s.count("*") == 1 for s in sources):
            dims = [op.dim for op in t.operations]
            converters.append((sources, targets[0], dims[0], dims[1] if len(dims) > 1 else None))
        else:
            return {}
    renamed = {}  # the name each stored key has once renamed -> the stored key
    for key in keys:
        name = key
        for source, target in renames:
            name = name.replace(source, target)
        renamed[name] = key
    out: dict[str, Converted] = {}
    for sources, target, stack_dim, cat_dim in converters:
        found: dict[str, dict[int, dict[int, str]]] = {}  # prefix -> pattern -> expert -> key
        for i, source in enumerate(sources):
            pattern = re.compile(re.escape(source).replace(r"\*", r"(\d+)") + "$")
            for name, key in renamed.items():
                m = pattern.search(name)
                if m:
                    found.setdefault(name[:m.start()], {}).setdefault(i, {})[int(m[1])] = key
        for prefix, per in found.items():
            counts = {len(e) for e in per.values()}
            if len(per) != len(sources) or len(counts) != 1 or \
                    any(sorted(e) != list(range(len(e))) for e in per.values()):
                continue  # (an expert missing: the tensor stays missing, and is named)
            out[prefix + target] = Converted(
                tuple(tuple(per[i][e] for e in range(len(per[i]))) for i in range(len(sources))),
                stack_dim, cat_dim)
    for name, key in renamed.items():
        if name != key and name not in out:
            out[name] = Converted(((key,),))
    return out


def _patterns(p: str | list[str]) -> list[str] | None:
    """The patterns as plain names (`*` an expert's number); None when one uses more of the
    regular expressions transformers allows."""
    ps = [p] if isinstance(p, str) else list(p)
    return None if any(re.search(r"[\^$()\[\]{}+?|\\]", s) for s in ps) else ps
