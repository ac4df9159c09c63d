"""Reports in words: why a kernel was chosen (`explain`), and what changed between two runs
(`diff`). Both read the report's JSON form (`Report.to_dict()`, or a file `--json` wrote), so
they work on a saved report as on a live one."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..errors import EqsatError
from .units import fmt_bytes, fmt_count, fmt_signed_us, fmt_us


def find_kernels(report: dict[str, Any], query: int | str) -> list[dict[str, Any]]:
    """The kernels a query names: an id (12 or "%12"), a label ("gemm[rms_norm]") or an op
    ("gemm", "attention"). Raises EqsatError, listing what there is, when none matches."""
    kernels = report.get("kernels") or []
    text = str(query).removeprefix("%")
    if text.isdigit():
        found = [k for k in kernels if k["id"] == int(text)]
    else:
        found = [k for k in kernels if k["label"] == text] or \
            [k for k in kernels if k["op"] == text]
    if not found:
        labels = sorted({k["label"] for k in kernels if k.get("bound") != "free"})
        raise EqsatError(f"no kernel of the program is {query!r}; its kernels: "
                         f"{', '.join(labels) or 'none'} (or an id, such as %{kernels[0]['id']})"
                         if kernels else f"the report lists no kernels to match {query!r}")
    return found


def programs(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The programs a report describes: one (optimize()'s), or a Generator's prefill and
    decode programs, by name."""
    if "kernels" in report or "prefill" not in report:
        return [("", report)]
    return [("prefill", report["prefill"]), ("decode", report["decode"])]


def explain(report: dict[str, Any], query: int | str) -> str:
    """Each kernel the query names: what it computes, what it costs (predicted, and measured
    when profiled), the rules that built it, and what it was chosen over, by how much. A
    Generator's report: in each of its programs."""
    parts = []
    for name, program in programs(report):
        text = "\n\n".join(_kernel_text(k) for k in find_kernels(program, query))
        parts.append(f"## {name} program\n{text}" if name else text)
    return "\n\n".join(parts)


def _kernel_text(k: dict[str, Any]) -> str:
    operands = ", ".join(f"%{i}" for i in k.get("operands", []))
    lines = [f"%{k['id']} = {k['label']}({operands}) -> {k['output']}"]
    lines.append("  " + _cost_text(k))
    if k["rules"] or k.get("class_rules"):
        built = ", ".join(k["rules"]) or "no rule (the captured program's own op)"
        also = (f"; its e-class also holds the results of {', '.join(k['class_rules'])}"
                if k.get("class_rules") else "")
        lines.append(f"  built by: {built}{also}")
    else:
        lines.append("  built by: no rule (the captured program's own op)")
    alts = k["alternatives"]
    if not alts:
        lines.append("  no alternative: its e-class holds this e-node only")
    else:
        shown = "" if len(alts) == k["alternatives_total"] else \
            f" (the {len(alts)} cheapest of {k['alternatives_total']})"
        lines.append(f"  chosen over{shown}:")
        width = max(len(a["term"]) for a in alts)
        for a in alts:
            lines.append(f"    {a['term']:<{width}}  own {fmt_us(a['own_us']):>9}  "
                         f"program {_delta_text(a['delta_us'])}")
    sharing = k.get("sharing")
    if sharing:
        users = ", ".join(f"%{i}" for i in sharing["consumers"])
        lines.append(f"  shared by {users}: each computing its own instead would change the "
                     f"program by {_delta_text(sharing['unshared_delta_us'])}")
        lines += [f"    {t}" for t in sharing["unshared"]]
    return "\n".join(lines)


def _cost_text(k: dict[str, Any]) -> str:
    if k["predicted_us"] is None:
        return "cost: not priced (an input's type is not a tensor)"
    if k["bound"] == "free":
        return "cost: free (a view: no data moves)"
    text = (f"predicted {fmt_us(k['predicted_us'])}, {k['bound']}-bound "
            f"({fmt_count(k['flops'], 'FLOP')}, {fmt_bytes(k['bytes'])} moved)")
    if k.get("measured_us") is not None:
        ratio = k["measured_us"] / k["predicted_us"] if k["predicted_us"] else None
        text += f"; measured {fmt_us(k['measured_us'])}"
        if k.get("group"):
            text += f" (backend kernel {k['group']})"
        if ratio is not None:
            text += f", {ratio:.2f}x the prediction"
    return text


