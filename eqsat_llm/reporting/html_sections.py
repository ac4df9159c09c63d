"""The report page's sections as HTML: summary, kernels, decisions, accuracy, rules, ops and
phases (docs/report.md says what each shows)."""

from __future__ import annotations

from typing import Any

from ..profile import FLAG_RATIO  # off by more than this factor: flagged, in red
from .html_pieces import (
    bar,
    category,
    esc,
    fmt_delta,
    fmt_ratio,
    fmt_type,
    margin,
    measured_of,
    profile_by_node,
    table,
)
from .svg_charts import dumbbell_chart
from .units import fmt_bytes, fmt_count, fmt_seconds, fmt_us

# --- summary ------------------------------------------------------------------------------------

def summary_section(d: dict[str, Any]) -> str:
    rows = [["ops", f"{d['nodes_before']} &rarr; {d['nodes_after']}"],
            ["predicted time", (f"{fmt_us(d['cost_before'])} &rarr; "
                                f"<b>{fmt_us(d['cost_after'])}</b> "
                                f"({esc(d['extraction_method'])} extraction)")],
            ["lower bound", lower_bound_text(d)],
            ["e-graph", (f"{d['eclasses']} classes, {d['enodes']} nodes after "
                         f"{d['iterations']} iterations; stopped: {esc(d['stop_reason'])}")],
            ["backend", esc(d.get("backend", ""))]]
    if d.get("profile"):
        rows.append(["cost model error", model_error_text(d["profile"])])
    rows += memory_rows(d.get("memory") or {})
    if d.get("folded_constants"):
        rows.append(["constants folded", (f"{d['folded_constants']} values, "
                                          f"{fmt_bytes(d['folded_bytes'])} prepared")])
    for key, name in (("fallback_ops", "ran in torch (fallback)"), ("torch_ops", "torch steps"),
                      ("unpriced_enodes", "e-nodes not priced"),
                      ("weight_formats", "GEMM weight formats")):
        if d.get(key):
            rows.append([name, esc(counts_text(d[key]))])
    return table([], [[esc(k), v] for k, v in rows], cls="summary")


def counts_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} x{v}" for k, v in sorted(value.items()))
    return ", ".join(map(str, value))


def lower_bound_text(d: dict[str, Any]) -> str:
    if d.get("lower_bound") is None:
        return "none (greedy extraction proves no bound)"
    gap = d.get("gap") or 0.0
    verdict = "optimal under the model" if gap <= 1e-9 else f"gap {fmt_us(gap)}"
    return f"{fmt_us(d['lower_bound'])} ({verdict})"


def model_error_text(p: dict[str, Any]) -> str:
    """The cost model's error in one sentence: median ratio, the worst kernel (by how many
    times it is off, either way), how many are off by more than FLAG_RATIO, the totals."""
    kernels = p.get("kernels") or []
    flagged = p.get("flagged")
    count = (len(flagged) if isinstance(flagged, list) else flagged if flagged is not None
             else sum(bool(k.get("flagged")) for k in kernels))
    worst = next((k for k in kernels if k.get("name") == p.get("worst_kernel")), {})
    why = f"; {esc(p['reason'])}" if p.get("reason") else ""
    return (f"measured / predicted: median <b>{fmt_ratio(p.get('median_ratio'))}</b>, worst "
            f"off by <b>{fmt_ratio(p.get('worst_ratio'))}</b> "
            f"({esc(p.get('worst_kernel') or '-')}: ratio {fmt_ratio(worst.get('ratio'))}); "
            f"{count} of {len(kernels)} backend kernels off by more than {FLAG_RATIO}x; total "
            f"{fmt_us(p.get('total_predicted_us'))} predicted, "
            f"{fmt_us(p.get('total_measured_us'))} measured ({esc(p.get('statistic', ''))} of "
            f"{esc(p.get('repeats', ''))} calls on the {esc(p.get('backend', ''))} backend)"
            + why)


