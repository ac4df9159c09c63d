"""What else extraction could have chosen, and what each choice would have cost.

An alternative is another e-node of a chosen class. It is priced as the whole program's
predicted cost had the class chosen it, the rest of the program kept: the nodes only the old
choice needed drop out, the classes only the new one needs come in at their cheapest tree
(`extract.cheapest_trees`), and a class both need is counted once. That is the margin of the
choice: positive where the extracted program is cheaper, negative where the extractor missed
a better program (a greedy extractor can; the ILP at gap 0 cannot).

Sharing is priced the same way: a kernel several classes consume (a merged QKV projection,
read through three slices) is weighed against every consumer switching, together, to its best
alternative that does not read it.

The change is computed locally, with reference counts of the program's classes: its cost is
the size of the part of the program that changes, not of the program.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..extraction.egraph_json import EGraph
from ..extraction.extract import cheapest_trees, reachable_classes

MAX_ALTERNATIVES = 6  # per class, the cheapest kept (the report says how many there were)


@dataclass(frozen=True)
class Alternative:
    node: str  # the e-node's id in the serialized e-graph
    own_us: float  # its own predicted cost
    delta_us: float | None  # the program's predicted cost change; None: it would be cyclic


class ProgramChoices:
    """An extracted program (a choice per reachable class) with what is needed to price
    changes of some of its choices."""

    def __init__(self, egraph: EGraph, choices: Mapping[str, str],
                 node_cost: Mapping[str, float], roots: list[str]):
        self.egraph = egraph
        self.choices = dict(choices)
        self.node_cost = node_cost
        order = reachable_classes(egraph, self.choices, roots)  # children before parents
        self.order = {cls: k for k, cls in enumerate(order)}
        self.refs: dict[str, int] = {}  # class -> uses by chosen nodes (and as a root)
        self.users: dict[str, list[str]] = {}  # class -> the classes whose chosen node reads it
        for cls in roots:
            self.refs[cls] = self.refs.get(cls, 0) + 1
        for cls in order:
            children = egraph.nodes[self.choices[cls]].children
            for child in children:
                self.refs[child] = self.refs.get(child, 0) + 1
            for child in dict.fromkeys(children):
                self.users.setdefault(child, []).append(cls)
        self.cheapest, _ = cheapest_trees(egraph, node_cost)

    def consumers(self, cls: str) -> list[str]:
        """The program's classes whose chosen node reads `cls` (in the program's order)."""
        return self.users.get(cls, [])

    def delta(self, changes: Mapping[str, str]) -> float | None:
        """The program's cost change when each class of `changes` chooses the given node
        instead (None when the result would be cyclic or need a class with no program)."""
        refs: dict[str, int] = {}  # changed reference counts
        nodes, cost = self.egraph.nodes, self.node_cost
        total = 0.0
        work: list[tuple[str, int]] = []
        for cls, new in changes.items():
            old = self.choices[cls]
            total += cost[new] - cost[old]
            work += [(c, -1) for c in nodes[old].children]
            work += [(c, +1) for c in nodes[new].children]
        while work:
            cls, step = work.pop()
            before = refs.get(cls, self.refs.get(cls, 0))
            refs[cls] = before + step
            if before == (0 if step == 1 else 1):  # it enters (0 -> 1) or leaves (1 -> 0)
                node = self.choice(cls, changes)
                if node is None:
                    return None
                total += step * cost[node]
                work += [(c, step) for c in nodes[node].children]
        return None if self._cyclic(changes) else total

    def choice(self, cls: str, changes: Mapping[str, str]) -> str | None:
        return changes.get(cls) or self.choices.get(cls) or self.cheapest.get(cls)

    def _cyclic(self, changes: Mapping[str, str]) -> bool:
        """Whether a changed class reaches itself (or another changed class reaches back).
        Any cycle passes through a changed class; below an unchanged program class that comes
        before every changed one in the program's order, none can be reached."""
        floor = min(self.order[c] for c in changes)
        nodes = self.egraph.nodes
        seen: set[str] = set()
        stack = [k for c in changes for k in nodes[changes[c]].children]
        while stack:
            cls = stack.pop()
            if cls in changes:
                return True
            if cls in seen or (cls in self.order and self.order[cls] < floor):
                continue
            seen.add(cls)
            node = self.choice(cls, changes)
            if node is not None:
                stack.extend(nodes[node].children)
        return False

    def alternatives(self, cls: str, keep: int = MAX_ALTERNATIVES) -> tuple[list[Alternative],
                                                                          int]:
        """The other e-nodes of `cls`, cheapest change first (at most `keep`), and how many
        there were."""
        chosen = self.choices[cls]
        found = []
        for nid in self.egraph.classes[cls]:
            node = self.egraph.nodes[nid]
            if nid == chosen or node.subsumed or nid not in self.node_cost:
                continue
            found.append(Alternative(nid, self.node_cost[nid], self.delta({cls: nid})))
        found.sort(key=lambda a: (a.delta_us is None, a.delta_us or 0.0))
        return found[:keep], len(found)

    def unshared(self, cls: str) -> tuple[float | None, dict[str, str]]:
        """The cost change if every consumer of `cls` took its best alternative that does not
        read `cls` (None, {} when one of them has none), and those alternatives."""
        changes: dict[str, str] = {}
        for user in self.consumers(cls):
            options = [a for a in self.alternatives(user, keep=len(
                self.egraph.classes[user]))[0] if a.delta_us is not None
                and cls not in self.egraph.nodes[a.node].children]
            if not options:
                return None, {}
            changes[user] = options[0].node
        return (self.delta(changes) if changes else None), changes
