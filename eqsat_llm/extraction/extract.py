"""Extraction: choose one e-node per e-class so that the chosen program is cheap.

The optimizer saturates an LLM inference graph with egglog, serializes the e-graph in the
egraph-serialize JSON format (the format the extraction-gym benchmark uses) and extracts
a program from it here. Two greedy extractors are provided:

* :func:`extract_tree_greedy` minimises each class's *tree* cost (shared subterms counted
  once per use). It is exact for tree cost and fast, but blind to sharing.
* :func:`extract_dag_greedy` is the "faster greedy DAG" heuristic of extraction-gym: it
  tracks, per class, the set of nodes its best program needs, so shared subterms are
  counted once. It usually beats tree-greedy on DAG cost, which is what inference
  actually pays (a shared tensor is computed once).

Every algorithm here is iterative: e-graphs can be thousands of levels deep, far beyond
Python's recursion limit.

The e-graph itself and its loader are egraph_json.py's. The building blocks the ILP
extractor (:mod:`eqsat_llm.extraction.ilp`) shares with these are public:
:func:`root_classes`, :func:`node_costs`, :func:`chosen_children`, :func:`chosen_cycles`,
:func:`acyclic_worklist` and :func:`break_cycles`.
"""

from __future__ import annotations

import heapq
import math
import numbers
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import EqsatError
from .egraph_json import EGraph, ENode

__all__ = [
    "CostFn",
    "Extraction",
    "ExtractionError",
    "acyclic_worklist",
    "break_cycles",
    "cheapest_trees",
    "check_extraction",
    "chosen_children",
    "chosen_cycles",
    "dag_cost",
    "extract_dag_greedy",
    "extract_tree_greedy",
    "node_costs",
    "reachable_classes",
    "root_classes",
    "tree_cost",
]


class ExtractionError(EqsatError, ValueError):
    """An extraction is impossible or a given choice map is not a valid program."""


@dataclass(slots=True)
class Extraction:
    """An extraction result.

    ``choices`` maps each class reachable from the roots (through chosen nodes) to its
    chosen node id; ``cost`` is the DAG cost of that program (each chosen node counted
    once) under the cost model used; ``lower_bound`` is set by exact/bounded methods only.
    """

    choices: dict[str, str]
    cost: float
    method: str
    seconds: float
    lower_bound: float | None = None


_LITTLE_ENDIAN = sys.byteorder == "little"  # _sum_bits reads ints as native 64-bit words

CostFn = Callable[[ENode], float]
"""A cost model: maps an e-node to a finite, non-negative cost (overrides ``node.cost``)."""


# --------------------------------------------------------------------------- checking / costs


def root_classes(egraph: EGraph, roots: Iterable[str] | None) -> list[str]:
    """The root classes to extract: ``roots``, or the e-graph's own when None. Raises
    :class:`ExtractionError` when there are none or one is not a class of the e-graph."""
    result = list(egraph.roots if roots is None else roots)
    if not result:
        raise ExtractionError("no roots: roots must be given (the e-graph has no root_eclasses)")
    for r in result:
        if r not in egraph.classes:
            raise ExtractionError(f"root class {r!r} is not a class of the e-graph")
    return result


def _cycle_message(cycle: list[str]) -> str:
    closed = cycle + cycle[:1]
    return "chosen program has a cycle through classes " + " -> ".join(map(repr, closed))


def _chosen_dfs(
    roots: Iterable[str],
    children_of: Callable[[str], Iterable[str]],
    on_cycle: Callable[[list[str]], bool],
) -> list[str] | None:
    """Iterative DFS of a chosen program from ``roots``: the classes in post-order (children
    before parents). ``children_of(cls)`` gives a class's child classes and is called once
    per class, when it is first reached (it may raise). At each back edge, ``on_cycle`` gets
    the classes of that cycle (from the one reached again down to the current one); if it
    returns true the search stops and returns None."""
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done
    order: list[str] = []
    for root in roots:
        if root in state:
            continue
        state[root] = 1
        stack: list[tuple[str, Any]] = [(root, iter(children_of(root)))]
        while stack:
            cls, it = stack[-1]
            for child in it:
                s = state.get(child)
                if s is None:
                    state[child] = 1
                    stack.append((child, iter(children_of(child))))
                    break
                if s == 1:
                    path = [c for c, _ in stack]
                    if on_cycle(path[path.index(child) :]):
                        return None
            else:
                stack.pop()
                state[cls] = 2
                order.append(cls)
    return order