def memory_rows(m: dict[str, Any]) -> list[list[str]]:
    if not m:
        return []
    eager = m.get("eager_peak_bytes")
    text = (f"arena {fmt_bytes(m.get('arena_bytes'))} (liveness bound "
            f"{fmt_bytes(m.get('lower_bound_bytes'))}, every intermediate in its own buffer "
            f"{fmt_bytes(m.get('naive_bytes'))}"
            + (f", eager peak {fmt_bytes(eager)}" if eager is not None else "")
            + f"); {m.get('inplace', 0)} in place, {m.get('views', 0)} views")
    return [["memory", text]]


# --- kernels and decisions ------------------------------------------------------------------------

def kernels_section(d: dict[str, Any]) -> str:
    kernels = d.get("kernels") or []
    if not kernels:
        return "<p>The report lists no kernels.</p>"
    by_node = profile_by_node(d)
    row_ids = {k["id"] for k in kernels}
    rows, attrs = [], []
    for k in kernels:
        measured, ratio, off = measured_of(k, by_node.get(k["id"]))
        attrs.append(f' id="kernel-{k["id"]}" data-kernel="{k["id"]}"'
                     + (' class="off"' if off else ""))
        rows.append([str(k["id"]), kernel_name(k),
                     inputs_cell(k, row_ids),
                     fmt_type(str(k.get("output", ""))), cost_cell(k),
                     measured_cell(measured, by_node.get(k["id"])), fmt_ratio(ratio),
                     esc(", ".join(k.get("rules") or [])) or '<span class="dim">-</span>',
                     alternatives_cell(k)])
    note = (f"<p>Rows in red: the kernel's backend kernel took more than {FLAG_RATIO}x or less "
            f"than 1/{FLAG_RATIO} of its predicted time. Measured time and ratio are the backend "
            "kernel's, shared by the IR nodes it covers.</p>")
    head = ["#", "kernel", "inputs", "output", "predicted", "measured", "measured / predicted",
            "rules that built it", "alternatives"]
    return note + table(head, rows, attrs, cls="kernels")


def inputs_cell(k: dict[str, Any], row_ids: set[int]) -> str:
    """Input types, each after the node that computes it (a link when that is a kernel)."""
    types = k.get("inputs") or []
    operands = k.get("operands") or [None] * len(types)
    cells = []
    for t, i in zip(types, operands):
        ref = ("" if i is None or t.startswith("py_") else
               f'<a href="#kernel-{i}">%{i}</a> ' if i in row_ids else
               f'<span class="dim">%{i}</span> ')
        cells.append(f'<span class="nw">{ref}{fmt_type(t)}</span>')
    return "<br>".join(cells)


def kernel_name(k: dict[str, Any]) -> str:
    bound = k.get("bound")
    badge = f' <span class="badge {esc(bound)}">{esc(bound)}</span>' if bound else ""
    return f"<b>{esc(k.get('label') or k.get('op'))}</b>{badge}"


def cost_cell(k: dict[str, Any]) -> str:
    work = []
    if k.get("flops"):
        work.append(fmt_count(k["flops"], "FLOP"))
    if k.get("bytes"):
        work.append(fmt_bytes(k["bytes"]))
    detail = f'<br><span class="dim">{esc(", ".join(work))}</span>' if work else ""
    return fmt_us(k.get("predicted_us")) + detail


def measured_cell(measured: float | None, pk: dict[str, Any] | None) -> str:
    if measured is None:
        return '<span class="dim">-</span>'
    group = f'<br><span class="dim">in {esc(pk.get("name"))}</span>' if pk else ""
    return fmt_us(measured) + group


