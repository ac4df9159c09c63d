"""The fuzzer's long mode: many seeds of random models on the given backends, each seed's count,
failures and time appended to a log as it finishes (a run may be stopped at any time), and the
totals written to benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/fuzz_long.py --seeds 2000 2100 [--per-seed 250]
        [--backend c,reference] [--log fuzz_long.jsonl] [--save DIR]
    .venv/bin/python benchmarks/fuzz_long.py --log fuzz_long.jsonl --write   # totals only
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

SECTION = "## Fuzzing: random models against eager"


def run(args: argparse.Namespace) -> None:
    from eqsat_llm.fuzz import fuzz

    warnings.filterwarnings("ignore")
    for seed in range(args.seeds[0], args.seeds[1]):
        result = fuzz(args.per_seed, seed, args.backend.split(","),
                      save_dir=Path(args.save) if args.save else None)
        line = {"seed": seed, "models": result.models, "steps": result.steps,
                "backends": result.backends, "failing": len(result.found),
                "seconds": round(result.seconds, 1),
                "failures": [str(f.failures[0]) for f in result.found],
                "saved": [str(f.saved) for f in result.found if f.saved]}
        with open(args.log, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"seed {seed}: {result.models} models, {len(result.found)} failing, "
              f"{result.seconds:.0f} s", flush=True)


def summary(log: Path) -> str:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    by_backends: dict[str, list[dict]] = {}
    for r in rows:
        by_backends.setdefault(",".join(r["backends"]), []).append(r)
    lines = [(f"Command: `.venv/bin/python benchmarks/fuzz_long.py --seeds A B --backend ... "
             f"--log {log.name}` then `--write` ({platform.machine()}, 2 cores shared with "
             "other work, so seconds per model are upper bounds). Each model is optimized "
             "once and run on every backend of its row; a failing model is shrunk and saved "
             "(docs/fuzzing.md)."), "",
             "| backends | seeds | models | steps | failing models | seconds per model |",
             "|---|---|---|---|---|---|"]
    for backends, rs in by_backends.items():
        models = sum(r["models"] for r in rs)
        lines.append(f"| {backends} | {min(r['seed'] for r in rs)}..{max(r['seed'] for r in rs)}"
                     f" | {models:,} | {sum(r['steps'] for r in rs):,} | "
                     f"{sum(r['failing'] for r in rs)} | "
                     f"{sum(r['seconds'] for r in rs) / max(models, 1):.2f} |")
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
