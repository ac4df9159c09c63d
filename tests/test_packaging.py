"""What `pip install .` ships: every package directory of the source tree is listed in
pyproject.toml, under its installed name (rules/ and codegen/ install as eqsat_llm.rules and
eqsat_llm.codegen), so that a non-editable install imports what the checkout does."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    on_disk = set()
    for name, directory in setuptools["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            on_disk.add(".".join((name, *relative.parts)))
    assert sorted(on_disk - listed) == [], "add these to [tool.setuptools] packages"
    assert sorted(listed - on_disk) == []
