"""Extractors on the public extraction-gym e-graphs (../shared/extraction-gym): DAG cost and
seconds per method, per folder, and the slowest files.

    .venv/bin/python benchmarks/extraction_gym.py [--methods tree dag ilp] [--time-limit 10]
        [--write]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

from eqsat_llm.extraction import extract as ex
from eqsat_llm.extraction.egraph_json import load_egraph

GYM = Path(__file__).resolve().parents[2] / "shared" / "extraction-gym"
SECTION = "## Extraction on the extraction-gym e-graphs"


def methods(time_limit: float) -> dict:
    table = {"tree": ex.extract_tree_greedy, "dag": ex.extract_dag_greedy}
    try:
        from eqsat_llm.extraction.ilp import extract_ilp
    except ImportError:
        return table
    table["ilp"] = lambda g: extract_ilp(g, time_limit=time_limit)
    return table


def run(names: list[str], time_limit: float) -> list[dict]:
    available = methods(time_limit)
    rows = []
    for path in sorted(GYM.rglob("*.json")):
        egraph = load_egraph(path)
        row = {"file": str(path.relative_to(GYM)), "nodes": len(egraph.nodes)}
        for name in names:
            t = time.perf_counter()
            result = available[name](egraph)
            ex.check_extraction(egraph, result.choices)
            row[name] = result.cost
            row[name + "_s"] = time.perf_counter() - t
            if result.lower_bound is not None:
                row[name + "_lb"] = result.lower_bound
        rows.append(row)
        print(row, flush=True)
    return rows


def summarize(rows: list[dict], names: list[str], time_limit: float) -> str:
    folders: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        folders[r["file"].split("/")[0]].append(r)
    head = "| folder | files | nodes | " + " | ".join(
        f"{n} cost | {n} s" for n in names) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for folder, rs in sorted(folders.items()):
        cells = [folder, str(len(rs)), str(sum(r["nodes"] for r in rs))]
        for n in names:
            cells += [f"{sum(r[n] for r in rs):.6g}", f"{sum(r[n + '_s'] for r in rs):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if "ilp" in names:
        lines += ["", "Per file (ILP lower bound and gap = cost - bound; gap 0: proved optimal):",
                  "", "| file | nodes | " + " | ".join(f"{n} cost" for n in names)
                  + " | ilp bound | gap | ilp s |", "|---|" + "---|" * (len(names) + 4)]
        for r in rows:
            bound = r.get("ilp_lb")
            gap = "" if bound is None else f"{r['ilp'] - bound:.4g}"
            lines.append(f"| {r['file']} | {r['nodes']} | "
                         + " | ".join(f"{r[n]:.6g}" for n in names)
                         + f" | {'' if bound is None else f'{bound:.6g}'} | {gap} | "
                         f"{r['ilp_s']:.2f} |")
    slow = max(rows, key=lambda r: max(r[n + "_s"] for n in names))
    lines.append("")
    lines.append(f"Slowest file: `{slow['file']}` ({slow['nodes']} nodes): " + ", ".join(
        f"{n} {slow[n + '_s']:.2f} s" for n in names) + ".")
    if "ilp" in names:
        optimal = sum(1 for r in rows if r.get("ilp_lb") is not None and
                      r["ilp"] - r["ilp_lb"] <= 1e-6 * max(1.0, r["ilp"]))
        worse = [r["file"] for r in rows if r["ilp"] > r["dag"] + 1e-9]
        lines.append(f"ILP (time limit {time_limit:g} s) proved optimality on {optimal} of "
                     f"{len(rows)} files; files where ILP is worse than DAG-greedy: "
                     f"{worse or 'none'}.")
    return "\n".join(lines)


def main() -> None:
    from optimize_time import write_section

    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", nargs="+", default=list(methods(10.0)))
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    rows = run(args.methods, args.time_limit)
    text = (f"{SECTION}\n\nCommand: `.venv/bin/python benchmarks/extraction_gym.py --write` "
            "(costs are DAG costs summed over the folder's files; seconds summed).\n\n"
            + summarize(rows, args.methods, args.time_limit))
    print(text)
    if args.write:
        write_section(text, SECTION)


if __name__ == "__main__":
    main()
