"""Every causal-LM family transformers ships, classified against eqsat-llm: compiled fully,
compiled with torch steps (listed), refused (with the reason) or WRONG.

    .venv/bin/python benchmarks/families.py [--families a,b] [--seqs 32,1] [--jsonl out.jsonl]
        [--resume] [--write]

Families: transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, each config shrunk generically
(eqsat_llm.models.families), random weights, the family's attention (sdpa, eager where transformers
has no sdpa path). Per family and prompt length: eager logits vs `optimize(model, (ids,),
backend="c")` with the default rules, on the example ids and on fresh ones, every compiled
call run twice on a poisoned arena (EQSAT_POISON_CHECK=1). `--write` puts the summary and the
table in benchmarks/RESULTS.md and docs/families.md, and the classification in
tests/families_expected.json. How to read it: docs/families.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("EQSAT_POISON_CHECK", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from optimize_time import cpu_name, write_section

from eqsat_llm.models import families
from eqsat_llm.models.family_check import SEQS, STATUSES, TOL, Check, check, worst

SECTION = "## Every causal-LM family (benchmarks/families.py)"
ROOT = Path(__file__).resolve().parent.parent
DOC, EXPECTED = ROOT / "docs" / "families.md", ROOT / "tests" / "families_expected.json"
BEGIN, END = "<!-- families table: benchmarks/families.py --write -->", "<!-- end of table -->"


def cell(c: Check) -> str:
    if c.status == "WRONG":
        return f"**WRONG** ({c.reason})"
    if c.status == "refused":
        return "refused"
    err = "-" if c.err is None else f"{c.err:.0e}"
    return f"{c.status} ({err})"


def attention_cell(c: Check) -> str:
    """How attention ran: fused `attention` kernels, or unfused (softmax ops left)."""
    if c.status == "refused":
        return "-"
    bits = [f"{c.fused_attention} fused"] if c.fused_attention else []
    bits += [f"{c.softmax} softmax (unfused)"] if c.softmax else []
    return ", ".join(bits) or "none"


def op_name(op: str) -> str:
    """`aten.cumsum.default` -> `cumsum`, `transformers.grouped_mm_fallback.default` ->
    `grouped_mm_fallback`: the table's width."""
    parts = op.split(".")
    if parts[0] in ("aten", "transformers") and len(parts) > 1:
        parts = parts[1:]
    return ".".join(parts[:-1] if len(parts) > 1 and parts[-1] == "default" else parts)


def row(fam: str, cls: str, checks: list[Check]) -> str:
    first = checks[0]
    ops = Counter()
    for c in checks:
        ops.update(c.torch_ops)
    steps = ", ".join(sorted({op_name(op) for op in ops})) or "-"
    reason = next((c.reason for c in checks if c.status in ("refused", "WRONG")), "")
    reason += "" if all(c.backend in ("c", "") for c in checks) else \
        f" backend {'/'.join(c.backend for c in checks)}"
    cells = " | ".join(cell(c) for c in checks)
    secs = sum(c.seconds for c in checks)
    return (f"| {fam} | {cls} | {worst(checks)} | {first.attention_impl or '-'} | {cells} | "
            f"{attention_cell(first)} | {steps} | {reason.replace('|', '/')} | {secs:.0f} |")


