"""Why this program: the report's kernels (schema), provenance recorded as rules fire, the
alternatives' prices checked against whole-program costs, `explain` and `report diff`."""

import copy
import json
import random

import pytest
from egglog import rewrite, var

from eqsat_llm import optimize
from eqsat_llm.cli import main
from eqsat_llm.egraph.analysis import analysis
from eqsat_llm.egraph.decode import serialize
from eqsat_llm.egraph.encode import declared, encode
from eqsat_llm.egraph.language import E, Tensor
from eqsat_llm.egraph.provenance import read, recording_ruleset
from eqsat_llm.egraph.saturate import saturate
from eqsat_llm.errors import EqsatError
from eqsat_llm.extraction.egraph_json import load_egraph
from eqsat_llm.extraction.extract import (
    ExtractionError,
    cheapest_trees,
    dag_cost,
    extract_dag_greedy,
    node_costs,
)
from eqsat_llm.ir import VALUE_LEAVES, Graph, TensorType
from eqsat_llm.models.workloads import llama_block_case
from eqsat_llm.reporting.alternatives import ProgramChoices
from eqsat_llm.reporting.explain import diff
from eqsat_llm.rulebook import Rule

KERNEL_KEYS = {"id": int, "op": str, "label": str, "operands": list, "inputs": list,
               "output": str, "consumers": int, "rules": list, "class_rules": list,
               "alternatives": list, "alternatives_total": int}


@pytest.fixture(scope="module")
def prefill():
    model, inputs = llama_block_case("prefill")
    return optimize(model, inputs, measure_eager=False)


def test_every_kernel_of_the_program_has_an_entry_in_the_documented_schema(prefill):
    report = json.loads(json.dumps(prefill.report.to_dict()))  # plain JSON, no default=
    g = prefill.graph
    live = g.live_ids()
    assert [k["id"] for k in report["kernels"]] == [
        n.id for n in g.nodes if n.id in live and n.op not in VALUE_LEAVES]
    for k in report["kernels"]:
        for key, kind in KERNEL_KEYS.items():
            assert isinstance(k[key], kind), (key, k)
        assert k["op"] == g.node(k["id"]).op and k["operands"] == list(g.node(k["id"]).inputs)
        assert k["predicted_us"] >= 0 and k["bound"] in ("compute", "memory", "overhead", "free")
        for a in k["alternatives"]:
            assert set(a) == {"op", "term", "own_us", "delta_us"}
        assert k["alternatives_total"] >= len(k["alternatives"])
    assert report["unpriced_enodes"] == {}  # (the analysis's vec_gather is not the op gather)
    priced = sum(k["predicted_us"] for k in report["kernels"])
    assert priced == pytest.approx(report["cost_after"], rel=1e-6)  # the extracted cost


def test_the_block_shows_what_the_merged_qkv_projection_and_attention_beat(prefill):
    kernels = prefill.report.kernels
    (qkv,) = [k for k in kernels if k.get("sharing")
              and len(k["sharing"]["consumers"]) == 3]
    assert qkv["label"] == "gemm[rms_norm]" and "merge-parallel-matmul" in qkv["class_rules"]
    unshared = qkv["sharing"]["unshared"]
    assert len(unshared) == 3 and all(t.startswith("gemm") for t in unshared)
    assert {"q_proj.weight", "k_proj.weight", "v_proj.weight"} == {
        w for t in unshared for w in ("q_proj.weight", "k_proj.weight", "v_proj.weight")
        if w in t}
    assert qkv["sharing"]["unshared_delta_us"] > 0  # the ILP's choice is the cheaper one
    (attention,) = [k for k in kernels if k["op"] == "attention"]
    assert "attention" in attention["rules"]
    assert attention["alternatives"] and all(a["delta_us"] > 0
                                             for a in attention["alternatives"])
    text = prefill.report.explain("attention")
    assert "chosen over" in text and attention["alternatives"][0]["term"] in text
    assert "shared by" in prefill.report.explain("gemm[rms_norm]")


@pytest.mark.parametrize("shape", ["prefill", "decode"])
def test_no_alternative_beats_an_optimal_ilp_extraction(shape, prefill):
    compiled = prefill if shape == "prefill" else optimize(*llama_block_case(shape),
                                                           measure_eager=False)
    report = compiled.report
    assert report.lower_bound is not None and report.cost_after - report.lower_bound < 1e-6
    deltas = [a["delta_us"] for k in report.kernels for a in k["alternatives"]
              if a["delta_us"] is not None]
    assert deltas and min(deltas) > -1e-6


