"""Text -> pooled embedding h -> aligned-token logits W_lm h.

Follows text-is-worth-several-tokens §2-3: the prompt-based embedding (PromptEOL by
default, last-token pooling) of a decoder LLM, read out through the LLM's own LM head.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
import torch

from embedder.adapters import adapter_embedding, adapter_identity, resolve_adapter
from embedder.config import PLACEHOLDER, POOLINGS, PROMPT_EOL, ROLES, EmbedderConfig, check_role  # noqa: F401  (re-exported)
from embedder.hardware import Capability, Precision, choose_precision, device_capability, openvino_available, speed_candidates
from embedder.memory import MemoryBody, MemoryTokens, memory_ids, pool_memory
from embedder.models import DEFAULT_MODEL, ResolvedModel, resolve_model
from embedder.runtime import Runtime, cacheable_prefix, make_runtime
from embedder.speed_probe import PROBE_DOCUMENTS, PROBE_QUERIES, ProbeSetup, SpeedVerdict, probe_speed
from embedder.tokenization import TextTokens

log = logging.getLogger(__name__)


def set_bidirectional(model: torch.nn.Module, bidirectional: bool) -> None:
    """Switch a decoder's self-attention between causal and bidirectional masks."""
    model.config.is_causal = not bidirectional  # read by transformers' mask builder
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = not bidirectional  # read by the SDPA kernel


