"""Optimal DAG extraction as a mixed-integer program solved with HiGHS (``highspy``).

Model (after pruning to the classes reachable from the roots and to the nodes that can
appear in *some* acyclic program):

* a binary ``x_n`` per choosable node; per class ``sum x_n <= 1`` (``== 1`` for roots);
* for every node ``n`` and distinct child class ``c``: ``sum_{m in c} x_m >= x_n``;
* objective ``sum cost_n x_n`` -- the DAG cost (a shared node is counted once).

Acyclicity is enforced lazily: solve, look for cycles in the chosen program, add one cut
per cycle found (for the cycle's classes ``c_1 -> ... -> c_k -> c_1``, at most ``k - 1`` of
the "edge sets" ``{n in c_i : c_{i+1} in children(n)}`` may be used), and re-solve. Each
model is a relaxation of the true problem, so every dual bound is a valid lower bound.
The dag-greedy solution warm-starts every solve and is the fallback: the result is never
worse than dag-greedy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .egraph_json import EGraph
from .extract import (
    CostFn,
    Extraction,
    ExtractionError,
    acyclic_worklist,
    break_cycles,
    check_extraction,
    chosen_children,
    chosen_cycles,
    dag_cost,
    extract_dag_greedy,
    node_costs,
    reachable_classes,
    root_classes,
)

__all__ = ["extract_ilp"]


def _new_highs() -> Any:
    """A HiGHS instance. The first one prints a banner on the process's stdout whatever the
    options say; it is sent to /dev/null so that reports and JSON output stay clean."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            import highspy

            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)

_MAX_CUTS_PER_ROUND = 500
_BOUND_TOL = 1e-6


def _prune(
    egraph: EGraph, roots: list[str], node_cost: Mapping[str, float]
) -> dict[str, list[str]]:
    """Class -> usable nodes: reachable from the roots, and each node in the least fixed
    point "all child classes have a usable node" (so no self-loops, no dead children)."""
    nodes = egraph.nodes
    # Reachable classes through choosable nodes.
    # (a dict keeps insertion order: the model, and so the solver's choice among equal-cost
    # programs, does not depend on Python's hash seed)
    seen = dict.fromkeys(roots)
    stack = list(roots)
    while stack:
        cls = stack.pop()
        for nid in egraph.classes.get(cls, ()):
            if nid not in node_cost:
                continue
            for k in nodes[nid].children:
                if k not in seen:
                    seen[k] = None
                    stack.append(k)
    # Least fixed point (Kahn style) over the reachable part.
    pending, parents, queue = acyclic_worklist(
        nodes,
        (nid for cls in seen for nid in egraph.classes.get(cls, ()) if nid in node_cost),
    )
    ok_class: set[str] = set()
    ok_node: set[str] = set()
    while queue:
        nid = queue.pop()
        ok_node.add(nid)
        cls = nodes[nid].eclass
        if cls in ok_class:
            continue
        ok_class.add(cls)
        for p in parents.get(cls, ()):
            pending[p] -= 1
            if pending[p] == 0:
                queue.append(p)
    # A node is usable once all its child classes are resolved (also after its class was).
    usable: dict[str, list[str]] = {}
    for cls in seen:
        lst = [
            nid
            for nid in egraph.classes.get(cls, ())
            if nid in node_cost
            and cls not in nodes[nid].children  # self-loop: never in an acyclic program
            and all(k in ok_class for k in nodes[nid].children)
        ]
        if lst:
            usable[cls] = lst
    return usable


def _find_cycles(
    egraph: EGraph, roots: list[str], choice: Mapping[str, str], limit: int
) -> list[list[str]] | None:
    """Up to ``limit`` cycles (lists of classes) in the chosen program reachable from the
    roots; None if a reachable class has no choice. Iterative DFS."""
    try:
        return chosen_cycles(roots, chosen_children(egraph, choice), limit)
    except ExtractionError:  # a reachable class without a choice
        return None


def _cost_of(
    egraph: EGraph, roots: list[str], choices: Mapping[str, str], cost: CostFn | None
) -> float | None:
    try:
        check_extraction(egraph, choices, roots)
        return dag_cost(egraph, choices, roots, cost)
    except ExtractionError:
        return None