def test_a_captured_op_has_no_rule_and_every_used_rule_built_part_of_the_program(prefill):
    kernels = prefill.report.kernels
    assert any(k["op"] == "permute" and not k["rules"] for k in kernels)
    built = {r for k in kernels for r in k["rules"]}
    used = {r.name for r in prefill.report.rules if r.used}
    assert built <= used  # (used also counts results folded into constants, and merges)
    assert {"attention", "rms-norm-matmul", "matmul-swiglu", "rope"} <= built


def _saturated(rules, graph):
    eg = declared(analysis, recording_ruleset(rules))
    enc = encode(graph, egraph=eg)
    saturate(enc.egraph, rules)
    return serialize(enc.egraph)


def test_provenance_names_the_rule_of_each_enode_not_of_its_class():
    x, y = var("x", Tensor), var("y", Tensor)
    rules = [Rule("neg-neg-to-abs", "test", "exact", rewrite(E.neg(E.neg(x))).to(E.abs(x))),
             Rule("add-self-to-abs", "test", "exact", rewrite(E.add(y, y)).to(E.abs(y))),
             Rule("neg-neg-away", "test", "exact", rewrite(E.neg(E.neg(x))).to(x))]
    g = Graph()
    t = TensorType((4,), "float32")
    a = g.append("input", (), {"name": "a", "index": 0}, t)
    b = g.append("input", (), {"name": "b", "index": 1}, t)
    nn = g.add("neg", [g.add("neg", [a])])
    g.outputs = [g.add("mul", [nn, g.add("add", [b, b])])]
    s = _saturated(rules, g)
    made, merged = read(s)
    nodes = s["nodes"]
    def class_of_input(name):
        return next(n["eclass"] for n in nodes.values() if n["op"] == "input"
                    and nodes[n["children"][0]]["op"] == json.dumps(name))
    abs_of = {nodes[nodes[nid]["children"][0]]["eclass"]: r for nid, r in made.items()
              if nodes[nid]["op"] == "abs"}
    # (abs(neg a) too: neg(neg(neg a)) is neg a once neg(neg a) = a)
    assert abs_of.pop(class_of_input("b")) == ("add-self-to-abs",)
    assert abs_of[class_of_input("a")] == ("neg-neg-to-abs",)
    assert set(abs_of.values()) == {("neg-neg-to-abs",)}
    assert set(merged.values()) == {("neg-neg-away",)}  # into a, and into neg a
    assert not any(nodes[nid]["op"] in ("neg", "add", "mul") for nid in made)  # captured


