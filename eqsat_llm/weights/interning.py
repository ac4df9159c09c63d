"""One copy of equal compile-time tensors across programs.

The programs of one model (a Generator's decode step and prefill chunk; torch.compile's
specialisations per shape) fold and pack the same weights: each would hold its own copy,
several times the model's size in all. `intern(t)` returns an equal tensor that an earlier
program already holds (compared in full: a sampled fingerprint only picks the candidates),
else remembers `t`. Only weak references are kept, so a tensor goes when its last program
does. Interned tensors are read-only by contract: folded constants and prepared weights."""

from __future__ import annotations

import threading
import weakref

import torch

_SAMPLES = 64
_TABLE: dict[tuple, list[weakref.ref]] = {}
_LOCK = threading.Lock()


def _fingerprint(t: torch.Tensor) -> tuple:
    flat = t.reshape(-1)
    step = max(1, flat.numel() // _SAMPLES)
    return (tuple(t.shape), t.dtype, tuple(t.stride()), tuple(flat[::step][:_SAMPLES].tolist()))


def intern(t: torch.Tensor) -> torch.Tensor:
    """An equal tensor (shape, dtype, strides, every value) already interned, else `t`."""
    if t.requires_grad or t.device.type == "meta" or t.numel() < 4096:
        return t  # small ones are not worth a lookup
    key = _fingerprint(t)
    with _LOCK:
        refs = _TABLE.setdefault(key, [])
        refs[:] = [r for r in refs if r() is not None]
        for ref in refs:
            other = ref()
            if other is not None and torch.equal(other, t):
                return other
        refs.append(weakref.ref(t))
        if len(_TABLE) > 4096:  # drop the keys whose tensors are all gone
            for k in [k for k, rs in _TABLE.items() if all(r() is None for r in rs)]:
                del _TABLE[k]
    return t
