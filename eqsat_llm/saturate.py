"""Equality saturation under limits.

Each round runs the analysis to a fixed point (so every node has its shape and dtype) and then
one iteration of the rewrite rules. Saturation stops when a round changes nothing, or at the
first limit reached: rounds, e-graph size (tuples in all tables), or wall time. The e-graph is
valid at every stop, so extraction always has a program: a limit stops the search, never the
compile.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from egglog import EGraph

from .egraph.analysis import analysis
from .rulebook import Rule, as_ruleset


@dataclass(frozen=True)
class Limits:
    iterations: int = 30
    enodes: int = 200_000
    seconds: float = 30.0


@dataclass
class SaturationResult:
    iterations: int
    stop_reason: str  # "saturated", "iteration_limit", "enode_limit", "time_limit"
    matches: Counter[str] = field(default_factory=Counter)  # rule name -> matches
    enodes_per_iteration: list[int] = field(default_factory=list)
    seconds: float = 0.0


def egraph_size(egraph: EGraph) -> int:
    return sum(size for _, size in egraph.all_function_sizes())


def saturate(egraph: EGraph, rules: list[Rule], limits: Limits | None = None,
             progress: Callable[[str], None] | None = None) -> SaturationResult:
    limits = limits or Limits()
    start = time.perf_counter()
    by_key = {r.key: r.name for r in rules}
    result = SaturationResult(0, "saturated")
    egraph.run(analysis.saturate())
    result.enodes_per_iteration.append(egraph_size(egraph))
    if not rules:
        result.seconds = time.perf_counter() - start
        return result
    rewrites = as_ruleset(rules)
    while True:
        if result.iterations >= limits.iterations:
            result.stop_reason = "iteration_limit"
            break
        report = egraph.run(rewrites)
        egraph.run(analysis.saturate())
        result.iterations += 1
        for key, n in report.num_matches_per_rule.items():
            if key in by_key:
                result.matches[by_key[key]] += n
        size = egraph_size(egraph)
        result.enodes_per_iteration.append(size)
        if progress:
            progress(f"iteration {result.iterations}: {size} e-graph entries")
        if not report.updated:
            break
        if size >= limits.enodes:
            result.stop_reason = "enode_limit"
            break
        if time.perf_counter() - start >= limits.seconds:
            result.stop_reason = "time_limit"
            break
    result.seconds = time.perf_counter() - start
    return result
