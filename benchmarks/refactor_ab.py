"""Before/after of a refactor, side by side: the compiled program of each reference workload
built by the code at another commit ("before") and by this checkout ("after"), timed
alternately in separate processes (one package version per process), each against eager in
its own process so that machine drift cancels in the ratio. For refactors that must change
neither the programs (op counts, predicted cost) nor their speed.

    .venv/bin/python benchmarks/refactor_ab.py --before COMMIT --title "SECTION TITLE"
        [--pairs 2] [--rounds 5] [--write]

`--before` is checked out with `git worktree` into a temporary directory (its rules/ and
codegen/ linked under eqsat_llm/, as the package installs them) and imported through
PYTHONPATH with this checkout's venv."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("llama_block_prefill", "llama_block_decode", "llama_block_decode_kv", "gpt2",
             "llama")


def measure(rounds: int) -> dict:
    """In this process: per workload, the optimized program's op counts and the median ms of
    it and of eager (interleaved, 2 threads)."""
    import warnings

    import torch

    from eqsat_llm import optimize
    from eqsat_llm.models.workloads import WORKLOADS as BUILD

    torch.set_num_threads(2)
    out = {}
    for name in WORKLOADS:
        model, inputs = BUILD[name]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = optimize(model, inputs, measure_eager=False)
        fns = {"eager": lambda m=model, x=inputs: m(*x),
               "eqsat": lambda c=compiled, x=inputs: c(*x)}
        times: dict[str, list[float]] = {k: [] for k in fns}
        with torch.no_grad():
            for f in fns.values():
                f()
            for _ in range(rounds):
                for k, f in fns.items():
                    n, t0 = 0, time.perf_counter()
                    while time.perf_counter() - t0 < 0.4:
                        f()
                        n += 1
                    times[k].append((time.perf_counter() - t0) / n * 1e3)
        ops = {k: v for k, v in compiled.graph.op_counts().items()}
        out[name] = {"ops": ops, "predicted_us": compiled.report.cost_after,
                     **{f"{k}_ms": statistics.median(v) for k, v in times.items()}}
    return out


def worktree(commit: str, tmp: Path) -> Path:
    path = tmp / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(path),
                    commit], check=True, capture_output=True)
    for pkg in ("rules", "codegen"):
        (path / "eqsat_llm" / pkg).symlink_to(Path("..") / pkg)
    return path


def run_in(tree: Path, rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            f"import refactor_ab as m; print(json.dumps(m.measure({rounds})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(runs: dict[str, list[dict]]) -> str:
    head = ("| workload | ops before -> after | predicted us before -> after | eqsat ms before | "
            "eqsat ms after | eager / eqsat before | eager / eqsat after | "
            "after / before (ratios) |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name in WORKLOADS:
        b = [r[name] for r in runs["before"]]
        a = [r[name] for r in runs["after"]]
        ratio_b = statistics.median(x["eager_ms"] / x["eqsat_ms"] for x in b)
        ratio_a = statistics.median(x["eager_ms"] / x["eqsat_ms"] for x in a)
        nb, na = sum(b[0]["ops"].values()), sum(a[0]["ops"].values())
        pb, pa = b[0]["predicted_us"], a[0]["predicted_us"]
        lines.append(f"| {name} | {nb} -> {na} | {pb:.1f} -> {pa:.1f} | "
                     f"{statistics.median(x['eqsat_ms'] for x in b):.3f} | "
                     f"{statistics.median(x['eqsat_ms'] for x in a):.3f} | {ratio_b:.2f} | "
                     f"{ratio_a:.2f} | {ratio_b / ratio_a:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the commit to compare against")
    p.add_argument("--title", required=True, help="the RESULTS.md section's title")
    p.add_argument("--rounds", type=int, default=5, help="rounds per process")
    p.add_argument("--pairs", type=int, default=2, help="before/after process pairs")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        before = worktree(args.before, Path(tmp))
        try:
            for _ in range(args.pairs):
                runs["before"].append(run_in(before, args.rounds))
                runs["after"].append(run_in(ROOT, args.rounds))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False, capture_output=True)
    text = table(runs)
    changed = {n: (runs["before"][0][n]["ops"], runs["after"][0][n]["ops"]) for n in WORKLOADS}
    print(text)
    for n, (b, a) in changed.items():
        print(n, "before", dict(sorted(b.items())), "\n", " " * len(n), "after ",
              dict(sorted(a.items())))
    if args.write:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from optimize_time import write_section

        cmd = "    .venv/bin/python benchmarks/refactor_ab.py " + " ".join(
            shlex.quote(a) for a in (argv or sys.argv[1:]))
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load = f"1-minute load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
        write_section(f"{when}, 2 threads, {args.pairs} process pairs x {args.rounds} rounds "
                      f"(median; {load}):\n\n{cmd}\n\n{text}\n", f"## {args.title}")


if __name__ == "__main__":
    main()
