"""Shrinking a failing model to a minimal one that still fails: fewer outputs (or an earlier
value as the output), fewer layers in a stack, steps bypassed
(a step's uses read one of its operands, or a fresh input, of the same shape and dtype),
no NaN/inf in inputs that do not need them; dead steps, inputs and parameters pruned.
Greedy: each candidate that is still a valid model and still fails is kept."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .spec import FuzzModel, Spec, Tensor, make_inputs


def shrink(spec: Spec, fails: Callable[[Spec], bool], budget: int = 80,
           progress: Callable[[str], None] | None = None) -> Spec:
    """The smallest failing spec found in at most `budget` checks of `fails`."""
    best = prune(spec)
    checks = 0
    improved = True
    while improved and checks < budget:
        improved = False
        for candidate in _candidates(best):
            if checks >= budget:
                break
            candidate = prune(candidate)
            if _size(candidate) >= _size(best) or not _valid(candidate):
                continue
            checks += 1
            if fails(candidate):
                best, improved = candidate, True
                if progress:
                    progress(f"shrunk to {len(best.steps)} steps")
                break
    return best


def _size(spec: Spec) -> tuple[int, int, int, int]:
    return (len(spec.steps),
            len(spec.inputs) + len(spec.params) + len(spec.buffers) + len(spec.outputs),
            sum(kw["count"] for op, _, kw in spec.steps if op == "layers"),
            sum(t.special for t in spec.inputs))


def _valid(spec: Spec) -> bool:
    try:
        with torch.no_grad():
            FuzzModel(spec)(*make_inputs(spec))
        return True
    except Exception:  # noqa: BLE001 - a candidate torch rejects is simply not a model
        return False


def _candidates(spec: Spec) -> Iterator[Spec]:
    if len(spec.outputs) > 1:
        for out in spec.outputs:
            yield _with(spec, outputs=[out])
    for k in range(len(spec.steps)):  # an earlier value as the output: the rest goes dead
        yield _with(spec, outputs=[f"v{k}"])
    shapes = _shapes(spec)
    for k in reversed(range(len(spec.steps))):
        ref = f"v{k}"
        for operand in spec.steps[k][1]:
            if operand is not None and shapes.get(operand) == shapes[ref]:
                yield _replace(spec, ref, operand)
        bypass = spec.copy()  # the step's value becomes an input
        shape, dtype = shapes[ref]
        bypass.inputs.append(Tensor(list(shape), dtype, high=2,
                                    seed=1000 + len(bypass.inputs)))
        yield _replace(bypass, ref, f"i{len(bypass.inputs) - 1}")
    for k, (op, refs, kw) in enumerate(spec.steps):
        if op == "layers" and kw["count"] > 1:  # fewer layers
            fewer = spec.copy()
            fewer.steps[k] = (op, refs, {**kw, "count": kw["count"] - 1})
            yield fewer
    for k, t in enumerate(spec.inputs):
        if t.special:
            calm = spec.copy()
            calm.inputs[k].special = False
            yield calm


def _shapes(spec: Spec) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each value's shape and dtype (from one eager run)."""
    from .spec import DTYPES

    names = {d: n for n, d in DTYPES.items()}
    with torch.no_grad():
        env = FuzzModel(spec).values(*make_inputs(spec))
    return {r: (tuple(v.shape), names[v.dtype]) for r, v in env.items()}


def _with(spec: Spec, **changes) -> Spec:
    out = spec.copy()
    for name, value in changes.items():
        setattr(out, name, value)
    return out


def _replace(spec: Spec, old: str, new: str) -> Spec:
    out = spec.copy()
    out.steps = [(op, [new if r == old else r for r in refs], kw) for op, refs, kw in out.steps]
    out.outputs = [new if r == old else r for r in out.outputs]
    return out


def prune(spec: Spec) -> Spec:
    """The spec without what its outputs do not read, refs renumbered."""
    live = set(spec.outputs)
    for k in reversed(range(len(spec.steps))):
        if f"v{k}" in live:
            live.update(r for r in spec.steps[k][1] if r is not None)
    rename: dict[str, str] = {}
    out = Spec(seed=spec.seed)
    for prefix, tensors, kept in (("i", spec.inputs, out.inputs), ("p", spec.params, out.params),
                                  ("b", spec.buffers, out.buffers)):
        for k, t in enumerate(tensors):
            if f"{prefix}{k}" in live:
                rename[f"{prefix}{k}"] = f"{prefix}{len(kept)}"
                kept.append(t)
    for k, (op, refs, kw) in enumerate(spec.steps):
        if f"v{k}" in live:
            rename[f"v{k}"] = f"v{len(out.steps)}"
            out.steps.append((op, [None if r is None else rename[r] for r in refs], dict(kw)))
    out.outputs = [rename[r] for r in spec.outputs]
    return out
