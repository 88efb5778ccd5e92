"""Queries without the LLM on their path (issue 28): a distilled student's identity check, the
choice at load time (``query_encoder``), ``llm`` equal to the plain path, the query cache."""
from __future__ import annotations

import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from conftest import retriever_over as _retriever

from embedder.query_encoder import (
    DistilledQueryEncoder,
    LMHead,
    QueryEncoderMismatch,
    llm_token_ids,
    make_head,
    make_student_head,
    teacher_identity,
)
from retriever.query import EncodedQuery, encode_queries
from retriever.query_cache import QueryCache


# ------------------------------------------------------------------ the query cache
def _q(text: str) -> EncodedQuery:
    return EncodedQuery(text, np.arange(3, dtype=np.int64), np.ones(3, np.float32), 1, np.zeros(4, np.float32), query_encoder="llm")


def test_the_query_cache_is_bounded_and_evicts_the_least_recently_used():
    cache = QueryCache(3)
    for t in "abc":
        cache.put(t, _q(t))
    assert cache.get("a").text == "a"  # a is now the most recently used
    cache.put("d", _q("d"))
    assert len(cache) == 3 and cache.get("b") is None and {t for t in "acd" if cache.get(t)} == {"a", "c", "d"}
    assert (cache.hits, cache.misses) == (4, 1)


def test_the_query_cache_hands_out_copies():
    cache = QueryCache(2)
    cache.put("a", _q("a"))
    got = cache.get("a")
    got.weights = np.zeros(3, np.float32)  # as idf weighting reassigns weights
    assert cache.get("a").weights.tolist() == [1.0, 1.0, 1.0]


def test_a_zero_sized_query_cache_keeps_nothing_and_bad_sizes_are_refused():
    cache = QueryCache(0)
    cache.put("a", _q("a"))
    assert cache.get("a") is None and len(cache) == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="non-negative integer"):
            QueryCache(bad)


def test_the_query_cache_is_thread_safe_and_stays_bounded():
    cache = QueryCache(50)
    errors = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(2000):
            key = f"q{int(rng.integers(200))}"
            got = cache.get(key)
            if got is not None and got.text != key:
                errors.append((key, got.text))
            cache.put(key, _q(key))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert not errors and len(cache) == 50
    assert cache.hits + cache.misses == 8 * 2000


# ------------------------------------------------------------------ the student and its identity
def _student(embedder, encoder_identity: dict, hidden: int = 0, seed: int = 0) -> DistilledQueryEncoder:
    torch.manual_seed(seed)
    head = make_head(int(encoder_identity["dim"]), embedder.dim, hidden)
    record = {"name": "test", "teacher": teacher_identity(embedder), "encoder": encoder_identity,
              "head": {"in": int(encoder_identity["dim"]), "out": embedder.dim, "hidden": hidden}}
    return DistilledQueryEncoder(head.eval(), record)


def test_a_student_round_trips_and_refuses_another_teacher(make_embedder, tmp_path):
    embedder = make_embedder()
    student = _student(embedder, {"name": "enc", "sha256": "abc", "dim": 8}, hidden=16)
    student.save(tmp_path / "student")
    loaded = DistilledQueryEncoder.load(tmp_path / "student")
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(loaded.states(x), student.states(x))
    loaded.check_teacher(embedder)  # the same model and adapter: accepted
    with pytest.raises(QueryEncoderMismatch, match="another model"):
        loaded.check_teacher(make_embedder(seed=1))  # another model (other weights, other identity)
    other_adapter = make_embedder()
    other_adapter.adapter = {"path": "/somewhere", "sha256": "f" * 64}
    with pytest.raises(QueryEncoderMismatch, match="another adapter"):
        loaded.check_teacher(other_adapter)
    with pytest.raises(QueryEncoderMismatch, match="reads enc embeddings"):
        loaded.check_encoder({"name": "other", "sha256": "def"})


def _bag_student(embedder, encoder_identity: dict, hidden: int = 8, seed: int = 0) -> DistilledQueryEncoder:
    torch.manual_seed(seed)
    d_enc = int(encoder_identity["dim"])
    head = make_student_head("token-bag", d_enc, embedder.dim, hidden, gate_hidden=4)
    record = {"name": "bag", "teacher": teacher_identity(embedder), "encoder": encoder_identity,
              "head": {"kind": "token-bag", "in": d_enc, "out": embedder.dim, "hidden": hidden, "gate_hidden": 4, "max_tokens": 16}}
    return DistilledQueryEncoder(head.eval(), record)