def table(results: dict[str, list[Check]], seqs: list[int]) -> str:
    names = families.families()
    head = ("| family | class | status | attention impl | "
            + " | ".join(f"T={s} (rel. err)" for s in seqs)
            + f" | attention at T={seqs[0]} | ops in torch | reason | s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    lines += [row(f, names.get(f, "?"), cs) for f, cs in sorted(results.items())]
    return "\n".join(lines)


def counts(results: dict[str, list[Check]]) -> str:
    n = Counter(worst(cs) for cs in results.values())
    return ", ".join(f"{n.get(s, 0)} {s}" for s in STATUSES) + f" (of {len(results)})"


def attention_counts(results: dict[str, list[Check]]) -> str:
    """How the families that ran computed attention (at the first prompt length)."""
    n: Counter = Counter()
    for cs in results.values():
        c = cs[0]
        if c.status != "refused":
            n["all fused" if c.fused_attention and not c.softmax else
              "unfused, some or all layers (softmax over scores left)" if c.softmax else
              "no attention kernel or score softmax (state-space / recurrent layers)"] += 1
    return ", ".join(f"{k} in {v}" for k, v in n.most_common())


def write_doc(text: str) -> None:
    old = DOC.read_text()
    start, end = old.index(BEGIN) + len(BEGIN), old.index(END)
    DOC.write_text(old[:start] + "\n\n" + text + "\n\n" + old[end:])


def write_expected(results: dict[str, list[Check]]) -> None:
    """tests/families_expected.json: per family and prompt length, the status, the ops that
    ran in torch and the softmax over scores left unfused (the families run here replaced,
    the others kept)."""
    old = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {}
    for fam, checks in results.items():
        old[fam] = {str(c.seq): {"status": c.status, "torch_ops": sorted(c.torch_ops),
                                 "unfused_softmax": c.softmax} for c in checks}
    EXPECTED.write_text("{\n" + ",\n".join(f" {json.dumps(f)}: {json.dumps(v)}"
                                           for f, v in sorted(old.items())) + "\n}\n")


def load(path: Path) -> dict[str, list[Check]]:
    out: dict[str, list[Check]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            c = Check(**json.loads(line))
            out.setdefault(c.family, []).append(c)
    return out


def main(argv: list[str] | None = None) -> dict[str, list[Check]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", default="", help="comma-separated model types (default: all)")
    p.add_argument("--seqs", default=",".join(map(str, SEQS)))
    p.add_argument("--jsonl", default="", help="append each check as a JSON line")
    p.add_argument("--resume", action="store_true", help="skip families already in --jsonl")
    p.add_argument("--write", action="store_true",
                   help="replace the section in RESULTS.md, the table in docs/families.md and "
                   "the families' entries in tests/families_expected.json")
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    import transformers

    transformers.logging.set_verbosity_error()  # per-model notices about defaults
    seqs = [int(s) for s in args.seqs.split(",")]
    names = [f for f in args.families.split(",") if f] or list(families.families())
    jsonl = Path(args.jsonl) if args.jsonl else None
    results = load(jsonl) if jsonl and args.resume else {}
    t0 = time.perf_counter()
    for fam in names:
        if fam in results:
            continue
        checks = [check(fam, s) for s in seqs]
        results[fam] = checks
        if jsonl:
            with jsonl.open("a") as f:
                f.writelines(json.dumps(dataclasses.asdict(c)) + "\n" for c in checks)
        print(table({fam: checks}, seqs).splitlines()[-1], flush=True)
    results = {f: results[f] for f in names if f in results}
    total = time.perf_counter() - t0
    checked = sum(c.seconds for cs in results.values() for c in cs)
    argv_ = argv if argv is not None else sys.argv[1:]
    cmd = ".venv/bin/python benchmarks/families.py" + (" " + shlex.join(argv_) if argv_ else "")
    date = f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"
    tab = table(results, seqs)
    summary = (f"Command: `{cmd}` ({date}, {cpu_name()}, {os.cpu_count()} cores, torch "
               f"{torch.__version__}, transformers {transformers.__version__}, Python "
               f"{platform.python_version()}; the checks took {checked:.0f} s in all, "
               f"{total:.0f} s in this run (the rest read from --jsonl); EQSAT_POISON_CHECK="
               f"{os.environ.get('EQSAT_POISON_CHECK')}).\n\n"
               f"Families: {counts(results)}. Prompt lengths {', '.join(map(str, seqs))}; "
               f"tolerance {TOL:g} of the largest |logit|. Attention at T={seqs[0]}: "
               f"{attention_counts(results)}. How to read the table: docs/families.md.")
    print("\n" + tab + "\n\n" + summary)
    if args.write:
        wrong = [f for f, cs in results.items() if worst(cs) == "WRONG"]
        listing = "\n".join(f"- {f}: {next(c.reason for c in results[f] if c.status == 'WRONG')}"
                            for f in wrong)
        write_section(f"{SECTION}\n\n{summary}" + (f"\n\nWRONG:\n\n{listing}" if wrong else "")
                      + "\n\n" + tab, SECTION)
        write_doc(summary + "\n\n" + tab)
        write_expected(results)
        print(f"wrote {SECTION!r} in benchmarks/RESULTS.md, the table in {DOC}, {EXPECTED}")
    return results


if __name__ == "__main__":
    main()
