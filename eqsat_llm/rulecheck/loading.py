"""Rules to check, from a .py file, an importable module or a family of the library."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
from pathlib import Path
from types import ModuleType

from .. import rulebook
from ..errors import RuleError
from ..rulebook import Rule

_loaded = itertools.count()


def _rules_in(module: ModuleType) -> list[Rule]:
    """The module's rules (rulebook.rules_of_module); for a package, its submodules' too."""
    found = rulebook.rules_of_module(module)
    if not found and hasattr(module, "__path__"):
        for value in vars(module).values():
            if isinstance(value, ModuleType) and value.__name__.startswith(module.__name__ + "."):
                found.extend(_rules_in(value))
    seen: set[str] = set()
    return [r for r in found if not (r.name in seen or seen.add(r.name))]


def load_rules_from(spec: str) -> list[Rule]:
    """The rules of a .py file (imported under a fresh module name, so a file can be loaded
    twice or reuse the library's rule names), of a family of the library (or "all"), or of an
    importable module."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise RuleError(f"no rule file {spec!r}")
        name = f"_eqsat_rules_{next(_loaded)}_" + re.sub(r"\W", "_", path.stem)
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except RuleError:  # a family that raised: the message names its file and line
            del sys.modules[name]
            raise
        except Exception as exc:
            del sys.modules[name]
            raise RuleError(f"rule file {spec!r} raised on import{_line_in(exc, path)}: "
                            f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            del sys.modules[name]
            raise
        return _rules_in(module)
    families = rulebook.load_library()
    if spec == "all" or spec in families:
        return rulebook.resolve([spec])
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise RuleError(f"{spec!r} is not a rule file, a rule family or an importable module: "
                        f"{exc}") from exc
    except RuleError:
        raise
    except Exception as exc:  # the module itself raised while importing
        raise RuleError(f"rule module {spec!r} raised on import: {type(exc).__name__}: "
                        f"{exc}") from exc
    return _rules_in(module)


def _line_in(exc: BaseException, path: Path) -> str:
    """' (line N)': the last line of the file `path` in exc's traceback; '' if none."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None and isinstance(exc, SyntaxError) and exc.lineno:
        line = exc.lineno
    return f" (line {line})" if line else ""