def test_a_token_bag_student_is_the_weighted_sum_of_the_querys_own_llm_tokens(make_embedder, tmp_path):
    embedder = make_embedder()
    student = _bag_student(embedder, {"name": "enc", "sha256": "abc", "dim": 8})
    texts, x = ["cat and dog", "a river"], np.zeros((2, 8), np.float32)
    with pytest.raises(RuntimeError, match="attach"):
        student.states(x, texts)
    student.attach(embedder)
    with pytest.raises(ValueError, match="reads the query texts"):
        student.states(x)
    # with the corrections and the pooled head at zero and equal token scores, h is the mean of
    # the query's own input embeddings: the lookup uses the teacher's tokenizer and table
    with torch.no_grad():
        for p in (*student.head.token[-1].parameters(), *student.head.gate[-1].parameters(), *student.head.pooled.parameters()):
            p.zero_()
    table = embedder.causal_lm.get_input_embeddings().weight.detach().numpy()
    want = [table[embedder.tokenizer(t, add_special_tokens=False)["input_ids"]].mean(0) for t in texts]
    np.testing.assert_allclose(student.states(x, texts), np.stack(want), rtol=1e-5, atol=1e-6)
    # the bag reads the text as the teacher does: an all-caps query folded (Embedder.normalise)
    np.testing.assert_array_equal(student.states(x, [t.upper() for t in texts]), student.states(x, texts))
    ids, mask = llm_token_ids(embedder, texts, max_tokens=2)  # cut to max_tokens, padded to the longest
    assert ids.shape == mask.shape == (2, 2) and mask.sum() == 4
    # saved and loaded: the same states once attached; the table is not in the student's files
    student.save(tmp_path / "bag")
    loaded = DistilledQueryEncoder.load(tmp_path / "bag").attach(embedder)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_array_equal(loaded.states(x, texts), student.states(x, texts))
    assert (tmp_path / "bag" / "head.safetensors").stat().st_size < table.nbytes