def alternatives_cell(k: dict[str, Any]) -> str:
    alts = k.get("alternatives") or []
    if not alts:
        return '<span class="dim">none</span>'
    best = margin(alts)
    chosen = ("every alternative makes a cycle" if best is None else
              f"next best {fmt_delta(best)}" if best >= 0 else
              f"an alternative was {fmt_us(-best)} cheaper")
    return (f"<details><summary>{alternatives_count(k)}: {esc(chosen)}</summary>"
            f"{alternatives_table(k)}</details>")


def alternatives_count(k: dict[str, Any]) -> str:
    """"3", or "6 of 40" when the report kept only the closest alternatives."""
    shown, total = len(k.get("alternatives") or []), k.get("alternatives_total") or 0
    return f"{shown} of {total}" if total > shown else str(shown)


def alternatives_table(k: dict[str, Any]) -> str:
    """The chosen kernel and what it beat, cheapest change first, with bars to compare."""
    alts = sorted(k.get("alternatives") or [],
                  key=lambda a: (a.get("delta_us") is None, a.get("delta_us") or 0.0))
    top = max([abs(a.get("delta_us") or 0.0) for a in alts] + [1e-9])
    notes = any(a.get("note") for a in alts)  # a column only when some alternative has one
    rows = [["<b>chosen</b>", f"<code>{esc(k.get('label') or k.get('op'))}</code>",
             fmt_us(k.get("predicted_us")), "0"] + [""] * notes]
    for a in alts:
        delta = a.get("delta_us")
        rows.append([esc(a.get("op", "")), f"<code>{esc(a.get('term', ''))}</code>",
                     fmt_us(a.get("own_us")),
                     fmt_delta(delta) + " " + bar(abs(delta or 0.0) / top,
                                                  "neg" if (delta or 0) < 0 else "")]
                    + [esc(a.get("note") or "")] * notes)
    attrs = [' class="chosen"'] + [""] * len(alts)
    head = ["op", "term", "own predicted cost", "program cost if chosen"] + ["note"] * notes
    return table(head, rows, attrs, cls="alts")


def decisions_section(d: dict[str, Any]) -> str:
    kernels = d.get("kernels") or []
    chosen = [k for k in kernels if k.get("alternatives")]
    if not chosen:
        return ("<p>No kernel's e-class held an alternative the report records (every kernel "
                "was the only way to compute its value, or alternatives were not recorded).</p>")
    intro = (f"<p>{len(chosen)} of {len(kernels)} kernels were chosen among alternatives. Each "
             "alternative's own predicted cost, and the change of the whole program's predicted "
             "cost had it been chosen instead (what extraction compares: an alternative may "
             "cost less alone and more in the program, when it needs inputs nothing else "
             "computes; <i>cycle</i>: choosing it would make the program depend on "
             "itself).</p>")
    # the kernels that compute come first; views, slices and permutes below, folded
    layout = [k for k in chosen if category(k.get("op", "")) == "layout"]
    compute = [k for k in chosen if k not in layout]
    folded = (f"<details><summary>{len(layout)} layout kernels (views, slices, permutes) "
              "chosen among alternatives</summary>" + "".join(decision(k) for k in layout)
              + "</details>") if layout else ""
    return intro + "".join(decision(k) for k in compute) + folded


def decision(k: dict[str, Any]) -> str:
    ins = ", ".join(t for t in k.get("inputs") or [] if not t.startswith("py_"))
    rules = ", ".join(k.get("rules") or []) or "none recorded"
    others = (f"; other rules that fired in its e-class: {esc(', '.join(k['class_rules']))}"
              if k.get("class_rules") else "")
    return (f'<div class="decision" id="decision-{k["id"]}"><h3>{esc(k.get("label"))} '
            f'<a href="#kernel-{k["id"]}">#{k["id"]}</a></h3>'
            f"<p><code>{esc(ins)}</code> &rarr; <code>{esc(k.get('output'))}</code>; predicted "
            f"{fmt_us(k.get('predicted_us'))}; built by: <b>{esc(rules)}</b>{others}</p>"
            f"{sharing_text(k.get('sharing'))}<p>Alternatives in its e-class "
            f"({alternatives_count(k)}):</p>{alternatives_table(k)}</div>")