def chosen_cycles(
    roots: Iterable[str], children_of: Callable[[str], Iterable[str]], limit: int
) -> list[list[str]]:
    """Up to ``limit`` cycles (lists of classes) of the chosen program reachable from
    ``roots``, in the order a depth-first walk meets them. ``children_of(cls)`` gives a
    class's child classes under the choice (see :func:`chosen_children`)."""
    cycles: list[list[str]] = []

    def found(cycle: list[str]) -> bool:
        cycles.append(cycle)
        return len(cycles) >= limit

    _chosen_dfs(roots, children_of, found)
    return cycles


def chosen_children(
    egraph: EGraph, choices: Mapping[str, str]
) -> Callable[[str], tuple[str, ...]]:
    """A ``children_of`` for walks of the chosen program (:func:`chosen_cycles`): a class's
    child classes through its chosen node. Raises :class:`ExtractionError` when a class's
    choice is missing or not a node of that class."""
    nodes = egraph.nodes

    def children_of(cls: str) -> tuple[str, ...]:
        nid = choices.get(cls)
        if nid is None:
            raise ExtractionError(f"reachable class {cls!r} has no chosen node")
        node = nodes.get(nid)
        if node is None or node.eclass != cls:
            raise ExtractionError(f"choice {nid!r} for class {cls!r} is not a node of that class")
        return node.children

    return children_of


def reachable_classes(
    egraph: EGraph, choices: Mapping[str, str], roots: Iterable[str] | None = None
) -> list[str]:
    """Classes reachable from the roots through chosen nodes, children before parents.

    Raises :class:`ExtractionError` if a reachable class has no choice, the choice is not
    a node of that class, or the chosen program is cyclic (no topological order exists).
    Iterative DFS, so depth is unbounded.
    """

    def cyclic(cycle: list[str]) -> bool:
        raise ExtractionError(_cycle_message(cycle))

    order = _chosen_dfs(root_classes(egraph, roots), chosen_children(egraph, choices), cyclic)
    assert order is not None  # ``cyclic`` raises rather than stopping the search
    return order


def check_extraction(
    egraph: EGraph, choices: Mapping[str, str], roots: Iterable[str] | None = None
) -> None:
    """Raise :class:`ExtractionError` unless ``choices`` is a valid, acyclic program:
    every reachable class chosen, each choice a node of its class, none subsumed."""
    for cls in reachable_classes(egraph, choices, roots):
        nid = choices[cls]
        if egraph.nodes[nid].subsumed:
            raise ExtractionError(f"chosen node {nid!r} of class {cls!r} is subsumed")


def dag_cost(
    egraph: EGraph,
    choices: Mapping[str, str],
    roots: Iterable[str] | None = None,
    cost: CostFn | None = None,
) -> float:
    """DAG cost: each chosen reachable node counted once (what evaluating the shared
    program costs). ``cost`` overrides ``node.cost`` like in the extractors."""
    nodes = egraph.nodes
    fn = cost or _stored_cost
    return math.fsum(fn(nodes[choices[c]]) for c in reachable_classes(egraph, choices, roots))


def tree_cost(
    egraph: EGraph,
    choices: Mapping[str, str],
    roots: Iterable[str] | None = None,
    cost: CostFn | None = None,
) -> float:
    """Tree cost: a shared class counted once per use (the size of the unshared term).

    Memoised per class in topological order, so it is linear even when the value is
    astronomically large (it is a float and may overflow to ``inf``). With several
    roots, the roots' tree costs are summed (a root listed twice counts twice).
    """
    nodes = egraph.nodes
    fn = cost or _stored_cost
    root_list = root_classes(egraph, roots)
    memo: dict[str, float] = {}
    for cls in reachable_classes(egraph, choices, root_list):
        node = nodes[choices[cls]]
        memo[cls] = fn(node) + sum(memo[c] for c in node.children)
    return sum(memo[r] for r in root_list)