def _random_egraph(rng: random.Random, classes: int) -> dict:
    """Classes 0..n-1; a node reads earlier classes, and now and then a later one (a cycle
    the extraction must avoid)."""
    nodes = {}
    for c in range(classes):
        for k in range(rng.randint(1, 3)):
            if c == 0:
                kids = []
            else:
                kids = [str(rng.randrange(c)) for _ in range(rng.randint(0, 2))]
                if rng.random() < 0.15:
                    kids.append(str(rng.randrange(classes)))
            nodes[f"{c}.{k}"] = {"op": f"f{k}", "eclass": str(c), "children":
                                 [f"{d}.0" for d in kids], "cost": rng.randint(0, 9)}
    return {"nodes": nodes, "root_eclasses": [str(classes - 1), str(classes // 2)]}


@pytest.mark.parametrize("seed", range(12))
def test_an_alternatives_price_is_the_whole_programs_cost_change(seed):
    """Checked by brute force: the program with the alternative chosen (new classes at their
    cheapest tree), priced whole by dag_cost."""
    egraph = load_egraph(_random_egraph(random.Random(seed), 14))
    try:
        result = extract_dag_greedy(egraph)
    except ExtractionError:
        pytest.skip("this draw has no acyclic program")
    costs = node_costs(egraph, None)
    program = ProgramChoices(egraph, result.choices, costs, egraph.roots)
    cheapest, _ = cheapest_trees(egraph, costs)
    checked = 0
    for cls in result.choices:
        changes = [{cls: a.node} for a in program.alternatives(cls, keep=99)[0]]
        changes.append(program.unshared(cls)[1])
        for change in filter(None, changes):
            full = {**cheapest, **result.choices, **change}
            try:
                want = dag_cost(egraph, full) - result.cost
            except ExtractionError:
                want = None
            got = program.delta(change)
            assert (got is None) == (want is None), (change, got, want)
            if want is not None:
                assert got == pytest.approx(want, abs=1e-9)
            checked += 1
    assert checked


def test_explain_refuses_an_unknown_kernel_listing_the_kernels(prefill):
    with pytest.raises(EqsatError, match="no kernel of the program is 'conv2d'.*attention"):
        prefill.report.explain("conv2d")
    first = prefill.report.kernels[0]
    assert prefill.report.explain(f"%{first['id']}").startswith(f"%{first['id']} = ")


def test_diff_names_what_changed_between_two_runs(prefill):
    a = prefill.report.to_dict()
    same = diff(a, copy.deepcopy(a))
    assert "kernels: the same" in same and "rules: the same" in same
    model, inputs = llama_block_case("prefill")
    b = optimize(model, inputs, measure_eager=False, rules=["fusion", "layout"]).report
    text = diff(a, b.to_dict())
    assert "- attention -> float32[1, 8, 128, 64]: 1 -> 0" in text
    assert "+ softmax" in text and "attention: 1 matches, used -> did not fire" in text
    assert "matmul-scale: 1 matches, not used -> not loaded" in text


def test_cli_explains_a_saved_report_and_diffs_two(prefill, tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(prefill.report.to_dict()))
    assert main(["explain", str(a), "--op", "attention"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("%") and "chosen over" in out
    assert main(["report", "diff", str(a), str(a)]) == 0
    assert "kernels: the same" in capsys.readouterr().out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["report", "diff", str(a), str(bad)]) == 2
    assert "is not an eqsat-llm report" in capsys.readouterr().err


def test_summary_lists_the_decisions_and_the_rules_that_prepared_a_match(prefill):
    text = prefill.report.summary()
    assert "decisions (margin" in text and "shared by 3, not sharing +" in text
    rules = {r.name: r for r in prefill.report.rules}
    # mm-as-matmul built the matmul that rms-norm-matmul fused: in the program's classes
    assert rules["mm-as-matmul"].in_classes and not rules["mm-as-matmul"].used
    assert rules["rms-norm-matmul"].used


def test_summary_and_diff_of_a_profile_that_timed_nothing(prefill):
    """Triton's interpreter times nothing: the profile says why, and the text says so."""
    report = copy.deepcopy(prefill.report)
    report.profile = {"backend": "triton", "repeats": 3, "statistic": "median",
                      "reason": "Triton's interpreter", "kernels": [], "median_ratio": None,
                      "worst_ratio": None, "worst_kernel": None, "flagged": 0,
                      "total_predicted_us": 0.0, "total_measured_us": None}
    assert "nothing timed: Triton's interpreter" in report.summary()
    assert "kernels: the same" in diff(report.to_dict(), report.to_dict())


def test_diff_refuses_a_generator_report_against_a_single_program(prefill):
    one = prefill.report.to_dict()
    with pytest.raises(EqsatError, match="Generator's"):
        diff({"prefill": one, "decode": one}, one)


def test_recording_provenance_leaves_saturation_unchanged():
    """The instrumented rules build what the plain ones build: the same e-graph size after
    every iteration and the same e-nodes, op by op, once the provenance rows are set aside."""
    from collections import Counter

    from egglog import ruleset

    from eqsat_llm.capture import capture
    from eqsat_llm.egraph.provenance import MADE
    from eqsat_llm.egraph.saturate import egraph_size
    from eqsat_llm.rulebook import resolve

    model, inputs = llama_block_case("decode")
    graph = capture(model, inputs).graph
    rules = resolve(None)

    def ops(serialized):  # the e-nodes (string literals aside: the rows hold rule names)
        return Counter(n["op"] for n in serialized["nodes"].values()
                       if not n["op"].startswith((MADE, '"')))

    recorded = declared(analysis, recording_ruleset(rules))
    recorded_enc = encode(graph, egraph=recorded)
    result = saturate(recorded_enc.egraph, rules)
    assert result.stop_reason == "saturated"

    plain_rules = ruleset(*(r.command for r in rules), name="plain")
    plain = encode(graph, egraph=declared(analysis, plain_rules)).egraph
    plain.run(analysis.saturate())
    sizes = [egraph_size(plain)]
    for _ in range(result.iterations):
        plain.run(plain_rules)
        plain.run(analysis.saturate())
        sizes.append(egraph_size(plain))
    # from the first iteration on: before it, the recording e-graph may already hold a ground
    # term of the rules' actions (the attention op's -inf "no sink" scalar and its analysis
    # rows: 4 entries), declared with the instrumented rules in an order that depends on
    # Python's hash seed; the plain e-graph makes it when a rule first fires
    assert sizes[1:] == result.enodes_per_iteration[1:]
    assert 0 <= result.enodes_per_iteration[0] - sizes[0] <= 4
    assert ops(serialize(plain)) == ops(serialize(recorded_enc.egraph))