class Embedder(TextTokens):
    """A decoder LLM used as a text embedder whose embeddings can be read as token logits.

    Build one with :meth:`Embedder.load` (registry name, path, hub id) or directly from a
    model and tokenizer already in memory (tests use a tiny random Llama).

    Two ways through the network:
    - :meth:`embed` / :meth:`iter_batches` (indexing, queries: ``role="query"`` reads the
      config's query template) go through a *runtime*
      (embedder/runtime.py: torch or OpenVINO, fp32 / bf16 / int8, the template prefix
      computed once), chosen by :meth:`load` from the hardware (embedder/hardware.py).
      A runtime snapshots the weights (prefix keys/values, an exported graph): an embedder
      whose weights change (training) is built with ``runtime=None``.
    - :meth:`pooled` is the differentiable torch path (training), fp32 or bf16 autocast (``bf16``).
    With ``runtime=None`` both are the plain torch path (the fp32 reference when ``bf16`` is off).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        config: EmbedderConfig | None = None,
        identity: dict | None = None,
        adapter: dict | None = None,
        device: str = "cpu",
        bf16: bool = False,
        runtime: str | None = None,
        dtype: str = "fp32",
        precision: Precision | None = None,
        capability: Capability | None = None,
        prefix_cache: bool = True,
        memory: MemoryTokens | None = None,
    ) -> None:
        config = config or EmbedderConfig()
        if config.pooling == "memory":
            if memory is None:
                raise ValueError("pooling 'memory' needs memory vectors: an LLM2Comp adapter (memory_tokens.safetensors) or memory=")
            if config.memory_tokens not in (0, memory.n):
                raise ValueError(f"the config asks for {config.memory_tokens} memory tokens, the memory holds {memory.n}")
            config = replace(config, memory_tokens=memory.n)  # recorded in manifests
        self.config = config
        self.memory = memory if config.pooling == "memory" else None
        if self.memory is not None:
            self.memory.to(device)
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.identity = identity or {"name": "in-memory", "sha256": ""}
        self.adapter = adapter
        self.device = device
        self.bf16 = bf16  # autocast in the differentiable path (training) and in the runtime-less path
        self.runtime_name = runtime
        self.dtype = dtype if runtime else ("bf16-autocast" if bf16 else "fp32")
        self.precision = precision
        self.capability = capability
        self.prefix_cache = prefix_cache  # False: the runtime recomputes the template prefix (for measuring it)
        self._runtime: Runtime | None = None
        self._runtimes: dict[tuple[str, str], Runtime] = {}  # by (name, dtype): documents and queries may share one
        # dtype "auto" (or runtime "auto"): measured on first use (embedder/speed_probe.py), for
        # documents and for queries apart; until then the query plan is the document plan
        self.query_runtime: tuple[str, str] | None = None
        self.query_precision: Precision | None = None
        self.speed_verdict: SpeedVerdict | None = None
        self._runtime_lock = threading.RLock()
        set_bidirectional(self.causal_lm, self.config.attention == "bidirectional")
        self._pad_id = self._pick_pad_id()
        self._prefix, self._suffix = self._template_ids(self.config.template("document"))
        self._query_prefix, self._query_suffix = self._template_ids(self.config.template("query"))
        self._init_tokens()

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str] = DEFAULT_MODEL,
        adapter: str | os.PathLike[str] | None = "default",
        config: EmbedderConfig | None = None,
        device: str | None = None,
        bf16: bool = False,
        dtype: str = "auto",
        runtime: str | None = "auto",
        settings: dict | None = None,
    ) -> Embedder:
        """Load a backbone (and optionally a LoRA adapter) by name or path.

        Without ``config``, the embedding settings are the ones the adapter was trained with
        (its record: prompt, query prompt, pooling, attention, memory tokens; embedder/adapters.py), then
        ``settings`` (EmbedderConfig fields) on top. An adapter with memory vectors
        (LLM2Comp) brings them along, so that ``Embedder.load(model, adapter=DIR)`` is the
        embedder that training wrote.

        ``dtype`` (auto|fp32|bf16|int8) and ``runtime`` (auto|torch|openvino) pick how
        :meth:`embed` runs (see embedder/hardware.py: ``auto`` is chosen from the detected
        hardware). ``runtime=None``: the plain torch path with weights that may change
        (training), fp32, or bf16 autocast with ``bf16=True``.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        resolved: ResolvedModel = resolve_model(model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tok = AutoTokenizer.from_pretrained(resolved.directory)
        lm = AutoModelForCausalLM.from_pretrained(resolved.directory, dtype=torch.float32)
        adapter_dir = resolve_adapter(adapter, resolved.name)
        if config is None and (adapter_dir is not None or settings):
            fields = {**adapter_embedding(adapter_dir), **(settings or {})}
            if fields.get("pooling") != "memory":  # another pooling asked for: the memory is not read
                fields.pop("memory_tokens", None)
            config = EmbedderConfig(**fields)
        memory = MemoryTokens.load(adapter_dir) if adapter_dir is not None else None
        if adapter_dir is not None:
            from peft import PeftModel

            # merge: inference then runs at the backbone's speed, with identical outputs.
            lm = PeftModel.from_pretrained(lm, str(adapter_dir)).merge_and_unload()
        if device == "cpu":
            torch.set_num_threads(os.cpu_count() or 1)
        precision = capability = None
        if runtime is not None:
            capability = device_capability(device)
            precision = choose_precision(dtype, runtime, capability, openvino_available())
            log.info("encoder runtime %s %s (%s); %s", precision.runtime, precision.dtype, precision.reason, capability.describe())
        return cls(
            lm, tok, config, resolved.identity(), adapter_identity(adapter_dir), device, bf16,
            runtime=precision.runtime if precision else None, dtype=precision.dtype if precision else "fp32",
            precision=precision, capability=capability, memory=memory,
        )

    @property
    def causal_lm(self) -> torch.nn.Module:
        """The underlying transformers causal LM (unwrapped from peft if needed)."""
        m = self.model
        return m.get_base_model() if hasattr(m, "get_base_model") else m

    @property
    def vocab_size(self) -> int:
        return int(self.causal_lm.get_output_embeddings().weight.shape[0])

    @property
    def dim(self) -> int:
        return int(self.causal_lm.get_output_embeddings().weight.shape[1])

    def _pick_pad_id(self) -> int:
        tok = self.tokenizer
        for cand in (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id):
            if cand is not None:
                return int(cand)
        return 0  # padded positions are masked out, any id works

    def _template_ids(self, template: str) -> tuple[list[int], list[int]]:
        """Token ids of a template's parts before and after the placeholder (special prefix included)."""
        prefix, suffix = template.split(PLACEHOLDER, 1)
        before = self._special_prefix() + self.tokenizer(prefix, add_special_tokens=False)["input_ids"]
        return before, (self.tokenizer(suffix, add_special_tokens=False)["input_ids"] if suffix else [])

    def _special_prefix(self) -> list[int]:
        # Whatever the tokenizer puts before a text by default (e.g. Llama's BOS).
        with_sp = self.tokenizer("a", add_special_tokens=True)["input_ids"]
        without = self.tokenizer("a", add_special_tokens=False)["input_ids"]
        n = len(with_sp) - len(without)
        return list(with_sp[:n]) if n > 0 and with_sp[n:] == without else []

    # ------------------------------------------------------------ tokenisation
    # (normalise, token_ids, literal_token_ids, token_strings: embedder/tokenization.py)
    def prompt_ids(self, texts: Sequence[str], role: str = "document") -> list[list[int]]:
        """Token ids of each text inside the prompt template of ``role``; only the text is truncated."""
        check_role(role)
        if not texts:  # fast tokenizers fail on an empty batch
            return []
        body = self.tokenizer([self.normalise(t) for t in texts], add_special_tokens=False, truncation=True, max_length=self.config.max_length)
        return self.wrap_ids(body["input_ids"], role)

    def wrap_ids(self, text_ids: Sequence[Sequence[int]], role: str = "document") -> list[list[int]]:
        """Put already tokenised texts into the prompt of ``role`` (template, then memory slots if any); no truncation."""
        check_role(role)
        prefix, suffix = (self._query_prefix, self._query_suffix) if role == "query" else (self._prefix, self._suffix)
        # Memory slots go after the whole prompt: they read the text, the text never reads them
        # under causal attention, and they are never truncated.
        tail = memory_ids(self.causal_lm.get_input_embeddings().weight.shape[0], self.memory.n) if self.memory is not None else []
        return [prefix + list(ids) + suffix + tail for ids in text_ids]

    # --------------------------------------------------------------- encoding
    def _pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded ids, mask (int64) and lengths of a batch of id lists."""
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        ids = np.full((len(rows), int(lengths.max())), self._pad_id, dtype=np.int64)
        mask = np.zeros(ids.shape, dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask, lengths

    def _pool(self, hidden: torch.Tensor, mask: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
        hidden = hidden.float()
        if self.config.pooling == "memory":
            return pool_memory(hidden, lengths, self.memory.n)
        if self.config.pooling == "last":
            return hidden[torch.arange(len(lengths), device=hidden.device), torch.as_tensor(lengths - 1, device=hidden.device)]
        m = torch.as_tensor(mask, device=hidden.device).unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1)

    def _forward_pooled(self, batch_ids: list[list[int]]) -> torch.Tensor:
        ids, mask, lengths = self._pad(batch_ids)
        body = self.body()
        with torch.autocast(device_type=self.device.split(":")[0], dtype=torch.bfloat16, enabled=self.bf16):
            hidden = body(input_ids=torch.from_numpy(ids).to(self.device), attention_mask=torch.from_numpy(mask).to(self.device)).last_hidden_state
        return self._pool(hidden, mask, lengths)

    def body(self) -> torch.nn.Module:
        """The transformer without the LM head, reading memory-slot ids where pooling is "memory"."""
        body = self.causal_lm.base_model
        return MemoryBody(body, self.memory) if self.memory is not None else body

    def shared_prefix(self) -> list[int]:
        """The leading prompt ids every text starts with, whatever its role.

        The document template's prefix; with a query template, only the ids the two prefixes
        share (under causal attention their states are the same for both). One runtime then
        serves both roles, with one exported graph: a query template that starts as the
        document template does keeps the whole prefix cached.
        """
        shared = []
        for doc_id, query_id in zip(self._prefix, self._query_prefix):
            if doc_id != query_id:
                break
            shared.append(doc_id)
        return shared

    def _runtime_prefix(self) -> list[int] | None:
        # The prefix is computed once only where it cannot depend on the text:
        # causal attention, and last-token pooling (mean pooling needs its states;
        # memory pooling runs the whole prompt, which keeps one path to test).
        prefix = self.shared_prefix()
        cacheable = self.prefix_cache and self.config.attention == "causal" and self.config.pooling == "last" and prefix
        return prefix if cacheable else None

    @property
    def measuring(self) -> bool:
        """Whether the runtime is still to be measured on this machine (``auto``, not yet resolved)."""
        return self.runtime_name is not None and "auto" in (self.runtime_name, self.dtype)

    def resolve_runtime(self, refresh: bool = False) -> None:
        """Decide ``auto`` now: time the candidate runtimes on this machine the first time (a few
        seconds, kept beside the exported graph: embedder/speed_probe.py), else read that verdict
        (``refresh``: time them again, and keep the new verdict). Documents run in
        :attr:`runtime_name` / :attr:`dtype`, queries in :attr:`query_runtime`."""
        with self._runtime_lock:
            if not self.measuring:
                return
            cap = self.capability or device_capability(self.device)
            self.capability = cap
            forced = self.runtime_name if self.runtime_name != "auto" else "auto"
            have_openvino = openvino_available()
            if cap.device != "cpu":
                p = choose_precision("auto", forced, cap, have_openvino)
                self.runtime_name, self.dtype, self.precision = p.runtime, p.dtype, p
                return
            candidates, skipped = speed_candidates(cap, forced, have_openvino)
            if len(candidates) == 1:
                p = Precision(*candidates[0], "the only candidate on this CPU (" + "; ".join(skipped) + ")")
                self.runtime_name, self.dtype, self.precision = p.runtime, p.dtype, p
                return
            verdict = probe_speed(self._probe_setup(cap), candidates, skipped, refresh=refresh)
            self.speed_verdict = verdict
            (self.runtime_name, self.dtype), self.query_runtime = verdict.documents, verdict.queries
            # the reasons (and so manifests) are the same whether the verdict was measured now or read
            self.precision = Precision(*verdict.documents, verdict.documents_reason)
            self.query_precision = Precision(*verdict.queries, verdict.queries_reason)
            how = "a verdict kept from an earlier run" if verdict.cached else f"measured now, {verdict.seconds:.1f} s"
            log.info("encoder runtime: documents %s %s, queries %s %s (speed probe: %s)", *verdict.documents, *verdict.queries, how)

    def _probe_setup(self, cap: Capability) -> ProbeSetup:
        """The speed probe's inputs: its fixed texts through this embedder's templates, as :meth:`embed` pads them."""
        prefix = cacheable_prefix(self.body(), self._runtime_prefix())
        skip = len(prefix or [])
        doc_rows = self.prompt_ids(list(PROBE_DOCUMENTS)[: self.config.batch_size])
        doc_rows.sort(key=len, reverse=True)  # longest first, as iter_batches orders a batch
        docs = self._pad([r[skip:] for r in doc_rows])
        queries = [self._pad([r[skip:]]) for r in self.prompt_ids(list(PROBE_QUERIES), role="query")]
        fingerprint = {"pooling": self.config.pooling, "attention": self.config.attention, "memory": self.memory.n if self.memory else 0}
        return ProbeSetup(
            self.body(), self.identity, self.adapter, prefix, docs, queries, self._pool, self.top_tokens, int(torch.get_num_threads()), cap,
            fingerprint,
        )

    def runtime(self, role: str = "document") -> Runtime | None:
        """The inference runtime that encodes ``role``'s texts (built on first use; None for the
        plain torch path). Documents and queries share one unless the speed probe chose two."""
        if self.runtime_name is None:
            return None
        with self._runtime_lock:  # two threads' first queries must not export twice
            self.resolve_runtime()
            if role == "query" and self.query_runtime and self.query_runtime != (self.runtime_name, self.dtype):
                return self._query_runtime()
            if self._runtime is None:
                rt = self._build(self.runtime_name, self.dtype)
                if rt.fallback:  # the asked-for setting cannot run here: record what runs, and why
                    self.runtime_name, self.dtype = rt.name, rt.dtype
                    self.precision = Precision(rt.name, rt.dtype, f"fallback: {rt.fallback}")
                self._runtime = rt
        return self._runtime

    def _build(self, name: str, dtype: str) -> Runtime:
        if (name, dtype) not in self._runtimes:
            self._runtimes[(name, dtype)] = make_runtime(name, dtype, self.body(), self.identity, self.adapter, self._runtime_prefix(), self.device)
        return self._runtimes[(name, dtype)]

    def _query_runtime(self) -> Runtime:
        rt = self._build(*self.query_runtime)
        if rt.fallback and (rt.name, rt.dtype) != self.query_runtime:
            self.query_runtime = (rt.name, rt.dtype)
            self.query_precision = Precision(rt.name, rt.dtype, f"fallback: {rt.fallback}")
        return rt

    def _runtime_pooled(self, batch_ids: list[list[int]], role: str = "document") -> torch.Tensor:
        rt = self.runtime(role)
        skip = rt.prefix_len
        ids, mask, lengths = self._pad([row[skip:] for row in batch_ids])
        return self._pool(rt.hidden(ids, mask), mask, lengths)

    def pooled(self, batch_ids: list[list[int]]) -> torch.Tensor:
        """Pooled h (n, d) float32 of prompt token ids (from :meth:`prompt_ids`), in the given order.

        Not under inference_mode, so gradients flow where the caller enables them
        (Text2Token training pools exactly as indexing does through this method).
        """
        return self._forward_pooled(batch_ids)

    def iter_batches(self, texts: Sequence[str], role: str = "document") -> Iterable[tuple[np.ndarray, torch.Tensor, int]]:
        """Yield (positions, pooled embeddings, n_tokens) per batch, longest texts first, of
        ``texts`` read as ``role`` ("document" or "query": the config's query template).

        Sorting by length keeps padding (wasted compute) small.
        """
        all_ids = self.prompt_ids(texts, role)
        order = np.argsort([-len(x) for x in all_ids], kind="stable")
        bs = self.config.batch_size
        for start in range(0, len(order), bs):
            pos = order[start : start + bs]
            batch = [all_ids[i] for i in pos]
            h = self._runtime_pooled(batch, role) if self.runtime_name else self._forward_pooled(batch)
            yield pos, h, sum(len(x) for x in batch)

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], role: str = "document") -> np.ndarray:
        """Pooled embeddings h, shape (n, d), float32, in input order (not normalised), of
        ``texts`` read as ``role`` ("document", or "query": retrieval queries)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for pos, h, _ in self.iter_batches(texts, role):
            out[pos] = h.cpu().numpy()
        return out

    def logits(self, h: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Aligned-token logits W_lm h, shape (n, V), float32 (Eq. 15's e_t^T h)."""
        h = torch.as_tensor(h, dtype=torch.float32, device=self.device)
        w = self.causal_lm.get_output_embeddings().weight
        return h @ w.float().T

    @torch.inference_mode()
    def top_tokens(self, h: torch.Tensor | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k aligned tokens of embeddings: (ids int32 (n, k), logits float32 (n, k)), best first."""
        k = min(k, self.vocab_size)
        vals, ids = torch.topk(self.logits(h), k, dim=-1)
        return ids.cpu().numpy().astype(np.int32), vals.cpu().numpy().astype(np.float32)

    def aligned_tokens(self, text: str, k: int = 10) -> list[tuple[str, float]]:
        """The top-k aligned tokens of one text with their logits (the papers' tables)."""
        ids, vals = self.top_tokens(self.embed([text]), k)
        return list(zip(self.token_strings(ids[0]), vals[0].tolist()))

    def describe(self) -> dict:
        """What an index manifest records about the embedder."""
        return {"model": self.identity, "adapter": self.adapter, "embedding": self.config.to_dict(), "runtime": self.runtime_info()}

    def runtime_summary(self) -> str:
        """One line for people: the runtime and dtype, why, and the hardware they were chosen for
        (``auto`` is measured first, the first time on this machine)."""
        self.resolve_runtime()
        if self.precision is None or self.capability is None:
            return f"encoder: {self.runtime_info()['name']} {self.dtype}"
        p = self.precision
        line = f"encoder: {p.runtime} {p.dtype} ({p.reason})"
        q = self.query_precision
        if q is not None and (q.runtime, q.dtype) != (p.runtime, p.dtype):
            line += f"; queries: {q.runtime} {q.dtype} ({q.reason})"
        if self.speed_verdict is not None:
            v = self.speed_verdict
            line += " [speed probe: kept from an earlier run]" if v.cached else f" [speed probe: measured now, {v.seconds:.1f} s]"
        return f"{line}; {self.capability.describe()}"

    def runtime_info(self) -> dict:
        """How the network runs (recorded in manifests): runtime, dtype, why, and the hardware;
        where ``auto`` was measured, the queries' runtime and the speed probe's verdict (``auto``
        is resolved first: a manifest never says "auto", even where only build workers encoded)."""
        self.resolve_runtime()
        info: dict = {"name": self.runtime_name or "torch-plain", "dtype": self.dtype}
        if self.precision is not None:
            info["reason"] = self.precision.reason
        if self.query_runtime is not None and self.query_precision is not None:
            info["queries"] = {"name": self.query_runtime[0], "dtype": self.query_runtime[1], "reason": self.query_precision.reason}
        if self.speed_verdict is not None:
            info["speed_probe"] = self.speed_verdict.record()
        if self.capability is not None:
            info["capability"] = self.capability.to_dict()
        return info