def _stored_cost(node: ENode) -> float:
    return node.cost


def node_costs(egraph: EGraph, cost: CostFn | None) -> dict[str, float]:
    """Cost of every choosable (non-subsumed) node, calling the cost model once per node."""
    if cost is None:
        return {nid: n.cost for nid, n in egraph.nodes.items() if not n.subsumed}
    out: dict[str, float] = {}
    for nid, node in egraph.nodes.items():
        if node.subsumed:
            continue
        value = cost(node)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ExtractionError(f"cost model returned {value!r} for node {nid!r}: not a number")
        value = float(value)
        if not (0.0 <= value < math.inf):  # also rejects NaN
            raise ExtractionError(
                f"cost model returned {value!r} for node {nid!r}: must be finite and >= 0"
            )
        out[nid] = value
    return out


def _require_roots(roots: list[str], choice: Mapping[str, str]) -> None:
    for r in roots:
        if r not in choice:
            raise ExtractionError(
                f"root class {r!r} has no finite-cost choice (every program for it is cyclic "
                "or uses subsumed nodes)"
            )


def _finish(
    egraph: EGraph,
    roots: list[str],
    choice: dict[str, str],
    node_cost: dict[str, float],
    method: str,
    start: float,
) -> Extraction:
    """Restrict ``choice`` to the classes reachable from the roots and price the result."""
    _require_roots(roots, choice)
    order = reachable_classes(egraph, choice, roots)
    choices = {c: choice[c] for c in order}
    total = math.fsum(node_cost[choices[c]] for c in order)
    return Extraction(choices, total, method, time.perf_counter() - start)


# --------------------------------------------------------------------------- tree greedy


def extract_tree_greedy(
    egraph: EGraph, roots: Iterable[str] | None = None, cost: CostFn | None = None
) -> Extraction:
    """Bottom-up greedy extraction minimising each class's tree cost.

    ``cost(class) = min over its nodes of cost(node) + sum of child-class costs``. Solved
    with a worklist ordered by cost (Knuth's generalisation of Dijkstra): a node is priced
    once, when its last child class gets its final cost, and a class is final the first
    time it is popped. That is the least fixed point in O(E log V) with no re-sweeps, and
    the choices are acyclic by construction (a node is chosen only after all its child
    classes were final). Stops as soon as every root is final. ``Extraction.cost`` is the
    DAG cost of the chosen program.
    """
    start = time.perf_counter()
    root_list = root_classes(egraph, roots)
    node_cost = node_costs(egraph, cost)
    choice, _ = cheapest_trees(egraph, node_cost, set(root_list))
    return _finish(egraph, root_list, choice, node_cost, "tree-greedy", start)


def cheapest_trees(egraph: EGraph, node_cost: Mapping[str, float],
                   until: set[str] | None = None) -> tuple[dict[str, str], dict[str, float]]:
    """Each class's node of least tree cost, and that cost: for every class that has an
    acyclic program, or (``until``) as soon as those classes are final."""
    nodes = egraph.nodes
    # pending: node -> number of distinct child classes not final yet. Ties in the heap
    # break by insertion order (``seq``).
    pending, parents, ready = acyclic_worklist(nodes, node_cost)
    heap = [(node_cost[nid], seq, nid) for seq, nid in enumerate(ready)]
    heapq.heapify(heap)
    seq = len(heap)

    best: dict[str, float] = {}
    choice: dict[str, str] = {}
    todo = set(until) if until is not None else None
    while heap and (todo is None or todo):
        total, _, nid = heapq.heappop(heap)
        cls = nodes[nid].eclass
        if cls in best:
            continue
        best[cls] = total
        choice[cls] = nid
        if todo is not None:
            todo.discard(cls)
        for p in parents.get(cls, ()):
            left = pending[p] - 1
            pending[p] = left
            if left == 0:
                pnode = nodes[p]
                if pnode.eclass not in best:
                    t = node_cost[p] + sum(best[k] for k in pnode.children)
                    heapq.heappush(heap, (t, seq, p))
                    seq += 1
    return choice, best


