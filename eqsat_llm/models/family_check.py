"""Each causal-LM family transformers ships (eqsat_llm.models.families) against eqsat-llm: eager
logits vs `optimize(model, (ids,), backend="c")` with the default rules, at a prompt and at one
token, classified as

- "compiled": the whole program runs as generated C and matches eager;
- "torch steps": it matches eager, some ops run in torch between the C segments (listed);
- "refused": not built (a multimodal config, a drafter...) or a clear error at capture or
  optimize (the reason, shortened);
- "WRONG": it compiled and its logits differ from eager's (a bug).

    check("qwen3", 32)   # -> Check(status="compiled", err=3e-07, ...)
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from ..api import optimize
from . import families

# float32 programs: error relative to the largest |logit| of eager's output
TOL = 1e-4
STATUSES = ("compiled", "torch steps", "refused", "WRONG")
SEQS = (32, 1)


@dataclass
class Check:
    """One family at one prompt length."""
    family: str
    seq: int
    status: str
    reason: str = ""  # why refused; what a WRONG family got wrong
    attention_impl: str = ""  # sdpa or eager (transformers' choice for the family)
    torch_ops: dict[str, int] = field(default_factory=dict)  # ops that ran in torch
    backend: str = ""
    fused_attention: int = 0  # `attention` kernels in the program
    softmax: int = 0  # softmax over scores (rank >= 3) left outside them: unfused attention
    err: float | None = None  # max |compiled - eager| / max |eager|, example and fresh ids
    seconds: float = 0.0


def short(exc: BaseException, n: int = 200) -> str:
    """An exception in one line: its type and the start of its message."""
    msg = re.sub(r"\S*site-packages/", "", " ".join(str(exc).split()))  # paths of this machine
    return f"{type(exc).__name__}: {msg[:n]}{'...' if len(msg) > n else ''}"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (inf where got is not finite where want is)."""
    if got.shape != want.shape:
        return float("inf")
    diff = (got.double() - want.double()).abs().max().item()
    return float("inf") if math.isnan(diff) else diff / max(want.abs().max().item(), 1e-30)


def check(family: str, seq: int, *, seed: int = 0, **optimize_options: Any) -> Check:
    """Build the family (seed), optimize it for [1, seq] ids on the C backend, and compare
    with eager on those ids and on fresh ones (an input folded into a constant shows there)."""
    t0 = time.perf_counter()
    c = Check(family, seq, "refused")
    try:
        c.attention_impl = families.attention(family)
        model, (ids,) = families.build(family, seq=seq, seed=seed)
    except families.Refused as exc:
        c.reason = str(exc)
        return _done(c, t0)
    except Exception as exc:  # noqa: BLE001 - the family's model cannot be built offline
        c.reason = f"not built: {short(exc)}"
        return _done(c, t0)
    vocab = model.model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed + 1)
    fresh = torch.randint(3, vocab - 1, ids.shape, generator=gen)
    try:
        with torch.no_grad():
            want, want_fresh = model(ids), model(fresh)
    except Exception as exc:  # noqa: BLE001 - eager itself fails at this shape
        c.reason = f"eager fails: {short(exc)}"
        return _done(c, t0)
    if not torch.isfinite(want).all():
        c.reason = "eager's logits are not finite with random weights"
        return _done(c, t0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FallbackWarning: the ops land in torch_ops
            compiled = optimize(model, (ids,), backend="c", measure_eager=False,
                                **optimize_options)
    except Exception as exc:  # noqa: BLE001 - a refusal, with the optimizer's reason
        c.reason = short(exc)
        return _done(c, t0)
    r = compiled.report
    c.backend = r.backend
    c.torch_ops = dict(r.torch_ops or {}) | {op: 1 for op in r.fallback_ops
                                             if op not in (r.torch_ops or {})}
    c.fused_attention = r.op_counts_after.get("attention", 0)
    # attention scores are [batch, heads, queries, keys]; a router's softmax is 2-D
    c.softmax = sum(n.op == "softmax" and len(n.type.shape) >= 3 for n in compiled.graph.nodes)
    try:
        c.err = max(rel_err(compiled(ids), want), rel_err(compiled(fresh), want_fresh))
    except Exception as exc:  # noqa: BLE001 - compiled but cannot run: a bug, like WRONG
        c.status, c.reason = "WRONG", f"the compiled program fails: {short(exc)}"
        return _done(c, t0)
    if not c.err <= TOL:
        c.status, c.reason = "WRONG", f"max error {c.err:.2e} of max |logit|"
    elif c.torch_ops or c.backend != "c":
        c.status = "torch steps"
    else:
        c.status = "compiled"
    return _done(c, t0)


def _done(c: Check, t0: float) -> Check:
    c.seconds = time.perf_counter() - t0
    return c


def worst(checks: list[Check]) -> str:
    """A family's status over its prompt lengths: the worst one."""
    return max((c.status for c in checks), key=STATUSES.index)
