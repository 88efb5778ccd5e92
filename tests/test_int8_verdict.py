"""The int8 verdict (issue 54): issue 28's shared-collection check is recorded beside the adapter
as ``int8-quality.json`` by the precision table, and only a passed check about *these* weights
lets the speed probe offer OpenVINO int8 to ``dtype="auto"``. The beir-eval results are written
by hand here: the check reads nDCG@10 and run parameters, never a model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedder.runtime import int8_recipe_id
from embedder.speed_probe import INT8_VERDICT_FILE, recorded_int8_verdict, write_int8_verdict
from embedder.util import weights_sha256
from experiments import precision_table


def _adapter(tmp_path: Path, content: bytes = b"lora weights") -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    (folder / "adapter_model.safetensors").write_bytes(content)
    return folder


def _results(folder: Path, sha: str, dtype: str, ndcg: dict[str, dict[str, float]]) -> Path:
    """A beir-eval results file with one run per (collection, system): its nDCG@10 and params."""
    params = {"adapter": {"sha256": sha}, "runtime": {"name": "openvino", "dtype": dtype,
                                                      "capability": {"name": "mocked Xeon", "flags": ["avx512_vnni"]}}}
    datasets = [{"name": name, "source": f"../shared/data/{name}",
                 "results": {s: {"metrics": {"ndcg@10": v}, "params": params, "run_file": f"{name}-{s}.trec"} for s, v in systems.items()}}
                for name, systems in ndcg.items()]
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"kind": "beir-eval", "datasets": datasets, "systems": {}}))
    return folder


@pytest.fixture(autouse=True)
def _no_p_values(monkeypatch):
    monkeypatch.setattr(precision_table, "_p_value", lambda *a: None)  # needs the collections' qrels and run files


REFERENCE = {"adi": {"sparse": 0.40, "dense": 0.45}, "cisi": {"sparse": 0.20, "dense": 0.22}}


def test_a_passed_check_lets_the_probe_offer_int8_for_these_weights_only(tmp_path):
    adapter = _adapter(tmp_path)
    sha = weights_sha256(adapter)
    ref = _results(tmp_path / "fp32", sha, "fp32", REFERENCE)
    cand = _results(tmp_path / "int8", sha, "int8", {"adi": {"sparse": 0.403, "dense": 0.446}, "cisi": {"sparse": 0.199, "dense": 0.22}})
    assert precision_table.main(["--reference", str(ref), "--candidate", str(cand), "--systems", "sparse,dense",
                                 "--out", str(tmp_path / "table.json"), "--int8-verdict", str(adapter)]) == 0
    verdict = json.loads((adapter / INT8_VERDICT_FILE).read_text())
    assert verdict["passed"] and verdict["adapter_sha256"] == sha and verdict["int8_recipe"] == int8_recipe_id()
    assert verdict["max_ndcg_drop"] == pytest.approx(0.004) and set(verdict["differences"]) == {"adi/sparse", "adi/dense", "cisi/sparse", "cisi/dense"}
    assert "mocked Xeon" in verdict["cpu"] and "table.json" in verdict["source"]
    assert recorded_int8_verdict({"path": str(adapter), "sha256": sha})[0]
    # new weights in the same folder: the verdict is about the old ones
    (adapter / "adapter_model.safetensors").write_bytes(b"retrained")
    assert not recorded_int8_verdict({"path": str(adapter), "sha256": weights_sha256(adapter)})[0]


def test_a_difference_beyond_the_tolerance_either_way_fails(tmp_path):
    adapter = _adapter(tmp_path)
    sha = weights_sha256(adapter)
    better = write_int8_verdict(adapter, {"adi/sparse": 0.008, "adi/dense": 0.0}, "test", "cpu")
    assert not better["passed"] and better["max_ndcg_drop"] == 0.0  # much higher is a different model too
    assert not recorded_int8_verdict({"path": str(adapter), "sha256": sha})[0]
    worse = write_int8_verdict(adapter, {"adi/sparse": -0.006}, "test", "cpu")
    assert not worse["passed"] and worse["max_ndcg_drop"] == pytest.approx(0.006)
    with pytest.raises(ValueError, match="no nDCG@10 differences"):
        write_int8_verdict(adapter, {}, "test", "cpu")


@pytest.mark.parametrize("case", ["other adapter", "not int8", "collection missing"])
def test_the_verdict_is_refused_for_runs_that_are_not_the_check(tmp_path, case):
    adapter = _adapter(tmp_path)
    sha = weights_sha256(adapter)
    ref = _results(tmp_path / "fp32", sha, "fp32", REFERENCE)
    cand_ndcg = {"adi": REFERENCE["adi"]} if case == "collection missing" else REFERENCE
    cand = _results(tmp_path / "cand", "f00" if case == "other adapter" else sha, "fp32" if case == "not int8" else "int8", cand_ndcg)
    with pytest.raises(SystemExit, match={"other adapter": "adapter weights f00", "not int8": "int8 candidate",
                                          "collection missing": "no run for cisi"}[case]):
        precision_table.main(["--reference", str(ref), "--candidate", str(cand), "--systems", "sparse,dense",
                              "--out", str(tmp_path / "table.json"), "--int8-verdict", str(adapter)])
    assert not (adapter / INT8_VERDICT_FILE).exists()