# --------------------------------------------------------------------------- DAG greedy


def extract_dag_greedy(
    egraph: EGraph, roots: Iterable[str] | None = None, cost: CostFn | None = None
) -> Extraction:
    """Greedy DAG extraction (extraction-gym's "faster greedy DAG").

    Each class keeps a *cost set*: the nodes its best program needs (its chosen node plus
    the union of its children's sets), and picks the node minimising the set's total, so
    shared subterms are counted once. A FIFO worklist re-prices the parents of a class
    whenever its total drops. A node is priced only once all its child classes have sets,
    and is rejected when its own class is among its children or its union already holds
    a node of its class (it would be cyclic).

    Sets are bitsets over node indices (Python ints): a union is one C-speed OR and a set
    costs n/8 bytes, so deep graphs (a chain of 20k classes) stay fast and small, where
    extraction-gym's per-class hash maps grow quadratically. The total is the sum of the
    member nodes' costs. Where two children's sets hold different nodes of one class (a
    stale view of a class whose choice changed), both are counted, not one arbitrary one:
    this keeps a set's total >= each child's, which is what makes the choices acyclic by
    construction. :func:`break_cycles` stays as a safety net (float ties).
    """
    start = time.perf_counter()
    root_list = root_classes(egraph, roots)
    node_cost = node_costs(egraph, cost)
    nodes = egraph.nodes

    # Index the choosable nodes grouped by class, so a class is a contiguous bit span.
    index: dict[str, int] = {}
    weights: list[float] = []
    span: dict[str, tuple[int, int]] = {}  # class -> (first bit, mask of its nodes' bits)
    for cls, nids in egraph.classes.items():
        first = len(weights)
        for nid in nids:
            if nid in node_cost:
                index[nid] = len(weights)
                weights.append(node_cost[nid])
        span[cls] = (first, (1 << (len(weights) - first)) - 1)

    kid_classes: dict[str, tuple[str, ...]] = {}
    parents: dict[str, list[str]] = {c: [] for c in egraph.classes}
    queue: deque[str] = deque()
    for nid in node_cost:
        kids = tuple(dict.fromkeys(nodes[nid].children))  # distinct, stable order
        kid_classes[nid] = kids
        for k in kids:
            parents[k].append(nid)
        if not kids:
            queue.append(nid)
    queued = set(queue)

    bits: dict[str, int] = {}  # class -> its cost set
    size: dict[str, int] = {}  # class -> popcount of its cost set
    totals: dict[str, float] = {}
    choice: dict[str, str] = {}
    inf = math.inf
    while queue:
        nid = queue.popleft()
        queued.discard(nid)
        kids = kid_classes[nid]
        cls = nodes[nid].eclass
        prev = totals.get(cls, inf)
        c = node_cost[nid]
        me = 1 << index[nid]
        if not kids:
            new, total = me, c
        else:
            if cls in kids or any(k not in bits for k in kids):
                continue  # self-loop, or some child class has no program yet
            if len(kids) == 1:
                k = kids[0]
                total = totals[k] + c
                if total >= prev:
                    continue
                union = bits[k]
            else:
                big = max(kids, key=size.__getitem__)
                if max(totals[k] for k in kids) + c >= prev:
                    continue  # the union costs at least its dearest child
                union = 0
                for k in kids:
                    union |= bits[k]
                total = _sum_bits(union ^ bits[big], weights, totals[big] + c, prev)
                if total >= prev:
                    continue
            first, mask = span[cls]
            if (union >> first) & mask:
                continue  # the children's programs already need this class: cyclic
            new = union | me
        if total < prev:
            bits[cls] = new
            size[cls] = new.bit_count()
            totals[cls] = total
            choice[cls] = nid
            for p in parents[cls]:
                if p not in queued:
                    queued.add(p)
                    queue.append(p)

    _require_roots(root_list, choice)
    break_cycles(egraph, root_list, choice, node_cost)
    return _finish(egraph, root_list, choice, node_cost, "dag-greedy", start)