def _delta_text(delta: float | None) -> str:
    if delta is None:
        return "(not possible: the program would be cyclic)"
    return f"{'+' if delta >= 0 else '-'}{fmt_us(abs(delta))}" + (
        "  (cheaper: the extractor missed it)" if delta < -1e-6 else "")


# --------------------------------------------------------------------------- diff


def diff(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """What changed from report `a` to report `b`: predicted cost, kernels (by label and
    output type), rules fired and used, e-graph size, and measured error when profiled.
    Two Generator reports: program by program."""
    pa, pb = programs(a), programs(b)
    if [n for n, _ in pa] != [n for n, _ in pb]:
        raise EqsatError("one report is a Generator's (prefill and decode), the other not")
    if len(pa) > 1:
        return "\n\n".join(f"## {name} program\n" + _program_diff(x, y, names)
                           for (name, x), (_, y) in zip(pa, pb))
    return _program_diff(a, b, names)


def _program_diff(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> str:
    lines = [f"report diff: {names[0]} -> {names[1]}"]
    lines.append(f"predicted cost: {fmt_us(a['cost_after'])} -> {fmt_us(b['cost_after'])} "
                 f"({fmt_signed_us(b['cost_after'] - a['cost_after'])}); captured program "
                 f"{fmt_us(a['cost_before'])} -> {fmt_us(b['cost_before'])}")
    lines.append(f"nodes: {a['nodes_after']} -> {b['nodes_after']}; e-graph "
                 f"{a['enodes']} -> {b['enodes']} nodes, stopped: {a['stop_reason']} -> "
                 f"{b['stop_reason']}")
    lines += _kernel_diff(a.get("kernels") or [], b.get("kernels") or [])
    lines += _rule_diff(a["rules"], b["rules"])
    pa, pb = a.get("profile"), b.get("profile")
    if pa and pb and pa["median_ratio"] is not None and pb["median_ratio"] is not None:
        lines.append(f"measured: {fmt_us(pa['total_measured_us'])} -> "
                     f"{fmt_us(pb['total_measured_us'])}; model error median "
                     f"{pa['median_ratio']:.2f}x -> {pb['median_ratio']:.2f}x, worst "
                     f"{pa['worst_ratio']:.2f}x -> {pb['worst_ratio']:.2f}x")
    return "\n".join(lines)


def _kernel_key(k: dict[str, Any]) -> str:
    return f"{k['label']} -> {k['output']}"


def _kernel_diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Kernels matched by label and output type (ids differ between runs)."""
    def priced(ks: list[dict[str, Any]]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for k in ks:
            if k.get("bound") != "free":
                out.setdefault(_kernel_key(k), []).append(k["predicted_us"] or 0.0)
        return out
    pa, pb = priced(a), priced(b)
    lines = []
    for key in sorted(set(pa) | set(pb)):
        na, nb = len(pa.get(key, [])), len(pb.get(key, []))
        ca, cb = sum(pa.get(key, [])), sum(pb.get(key, []))
        if na != nb:
            lines.append(f"  {'+' if nb > na else '-'} {key}: {na} -> {nb} "
                         f"({fmt_us(ca)} -> {fmt_us(cb)})")
        elif abs(cb - ca) > 1e-3 * max(ca, cb, 1e-9):
            lines.append(f"  ~ {key}: {fmt_us(ca)} -> {fmt_us(cb)} ({fmt_signed_us(cb - ca)})")
    return ["kernels:" if lines else "kernels: the same", *lines]


def _rule_diff(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Rules whose matches or use changed (one that neither run fired is left out)."""
    ra, rb = {r["name"]: r for r in a}, {r["name"]: r for r in b}
    idle = {"not loaded", "did not fire"}
    lines = []
    for name in sorted(set(ra) | set(rb)):
        was, now = _rule_state(ra.get(name)), _rule_state(rb.get(name))
        if was != now and not {was, now} <= idle:
            lines.append(f"  {name}: {was} -> {now}")
    added = Counter(r["family"] for n, r in rb.items() if n not in ra)
    removed = Counter(r["family"] for n, r in ra.items() if n not in rb)
    head = "rules:" if lines else "rules: the same matches and uses"
    if added or removed:
        head += (f" (loaded {sum(added.values())} more, {sum(removed.values())} fewer)")
    return [head, *lines]


def _rule_state(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not loaded"
    if not r["matches"]:
        return "did not fire"
    return f"{r['matches']} matches, {'used' if r['used'] else 'not used'}"

