"""README's benchmark figures are generated from benchmarks/RESULTS.md
(scripts/readme_figures.py): the README agrees with the generator, and the generator reads
its figures from RESULTS.md's last runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_figures",
                                               ROOT / "scripts" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)


def test_readme_figures_are_the_generated_ones():
    readme, results = figures.README.read_text(), figures.RESULTS.read_text()
    assert {m[1] for m in figures.BLOCK.findall(readme)} == set(figures.FIGURES)
    assert figures.generated(readme, results) == readme, \
        "README.md's figures differ from benchmarks/RESULTS.md: run scripts/readme_figures.py"


def test_a_figure_changed_in_results_changes_the_readme():
    readme, results = figures.README.read_text(), figures.RESULTS.read_text()
    cpu = figures.section(results, "CPU: eqsat-llm against eager")
    head, rows = figures.table(cpu)
    row, i = rows[0], head.index("eqsat/ORT")
    line = "| " + " | ".join(row) + " |"
    assert line in cpu
    edited = results.replace(
        cpu, cpu.replace(line, "| " + " | ".join(row[:i] + ["9.99"] + row[i + 1:]) + " |"))
    assert "| 9.99 |" in figures.generated(readme, edited)
    assert "| 9.99 |" not in readme
