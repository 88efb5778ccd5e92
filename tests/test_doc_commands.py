"""Every command the documentation quotes exists and parses: README.md, BENCHMARKS.md, docs/*.md.

Collected: each command of a fenced shell block (```bash, ```sh, ```console or a plain ```) whose
program is a console script of setup.cfg, ``python -m MODULE`` or ``make TARGET``, and every
``python -m MODULE`` anywhere in the text (inline code included). Checked, with no network and no
model: a console script or module exists and answers ``--help`` (exit 0, a usage line), a
subcommand's own ``--help`` where the command names one, every ``--option`` the command writes is
one its help lists, and a make target is one the Makefile defines.

The ``--help`` calls run in one subprocess (tests/_doc_commands_check.py): the libraries are imported
once, and nothing the programs set up at import leaks into this test process.
"""
from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([A-Za-z]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL_LANGS = {"", "bash", "sh", "shell", "console", "zsh"}
INLINE_MODULE = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {"<", ">", ">>", "2>", "2>&1", "<<"}


def console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return {name.strip(): target.strip() for name, _, target in (line.partition("=") for line in lines)}


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(), re.MULTILINE))


def _logical_lines(block: str) -> list[str]:
    """The block's commands: continuation lines (a trailing backslash) joined, prompts stripped."""
    out, cur = [], ""
    for raw in block.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        out.append(cur.strip().removeprefix("$ "))
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return [line for line in out if line and not line.startswith("#")]


def _segments(line: str) -> list[list[str]]:
    """A shell line's simple commands as token lists (pipes, &&, ; split them; a redirect ends one)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        tokens = list(lex)
    except ValueError:  # an unbalanced quote: not a command this test can read
        return []
    segs, cur, redirected = [], [], False
    for tok in tokens:
        if tok in SEPARATORS:
            segs.append(cur)
            cur, redirected = [], False
        elif tok in REDIRECTS or tok.startswith(("<", ">")):
            redirected = True
        elif not redirected:
            cur.append(tok)
        else:
            redirected = False  # the redirect's file: skipped, the command goes on
    segs.append(cur)
    return [s for s in segs if s]


def _command(tokens: list[str], scripts: dict[str, str]) -> tuple[str, str, list[str]] | None:
    """(kind, program, arguments) of a simple command this test checks, or None."""
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    if not tokens:
        return None
    prog = tokens[0].removeprefix(".venv/bin/")
    if prog in scripts:
        return "script", prog, tokens[1:]
    if prog in ("python", "python3") and len(tokens) > 2 and tokens[1] == "-m":
        return "module", tokens[2], tokens[3:]
    if prog == "make":
        return "make", "make", tokens[1:]
    return None


def collect() -> list[dict]:
    """Every checked command of the documentation, with where it was found."""
    scripts = console_scripts()
    found: dict[tuple, dict] = {}

    def add(kind: str, prog: str, args: list[str], where: str) -> None:
        options = sorted({a.split("=", 1)[0] for a in args if a.startswith("--") and len(a) > 2})
        sub = args[0] if args and not args[0].startswith("-") and kind != "make" else None
        key = (kind, prog, sub, tuple(options)) if kind != "make" else (kind, prog, tuple(args))
        entry = found.setdefault(key, {"kind": kind, "prog": prog, "sub": sub, "options": options, "args": args, "where": []})
        entry["where"].append(where)

    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        rel = doc.relative_to(REPO).as_posix()
        for m in FENCE.finditer(text):
            if m.group(1).lower() not in SHELL_LANGS:
                continue
            first = text.count("\n", 0, m.start()) + 2
            for line in _logical_lines(m.group(2)):
                for seg in _segments(line):
                    cmd = _command(seg, scripts)
                    if cmd:
                        add(*cmd, f"{rel}:{first}")
        for m in INLINE_MODULE.finditer(text):
            add("module", m.group(1).rstrip("."), [], f"{rel}:{text.count(chr(10), 0, m.start()) + 1}")
    return list(found.values())


COMMANDS = collect()


@pytest.fixture(scope="module")
def helps() -> dict:
    """``--help`` of every program and subcommand the documentation names, from one subprocess."""
    scripts = console_scripts()
    asks = []
    for c in COMMANDS:
        if c["kind"] == "make":
            continue
        target = scripts.get(c["prog"]) if c["kind"] == "script" else None
        asks.append({"kind": c["kind"], "prog": c["prog"], "target": target, "sub": None})
        if c["sub"]:
            asks.append({"kind": c["kind"], "prog": c["prog"], "target": target, "sub": c["sub"]})
    unique = list({json.dumps(a, sort_keys=True): a for a in asks}.values())
    # the repository root first on the path, as for `python -m experiments.NAME` typed there: the
    # studies are not installed (not in the wheel), and this script's own folder is tests/
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "_doc_commands_check.py")],
        input=json.dumps(unique), capture_output=True, text=True, timeout=900, cwd=REPO, env=env, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(a["kind"], a["prog"], a["sub"]): a for a in answers}


def _id(c: dict) -> str:
    return " ".join(x for x in (c["prog"], c["sub"] or "", *c["options"]) if x)[:90]


def test_the_documentation_quotes_commands():
    """The collector still finds what it checks (a broken pattern would pass every test below)."""
    progs = {c["prog"] for c in COMMANDS}
    assert {"build-index", "search-index", "serve", "beir-eval", "make"} <= progs
    assert any(c["kind"] == "module" for c in COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS, ids=_id)
def test_documented_command_exists_and_parses(cmd: dict, helps: dict):
    where = ", ".join(cmd["where"][:3])
    if cmd["kind"] == "make":
        missing = [t for t in cmd["args"] if "=" not in t and not t.startswith("-") and t not in make_targets()]
        assert not missing, f"{where}: make {' '.join(cmd['args'])}: no target {missing} in the Makefile"
        return
    top = helps[(cmd["kind"], cmd["prog"], None)]
    name = cmd["prog"] if cmd["kind"] == "script" else f"python -m {cmd['prog']}"
    assert top["ok"], f"{where}: {name} --help: {top['error']}"
    text = top["help"]
    if cmd["sub"]:
        sub = helps[(cmd["kind"], cmd["prog"], cmd["sub"])]
        if sub["ok"] and sub["help"] != top["help"]:  # a subcommand: its own options
            text = sub["help"]
    unknown = [o for o in cmd["options"] if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not unknown, f"{where}: {name}{' ' + cmd['sub'] if cmd['sub'] else ''}: options {unknown} are not in its --help"
