"""Shipped adapters: named on the command line, `default` per backbone, clear errors."""
from __future__ import annotations

import json

import pytest

from embedder.adapters import DEFAULT_ADAPTERS, SHIPPED_DIR, resolve_adapter, shipped_adapter, shipped_adapters
from embedder.models import ModelNotAvailable


def test_every_default_is_shipped_and_records_its_backbone():
    names = shipped_adapters()
    for model, name in DEFAULT_ADAPTERS.items():
        assert name in names
        assert shipped_adapter(model) == SHIPPED_DIR / name
        record = json.loads((SHIPPED_DIR / name / "text2token.json").read_text())
        assert record["backbone"]["name"] == model  # a default for one backbone is trained on it


def test_names_none_default_and_directories_resolve(tmp_path):
    name = shipped_adapters()[0]
    assert resolve_adapter(name, "smollm2-135m") == (SHIPPED_DIR / name).resolve()
    assert resolve_adapter("none", "smollm2-135m") is None and resolve_adapter(None, "smollm2-135m") is None
    assert resolve_adapter("default", "a-backbone-with-no-adapter") is None  # the raw backbone
    (tmp_path / "adapter_config.json").write_text("{}")
    assert resolve_adapter(tmp_path, "smollm2-135m") == tmp_path.resolve()


def test_a_shipped_adapter_of_another_backbone_is_refused():
    with pytest.raises(ModelNotAvailable, match="trained on smollm2-135m, not on tiny"):
        resolve_adapter(DEFAULT_ADAPTERS["smollm2-135m"], "tiny")


def test_unknown_adapter_lists_the_shipped_ones(tmp_path):
    with pytest.raises(ModelNotAvailable, match="nor a shipped adapter") as info:
        resolve_adapter(tmp_path / "nope", "smollm2-135m")
    assert all(n in str(info.value) for n in shipped_adapters())


def test_every_shipped_query_encoder_was_distilled_from_its_adapters_weights():
    """``query_encoder="auto"`` takes a student kept beside an index's adapter: it must have been distilled from
    exactly those weights. contrastive-v2 ships one; the default adapter (v4) has none yet, so "auto" is the LLM there."""
    from embedder.adapters import adapter_identity
    from embedder.query_encoder import STUDENT_FILE, DistilledQueryEncoder, student_beside

    with_student = []
    for name in shipped_adapters():
        identity = adapter_identity(SHIPPED_DIR / name)
        path = student_beside(identity)
        if path is None:
            continue
        with_student.append(name)
        assert (path / STUDENT_FILE).exists()
        student = DistilledQueryEncoder.load(path)
        assert student.record["teacher"]["adapter"] == identity["sha256"]
        assert student.record["weights"] == "fp16" and student.kind == "token-bag"
        assert student.record["encoder"]["name"] == "minilm"
        assert student.record["faithfulness"]["n"] > 1000  # measured on held-out texts when it was distilled
    assert "smollm2-135m-contrastive-v2" in with_student


def test_auto_reads_queries_with_the_llm_where_the_adapter_has_no_student():
    from embedder.adapters import adapter_identity
    from embedder.query_encoder import student_beside
    from retriever.query_encoding import choose_query_encoder

    identity = adapter_identity(SHIPPED_DIR / DEFAULT_ADAPTERS["smollm2-135m"])
    if student_beside(identity) is not None:
        pytest.skip("the default adapter ships a student: auto takes it (the test above checks it)")

    class NoStudentEmbedder:
        adapter = identity

    assert choose_query_encoder("auto", NoStudentEmbedder(), encoder=None) == (None, None)
