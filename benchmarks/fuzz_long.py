"""The fuzzer's long mode: many seeds of random models on the given backends, each seed's count,
failures and time appended to a log as it finishes (a run may be stopped at any time), and the
totals written to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/fuzz_long.py --seeds 2000 2100 [--per-seed 250]
        [--backend c,reference] [--log fuzz_long.jsonl] [--save DIR] [--structures 4]
    .venv/bin/python benchmarks/fuzz_long.py --log fuzz_long.jsonl --write   # totals only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

from eqsat_llm.extraction.machine import cpu_model

SECTION = "## Fuzzing: random models against eager"


def run(args: argparse.Namespace) -> None:
    from eqsat_llm.fuzz import fuzz

    warnings.filterwarnings("ignore")
    for seed in range(args.seeds[0], args.seeds[1]):
        result = fuzz(args.per_seed, seed, args.backend.split(","),
                      save_dir=Path(args.save) if args.save else None,
                      structures_weight=args.structures)
        line = {"seed": seed, "structures": args.structures,
                "big_share": round(big_share(args.structures), 3), "models": result.models,
                "steps": result.steps,
                "backends": result.backends, "failing": len(result.found),
                "seconds": round(result.seconds, 1),
                "holds": dict(result.holds),
                "failures": [str(f.failures[0]) for f in result.found],
                "saved": [str(f.saved) for f in result.found if f.saved]}
        with open(args.log, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"seed {seed}: {result.models} models, {len(result.found)} failing, "
              f"{result.seconds:.0f} s", flush=True)


def big_share(weight: int) -> float:
    """The share of a model's family draws that are big families (fuzz/structures.py)."""
    from eqsat_llm.fuzz.generate import FAMILIES, STRUCTURES, UNIT

    big = sum(w for _, w in STRUCTURES) * weight
    return big / (big + sum(w for _, w in FAMILIES) * UNIT)


def summary(log: Path) -> str:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        share = f"{r['big_share']:.1%}" if "big_share" in r else "none"
        groups.setdefault((",".join(r["backends"]), share), []).append(r)
    lines = [(f"Command: `EQSAT_POISON_CHECK=1 .venv/bin/python benchmarks/fuzz_long.py "
             f"--seeds A B --backend ... [--structures N] --log {log.name}` then `--write` "
             f"({cpu_model()}, "
             f"{platform.machine()}, {os.cpu_count()} cores shared with other work, so seconds "
             "per model are upper bounds). Each model is optimized once and run on every "
             "backend of its row, every compiled call twice on a poisoned arena; a failing "
             "model is shrunk and saved (docs/fuzzing.md). `--structures N` draws the big "
             "families (KV cache, state, layers, MoE, integers, large) N times as often as the "
             "test share does; the table gives their share of the family draws."), "",
             ("| backends | big families' share | seeds | models | steps | failing models "
              "| seconds per model |"), "|---|---|---|---|---|---|---|"]
    for (backends, share), rs in groups.items():
        models = sum(r["models"] for r in rs)
        lines.append(f"| {backends} | {share} | {min(r['seed'] for r in rs)}.."
                     f"{max(r['seed'] for r in rs)} | {models:,} | "
                     f"{sum(r['steps'] for r in rs):,} | {sum(r['failing'] for r in rs)} | "
                     f"{sum(r['seconds'] for r in rs) / max(models, 1):.2f} |")
    for (backends, share), rs in groups.items():
        holds: dict[str, int] = {}
        for r in rs:
            for kind, n in r.get("holds", {}).items():
                holds[kind] = holds.get(kind, 0) + n
        if holds:
            lines.append(f"\nModels holding each kind ({backends}, big families {share}): "
                         + ", ".join(f"{k} {n}" for k, n in sorted(holds.items())) + ".")
    for r in rows:
        for failure in r["failures"]:
            lines.append(f"- seed {r['seed']}: {failure}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs=2, metavar=("FIRST", "END"))
    ap.add_argument("--per-seed", type=int, default=250)
    ap.add_argument("--backend", default="c,reference")
    ap.add_argument("--log", default="fuzz_long.jsonl")
    ap.add_argument("--save", default="", help="save failing models here")
    ap.add_argument("--structures", type=int, default=1,
                    help="weight multiplier of the big families (KV cache, layers, MoE, ...)")
    ap.add_argument("--write", action="store_true", help="write the totals to RESULTS.md")
    args = ap.parse_args()
    start = time.perf_counter()
    if args.seeds:
        run(args)
        print(f"{time.perf_counter() - start:.0f} s")
    text = summary(Path(args.log))
    print(text)
    if args.write:
        from optimize_time import write_section
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
