"""Every buildable transformers family, deepened to 8 layers: the Generator's prefill program
captured with repeated layers stamped (capture/stamping.py) against the same capture with every
layer traced, compared node for node. For changes to stamping that must keep the IR.

    .venv/bin/python scripts/stamping_sweep.py [FAMILY,...] > sweep.jsonl

One JSON line a family: `stamped` (calls spliced), `fallback` (why every layer was traced),
`same` (the live IR equal, constants compared by value: a constant of a layer's own code is one
leaf for all stamped calls and one per layer traced in full; those made by `torch.empty*` hold
whatever memory held, compared by type), or `error` (the capture failed, stamped or not: the
family's program does not capture at 8 layers). A family whose `CachedStep` cannot be built is
checked on its plain forward (`logits`). About an hour on two cores."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch

from eqsat_llm.capture import capture
from eqsat_llm.capture.converter import capture_plain
from eqsat_llm.generation.generator import example_inputs
from eqsat_llm.generation.kv_cache import CachedStep
from eqsat_llm.models import families
from eqsat_llm.models.model_matrix import Logits

LAYERS = 8  # two layer kinds alternating (a 2-layer config's lists repeated): 4 of each


def deepened(family: str) -> torch.nn.Module:
    cfg = families.config(family, families.attention(family))
    for k, v in list(vars(cfg).items()):
        if k.startswith("_"):
            continue
        if isinstance(v, list) and len(v) == families.LAYERS:
            setattr(cfg, k, [v[i % len(v)] for i in range(LAYERS)])
        elif k in families.LAYER_COUNTS and v == families.LAYERS:
            setattr(cfg, k, LAYERS)
    torch.manual_seed(0)
    return getattr(families._transformers(), families.families()[family])(cfg).eval()


def canonical(graph) -> tuple[list, list]:
    """The live nodes hash-consed, constants by value (by type where made by torch.empty*)."""
    live, number, table = graph.live_ids(), {}, {}
    for n in graph.nodes:
        if n.id not in live:
            continue
        if n.op == "const":
            value = graph.constants[n.attrs["name"]]
            ident = ("const", str(n.type)) if "empty" in n.attrs["name"] or not isinstance(
                value, torch.Tensor) else ("const", str(n.type), hashlib.sha1(
                    value.detach().reshape(-1).contiguous().view(torch.uint8).numpy()
                    .tobytes()).hexdigest())
        elif n.op == "param":
            ident = ("param", n.attrs["name"], str(n.type))
        else:
            attrs = sorted((k, repr(v)) for k, v in n.attrs.items() if k not in ("key", "fn"))
            ident = (n.op, tuple(number[i] for i in n.inputs), tuple(attrs), str(n.type))
        number[n.id] = table.setdefault(ident, len(table))
    return list(table), [number[o] for o in graph.outputs]


def check(family: str) -> dict:
    model = deepened(family)
    try:
        program, example = CachedStep(model, 1, 64), example_inputs(5, 1, 64, False)
    except Exception:  # noqa: BLE001 - not a Generator model: its plain forward
        program, example = Logits(model).eval(), (torch.randint(3, 100, (1, 8)),)
    try:
        stamped = capture(program, example)
        record = {"stamped": stamped.stamped_calls, "fallback": stamped.stamping_fallback}
        full = capture_plain(program, example)
    except Exception as exc:  # noqa: BLE001 - recorded: the capture fails either way
        return {"error": f"{type(exc).__name__}: {str(exc)[:150]}"}
    record["same"] = canonical(stamped.graph) == canonical(full.graph) and \
        stamped.mutations == full.mutations
    return record


def main() -> None:
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else sorted(families.families())
    for family in names:
        if families.refusal(family):
            continue
        try:
            record = check(family)
        except Exception as exc:  # noqa: BLE001 - a config that does not deepen
            record = {"error": f"{type(exc).__name__}: {str(exc)[:150]}"}
        print(json.dumps({"family": family, **record}), flush=True)


if __name__ == "__main__":
    main()