def extract_ilp(
    egraph: EGraph,
    roots: Iterable[str] | None = None,
    cost: CostFn | None = None,
    time_limit: float = 10.0,
    warm_start: Extraction | None = None,
) -> Extraction:
    """Optimal (within ``time_limit`` seconds) DAG extraction by MILP with HiGHS.

    Returns ``Extraction(method="ilp")`` whose ``cost`` is the recomputed DAG cost of the
    returned choices and ``lower_bound`` the solver's proven bound (``== cost`` when the
    solve proved optimality, always ``<= cost``; at least the trivial bound, the dearest
    root's cheapest node, when no solve finished). The result is never worse than
    ``warm_start`` (dag-greedy's extraction when None). Raises :class:`ExtractionError`
    when no acyclic program exists. HiGHS may overrun ``time_limit`` by a few seconds on
    the largest e-graphs (phases where it checks neither its limit nor interrupts).
    """
    import highspy

    start = time.perf_counter()
    deadline = start + max(0.0, float(time_limit))
    root_list = list(dict.fromkeys(root_classes(egraph, roots)))
    node_cost = node_costs(egraph, cost)
    nodes = egraph.nodes

    # Incumbent: the warm start if valid, else dag-greedy.
    best_choices: dict[str, str] | None = None
    best_cost = math.inf
    if warm_start is not None:
        c = _cost_of(egraph, root_list, warm_start.choices, cost)
        if c is not None:
            best_choices, best_cost = dict(warm_start.choices), c
    if best_choices is None:
        greedy = extract_dag_greedy(egraph, root_list, cost)  # raises if no program exists
        best_choices, best_cost = (
            dict(greedy.choices),
            dag_cost(egraph, greedy.choices, root_list, cost),
        )

    usable = _prune(egraph, root_list, node_cost)
    for r in root_list:
        if r not in usable:
            raise ExtractionError(f"root class {r!r} has no acyclic program")

    col_of: dict[str, int] = {}
    col_node: list[str] = []
    for cls, lst in usable.items():
        for nid in lst:
            col_of[nid] = len(col_node)
            col_node.append(nid)
    ncol = len(col_node)
    costs = np.array([node_cost[n] for n in col_node], dtype=np.float64)

    h = _new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.addVars(ncol, np.zeros(ncol), np.ones(ncol))
    h.changeColsCost(ncol, np.arange(ncol, dtype=np.int32), costs)
    h.changeColsIntegrality(
        ncol,
        np.arange(ncol, dtype=np.int32),
        np.full(ncol, highspy.HighsVarType.kInteger, dtype=np.uint8),
    )

    lower: list[float] = []
    upper: list[float] = []
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    roots_set = set(root_list)
    for cls, lst in usable.items():
        starts.append(len(index))
        lower.append(1.0 if cls in roots_set else 0.0)
        upper.append(1.0)
        index.extend(col_of[n] for n in lst)
        value.extend([1.0] * len(lst))
    for cls, lst in usable.items():
        for nid in lst:
            for k in dict.fromkeys(nodes[nid].children):
                starts.append(len(index))
                lower.append(0.0)
                upper.append(math.inf)
                index.append(col_of[nid])
                value.append(-1.0)
                index.extend(col_of[m] for m in usable[k])
                value.extend([1.0] * len(usable[k]))
    _add_rows(h, lower, upper, starts, index, value)

    def warm() -> None:
        sol = np.zeros(ncol)
        for nid in best_choices.values():  # type: ignore[union-attr]
            j = col_of.get(nid)
            if j is not None:
                sol[j] = 1.0
        h.setSolution(ncol, np.arange(ncol, dtype=np.int32), sol)

    def interrupt(event: Any) -> None:
        # HiGHS's own time limit is checked too rarely inside big LP solves.
        if time.perf_counter() > deadline:
            event.interrupt()

    for cb in (h.cbSimplexInterrupt, h.cbIpmInterrupt, h.cbMipInterrupt):
        cb.subscribe(interrupt)

    bound = -math.inf
    proved = False
    use_warm = True
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        # HiGHS overruns its limit in long phases without checks: leave it some slack.
        h.setOptionValue("time_limit", max(0.8 * left, 0.01))
        h.clearSolver()
        if use_warm:
            warm()
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        feasible = info.primal_solution_status == 2  # kSolutionStatusFeasible
        x = np.asarray(h.getSolution().col_value) if feasible else None
        if use_warm and x is not None:
            # HiGHS 1.16 can report a better objective (and dual bound) than the solution
            # it returns after a user-supplied start; such a solve proves nothing, so
            # redo it from scratch and stop warm-starting.
            obj = float(costs @ x)
            if abs(obj - info.objective_function_value) > _BOUND_TOL * max(1.0, abs(obj)):
                use_warm = False
                continue
        if status == highspy.HighsModelStatus.kOptimal:
            round_bound = min(info.objective_function_value, info.mip_dual_bound)
        else:
            round_bound = info.mip_dual_bound
        if math.isfinite(round_bound):
            bound = max(bound, round_bound)
        if x is None:
            break
        choice: dict[str, str] = {}
        for j in np.nonzero(x > 0.5)[0]:
            nid = col_node[int(j)]
            choice[nodes[nid].eclass] = nid
        cycles = _find_cycles(egraph, root_list, choice, _MAX_CUTS_PER_ROUND)
        if cycles is None:
            break
        if not cycles:
            c = _cost_of(egraph, root_list, choice, cost)
            if c is not None and c < best_cost:
                best_choices, best_cost = _reachable(egraph, root_list, choice), c
            proved = status == highspy.HighsModelStatus.kOptimal
            break
        # Repair the cyclic incumbent into a candidate, then cut the cycles off.
        repaired = dict(choice)
        try:
            for cls, lst in usable.items():
                repaired.setdefault(cls, lst[0])
            break_cycles(egraph, root_list, repaired, node_cost)
            c = _cost_of(egraph, root_list, repaired, cost)
            if c is not None and c < best_cost:
                best_choices, best_cost = _reachable(egraph, root_list, repaired), c
        except (ExtractionError, KeyError):
            pass
        if status != highspy.HighsModelStatus.kOptimal:
            break  # timed out with a cyclic incumbent: the relaxation bound still holds
        lower, upper, starts, index, value = [], [], [], [], []
        for cyc in cycles:
            starts.append(len(index))
            k = len(cyc)
            lower.append(-math.inf)
            upper.append(float(k - 1))
            cols: set[int] = set()
            for i, cls in enumerate(cyc):
                nxt = cyc[(i + 1) % k]
                cols.update(col_of[n] for n in usable[cls] if nxt in nodes[n].children)
            index.extend(sorted(cols))
            value.extend([1.0] * len(cols))
        _add_rows(h, lower, upper, starts, index, value)

    assert best_choices is not None
    final_cost = dag_cost(egraph, best_choices, root_list, cost)
    check_extraction(egraph, best_choices, root_list)
    if proved and abs(bound - final_cost) <= _BOUND_TOL * max(1.0, abs(final_cost)):
        lb = final_cost
    else:
        # No proof: the best dual bound, at least the trivial one (each root's cheapest node).
        trivial = max(min(node_cost[n] for n in usable[r]) for r in root_list)
        lb = min(max(bound, trivial), final_cost)
    return Extraction(best_choices, final_cost, "ilp", time.perf_counter() - start, lb)


def _reachable(egraph: EGraph, roots: list[str], choice: Mapping[str, str]) -> dict[str, str]:
    return {c: choice[c] for c in reachable_classes(egraph, choice, roots)}


def _add_rows(
    h: Any,
    lower: list[float],
    upper: list[float],
    starts: list[int],
    index: list[int],
    value: list[float],
) -> None:
    if not lower:
        return
    status = h.addRows(
        len(lower),
        np.array(lower, dtype=np.float64),
        np.array(upper, dtype=np.float64),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value, dtype=np.float64),
    )
    if status.name == "kError":
        raise RuntimeError("HiGHS rejected the extraction model rows")
