"""``dtype="auto"`` is measured on the machine, not read from its CPU flags (issue 54): the
candidates follow the capability, the fastest faithful one is taken for documents and for
queries apart, a candidate that crashes or is unfaithful is never taken, int8 only with a
recorded nDCG@10 verdict, and the verdict is kept so that a second load times nothing.
Capabilities and timings are mocked: these tests check the choice, never a speed."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from embedder import speed_probe
from embedder.hardware import Capability, choose_precision, speed_candidates
from embedder.runtime_probe import VERDICTS_FILE
from embedder.speed_probe import INT8_VERDICT_FILE, Measurement, Trial, choose, judge, recorded_int8_verdict

AVX2 = Capability("cpu", "AMD EPYC (mocked AVX2)", ("avx2", "fma"), native_bf16=False)
VNNI = Capability("cpu", "Intel Xeon (mocked AVX-512 VNNI)", ("avx2", "fma", "avx512f", "avx512_vnni"), native_bf16=False)
BF16_NO_VNNI = Capability("cpu", "mocked AVX512-BF16, no VNNI", ("avx2", "fma", "avx512f", "avx512_bf16"), native_bf16=True)
XEON_BF16 = Capability("cpu", "Intel Xeon (mocked AVX512-BF16, VNNI, no AMX)", ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"), native_bf16=True)
AMX = Capability("cpu", "Intel Xeon (mocked AMX)", ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"), native_bf16=True)
TEXTS = ["the cat sat near the river", "computer memory and data", "a game of chess with the team"]


# ------------------------------------------------------------------ candidates
@pytest.mark.parametrize(
    ("cap", "runtime", "have_openvino", "expected"),
    [
        (AVX2, "auto", True, [("torch", "fp32"), ("openvino", "fp32")]),  # bf16 emulated, int8 without VNNI: not timed
        (AVX2, "auto", False, [("torch", "fp32")]),
        (VNNI, "auto", True, [("torch", "fp32"), ("openvino", "fp32"), ("openvino", "int8")]),
        (BF16_NO_VNNI, "auto", True, [("torch", "fp32"), ("openvino", "fp32"), ("torch", "bf16"), ("openvino", "bf16")]),
        (XEON_BF16, "auto", True, [("torch", "fp32"), ("openvino", "fp32"), ("torch", "bf16"), ("openvino", "bf16"), ("openvino", "int8")]),
        (AMX, "torch", True, [("torch", "fp32"), ("torch", "bf16")]),
        (AMX, "openvino", True, [("openvino", "fp32"), ("openvino", "bf16"), ("openvino", "int8")]),
    ],
)
def test_candidates_follow_the_capability(cap, runtime, have_openvino, expected):
    candidates, skipped = speed_candidates(cap, runtime, have_openvino)
    assert candidates == expected
    if not cap.native_bf16:
        assert any(s.startswith("bf16: emulated") for s in skipped)  # said, and never timed
    p = choose_precision("auto", runtime, cap, have_openvino)
    if len(expected) == 1:  # nothing to measure
        assert (p.runtime, p.dtype) == expected[0]
    else:  # measured at first use: no precision is read off the flags
        assert p.dtype == "auto" and p.runtime == runtime


def test_forced_choices_are_not_measured():
    assert (choose_precision("bf16", "auto", AVX2, True).dtype, choose_precision("bf16", "auto", AVX2, True).runtime) == ("bf16", "openvino")
    assert choose_precision("fp32", "torch", AMX, True).dtype == "fp32"
    assert choose_precision("int8", "auto", AVX2, True).dtype == "int8"


# ------------------------------------------------------------------ judging and choosing (pure)
def _trial(label: str, docs: float, query: float, offered: bool = True, reason: str = "offered") -> Trial:
    runtime, dtype = label.split()
    return Trial(runtime, dtype, True, reason, docs, query, 1.0, 1.0, offered, offered)


def test_the_fastest_offered_is_taken_for_documents_and_for_queries_apart():
    trials = [
        _trial("torch fp32", 3.0, 100.0),
        _trial("openvino fp32", 4.5, 60.0),
        _trial("openvino bf16", 8.0, 70.0),  # the fastest for documents
        _trial("torch bf16", 7.0, 55.0),  # the fastest for queries
        _trial("openvino int8", 50.0, 5.0, offered=False, reason="unfaithful: cosine min 0.9"),  # faster, never taken
        Trial("openvino", "bf16", False, "killed by SIGFPE at its first compile"),
    ]
    verdict = choose(trials, ["int8: no VNNI"])
    assert verdict.documents == ("openvino", "bf16") and verdict.queries == ("torch", "bf16")
    assert "8.0 docs/s" in verdict.documents_reason and "55.0 ms" in verdict.queries_reason
    assert "unfaithful" in verdict.documents_reason and "not timed: int8" in verdict.documents_reason
    again = speed_probe.SpeedVerdict.from_dict(json.loads(json.dumps(verdict.to_dict())), cached=True)
    assert again.documents == verdict.documents and again.trials == verdict.trials and again.cached


def test_with_nothing_offered_the_reference_runs():
    verdict = choose([Trial("openvino", "bf16", False, "killed by SIGFPE")], [])
    assert verdict.documents == verdict.queries == ("torch", "fp32") and "killed by SIGFPE" in verdict.documents_reason


def _measured(docs: np.ndarray, queries: np.ndarray, ok: bool = True) -> Measurement:
    return Measurement(ok, "ran" if ok else "killed by SIGSEGV", 1.0, [0.01] * len(queries), docs, queries)


def _top(h: np.ndarray, k: int):
    order = np.argsort(-h, axis=1)[:, :k]
    return order, np.take_along_axis(h, order, 1)


@pytest.fixture
def reference() -> Measurement:
    rng = np.random.default_rng(0)
    return _measured(rng.normal(size=(4, 200)).astype(np.float32), rng.normal(size=(3, 200)).astype(np.float32))


def test_the_faithfulness_gate(reference):
    no_int8 = (False, "no recorded verdict")
    same = judge(("openvino", "bf16"), _measured(reference.docs * 1.001, reference.queries), reference, _top, no_int8)
    assert same.faithful and same.offered and same.cosine_min >= 0.995 and same.overlap_min == 1.0
    # one query off: cosine below 0.995 on a single text is enough to refuse it
    off = reference.queries.copy()
    off[1] = np.random.default_rng(1).normal(size=200)
    bad = judge(("openvino", "bf16"), _measured(reference.docs, off), reference, _top, no_int8)
    assert not bad.faithful and not bad.offered and bad.reason.startswith("unfaithful")
    # cosine high but the top-64 tokens moved: small values near the cut swapped (cosine stays ~1)
    shuffled = reference.docs.copy()
    ranks = np.argsort(-shuffled[0])
    shuffled[0, ranks[54:64]], shuffled[0, ranks[64:74]] = shuffled[0, ranks[64:74]], shuffled[0, ranks[54:64]].copy()
    moved = judge(("torch", "bf16"), _measured(shuffled, reference.queries), reference, _top, no_int8)
    assert moved.overlap_min < 0.9 and not moved.offered
    crashed = judge(("openvino", "int8"), Measurement(False, "killed by SIGSEGV at its first compile"), reference, _top, no_int8)
    assert not crashed.ran and not crashed.offered and "SIGSEGV" in crashed.reason
    # int8: faithful on the probe texts is not enough without issue 28's nDCG@10 verdict
    int8 = judge(("openvino", "int8"), _measured(reference.docs, reference.queries), reference, _top, no_int8)
    assert int8.faithful and not int8.offered and "not offered" in int8.reason
    int8 = judge(("openvino", "int8"), _measured(reference.docs, reference.queries), reference, _top, (True, "nDCG@10 within 0.003"))
    assert int8.offered


def test_int8_is_offered_only_with_a_recorded_verdict_for_these_weights_and_this_recipe(tmp_path):
    from embedder.runtime import int8_recipe_id

    adapter = {"path": str(tmp_path), "sha256": "abc"}
    assert not recorded_int8_verdict(adapter)[0] and not recorded_int8_verdict(None)[0]
    passed = {"adapter_sha256": "abc", "int8_recipe": int8_recipe_id(), "passed": True, "max_ndcg_drop": 0.004, "source": "x"}
    (tmp_path / INT8_VERDICT_FILE).write_text(json.dumps(passed))
    assert recorded_int8_verdict(adapter)[0]
    assert not recorded_int8_verdict({**adapter, "sha256": "other"})[0]  # about other weights
    for recipe in (None, "0123456789ab"):  # a verdict on another int8 graph (or from before recipes were recorded)
        (tmp_path / INT8_VERDICT_FILE).write_text(json.dumps({**passed, "int8_recipe": recipe}))
        ok, why = recorded_int8_verdict(adapter)
        assert not ok and "another int8 recipe" in why
    (tmp_path / INT8_VERDICT_FILE).write_text(json.dumps({**passed, "max_ndcg_drop": 0.008}))
    assert not recorded_int8_verdict(adapter)[0]  # above issue 28's 0.005


# ------------------------------------------------------------------ the embedder, timings mocked
def _fake_measure(docs_s: dict, query_s: dict, calls: list, unfaithful=(), crashed=()):
    """A ``measure`` that runs nothing but torch fp32 (for the reference embeddings) and reports the given timings."""
    real = speed_probe.measure

    def fake(candidate, setup, crashes):
        calls.append(candidate)
        label = " ".join(candidate)
        if label in crashed:
            return Measurement(False, "killed by SIGFPE at its first compile (in a child process)")
        got = real(("torch", "fp32"), setup, crashes)
        docs = got.docs if label not in unfaithful else -got.docs
        return Measurement(True, "ran", docs_s[label], [query_s[label]] * len(setup.queries), docs, got.queries)

    return fake


def _auto(make_embedder, monkeypatch, tmp_path, cap):
    import embedder.encoder as encoder_module
    import embedder.runtime as runtime_module

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path))
    monkeypatch.setattr(encoder_module, "device_capability", lambda device: cap)
    monkeypatch.setattr(runtime_module, "cpu_capability", lambda: cap)
    return lambda: make_embedder(runtime="auto", dtype="auto")


def test_auto_takes_the_measured_fastest_apart_and_a_second_load_reads_the_verdict(make_embedder, monkeypatch, tmp_path):
    calls: list = []
    docs_s = {"torch fp32": 1.0, "openvino fp32": 0.9, "torch bf16": 0.2, "openvino bf16": 0.05, "openvino int8": 0.01}
    query_s = {"torch fp32": 0.010, "openvino fp32": 0.004, "torch bf16": 0.002, "openvino bf16": 0.001, "openvino int8": 0.0005}
    # openvino bf16 is unfaithful and int8 crashes, though both are "faster": neither is ever taken
    monkeypatch.setattr(speed_probe, "measure", _fake_measure(docs_s, query_s, calls, unfaithful={"openvino bf16"}, crashed={"openvino int8"}))
    make = _auto(make_embedder, monkeypatch, tmp_path, XEON_BF16)
    embedder = make()
    assert embedder.measuring and embedder.precision is None and not calls  # nothing measured at construction
    got_docs, got_query = embedder.embed(TEXTS), embedder.embed(TEXTS[:1], role="query")
    assert (embedder.runtime_name, embedder.dtype) == ("torch", "bf16")  # the fastest faithful for documents
    assert embedder.query_runtime == ("torch", "bf16")
    assert got_docs.shape == (3, embedder.dim) and got_query.shape == (1, embedder.dim)
    info = embedder.runtime_info()
    assert info["speed_probe"]["documents"] == "torch bf16" and "measured now" in embedder.runtime_summary()
    assert any(line.startswith("openvino bf16") and "unfaithful" in line for line in info["speed_probe"]["candidates"])
    assert any(line.startswith("openvino int8") and "SIGFPE" in line for line in info["speed_probe"]["candidates"])
    assert "speed probe" in info["reason"]
    n_calls = len(calls)
    assert n_calls == 5  # each candidate once (torch fp32, the reference, among them)
    # a second load (another process would do the same): the kept verdict, no timing
    again = make()
    again.embed(TEXTS)
    assert len(calls) == n_calls and again.speed_verdict.cached
    assert (again.runtime_name, again.dtype) == ("torch", "bf16") and "kept from an earlier run" in again.runtime_summary()
    assert again.runtime_info() == info  # the same record (so the same manifest) whether measured now or read
    kept = [v for f in tmp_path.rglob(VERDICTS_FILE) for v in json.loads(f.read_text()).values() if v["fields"].get("kind") == "speed"]
    assert len(kept) == 1 and {t["runtime"] + " " + t["dtype"]: t["docs_per_s"] for t in kept[0]["trials"] if t["ran"]}["torch bf16"] > 0
    # another thread count is another setting: measured again
    monkeypatch.setattr("torch.get_num_threads", lambda: 3)
    make().resolve_runtime()
    assert len(calls) == 2 * n_calls
    fresh = make()  # asked to measure again (experiments.encoder_speed --reprobe)
    fresh.resolve_runtime(refresh=True)
    assert len(calls) == 3 * n_calls and not fresh.speed_verdict.cached


def test_documents_and_queries_may_run_in_different_runtimes(make_embedder, monkeypatch, tmp_path):
    calls: list = []
    docs_s = {"torch fp32": 1.0, "openvino fp32": 2.0, "torch bf16": 0.5, "openvino bf16": 3.0}
    query_s = {"torch fp32": 0.001, "openvino fp32": 0.010, "torch bf16": 0.005, "openvino bf16": 0.020}
    monkeypatch.setattr(speed_probe, "measure", _fake_measure(docs_s, query_s, calls))
    embedder = _auto(make_embedder, monkeypatch, tmp_path, BF16_NO_VNNI)()
    reference = make_embedder(runtime="torch", dtype="fp32")
    queries = embedder.embed(TEXTS, role="query")
    assert (embedder.runtime_name, embedder.dtype) == ("torch", "bf16") and embedder.query_runtime == ("torch", "fp32")
    assert embedder.runtime("query") is not embedder.runtime("document")
    np.testing.assert_allclose(queries, reference.embed(TEXTS, role="query"), atol=1e-5)  # queries really ran in fp32
    info = embedder.runtime_info()
    assert info["queries"]["name"] == "torch" and info["queries"]["dtype"] == "fp32" and "queries" in info["queries"]["reason"]
    assert "queries: torch fp32" in embedder.runtime_summary()
    from embedder.cache import embedder_key

    assert embedder_key(embedder, "query") != embedder_key(embedder)  # cached embeddings keyed by the runtime of their role


def test_forced_dtype_or_single_candidate_times_nothing(make_embedder, monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(speed_probe, "measure", _fake_measure({}, {}, calls))
    _auto(make_embedder, monkeypatch, tmp_path, AVX2)
    forced = make_embedder(runtime="torch", dtype="fp32")
    forced.embed(TEXTS)
    only = make_embedder(runtime="torch", dtype="auto")  # torch on AVX2: fp32 is the only candidate
    only.embed(TEXTS)
    assert calls == [] and (only.runtime_name, only.dtype) == ("torch", "fp32") and "only candidate" in only.runtime_info()["reason"]


def test_a_candidate_killed_in_its_child_is_never_chosen(make_embedder, monkeypatch, tmp_path):
    """The real children, on a mocked CPU with native bf16 whose OpenVINO bf16 compile dies;
    timings mocked so that bf16 would have been the fastest."""
    pytest.importorskip("openvino")
    monkeypatch.setattr(speed_probe, "OPENVINO_TARGET", "_runtime_crashes:time_that_crashes_in_bf16")
    real = speed_probe.measure
    docs_s = {"torch fp32": 1.0, "openvino fp32": 0.5, "torch bf16": 0.8, "openvino bf16": 0.01}

    def timed(candidate, setup, crashes):
        got = real(candidate, setup, crashes)
        if got.ok:
            got.doc_seconds, got.query_seconds = docs_s[" ".join(candidate)], [docs_s[" ".join(candidate)] / 10] * len(setup.queries)
        return got

    monkeypatch.setattr(speed_probe, "measure", timed)
    embedder = _auto(make_embedder, monkeypatch, tmp_path, BF16_NO_VNNI)()
    embedder.embed(TEXTS)
    trials = {t.label: t for t in embedder.speed_verdict.trials}
    assert not trials["openvino bf16"].ran and "killed by SIGFPE" in trials["openvino bf16"].reason
    assert trials["openvino fp32"].faithful and trials["torch bf16"].ran
    assert (embedder.runtime_name, embedder.dtype) == ("openvino", "fp32") == embedder.query_runtime
    # the children's crash verdicts are kept: the runtime built next read them, no child of its own
    assert embedder.runtime().verdict.cached and embedder.runtime().verdict.ok
    crash = [v for f in tmp_path.rglob(VERDICTS_FILE) for v in json.loads(f.read_text()).values() if "config" in v["fields"]]
    assert sorted((v["fields"]["config"]["INFERENCE_PRECISION_HINT"], v["ok"]) for v in crash) == [("bf16", False), ("f32", True)]


def test_a_candidate_whose_export_fails_is_out_not_the_probe(make_embedder, monkeypatch):
    """int8 without NNCF (or any export that fails): that candidate does not run; nothing is raised."""
    import embedder.runtime as runtime_module

    def no_export(*args, **kwargs):
        raise ImportError("No module named 'nncf'")

    monkeypatch.setattr(runtime_module, "exported_graph", no_export)
    got = speed_probe._measure_openvino("int8", make_embedder()._probe_setup(VNNI), crashes := [])
    assert not got.ok and "export failed" in got.reason and "nncf" in got.reason and crashes == []


def test_build_workers_get_the_runtime_the_parent_resolved(monkeypatch, tmp_path, make_corpus):
    """build-index --workers N: auto is decided once, by the parent (its probe), and the workers
    load that setting forced, never timing the runtimes again nor choosing another."""
    from indexer import cli as build_cli

    class Resolved:
        config = SimpleNamespace(to_dict=lambda: {"max_length": 64})
        runtime_name, dtype = "auto", "auto"

        def resolve_runtime(self):
            self.runtime_name, self.dtype = "openvino", "int8"  # what a probe on a VNNI CPU could pick

    seen = {}

    def fake_build(*args, **kw):
        seen["spec"] = kw["embedder_spec"]
        raise ValueError("stop here")  # the spec is what this test reads

    monkeypatch.setattr("embedder.encoder.Embedder.load", classmethod(lambda cls, *a, **k: Resolved()))
    monkeypatch.setattr(build_cli, "build_index", fake_build)
    argv = ["--corpus", str(make_corpus()), "--index", str(tmp_path / "index"), "--channels", "sparse", "--quiet"]
    assert build_cli.main([*argv, "--workers", "2"]) == 2
    assert (seen["spec"].runtime, seen["spec"].dtype) == ("openvino", "int8")
    assert build_cli.main([*argv, "--workers", "2", "--dtype", "fp32", "--runtime", "torch"]) == 2
    assert (seen["spec"].runtime, seen["spec"].dtype) == ("torch", "fp32")  # forced by the user: passed on as given