@pytest.mark.parametrize("context_dim", [0, 8])
def test_context_blocks_start_as_the_plain_bag_and_let_tokens_read_each_other(make_embedder, tmp_path, context_dim):
    embedder = make_embedder()
    identity = {"name": "enc", "sha256": "abc", "dim": 8}
    plain = _bag_student(embedder, identity).attach(embedder)
    torch.manual_seed(0)
    head = make_student_head("token-bag", 8, embedder.dim, 8, gate_hidden=4, context_layers=1, context_dim=context_dim)
    head.load_state_dict(plain.head.state_dict(), strict=False)  # the same gate, corrections and pooled head
    if context_dim:  # blocks in a narrower space, added back through an up-projection that starts at zero
        assert head.down.out_features == context_dim and not head.up.weight.any()
    record = {**plain.record, "head": {**plain.record["head"], "context_layers": 1, "context_dim": context_dim}}
    student = DistilledQueryEncoder(head.eval(), record).attach(embedder)
    texts, x = ["cat and dog", "a river bank", "dog"], np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    # untrained, a block's residual branches (and a narrow block's up-projection) output zero: the student is the plain bag
    np.testing.assert_allclose(student.states(x, texts), plain.states(x, texts), rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        for p in [*head.context.parameters(), *(head.up.parameters() if context_dim else [])]:
            p.add_(0.5 * torch.randn_like(p))
    # trained, the blocks mix each token with its neighbours: the states move off the plain bag
    changed = student.states(x, texts)
    assert not np.allclose(changed, plain.states(x, texts), atol=1e-4)
    # padding does not leak: a query's state is the same alone and in a batch with longer ones
    np.testing.assert_allclose(student.states(x[2:], texts[2:]), changed[2:], rtol=1e-4, atol=1e-5)
    # an empty query has no tokens: no NaN from attending over nothing, only the pooled head's h
    with torch.no_grad():
        pooled = head.pooled(torch.from_numpy(x[:1])).numpy()
    np.testing.assert_allclose(student.states(x[:1], [""]), pooled, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(student.states(x[:2], ["", texts[1]])[1], changed[1], rtol=1e-4, atol=1e-5)
    student.save(tmp_path / "ctx")
    loaded = DistilledQueryEncoder.load(tmp_path / "ctx").attach(embedder)
    assert len(loaded.head.context) == 1 and (loaded.head.down is not None) == bool(context_dim)
    np.testing.assert_array_equal(loaded.states(x, texts), changed)


def test_a_compiled_head_gives_the_torch_heads_states(make_embedder, tmp_path, monkeypatch):
    """OpenVINO f32 runs the same graph: padded batches, an empty query and the context block included."""
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    embedder = make_embedder()
    torch.manual_seed(3)
    head = make_student_head("token-bag", 8, embedder.dim, 8, gate_hidden=4, context_layers=1)
    for p in head.parameters():  # off the identity start, so that the block's attention counts
        torch.nn.init.normal_(p, std=0.3)
    record = {"name": "ctx", "teacher": teacher_identity(embedder), "encoder": {"name": "enc", "sha256": "abc", "dim": 8},
              "head": {"kind": "token-bag", "in": 8, "out": embedder.dim, "hidden": 8, "gate_hidden": 4, "max_tokens": 16, "context_layers": 1}}
    texts = ["cat and dog near the river bank", "dog", "", "a game with the team"]
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    plain = DistilledQueryEncoder(head.eval(), record).attach(embedder)
    want = plain.states(x, texts)
    compiled = DistilledQueryEncoder(head.eval(), record).attach(embedder).compile("f32")
    assert compiled.runtime_name == "openvino" and compiled.runtime_reason == "openvino f32"
    np.testing.assert_allclose(compiled.states(x, texts), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled.states(x[1:2], texts[1:2]), want[1:2], rtol=1e-4, atol=1e-5)  # alone = in a padded batch
    assert np.isfinite(compiled.states(x[2:3], [""])).all()


def test_a_compiled_head_that_reads_encoder_token_states_gives_the_torch_heads(make_embedder, tmp_path, monkeypatch):
    """Five inputs: a batch runs the dynamic graph; one query pads its LLM tokens and its encoder
    tokens (of other counts) to one static length."""
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    embedder = make_embedder()
    student = _encoder_token_student(embedder, {"name": "enc", "sha256": "abc", "dim": 8}, seed=3).attach(embedder)
    for p in student.head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    texts = ["cat and dog near the river bank", "dog", "", "a game with the team"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    states, mask = (0.5 * rng.standard_normal((4, 7, 8))).astype(np.float32), np.ones((4, 7), np.float32)
    mask[1, 3:] = mask[2, 2:] = 0
    want = student.states(x, texts, (states, mask))
    compiled = DistilledQueryEncoder(student.head, student.record).attach(embedder).compile("f32")
    assert compiled.runtime_name == "openvino" and compiled.runtime_reason == "openvino f32", compiled.runtime_reason
    np.testing.assert_allclose(compiled.states(x, texts, (states, mask)), want, rtol=1e-4, atol=1e-5)
    for i in range(4):  # one at a time, the encoder's states cut to the query's own
        n = int(mask[i].sum())
        one = compiled.states(x[i : i + 1], texts[i : i + 1], (states[i : i + 1, :n], mask[i : i + 1, :n]))
        np.testing.assert_allclose(one, want[i : i + 1], rtol=1e-4, atol=1e-5)


def test_the_compiled_heads_precision_follows_the_cpu_capability():
    """bf16 only where the CPU has it in hardware (emulated bf16 is ~5x slower than f32)."""
    from embedder.hardware import Capability, student_precision

    assert student_precision(Capability("cpu", "AMD EPYC", ("avx2", "fma", "f16c"))) == "f32"
    assert student_precision(Capability("cpu", "AMD EPYC", ("avx2", "avx512f", "avx512_bf16"), native_bf16=True)) == "bf16"
    assert student_precision(Capability("cpu", "Xeon", ("avx512f", "amx_bf16", "amx_int8"), native_bf16=True)) == "bf16"
    assert student_precision(Capability("cpu", "old x86", ("avx",))) == "f32"
    assert student_precision(Capability("cuda", "H100", (), native_bf16=True)) == "f32"  # OpenVINO's CPU plugin compiles it


def _ctx_student(embedder):
    torch.manual_seed(3)
    head = make_student_head("token-bag", 8, embedder.dim, 8, gate_hidden=4, context_layers=1)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    record = {"name": "ctx", "teacher": teacher_identity(embedder), "encoder": {"name": "enc", "sha256": "abc", "dim": 8},
              "head": {"kind": "token-bag", "in": 8, "out": embedder.dim, "hidden": 8, "gate_hidden": 4, "max_tokens": 16, "context_layers": 1}}
    return DistilledQueryEncoder(head.eval(), record).attach(embedder)


@pytest.mark.parametrize("native_bf16", [False, True])
def test_compile_takes_the_precision_the_cpu_calls_for(make_embedder, tmp_path, monkeypatch, native_bf16):
    """The capability mocked both ways: the head compiles in the precision student_precision gives, and
    its states stay those of the torch head (bf16: to bf16's rounding)."""
    from embedder import hardware

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    cap = hardware.Capability("cpu", "mocked", ("avx2", "avx512_bf16") if native_bf16 else ("avx2",), native_bf16=native_bf16)
    monkeypatch.setattr(hardware, "cpu_capability", lambda *a, **k: cap)
    from embedder.student_runtime import CompiledHead

    tried: list[str] = []
    real_init = CompiledHead.__init__

    def spy(self, *args, precision="f32", **kwargs):
        tried.append(precision)
        real_init(self, *args, precision=precision, **kwargs)

    monkeypatch.setattr(CompiledHead, "__init__", spy)
    embedder = make_embedder()
    student = _ctx_student(embedder)
    texts, x = ["cat and dog near the river bank", "dog"], np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    want = student.states(x, texts)
    student.compile()
    assert tried[0] == ("bf16" if native_bf16 else "f32") and student.runtime_name == "openvino"
    # this machine may lack the bf16 the capability claims: OpenVINO then runs it in f32, or refuses it and f32 answers
    assert student.runtime_reason.startswith("openvino bf16" if native_bf16 and len(tried) == 1 else "openvino f32")
    got = student.states(x, texts)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > (0.999 if native_bf16 else 0.999999)


def test_a_bf16_head_whose_compile_crashes_falls_back_to_f32_and_says_why(make_embedder, tmp_path, monkeypatch, caplog):
    """The AMX crash, simulated on any CPU: bf16 dies in its probe child, f32 then compiles."""
    from embedder.student_runtime import CompiledHead

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(CompiledHead, "probe_target", "_runtime_crashes:student_compile_that_crashes_in_bf16")
    embedder = make_embedder()
    student = _ctx_student(embedder)
    texts, x = ["cat and dog", "a river"], np.zeros((2, 8), np.float32)
    want = student.states(x, texts)
    with caplog.at_level("WARNING"):
        student.compile("bf16")
    assert student.runtime_name == "openvino" and student.runtime_reason.startswith("openvino f32 (")
    assert "bf16: killed by SIGFPE" in student.runtime_reason and "killed by SIGFPE" in caplog.text
    np.testing.assert_allclose(student.states(x, texts), want, rtol=1e-4, atol=1e-5)


def test_a_head_whose_compile_crashes_runs_in_torch_and_says_why(make_embedder, tmp_path, monkeypatch, caplog):
    """The first compile on a machine runs in a child: a native crash there (simulated) leaves the torch head."""
    from embedder.student_runtime import CompiledHead

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(CompiledHead, "probe_target", "_runtime_crashes:die")
    embedder = make_embedder()
    student = _bag_student(embedder, {"name": "enc", "sha256": "abc", "dim": 8}).attach(embedder)
    texts, x = ["cat and dog", "a river"], np.zeros((2, 8), np.float32)
    want = student.states(x, texts)
    with caplog.at_level("WARNING"):
        student.compile()
    assert student.runtime_name == "torch" and "killed by SIGFPE" in student.runtime_reason and "killed by SIGFPE" in caplog.text
    np.testing.assert_array_equal(student.states(x, texts), want)


def test_one_query_runs_the_graph_of_its_length_and_gives_the_torch_heads_states(make_embedder, tmp_path, monkeypatch):
    """A query alone pads to the next static length (its mask hides the padding); batches and
    longer queries run the dynamic graph; every answer is the torch head's."""
    from embedder.student_runtime import CompiledHead

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    head = _ctx_student(make_embedder()).head
    d = head.pooled[-1].out_features
    compiled = CompiledHead(head, 8, d, precision="f32", static_lengths=(4, 8))
    assert sorted(compiled.static) == [4, 8] and compiled.unfaithful == {}
    used: list = []
    real = compiled._request
    monkeypatch.setattr(compiled, "_request", lambda length: used.append(length) or real(length))
    rng = np.random.default_rng(0)
    for n, length, graph in [(1, 1, 4), (1, 4, 4), (1, 5, 8), (1, 8, 8), (1, 9, None), (2, 3, None)]:
        x = rng.standard_normal((n, 8)).astype(np.float32)
        tokens = (0.3 * rng.standard_normal((n, length, d))).astype(np.float32)
        mask = np.ones((n, length), np.float32)
        mask[-1, length // 2 + 1 :] = 0
        with torch.inference_mode():
            want = head(torch.from_numpy(x), torch.from_numpy(tokens), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(compiled(x, tokens, mask), want, rtol=1e-4, atol=1e-5)
        assert used[-1] == graph, (n, length)


def test_a_static_graph_that_computes_wrong_is_dropped_and_says_so(make_embedder, tmp_path, monkeypatch, caplog):
    """OpenVINO's bf16 graph of static length 8 is wrong on some CPUs, simulated on any: the graph of
    length 4 is built from another head's weights. It fails the check against the torch head, is
    dropped with a warning, and its queries run the next graph, right."""
    from embedder import student_runtime
    from embedder.student_runtime import CompiledHead, _export

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    student = _ctx_student(make_embedder())
    head, d = student.head, student.record["head"]["out"]
    other = copy.deepcopy(head)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn_like(p))
    _export(other.eval(), 8, d, tmp_path / "other")
    import openvino as ov

    wrong = ov.Core().read_model(str(tmp_path / "other" / "model.xml"))
    real_static = student_runtime.static_model
    monkeypatch.setattr(student_runtime, "static_model", lambda model, d_enc, d_llm, length: real_static(wrong if length == 4 else model, d_enc, d_llm, length))
    with caplog.at_level("WARNING"):
        compiled = CompiledHead(head, 8, d, precision="f32", static_lengths=(4, 8))
    assert sorted(compiled.static) == [8] and list(compiled.unfaithful) == [4] and "static length 4" in caplog.text
    x, tokens, mask = np.ones((1, 8), np.float32), np.full((1, 3, d), 0.2, np.float32), np.ones((1, 3), np.float32)
    with torch.inference_mode():
        want = head(torch.from_numpy(x), torch.from_numpy(tokens), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(compiled(x, tokens, mask), want, rtol=1e-4, atol=1e-5)


def test_a_cached_graph_that_is_not_the_heads_own_is_not_trusted(make_embedder, tmp_path, monkeypatch, caplog):
    """The exported graph found in the cache under the head's key computes another head (a stale or
    damaged export, simulated): it fails the check against the torch head in every precision, and
    the torch head answers, saying why."""
    import hashlib
    import json

    import openvino as ov

    from embedder.student_runtime import STUDENT_EXPORT_VERSION, _export, head_digest

    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    student = _ctx_student(make_embedder())
    key = hashlib.sha256(json.dumps({"head": head_digest(student.head), "export": STUDENT_EXPORT_VERSION, "openvino": ov.__version__}).encode())
    other = copy.deepcopy(student.head)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn_like(p))
    _export(other.eval(), 8, student.record["head"]["out"], tmp_path / "cache" / "runtimes" / f"student-{key.hexdigest()[:20]}")
    texts, x = ["cat and dog", "a river"], np.zeros((2, 8), np.float32)
    want = student.states(x, texts)
    with caplog.at_level("WARNING"):
        student.compile()
    assert student.runtime_name == "torch" and "off the torch head's" in student.runtime_reason
    np.testing.assert_array_equal(student.states(x, texts), want)


def test_a_damaged_student_record_names_its_file_and_field(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "query_encoder.json").write_text('{"format": 7}')
    with pytest.raises(ValueError, match=r"query_encoder.json: field 'format'"):
        DistilledQueryEncoder.load(tmp_path / "s")
    (tmp_path / "s" / "query_encoder.json").write_text(
        '{"format": 1, "teacher": {}, "encoder": {}, "head": {"kind": "lstm", "in": 4, "out": 4}}'
    )
    with pytest.raises(ValueError, match=r"query_encoder.json: field 'head.kind'"):
        DistilledQueryEncoder.load(tmp_path / "s")


# ------------------------------------------------------------------ the Retriever's choice


QUERIES = ["cat and dog near the river", "computer memory data", "a game with the team"]


def test_llm_queries_equal_the_plain_path(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    r = _retriever(path, tiny_embedder, encoder, query_encoder="llm")
    reference = encode_queries(tiny_embedder, QUERIES, r.expansion_m, r.literal)
    for mode in ("sparse", "dense"):
        got = r.encode(QUERIES, mode)
        for g, ref in zip(got, reference):
            assert g.tokens.tolist() == ref.tokens.tolist() and g.query_encoder == "llm"
            np.testing.assert_array_equal(g.embedding, ref.embedding)
    hits = r.search(QUERIES[0], k=3, mode="hybrid")
    assert hits and all(h.query_encoder == "llm" for h in hits)
    assert r.query_encoder == "llm"


def test_auto_without_a_student_is_the_llm_and_distilled_says_why_not(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    assert _retriever(path, tiny_embedder, encoder, query_encoder="auto").query_encoder == "llm"
    with pytest.raises(ValueError, match="no distilled query encoder beside the index's adapter"):
        _retriever(path, tiny_embedder, encoder, query_encoder="distilled")


@pytest.mark.parametrize("kind", ["pooled", "token-bag"])
def test_auto_takes_the_student_kept_beside_the_adapter(encoder_index, tiny_embedder, tmp_path, kind):
    path, encoder = encoder_index
    adapter_dir = tmp_path / "adapter"
    tiny_embedder.adapter = {"path": str(adapter_dir), "sha256": "a" * 64}
    make = _student if kind == "pooled" else _bag_student
    student = make(tiny_embedder, {**encoder.identity, "dim": encoder.dim}, hidden=8).attach(tiny_embedder)
    student.record["name"] = "beside"
    student.save(adapter_dir / "query-encoder")
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    manifest = Manifest.read(path)
    manifest.adapter = tiny_embedder.adapter  # as if the index had been built with that adapter
    r = Retriever(path, manifest, tiny_embedder, encoders={"encoder": encoder}, profile=None, query_encoder="auto")
    assert r.query_encoder == "distilled:beside"
    got = r.encode(QUERIES, "sparse")
    x = encoder.encode(QUERIES)
    # the student the Retriever loaded is the one saved, run where this CPU compiles it (bf16 where native)
    states = r.student.states(x, QUERIES)
    np.testing.assert_allclose(states, student.states(x, QUERIES), rtol=0, atol=1e-6 if r.student.runtime_reason.endswith("f32") else 0.05)
    np.testing.assert_allclose(np.stack([q.embedding for q in got]), states, rtol=0, atol=1e-6)
    hits = r.search(QUERIES[1], k=3, mode="hybrid")
    assert hits and all(h.query_encoder == "distilled:beside" for h in hits)
    # the expansion: the literal tokens, then W_lm h's top tokens through the student's LM head
    head = LMHead.of(tiny_embedder)
    top, _ = head.top_tokens(states, r.expansion_m)
    for q, ids in zip(got, top):
        assert q.tokens[q.n_literal:].tolist() == [t for t in ids.tolist() if t not in q.tokens[: q.n_literal].tolist()]
    # states computed elsewhere become the same queries the student's own path builds (the studies' way in)
    full = r.encode(QUERIES)
    built = r.encode_states(QUERIES, np.stack([q.embedding for q in full]), r.query_encoder)
    for a, b in zip(full, built):
        assert a.tokens.tolist() == b.tokens.tolist() and a.n_literal == b.n_literal and a.query_encoder == b.query_encoder
        np.testing.assert_array_equal(a.weights, b.weights)
        np.testing.assert_array_equal(a.embedding, b.embedding)
        np.testing.assert_allclose(a.encoder_embedding, b.encoder_embedding, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="expected"):
        r.encode_states(QUERIES, np.zeros((len(QUERIES), tiny_embedder.dim + 1), np.float32), "x")


def test_auto_falls_back_to_the_llm_where_the_students_sentence_encoder_is_not_installed(encoder_index, tiny_embedder, tmp_path, monkeypatch, caplog):
    """The package ships a student, not the sentence encoder it reads (an extra): auto must still load."""
    from embedder.models import ModelNotAvailable
    from embedder.sentence_encoder import SentenceEncoder

    path, encoder = encoder_index
    adapter_dir = tmp_path / "adapter"
    tiny_embedder.adapter = {"path": str(adapter_dir), "sha256": "a" * 64}
    student = _student(tiny_embedder, {"name": "minilm", "sha256": "b" * 64, "dim": encoder.dim}, hidden=8)
    student.save(adapter_dir / "query-encoder")

    def not_installed(*args, **kwargs):
        raise ModelNotAvailable("encoder 'minilm' is not installed (pip install 'aligned-tokens[encoder]')")

    monkeypatch.setattr(SentenceEncoder, "load", not_installed)
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    manifest = Manifest.read(path)
    manifest.adapter = tiny_embedder.adapter
    with caplog.at_level("WARNING", logger="retriever.retriever"):
        r = Retriever(path, manifest, tiny_embedder, encoders={"encoder": encoder}, profile=None, query_encoder="auto")
    assert r.query_encoder == "llm" and "not installed" in caplog.text
    with pytest.raises(ModelNotAvailable, match="not installed"):
        Retriever(path, manifest, tiny_embedder, encoders={"encoder": encoder}, profile=None, query_encoder="distilled")


def test_the_lm_head_precision_follows_the_device():
    from embedder.hardware import Capability, lm_head_dtype

    assert lm_head_dtype(Capability("cpu", "AMD EPYC", ("avx2", "fma", "f16c"))) == "int8"
    assert lm_head_dtype(Capability("cpu", "old x86", ("avx",))) == "int8"  # Numba's kernel assumes no instruction set
    assert lm_head_dtype(Capability("cpu", "Xeon", ("avx512f", "amx_int8"), native_bf16=True)) == "int8"
    assert lm_head_dtype(Capability("cuda", "H100", (), native_bf16=True)) == "fp32"


def test_the_half_precision_lm_head_keeps_the_top_tokens(tiny_embedder):
    rng = np.random.default_rng(0)
    h = rng.standard_normal((32, tiny_embedder.dim)).astype(np.float32)
    want_ids, want_vals = tiny_embedder.top_tokens(h, 16)
    ids32, vals32 = LMHead.of(tiny_embedder, "fp32").top_tokens(h, 16)
    assert (ids32 == want_ids).all()
    np.testing.assert_allclose(vals32, want_vals, rtol=1e-6, atol=1e-6)
    ids16, vals16 = LMHead.of(tiny_embedder, "fp16").top_tokens(h, 16)
    overlap = [len(set(a) & set(b)) / 16 for a, b in zip(ids16.tolist(), want_ids.tolist())]
    assert min(overlap) >= 14 / 16 and np.mean(overlap) >= 0.97  # only near-ties at the cut may swap
    np.testing.assert_allclose(np.sort(vals16, axis=1), np.sort(want_vals, axis=1), atol=0.05 * np.abs(want_vals).max())
    with pytest.raises(ValueError, match="fp32, fp16, int8"):
        LMHead(torch.zeros(4, 2), "int4")


@pytest.mark.parametrize("k", [1, 16, 200])
def test_the_int8_lm_head_gives_fp32s_top_tokens(k):
    """The int8 first pass only bounds the logits; the answer is fp32's, ties aside. A head whose
    rows differ by less than int8 can resolve (near-duplicates, a tiny row) checks the bound."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3000, 64)).astype(np.float32)
    w[1000:1100] = w[0] + 1e-3 * rng.standard_normal((100, 64)).astype(np.float32)  # below one int8 step apart
    w[1100] *= 1e-6
    weight = torch.from_numpy(w)
    h = rng.standard_normal((24, 64)).astype(np.float32)
    h[:4] = w[0] * 3  # queries aimed at the near-duplicate rows, whose order int8 alone cannot see
    ref_ids, ref_vals = LMHead(weight, "fp32").top_tokens(h, k)
    ids, vals = LMHead(weight, "int8").top_tokens(h, k)
    assert ids.shape == (24, k) and ids.dtype == np.int32 and vals.dtype == np.float32
    # the same logits, best first; a token may differ from fp32's only where two fp32 logits tie at the cut
    np.testing.assert_allclose(vals, ref_vals, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(vals, np.take_along_axis(h @ w.T, ids.astype(np.int64), 1), rtol=1e-5, atol=1e-4)
    logits = h.astype(np.float64) @ w.T.astype(np.float64)
    for i, (a, b) in enumerate(zip(ids, ref_ids)):
        swapped = sorted(set(a.tolist()) ^ set(b.tolist()))
        np.testing.assert_allclose(logits[i, swapped], ref_vals[i, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,k", [(1, 1), (100, 7), (49152, 1), (49152, 128), (49152, 49152), (5000, 313)])
def test_kth_largest_is_npartitions(n, k):
    """The sampled selection gives np.partition's k-th largest, ties and all: spread values,
    many equal values (the sample's cut then lands inside a run of ties), and a sorted array
    (every stride-th value of the largest ones)."""
    from embedder.lm_head import kth_largest

    rng = np.random.default_rng(n + k)
    for values in (rng.standard_normal(n), rng.integers(0, 5, n).astype(np.float64), np.sort(rng.standard_normal(n))):
        assert kth_largest(values, k) == np.partition(values, n - k)[n - k]
    with pytest.raises(ValueError, match="k must be in"):
        kth_largest(np.zeros(3), 4)


_THREADS_AT_ONCE = """
from concurrent.futures import ThreadPoolExecutor
import numpy as np, torch
from embedder.lm_head import LMHead
rng = np.random.default_rng(2)
head = LMHead(torch.from_numpy(rng.standard_normal((2000, 32)).astype(np.float32)), "int8")
states = rng.standard_normal((64, 32)).astype(np.float32)
want = [head.top_tokens(h[None], 10)[0] for h in states]
with ThreadPoolExecutor(8) as pool:
    got = list(pool.map(lambda h: head.top_tokens(h[None], 10)[0], states))
assert all((g == w).all() for g, w in zip(got, want))
"""


@pytest.mark.parametrize("layer", ["default", "workqueue"])
def test_the_int8_lm_head_answers_threads_at_once(layer):
    """A served Retriever encodes queries from many threads: each gets its own answer. Numba's
    workqueue layer (where neither TBB nor OpenMP is installed) aborts the process when two
    threads enter a parallel kernel at once, so the kernel is entered one thread at a time."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NUMBA_THREADING_LAYER": layer, "PYTHONPATH": str(repo)}
    done = subprocess.run([sys.executable, "-c", _THREADS_AT_ONCE], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_int8_lm_head_falls_back_to_fp32_on_a_non_finite_state():
    w = torch.randn(50, 8)
    h = np.full((1, 8), np.nan, np.float32)
    ids, _ = LMHead(w, "int8").top_tokens(h, 5)
    assert ids.shape == (1, 5)  # no bound holds for NaN: the fp32 product answers, as on the LLM's own path


def test_a_student_of_another_adapter_is_refused_at_load(encoder_index, tiny_embedder, make_embedder, tmp_path):
    path, encoder = encoder_index
    student = _student(make_embedder(seed=1), {**encoder.identity, "dim": encoder.dim})
    student.save(tmp_path / "wrong")
    with pytest.raises(QueryEncoderMismatch):
        _retriever(path, tiny_embedder, encoder, query_encoder=str(tmp_path / "wrong"))


def test_the_retriever_caches_encoded_queries_per_encoder(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    r = _retriever(path, tiny_embedder, encoder, query_cache_size=8)
    calls = {"n": 0}
    real = tiny_embedder.embed

    def counting(texts, role="document"):
        calls["n"] += len(texts)
        return real(texts, role)

    tiny_embedder.embed = counting
    first = r.search(QUERIES[0], k=5, mode="sparse")
    again = r.search(QUERIES[0], k=5, mode="sparse")
    assert calls["n"] == 1 and [h.doc_id for h in first] == [h.doc_id for h in again]
    r.batch_search(QUERIES, k=5, mode="sparse")
    assert calls["n"] == 3  # only the two new queries
    r.search(QUERIES[0], k=5, mode="bm25")  # another channel set: its own entry, and no LLM call
    assert calls["n"] == 3 and len(r.query_cache) == 4


def test_concurrent_searches_through_the_cache_equal_serial_ones(encoder_index, tiny_embedder):
    path, encoder = encoder_index
    r = _retriever(path, tiny_embedder, encoder, query_cache_size=2)  # small: entries are evicted while others read
    serial = {q: [(h.doc_id, h.score) for h in r.search(q, k=5, mode="hybrid")] for q in QUERIES}
    r.query_cache.clear()
    barrier = threading.Barrier(6)

    def work(i: int):
        barrier.wait()
        q = QUERIES[i % 3]
        return q, [(h.doc_id, h.score) for h in r.search(q, k=5, mode="hybrid")]

    with ThreadPoolExecutor(6) as pool:
        for q, got in pool.map(work, range(6)):
            assert got == serial[q]


# ------------------------------------------------------------------ a student that reads the sentence encoder's token states
def _encoder_token_student(embedder, encoder_identity: dict, seed: int = 0) -> DistilledQueryEncoder:
    torch.manual_seed(seed)
    d_enc = int(encoder_identity["dim"])
    head = make_student_head("token-bag", d_enc, embedder.dim, 8, gate_hidden=4, context_layers=1, encoder_tokens=True)
    record = {"name": "enc-tokens", "teacher": teacher_identity(embedder), "encoder": encoder_identity,
              "head": {"kind": "token-bag", "in": d_enc, "out": embedder.dim, "hidden": 8, "gate_hidden": 4, "max_tokens": 16,
                       "context_layers": 1, "encoder_tokens": True}}  # fmt: skip
    return DistilledQueryEncoder(head.eval(), record)


def test_encoder_token_states_start_as_the_context_student_and_are_read_once_trained(make_embedder, tmp_path):
    embedder = make_embedder()
    identity = {"name": "enc", "sha256": "abc", "dim": 8}
    student = _encoder_token_student(embedder, identity).attach(embedder)
    assert student.reads_encoder_tokens
    texts = ["cat and dog", "a river bank", "dog"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    states, mask = rng.standard_normal((3, 5, 8)).astype(np.float32), np.ones((3, 5), np.float32)
    mask[2, 2:] = 0  # the third text has two real encoder tokens
    with pytest.raises(ValueError, match="token states"):
        student.states(x, texts)  # they must be given
    untrained = student.states(x, texts, (states, mask))
    # untrained, the block outputs zero: the encoder's tokens change nothing yet
    np.testing.assert_allclose(untrained, student.states(x, texts, (rng.standard_normal((3, 5, 8)).astype(np.float32), mask)), atol=1e-6)
    with torch.no_grad():
        for p in student.head.context.parameters():
            p.add_(0.5 * torch.randn_like(p))
    got = student.states(x, texts, (states, mask))
    other = states.copy()
    other[0] += 1.0
    moved = student.states(x, texts, (other, mask))
    assert not np.allclose(moved[0], got[0], atol=1e-4)  # the first text's encoder tokens are read
    np.testing.assert_allclose(moved[1:], got[1:], rtol=1e-5, atol=1e-6)  # and only its own
    # padding does not leak: the third text alone, its states cut to its real tokens
    np.testing.assert_allclose(student.states(x[2:], texts[2:], (states[2:, :2], mask[2:, :2])), got[2:], rtol=1e-4, atol=1e-5)
    # saved and loaded: the same head
    student.save(tmp_path / "enc-tokens")
    loaded = DistilledQueryEncoder.load(tmp_path / "enc-tokens").attach(embedder)
    assert loaded.reads_encoder_tokens
    np.testing.assert_array_equal(loaded.states(x, texts, (states, mask)), got)
    with pytest.raises(ValueError, match="context_layers"):
        make_student_head("token-bag", 8, embedder.dim, 8, encoder_tokens=True)


def test_ragged_token_states_batch_and_cache(tmp_path):
    from training.query_encoder.data import RaggedStates, encoder_token_states

    class Encoder:  # as SentenceEncoder.encode_with_tokens: one padded batch
        identity, dim, calls = {"sha256": "abc"}, 3, 0

        def encode_with_tokens(self, texts):
            Encoder.calls += 1
            n = max(len(t.split()) for t in texts)
            states = np.zeros((len(texts), n, 3), np.float32)
            mask = np.zeros((len(texts), n), np.float32)
            for i, t in enumerate(texts):
                k = len(t.split())
                states[i, :k] = np.arange(k)[:, None] + 10 * len(t)
                mask[i, :k] = 1
            return np.zeros((len(texts), 3), np.float32), states, mask

    texts = ["one two three", "a", "four five six seven eight nine"]
    got = encoder_token_states(Encoder(), texts, tmp_path, max_tokens=4, batch_size=2, progress=False)
    assert isinstance(got, RaggedStates) and len(got) == 3 and got.lengths().tolist() == [3, 1, 4]  # cut at max_tokens
    states, mask = got.batch([2, 1])
    assert states.shape == (2, 4, 3) and mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    np.testing.assert_array_equal(states[0, :, 0], np.arange(4) + 10 * len(texts[2]))
    assert not states[1, 1:].any()
    calls = Encoder.calls
    again = encoder_token_states(Encoder(), texts, tmp_path, max_tokens=4, batch_size=2, progress=False)
    assert Encoder.calls == calls  # read from the cache
    np.testing.assert_array_equal(again.flat, got.flat)


def test_the_retriever_gives_a_token_reading_student_the_encoders_token_states(encoder_index, tiny_embedder, tmp_path, monkeypatch):
    import embedder.hardware

    monkeypatch.setattr(embedder.hardware, "student_precision", lambda capability: "f32")  # exact on every CPU: bf16 rounding is tested apart
    path, encoder = encoder_index
    adapter_dir = tmp_path / "adapter"
    tiny_embedder.adapter = {"path": str(adapter_dir), "sha256": "a" * 64}
    student = _encoder_token_student(tiny_embedder, {**encoder.identity, "dim": encoder.dim}).attach(tiny_embedder)
    with torch.no_grad():
        for p in student.head.context.parameters():
            p.add_(0.5 * torch.randn_like(p))
    student.save(adapter_dir / "query-encoder")
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    manifest = Manifest.read(path)
    manifest.adapter = tiny_embedder.adapter
    r = Retriever(path, manifest, tiny_embedder, encoders={"encoder": encoder}, profile=None, query_encoder="auto")
    assert r.query_encoder == "distilled:enc-tokens"
    got = r.encode(QUERIES, "hybrid")
    assert r.student.runtime_reason == "openvino f32", r.student.runtime_reason
    for i, q in enumerate(QUERIES):  # one query at a time, as a served engine answers them
        x, states, mask = encoder.encode_with_tokens([q])
        np.testing.assert_allclose(got[i].embedding, student.states(x, [q], (states, mask))[0], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got[i].encoder_embedding, encoder.encode([q])[0], atol=1e-5)  # one forward serves the encoder channel
    assert all(h.query_encoder == "distilled:enc-tokens" for h in r.search(QUERIES[0], k=3, mode="hybrid"))
