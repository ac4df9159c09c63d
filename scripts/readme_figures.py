"""README's benchmark figures, generated from benchmarks/RESULTS.md: each block between
`<!-- figures: NAME -->` and `<!-- end figures -->` in README.md is rebuilt from the last run
of its RESULTS section, with the run's date and machine, so that no figure is copied by hand.

    .venv/bin/python scripts/readme_figures.py           # rewrite README.md's blocks
    .venv/bin/python scripts/readme_figures.py --check   # exit 1 when README.md disagrees

tests/test_readme_figures.py runs the check. A block: a function from the RESULTS section's
text to markdown, registered in FIGURES under the block's name.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS, README = ROOT / "benchmarks" / "RESULTS.md", ROOT / "README.md"
BLOCK = re.compile(r"(<!-- figures: (\S+) -->\n)(.*?)(<!-- end figures -->)", re.DOTALL)


def section(results: str, title: str) -> str:
    """The text of the RESULTS.md section whose heading starts with `title`."""
    m = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", results, re.MULTILINE | re.DOTALL)
    if m is None:
        raise SystemExit(f"benchmarks/RESULTS.md has no section '## {title}...'")
    return m.group(0)


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in text: its header's cells and its rows' cells."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    if len(lines) < 3:
        raise SystemExit("no table where one was expected in benchmarks/RESULTS.md")
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    head, rows = cells[0], []
    for row in cells[2:]:
        if len(row) != len(head):
            break  # the next table
        rows.append(row)
    return head, rows


def run_of(text: str) -> str:
    """When and where the section's run was made: its date and machine, from its Command
    line (the items before the software versions)."""
    m = re.search(r"^Command: `[^`]*` \(([^;\n]*)", text, re.MULTILINE) or re.search(
        r"^(\d{4}-\d\d-\d\d \d\d:\d\d UTC[^:\n]*):?$", text, re.MULTILINE)  # older sections
    if m is None:
        raise SystemExit("a RESULTS.md section without its date and machine")
    items = []
    for item in m.group(1).split(", "):
        if item.startswith(("Linux", "torch", "Python", "llama-cpp", "onnxruntime")):
            break
        items.append(item)
    return ", ".join(items)


def source(title: str, text: str) -> str:
    return f"(benchmarks/RESULTS.md, \"{title}\": {run_of(text)})"


def cpu(results: str) -> str:
    title = "CPU: eqsat-llm against eager, torch.compile and ONNX Runtime"
    text = section(results, title)
    head, cells = table(text)
    rows = {r[0]: dict(zip(head, r)) for r in cells}
    cols = [("llama_block_prefill", "LLaMA block prefill 1x128"), ("llama_block_decode",
            "decode 1x1"), ("llama_block_decode_kv", "decode, KV cache 127"),
            ("gpt2", "GPT-2 (small)"), ("llama", "LLaMA (small)")]
    out = ["| | " + " | ".join(name for _, name in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for label, key in (("ONNX Runtime", "eqsat/ORT"), ("eager PyTorch", "eqsat/eager")):
        out.append(f"| eqsat-llm / {label} | "
                   + " | ".join(rows[w][key] for w, _ in cols) + " |")
    return "\n".join(out) + "\n\n" + source(title, text) + "\n"


def side_by_side(title: str, peer: str) -> Callable[[str], str]:
    """A peer's section (benchmarks/llamacpp.py, ort_genai.py): prefill and decode, eqsat-llm /
    the peer with the ratio, one column per precision."""
    def block(results: str) -> str:
        text = section(results, title)
        head, rows = table(text)
        out = ["| | " + " | ".join(r[0] for r in rows) + " |", "|---|" + "---|" * len(rows)]
        for label, cell in (("prefill, ms", f"prefill ms, eqsat / {peer}"),
                            ("decode, ms a token", f"decode ms/token, eqsat / {peer}")):
            i = head.index(cell)  # its ratio is the column after it
            out.append(f"| {label} | " + " | ".join(
                f"{r[i]} ({r[i + 1].rstrip('x')})" for r in rows) + " |")
        return "\n".join(out) + "\n\n" + source(title, text) + "\n"
    return block


MODEL_NAMES = {"llama": "LLaMA", "qwen3": "Qwen3", "granite": "Granite", "olmo2": "OLMo2",
               "stablelm": "StableLM", "starcoder2": "Starcoder2", "gptj": "GPT-J", "opt": "OPT",
               "falcon": "Falcon", "gpt2": "GPT-2", "bert": "BERT", "mixtral": "Mixtral",
               "qwen2_moe": "Qwen2-MoE", "olmoe": "OLMoE", "phimoe": "PhiMoE",
               "deepseek_v3": "DeepSeek-V3", "gpt_oss": "gpt-oss",
               "tinyllama": "TinyLlama shape (4 layers)",
               "mixtral_large": "Mixtral, experts 1.4 GB (4 layers)"}


def models(results: str) -> str:
    title = "Models as users load them"
    text = section(results, title)
    head, rows = table(text)
    ratio = head.index("eqsat/ORT")
    by = {(r[0], r[1]): r[ratio] for r in rows}
    names = list(dict.fromkeys(r[0] for r in rows))
    out = ["| | " + " | ".join(MODEL_NAMES.get(n, n) for n in names) + " |",
           "|---|" + "---|" * len(names)]
    for label, shape_ in (("prefill 1x128", "1x128"), ("one token", "1x1")):
        out.append(f"| {label} | " + " | ".join(by.get((n, shape_), "") for n in names) + " |")
    return "\n".join(out) + "\n\n" + source(title, text) + "\n"


def ms(value: str) -> str:
    """A time in ms as README rounds it: 0.64, 9.6, 43.8, 571."""
    v = float(value)
    return f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


QUANT_SYSTEMS = [("eqsat fp32", "eqsat-llm fp32"), ("ort int8", "ONNX Runtime int8"),
                 ("eqsat int8", "eqsat-llm int8"), ("eqsat fp8", "eqsat-llm fp8"),
                 ("eqsat int4", "eqsat-llm int4"),
                 ("eqsat int8_dynamic", "eqsat-llm int8_dynamic")]
WORKLOAD_NAMES = {"LLaMA-style block": "LLaMA block", "TinyLlama 4 layers":
                  "TinyLlama shape (4 layers)"}


def quantized(results: str) -> str:
    """eqsat-llm's formats against ONNX Runtime int8: ms per call, and for eqsat-llm's
    quantized programs the ratio to ONNX Runtime int8 (bold where below 1 at prefill)."""
    title = "Quantized weights: eqsat-llm int8 / int4 against ONNX Runtime int8"
    text = section(results, title)
    head, rows = table(text)
    t, vs = head.index("ms per call"), head.index("vs ort int8")
    by = {(r[0], r[1]): r for r in rows}
    out = ["| | " + " | ".join(name for _, name in QUANT_SYSTEMS) + " |",
           "|---|" + "---|" * len(QUANT_SYSTEMS)]
    for workload in dict.fromkeys(r[0] for r in rows):
        cells = []
        for system, _ in QUANT_SYSTEMS:
            r = by[workload, system]
            quant = system.startswith("eqsat") and system != "eqsat fp32"
            cell = f"{ms(r[t])} ({r[vs]})" if quant else ms(r[t])
            prefill_win = quant and "prefill" in workload and float(r[vs]) < 1
            cells.append(f"**{cell}**" if prefill_win else cell)
        out.append(f"| {workload_name(workload)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\n" + source(title, text) + "\n"


def workload_name(workload: str) -> str:
    for long, short in WORKLOAD_NAMES.items():
        workload = workload.replace(long, short)
    return workload


def sparse(results: str) -> str:
    """The pruned models compiled dense and with sparsity="auto": ms per call, and the
    sparse program's ratio to dense ("kept dense" where the cost model chose no sparse
    GEMM)."""
    title = "Sparse weights: 2:4 and 16x16 blocks against the same model dense"
    text = section(results, title)
    head, rows = table(text)
    t, vs, kinds = (head.index(c) for c in ("ms per call", "vs eqsat dense", "sparse GEMMs"))
    by = {(r[0], r[1], r[2]): r for r in rows}
    prunings = (("2:4", "2:4"), ("50% zero blocks", "50% blocks"))
    out = ["| | " + " | ".join(f"{short}, {kind}" for _, short in prunings
                               for kind in ("dense", "sparse")) + " |", "|---|" + "---|" * 4]
    for workload in dict.fromkeys(r[0] for r in rows):
        cells = []
        for pruning, _ in prunings:
            dense, auto = by[workload, pruning, "eqsat dense"], by[
                workload, pruning, "eqsat sparsity=auto"]
            kept = "" if auto[kinds] else ": kept dense"
            cells += [ms(dense[t]), f"{ms(auto[t])} ({auto[vs]}{kept})"]
        out.append(f"| {workload_name(workload)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n\n" + source(title, text) + "\n"


FIGURES: dict[str, Callable[[str], str]] = {
    "cpu": cpu,
    "llamacpp": side_by_side("llama.cpp side by side (benchmarks/llamacpp.py)", "llama.cpp"),
    "llamacpp_avx2": side_by_side("llama.cpp side by side, AVX2 builds", "llama.cpp"),
    "ortgenai": side_by_side("ONNX Runtime GenAI side by side", "ORT GenAI"), "models": models,
    "quantized": quantized, "sparse": sparse}


def generated(readme: str, results: str) -> str:
    """readme with every figures block rebuilt from results."""
    def fill(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in FIGURES:
            raise SystemExit(f"README.md has a figures block {name!r} no generator makes")
        return m.group(1) + FIGURES[name](results) + m.group(4)
    return BLOCK.sub(fill, readme)


def main(argv: list[str]) -> int:
    readme, results = README.read_text(), RESULTS.read_text()
    new = generated(readme, results)
    if "--check" in argv:
        if new != readme:
            print("README.md's figures differ from benchmarks/RESULTS.md: run "
                  "scripts/readme_figures.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