def _sum_bits(d: int, weights: list[float], total: float, limit: float) -> float:
    """``total`` plus the weights of the set bits of ``d``; stops once it reaches ``limit``.

    Few bits: peel the lowest bit off at a time. Many: scan 64-bit words of the bytes,
    which is linear in the width instead of (bits x width)."""
    if d.bit_count() <= 16 or not _LITTLE_ENDIAN:
        while d:
            low = d & -d
            total += weights[low.bit_length() - 1]
            d ^= low
        return total
    words = memoryview(d.to_bytes((d.bit_length() + 63) // 64 * 8, "little")).cast("Q")
    for w_index, w in enumerate(words):
        if w:
            base = w_index * 64
            while w:
                low = w & -w
                total += weights[base + low.bit_length() - 1]
                w ^= low
            if total >= limit:
                return total
    return total


def acyclic_worklist(
    nodes: Mapping[str, ENode], nids: Iterable[str]
) -> tuple[dict[str, int], dict[str, list[str]], list[str]]:
    """Set up a Kahn-style worklist over the nodes ``nids``: ``pending`` (node -> number of
    distinct child classes not resolved yet), ``parents`` (class -> nodes having it as a
    distinct child) and ``ready`` (the childless nodes, in ``nids`` order)."""
    pending: dict[str, int] = {}
    parents: dict[str, list[str]] = {}
    ready: list[str] = []
    for nid in nids:
        kids = dict.fromkeys(nodes[nid].children)  # distinct, in a stable order
        if kids:
            pending[nid] = len(kids)
            for k in kids:
                parents.setdefault(k, []).append(nid)
        else:
            ready.append(nid)
    return pending, parents, ready


def _safe_choices(egraph: EGraph, node_cost: Mapping[str, float]) -> dict[str, str]:
    """For every class that has some acyclic program, a node whose children were all
    resolved earlier (Kahn-style order): any mix of these choices is acyclic."""
    nodes = egraph.nodes
    pending, parents, ready = acyclic_worklist(nodes, node_cost)
    queue = deque(ready)
    safe: dict[str, str] = {}
    while queue:
        nid = queue.popleft()
        cls = nodes[nid].eclass
        if cls in safe:
            continue
        safe[cls] = nid
        for p in parents.get(cls, ()):
            pending[p] -= 1
            if pending[p] == 0:
                queue.append(p)
    return safe


def _find_cycle(egraph: EGraph, roots: list[str], choice: Mapping[str, str]) -> list[str] | None:
    """Classes of one cycle among the chosen program reachable from ``roots``, or None."""
    nodes = egraph.nodes
    cycles = chosen_cycles(roots, lambda cls: nodes[choice[cls]].children, 1)
    return cycles[0] if cycles else None


def break_cycles(
    egraph: EGraph, roots: list[str], choice: dict[str, str], node_cost: Mapping[str, float]
) -> None:
    """Make the choices reachable from ``roots`` acyclic, in place.

    Each round switches one class on a cycle to its safe node (:func:`_safe_choices`). Safe
    edges go strictly earlier in the Kahn order, so a cycle always contains an unsafe
    choice, and every round fixes one class for good: at most one round per class.
    Picks the switch that raises the class's own node cost least. Normally no round runs.
    """
    cycle = _find_cycle(egraph, roots, choice)
    if cycle is None:
        return
    safe = _safe_choices(egraph, node_cost)
    while cycle is not None:
        unsafe = [c for c in cycle if choice[c] != safe[c]]
        cls = min(unsafe, key=lambda c: node_cost[safe[c]] - node_cost[choice[c]])
        choice[cls] = safe[cls]
        cycle = _find_cycle(egraph, roots, choice)
