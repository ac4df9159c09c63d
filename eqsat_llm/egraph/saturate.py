"""Equality saturation under limits.

Each round runs the analysis to a fixed point (so every node has its shape and dtype) and then
one iteration of the rewrite rules. Saturation stops when a round changes nothing, or at the
first limit reached: rounds, e-graph size (tuples in all tables), wall time, or the process's
resident memory. The e-graph is valid at every stop, so extraction always has a program: a
limit stops the search, never the compile.

A round cannot be interrupted (egglog runs it whole), and an explosive rule set (associativity
and commutativity) multiplies the e-graph each round. So a round is not started when, growing
as the last one did, it would end past the size, time or memory limit by more than half
(`OVERSHOOT`): the stop reason is then the limit's, with "projected" in the report.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from egglog import EGraph

from ..rulebook import Rule
from .analysis import analysis
from .provenance import MADE, instrumented, recording_ruleset


@dataclass(frozen=True)
class Limits:
    iterations: int = 30
    enodes: int = 200_000
    seconds: float = 30.0
    memory_mb: float = 8192.0  # resident memory of the whole process


# a round that would end past a limit by more than this factor is not started
OVERSHOOT = 1.5


@dataclass
class SaturationResult:
    iterations: int
    stop_reason: str  # "saturated", or "iteration_limit", "enode_limit", "time_limit",
    # "memory_limit" (the last three with " (projected)" when the next round would overrun)
    matches: Counter[str] = field(default_factory=Counter)  # rule name -> matches
    enodes_per_iteration: list[int] = field(default_factory=list)
    seconds: float = 0.0


def egraph_size(egraph: EGraph) -> int:
    """Tuples in all tables of the program and its analyses (provenance rows not counted)."""
    return sum(size for fn, size in egraph.all_function_sizes()
               if not str(fn).startswith(MADE))


def resident_mb() -> float:
    """The process's resident memory now (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _limit_reached(limits: Limits, size: int, seconds: float, memory: float,
                   growth: float, round_seconds: float, round_memory: float) -> str | None:
    """The limit reached now, or the one the next round (growing like the last) would
    overrun by more than OVERSHOOT."""
    now = (("enode_limit", size, limits.enodes), ("time_limit", seconds, limits.seconds),
           ("memory_limit", memory, limits.memory_mb))
    for reason, value, limit in now:
        if value >= limit:
            return reason
    after = (("enode_limit", size * growth, limits.enodes),
             ("time_limit", seconds + round_seconds * growth, limits.seconds),
             ("memory_limit", memory + round_memory * growth, limits.memory_mb))
    for reason, value, limit in after:
        if value > OVERSHOOT * limit:
            return reason + " (projected)"
    return None


def saturate(egraph: EGraph, rules: list[Rule], limits: Limits | None = None,
             progress: Callable[[str], None] | None = None) -> SaturationResult:
    limits = limits or Limits()
    start = time.perf_counter()
    by_key = {instrumented(r).decl: r.name for r in rules}
    result = SaturationResult(0, "saturated")
    egraph.run(analysis.saturate())
    result.enodes_per_iteration.append(egraph_size(egraph))
    if not rules:
        result.seconds = time.perf_counter() - start
        return result
    rewrites = recording_ruleset(rules)
    while True:
        if result.iterations >= limits.iterations:
            result.stop_reason = "iteration_limit"
            break
        round_start, memory_before = time.perf_counter(), resident_mb()
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
        now = time.perf_counter()
        memory = resident_mb()
        growth = size / max(result.enodes_per_iteration[-2], 1)
        reason = _limit_reached(limits, size, now - start, memory, growth, now - round_start,
                                max(memory - memory_before, 0.0))
        if reason is not None:
            result.stop_reason = reason
            break
    result.seconds = time.perf_counter() - start
    return result
