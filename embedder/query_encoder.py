"""Query encoders: what maps a query to the embedder's pooled state h.

The Retriever asks for "the query's state" and never knows which encoder answered:

- the LLM itself (:class:`Embedder` with its query template): the reference, ~40-70 ms a query
  on a CPU for the 135M backbone;
- a :class:`DistilledQueryEncoder`: a small student trained to reproduce h
  (training/query_encoder/). Two kinds of student:
  ``pooled``, a head over a frozen sentence encoder's embedding (all-MiniLM-L6-v2), which the
  index's encoder channel computes for every hybrid query anyway; and ``token-bag``
  (:class:`TokenBagHead`), which adds the query's own LLM tokens: each token's input embedding
  (a row of the LLM's table, looked up, no forward) gets a learned correction and a learned
  weight, and their weighted sum joins the pooled head's output. The LLM leaves the query path
  either way; the bag is the more faithful (training/README.md, "Query-encoder distillation").

h then gives both LLM channels' query: the dense vector, and through the LLM's own LM head the
aligned-token logits the expansion is taken from. A student records the model and adapter it was
distilled from; loading it beside another one is refused, as an index built with another model
is (indexer/manifest.py).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedder.lm_head import LMHead

log = logging.getLogger(__name__)

STUDENT_FILE = "query_encoder.json"
HEAD_FILE = "head.safetensors"
STUDENT_FORMAT = 1  # the record's layout; the student's kind is record["head"]["kind"] ("pooled" where absent)
STUDENT_KINDS = ("pooled", "token-bag")
# A student kept beside its adapter lives in the adapter's folder (embedder/adapters/NAME/ for a shipped one).
SHIPPED_SUBDIR = "query-encoder"


class QueryEncoderMismatch(ValueError):
    """A distilled query encoder was loaded beside an embedder it was not distilled from."""


def make_head(d_in: int, d_out: int, hidden: int = 1024) -> torch.nn.Module:
    """The student head: linear (``hidden`` 0) or one hidden GELU layer."""
    if hidden <= 0:
        return torch.nn.Linear(d_in, d_out)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_out))


class TokenBagHead(torch.nn.Module):
    """h of a query from its own LLM tokens and its sentence-encoder embedding.

    Each token's input embedding e (the LLM's own row, so W_lm h can give the token back) is
    corrected by a residual MLP and weighted by a softmax over the query's tokens of a learned
    score of e (the teacher weighs content words over function words); the pooled sentence
    embedding adds the context the bag lacks through its own MLP. A few matrix products of the
    query's dozen tokens: no LLM runs for it. ``context_layers`` > 0 first lets the tokens read
    each other through that many small self-attention blocks (the bag alone cannot tell "bank"
    of a river from a bank that lends); each block starts as the identity (its output
    projections are zero), so training begins from the plain bag. ``context_dim`` > 0 runs the
    blocks in a narrower space (feed-forward 2 x ``context_dim``): the tokens are projected down,
    read each other there, and the result is added back through an up-projection that starts
    at zero; a block's cost per token falls with the square of its width (576 -> 256: 2.5M ->
    0.8M multiply-adds). ``token_hidden``: the width of the per-token correction (0: ``hidden``).
    ``encoder_tokens`` > 0 (the sentence encoder's width; needs ``context_layers``): the blocks
    also read the sentence encoder's own token states, projected into their space and appended to
    the sequence as keys the LLM tokens attend to (and read each other through); only the LLM
    tokens go on into the bag. Those states are contextual (six layers of MiniLM, trained on a
    billion pairs), which one fresh block over context-free rows cannot learn from 35k texts.
    """

    def __init__(
        self, d_llm: int, d_enc: int, hidden: int = 1024, gate_hidden: int = 64, context_layers: int = 0,
        context_dim: int = 0, token_hidden: int = 0, encoder_tokens: int = 0,
    ) -> None:  # fmt: skip
        super().__init__()
        if encoder_tokens and not context_layers:
            raise ValueError("encoder_tokens: the sentence encoder's token states are read by the context blocks; give context_layers too")
        narrow = bool(context_layers and context_dim)
        width, ff = (context_dim, 2 * context_dim) if narrow else (d_llm, hidden)
        self.down = torch.nn.Linear(d_llm, width) if narrow else None
        self.encoder_in = torch.nn.Linear(encoder_tokens, width) if encoder_tokens else None
        self.context = torch.nn.ModuleList(_identity_block(width, ff) for _ in range(context_layers))
        self.up = torch.nn.Linear(width, d_llm) if narrow else None
        if self.up is not None:
            torch.nn.init.zeros_(self.up.weight)
            torch.nn.init.zeros_(self.up.bias)
        self.gate = torch.nn.Sequential(torch.nn.Linear(d_llm, gate_hidden), torch.nn.GELU(), torch.nn.Linear(gate_hidden, 1))
        t_hidden = token_hidden or hidden
        self.token = torch.nn.Sequential(torch.nn.Linear(d_llm, t_hidden), torch.nn.GELU(), torch.nn.Linear(t_hidden, d_llm))
        self.pooled = make_head(d_enc, d_llm, hidden)

    def forward(
        self, sentence: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor,
        encoder_states: torch.Tensor | None = None, encoder_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """``sentence`` (B, d_enc), ``tokens`` (B, L, d_llm) input embeddings, ``mask`` (B, L) 1 for real tokens -> h (B, d_llm).
        With ``encoder_tokens``: ``encoder_states`` (B, S, d_enc) the sentence encoder's token states, ``encoder_mask`` (B, S)."""
        pad = mask == 0
        z = tokens if self.down is None else self.down(tokens)
        n_llm = z.shape[1]
        if self.encoder_in is not None:
            if encoder_states is None or encoder_mask is None:
                raise ValueError("this student reads the sentence encoder's token states: give encoder_states and encoder_mask")
            z = torch.cat([z, self.encoder_in(encoder_states)], 1)
            pad_all = torch.cat([pad, encoder_mask == 0], 1)
        else:
            pad_all = pad
        # a text with no tokens (an empty query) attends over its padding rather than over nothing
        # (a NaN), and the mask below then gives it no bag: h is its pooled head's alone
        keys = pad_all & ~pad_all.all(1, keepdim=True)
        for block in self.context:
            z = block(z, src_key_padding_mask=keys)
        if self.encoder_in is not None:
            z = z[:, :n_llm]  # the encoder's tokens informed the LLM's; only the LLM's rows can be read back by W_lm
        tokens = z if self.up is None else tokens + self.up(z)
        weights = self.gate(tokens).squeeze(-1).masked_fill(pad, -1e4).softmax(-1) * mask
        return (weights.unsqueeze(-1) * (tokens + self.token(tokens))).sum(1) + self.pooled(sentence)


def _identity_block(d: int, hidden: int) -> torch.nn.Module:
    """A pre-norm self-attention block whose residual branches output zero until trained."""
    block = torch.nn.TransformerEncoderLayer(
        d, nhead=8 if d % 8 == 0 else 1, dim_feedforward=hidden, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
    )
    for layer in (block.self_attn.out_proj, block.linear2):
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    return block


def make_student_head(
    kind: str, d_enc: int, d_llm: int, hidden: int = 1024, gate_hidden: int = 64, context_layers: int = 0,
    context_dim: int = 0, token_hidden: int = 0, encoder_tokens: bool = False,
) -> torch.nn.Module:  # fmt: skip
    """A student's trainable part: ``pooled`` (:func:`make_head`) or ``token-bag`` (:class:`TokenBagHead`;
    ``encoder_tokens``: its context blocks also read the sentence encoder's token states)."""
    if kind == "pooled":
        if encoder_tokens:
            raise ValueError("encoder_tokens: only a token-bag student reads token states")
        return make_head(d_enc, d_llm, hidden)
    if kind == "token-bag":
        return TokenBagHead(d_llm, d_enc, hidden, gate_hidden, context_layers, context_dim, token_hidden, d_enc if encoder_tokens else 0)
    raise ValueError(f"unknown student kind {kind!r}: expected one of {', '.join(STUDENT_KINDS)}")


def llm_token_ids(embedder: Any, texts: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The texts' own LLM tokens as ``embedder`` (the teacher) reads them (``Embedder.normalise``:
    all-caps folded), no template and no special tokens: ids (n, L) int64 (0 where padded) and
    mask (n, L) float32, L the longest (at most ``max_tokens``; at least 1)."""
    rows = [r[:max_tokens] for r in embedder.token_ids([embedder.normalise(t) for t in texts])]
    width = max([1, *(len(r) for r in rows)])
    ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1.0
    return ids, mask


def teacher_identity(embedder: Any) -> dict:
    """What a student must match: the backbone's and the adapter's weights, and the query template."""
    return {
        "model": (embedder.identity or {}).get("sha256") or (embedder.identity or {}).get("name"),
        "adapter": (embedder.adapter or {}).get("sha256"),
        "query_template": embedder.config.template("query"),
    }


@dataclass
class DistilledQueryEncoder:
    """A frozen sentence encoder's embedding -> the teacher's pooled query state h."""

    head: torch.nn.Module
    record: dict  # query_encoder.json: teacher, encoder, head shape, training, faithfulness
    directory: Path | None = None
    # a token-bag student's teacher (attach): whose tokenizer reads the query and whose input-embedding table it looks up
    teacher: Any = None
    table: torch.Tensor | None = None
    # the head compiled by OpenVINO (:meth:`compile`); None: the torch head answers
    _compiled: Any = field(default=None, init=False, repr=False)
    runtime_reason: str = field(default="torch (not compiled)", init=False)  # why the head runs where it runs

    @property
    def kind(self) -> str:
        """``pooled`` (reads the sentence embedding) or ``token-bag`` (also the query's LLM tokens)."""
        return str(self.record.get("head", {}).get("kind", "pooled"))

    @property
    def reads_encoder_tokens(self) -> bool:
        """Whether the head also reads the sentence encoder's token states (:class:`TokenBagHead` ``encoder_tokens``)."""
        return bool(self.record.get("head", {}).get("encoder_tokens", False))

    @property
    def max_tokens(self) -> int:
        """The LLM tokens a token-bag student reads of a query (longer queries are cut)."""
        return int(self.record.get("head", {}).get("max_tokens", 96))

    def attach(self, embedder: Any) -> DistilledQueryEncoder:
        """Check ``embedder`` is the teacher (:meth:`check_teacher`) and, for a token-bag student,
        keep it for its tokenizer and input-embedding table (shared, not copied: not part of the student's files)."""
        self.check_teacher(embedder)
        if self.kind == "token-bag":
            self.teacher = embedder
            # on the CPU, where a student answers, whichever device the teacher runs on (a no-op on a CPU teacher)
            self.table = embedder.causal_lm.get_input_embeddings().weight.detach().cpu()
        return self

    @property
    def name(self) -> str:
        """How results and hits name this encoder."""
        return f"distilled:{self.record.get('name') or (self.directory.name if self.directory else 'in-memory')}"

    @property
    def encoder_identity(self) -> dict:
        """The sentence encoder whose embeddings the head reads (name, sha256)."""
        return self.record["encoder"]

    def check_teacher(self, embedder: Any) -> None:
        """Refuse an embedder this student was not distilled from (another model, adapter or template)."""
        want, have = self.record["teacher"], teacher_identity(embedder)
        for key in ("model", "adapter", "query_template"):
            if want.get(key) != have.get(key):
                where = self.directory or "this query encoder"
                raise QueryEncoderMismatch(
                    f"{where}: distilled from another {key.replace('_', ' ')} ({str(want.get(key))[:16]}...) than the index's "
                    f"embedder ({str(have.get(key))[:16]}...); re-distil it (distill-query-encoder) or use query_encoder='llm'"
                )

    def check_encoder(self, identity: dict) -> None:
        """Refuse a sentence encoder other than the one the head was trained on."""
        if identity.get("sha256") != self.encoder_identity.get("sha256"):
            raise QueryEncoderMismatch(
                f"{self.directory or 'this query encoder'}: its head reads {self.encoder_identity.get('name')} embeddings, "
                f"not {identity.get('name')}'s"
            )

    @torch.inference_mode()
    def states(
        self, encoder_embeddings: np.ndarray, texts: list[str] | None = None, encoder_tokens: tuple[np.ndarray, np.ndarray] | None = None
    ) -> np.ndarray:
        """The student's h (n, d) float32 of the sentence encoder's embeddings (n, d_enc) of
        ``texts`` (which a token-bag student also reads, with its teacher's tokenizer: :meth:`attach`).
        ``encoder_tokens``: the sentence encoder's (token states (n, S, d_enc), mask (n, S)) of the
        same texts (:meth:`embedder.sentence_encoder.SentenceEncoder.encode_with_tokens`), for a
        student that reads them (:attr:`reads_encoder_tokens`); the first ``max_tokens`` are read."""
        x = torch.from_numpy(np.ascontiguousarray(encoder_embeddings, dtype=np.float32))
        if self.kind == "pooled":
            return self.head(x).numpy()
        if texts is None or len(texts) != len(x):
            raise ValueError(f"a token-bag student reads the query texts: give the {len(x)} texts the embeddings are of")
        if self.table is None:
            raise RuntimeError("a token-bag student needs its teacher's tokenizer and table: call attach(embedder) first")
        ids, mask = llm_token_ids(self.teacher, list(texts), self.max_tokens)
        if self.reads_encoder_tokens:
            if encoder_tokens is None or len(encoder_tokens[0]) != len(x):
                raise ValueError(f"this student reads the sentence encoder's token states: give them for the {len(x)} texts")
            states, states_mask = (np.ascontiguousarray(a[:, : self.max_tokens], np.float32) for a in encoder_tokens)
            tokens = self.table[torch.from_numpy(ids)].float()
            if self._compiled is not None:
                return self._compiled(x.numpy(), tokens.numpy(), mask, states, states_mask)
            return self.head(x, tokens, torch.from_numpy(mask), torch.from_numpy(states), torch.from_numpy(states_mask)).numpy()
        if self._compiled is not None and self.table.dtype == torch.float32 and self.table.device.type == "cpu":
            # NumPy's gather skips torch's dispatch: 12 rows in 0.003 ms against 0.008 (hot, ad-hoc)
            return self._compiled(x.numpy(), np.take(self.table.numpy(), ids, axis=0), mask)
        tokens = self.table[torch.from_numpy(ids)].float()
        if self._compiled is not None:
            return self._compiled(x.numpy(), tokens.numpy(), mask)
        return self.head(x, tokens, torch.from_numpy(mask)).numpy()

    @property
    def runtime_name(self) -> str:
        """Where the head runs: "openvino" (after :meth:`compile`) or "torch"."""
        return "openvino" if self._compiled is not None else "torch"

    def compile(self, precision: str | None = None) -> DistilledQueryEncoder:
        """Run a token-bag head compiled by OpenVINO from now on (embedder/student_runtime.py:
        2.5x faster a query on a CPU than torch's eager head), where it exports and compiles here;
        else keep the torch head. ``precision``: "f32" or "bf16"; None: the one this CPU calls for
        (:func:`embedder.hardware.student_precision`: bf16 where it is native). A precision that
        fails its first compile (tried in a child process) falls back to f32, then to torch;
        :attr:`runtime_reason` says which runs and why. The weights are frozen into the graph: a
        head changed afterwards needs compile() again. What the Retriever does on loading a
        student; training and its measurements use torch."""
        if self.kind != "token-bag":
            return self
        from embedder.hardware import cpu_capability, student_precision
        from embedder.student_runtime import CompiledHead

        shape = self.record["head"]
        self._compiled = None
        failed: list[str] = []
        for p in dict.fromkeys([precision or student_precision(cpu_capability()), "f32"]):
            try:
                self._compiled = CompiledHead(self.head, int(shape["in"]), int(shape["out"]), precision=p, encoder_tokens=self.reads_encoder_tokens)
            except Exception as exc:  # noqa: BLE001 - an export or a compile fails in many ways; each means "try the next"
                failed.append(f"{type(exc).__name__}: {exc}")
                continue
            dropped = self._compiled.unfaithful
            if dropped:  # lengths whose fixed-shape graph computed wrong: they run the dynamic graph
                failed.append("static length " + ", ".join(f"{n} off by {e:.2g}" for n, e in dropped.items()))
            self.runtime_reason = f"openvino {p}" + (f" ({'; '.join(failed)})" if failed else "")
            if failed:
                log.warning("query encoder %s: the head runs in openvino %s (%s)", self.name, p, "; ".join(failed))
            return self
        self.runtime_reason = f"torch: openvino unusable here ({'; '.join(failed)})"
        log.warning("query encoder %s: the head runs in torch (%s)", self.name, "; ".join(failed))
        return self

    def save(self, directory: str | os.PathLike[str], weights: str = "fp32") -> Path:
        """Write the head and its record into ``directory`` (a temporary folder, then renamed).

        ``weights``: "fp32", or "fp16" (half the file, as the package ships it; :meth:`load`
        computes in fp32 either way, and the stored value of a weight moves by < 2^-11 of it)."""
        from safetensors.torch import save_file

        if weights not in ("fp32", "fp16"):
            raise ValueError(f"weights must be fp32 or fp16, not {weights!r}")
        stored = torch.float16 if weights == "fp16" else torch.float32
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a student ships with its adapter
        save_file({k: v.detach().to(stored).contiguous() for k, v in self.head.state_dict().items()}, str(tmp / HEAD_FILE))
        self.record = {**self.record, "weights": weights}
        (tmp / STUDENT_FILE).write_text(json.dumps({**self.record, "format": STUDENT_FORMAT}, indent=1, sort_keys=True), encoding="utf-8")
        for f in (HEAD_FILE, STUDENT_FILE):
            os.chmod(tmp / f, 0o644)
        if target.exists():
            import shutil

            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        self.directory = target
        return target

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> DistilledQueryEncoder:
        """Read a student written by :meth:`save` (``distill-query-encoder``)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        path = directory / STUDENT_FILE
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a distilled query encoder ({exc})") from None
        if not isinstance(record, dict) or record.get("format") != STUDENT_FORMAT:
            raise ValueError(f"{path}: field 'format': expected {STUDENT_FORMAT}, got {record.get('format') if isinstance(record, dict) else record!r}")
        for key in ("teacher", "encoder", "head"):
            if not isinstance(record.get(key), dict):
                raise ValueError(f"{path}: field {key!r} missing or not an object")  # noqa: TRY004 - a malformed file is bad input: ValueError naming file and field, which the CLIs catch
        shape = record["head"]
        kind = shape.get("kind", "pooled")
        if kind not in STUDENT_KINDS:
            raise ValueError(f"{path}: field 'head.kind': expected one of {', '.join(STUDENT_KINDS)}, got {kind!r}")
        head = make_student_head(
            kind, int(shape["in"]), int(shape["out"]), int(shape.get("hidden", 0)), int(shape.get("gate_hidden", 64)),
            int(shape.get("context_layers", 0)), int(shape.get("context_dim", 0)), int(shape.get("token_hidden", 0)),
            bool(shape.get("encoder_tokens", False)),
        )
        head.load_state_dict({k: v.float() for k, v in load_file(str(directory / HEAD_FILE)).items()})
        return cls(head.eval(), record, directory)


def student_beside(adapter: dict | None) -> Path | None:
    """The student kept in an adapter's folder (``ADAPTER/query-encoder/``, where the package ships
    one for a shipped adapter and ``distill-query-encoder --beside-adapter`` writes one); None where there is none."""
    path = (adapter or {}).get("path")
    if not path:
        return None
    student = Path(path) / SHIPPED_SUBDIR
    return student if (student / STUDENT_FILE).exists() else None


__all__ = [
    "HEAD_FILE",
    "SHIPPED_SUBDIR",
    "STUDENT_FILE",
    "STUDENT_KINDS",
    "DistilledQueryEncoder",
    "LMHead",
    "QueryEncoderMismatch",
    "TokenBagHead",
    "llm_token_ids",
    "make_head",
    "make_student_head",
    "student_beside",
    "teacher_identity",
]
