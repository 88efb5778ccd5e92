"""The import structure, where ``lint-imports`` (setup.cfg ``[importlinter]``) does not look.

* No import circle between files, at any level: every ``import`` of every module of the five
  packages counts, at module level, inside functions (deferred imports) and under
  ``if TYPE_CHECKING:`` alike. import-linter's layers forbid circles between layers only, and a
  circle inside a layer (``embedder/encoder.py`` <-> ``embedder/tokenization.py`` through
  TYPE_CHECKING, ``indexer/manifest.py`` <-> ``indexer/regular_files.py`` through a deferred
  import; issue 49) went unseen.
* The benchmarks contracts name every module they are about: a contract that lists modules says
  nothing about a module it does not list, so a new study missing from ``studies-independent``
  (as ``state_faithfulness`` was) could import another study unseen.
* The studies (experiments/) are not in the wheel, and nothing shipped imports them (the layers
  contract puts experiments above benchmarks).
"""
from __future__ import annotations

import ast
import configparser
from pathlib import Path

from conftest import REPO

SETUP_CFG = REPO / "setup.cfg"


def _config() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    return config


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def root_packages() -> list[str]:
    return _lines(_config()["importlinter"]["root_packages"])


# ------------------------------------------------------------------ the file-level graph
def modules(root: Path, packages: list[str]) -> dict[str, Path]:
    """{dotted module name: file} of every ``.py`` file under the packages (``pkg/__init__.py`` is ``pkg``)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            out[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """{module: {module it imports: line}}: every import statement anywhere in the file (module
    level, functions, ``if TYPE_CHECKING:``), resolved to the file it names: ``from pkg import x``
    is ``pkg.x`` where that is a module, else ``pkg`` (its ``__init__``); relative imports resolved."""
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start, edges in graph.items():
        if start in index:
            continue
        work = [(start, iter(edges))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(graph: dict[str, dict[str, int]], component: list[str], mods: dict[str, Path]) -> str:
    edges = [
        f"  {mods[a].relative_to(REPO) if mods[a].is_relative_to(REPO) else mods[a]}:{line} imports {b}"
        for a in component for b, line in graph[a].items() if b in component
    ]  # fmt: skip
    return " <-> ".join(component) + "\n" + "\n".join(edges)


def test_no_import_circle_between_files():
    mods = modules(REPO, root_packages())
    assert len(mods) > 100 and "embedder.encoder" in mods and "experiments.expansion_depth" in mods
    graph = import_graph(mods)
    found = circles(graph)
    assert not found, "import circles (every import counts: module level, in functions, under TYPE_CHECKING):\n" + "\n".join(
        describe(graph, c, mods) for c in found
    )


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The check itself: a deferred import, a TYPE_CHECKING import, ``from pkg import module``,
    a relative import and a package's ``__init__`` each close a circle it reports."""
    files = {
        "pkg/__init__.py": "from pkg.a import A\nfrom pkg.i import I\n",
        "pkg/i.py": "from pkg import A\nI = 2\n",  # pkg/__init__.py <-> pkg/i.py
        "pkg/a.py": "A = 1\ndef f():\n    from pkg import b\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from . import d\n",
        "pkg/sub/d.py": "from ..sub import c\n",
        "pkg/e.py": "import pkg.f\n",
        "pkg/f.py": "import pkg.e as e\n",
        "pkg/g.py": "from pkg import A\n",  # pkg/__init__.py; no circle: __init__ does not import g
        "other/__init__.py": "",
        "other/h.py": "import json\nfrom pkg.sub import c\n",  # outside imports and one-way edges: none
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    mods = modules(tmp_path, ["pkg", "other"])
    graph = import_graph(mods)
    assert graph["pkg.g"] == {"pkg": 1} and graph["other.h"] == {"pkg.sub.c": 2}
    assert sorted(circles(graph)) == [["pkg", "pkg.i"], ["pkg.a", "pkg.b"], ["pkg.e", "pkg.f"], ["pkg.sub.c", "pkg.sub.d"]]


# ------------------------------------------------------------------ the benchmarks contracts
def _benchmarks_children(folder: Path, prefix: str) -> set[str]:
    """The modules and sub-packages directly inside ``folder`` (not ``__init__``)."""
    names = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    names |= {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return {f"{prefix}.{n}" for n in names}


def test_studies_contract_names_every_study():
    contract = _config()["importlinter:contract:studies-independent"]
    assert contract["type"] == "independence"
    listed = _lines(contract["modules"])
    studies = _benchmarks_children(REPO / "experiments", "experiments")
    assert len(listed) == len(set(listed)), "a study listed twice"
    assert sorted(studies - set(listed)) == [], "studies missing from setup.cfg's studies-independent contract"
    assert sorted(set(listed) - studies) == [], "setup.cfg's studies-independent contract lists modules that are not studies"


def test_product_contracts_name_every_module_of_benchmarks():
    config = _config()
    product = _benchmarks_children(REPO / "benchmarks", "benchmarks")
    assert not (REPO / "benchmarks" / "studies").exists(), "the studies live in experiments/, outside the wheel"
    layered = {f"benchmarks.{m.strip()}" for layer in _lines(config["importlinter:contract:benchmarks-layers"]["layers"]) for m in layer.split("|")}
    assert sorted(layered ^ product) == [], "benchmarks-layers: not every module of benchmarks/"


def test_experiments_sit_above_the_shipped_packages_and_outside_the_wheel():
    config = _config()
    layers = _lines(config["importlinter:contract:layers"]["layers"])
    assert layers[:2] == ["experiments", "benchmarks"], "experiments/ above benchmarks: nothing shipped imports a study"
    assert "experiments" in root_packages()
    shipped = _lines(config["options.packages.find"]["include"])
    assert "benchmarks*" in shipped and not any(p.startswith("experiments") for p in shipped)