def sharing_text(sharing: Any) -> str:
    """A kernel several others read: what computing it once per reader would cost."""
    if not sharing:
        return ""
    if not isinstance(sharing, dict):
        return f"<p>{esc(sharing)}</p>"
    readers = ", ".join(f'<a href="#kernel-{c}">#{c}</a>' for c in sharing.get("consumers") or [])
    terms = "".join(f"<li><code>{esc(t)}</code></li>" for t in sharing.get("unshared") or [])
    return (f"<p>Shared by {readers}: computing it separately for each reader would change "
            f"the program's predicted cost by <b>{fmt_delta(sharing.get('unshared_delta_us'))}"
            f"</b>{', as:' if terms else '.'}</p>" + (f"<ul>{terms}</ul>" if terms else ""))


def accuracy_section(d: dict[str, Any]) -> str:
    p = d.get("profile")
    if not p or not p.get("kernels"):
        return ("<p>Not profiled: run <code>eqsat-llm optimize ... --profile</code> to measure "
                "each backend kernel and compare it with the cost model's prediction.</p>")
    flagged = [pk for pk in p["kernels"] if pk.get("flagged")]
    caption = (f'<p class="caption">{model_error_text(p)}. Each row is one backend kernel: '
               "the hollow diamond is its predicted time, the dot its measured time, the green "
               f"band the range within {FLAG_RATIO}x of the prediction; red rows lie outside it."
               "</p>")
    reasons = "".join(f"<li><b>{esc(pk.get('name'))}</b> ({fmt_ratio(pk.get('ratio'))}): "
                      f"{esc(pk.get('reason') or 'no reason given')}</li>" for pk in flagged)
    return (caption + dumbbell_chart(p["kernels"])
            + (f"<h3>Off by more than {FLAG_RATIO}x</h3><ul>{reasons}</ul>" if flagged else ""))


# --- rules, ops, phases -------------------------------------------------------------------------

def rules_section(d: dict[str, Any]) -> str:
    built: dict[str, list[str]] = {}
    for k in d.get("kernels") or []:
        for r in k.get("rules") or []:
            built.setdefault(r, []).append(f'<a href="#kernel-{k["id"]}">#{k["id"]}</a>')
    rules = d.get("rules") or []
    fired = sorted((r for r in rules if r["matches"]), key=lambda r: (not r["used"],
                                                                       -r["matches"]))
    rows = [[esc(r["name"]), esc(r["family"]), esc(r["soundness"]), str(r["matches"]),
             "yes" if r["used"] else "no", " ".join(built.get(r["name"], [])) or "-"]
            for r in fired]
    return (f"<p>{len(fired)} of {len(rules)} rules matched; "
            f"{sum(r['used'] for r in fired)} built part of the extracted program.</p>"
            + table(["rule", "family", "soundness", "matches", "used", "kernels it built"],
                    rows))


def ops_section(d: dict[str, Any]) -> str:
    before, after = d.get("op_counts_before") or {}, d.get("op_counts_after") or {}
    ops = sorted(set(before) | set(after), key=lambda o: (-before.get(o, 0), o))
    return table(["op", "before", "after"],
                 [[esc(o), str(before.get(o, 0)), str(after.get(o, 0))] for o in ops])


def phases_section(d: dict[str, Any]) -> str:
    timings = d.get("timings") or {}
    if not timings:
        return "<p>No timings recorded.</p>"
    total = sum(timings.values()) or 1.0
    rows = [[esc(k), fmt_seconds(v), bar(v / total)] for k, v in timings.items()]
    rows.append(["<b>total</b>", f"<b>{fmt_seconds(sum(timings.values()))}</b>", ""])
    return table(["phase", "time", "share"], rows, cls="phases")
