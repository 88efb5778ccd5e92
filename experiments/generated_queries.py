"""Pseudo-queries an instruct LLM writes for sampled documents (issue 71: "queries the instruct
backbone writes for sampled documents").

    python -m experiments.generated_queries --data shared --model smollm2-135m --out .cache/calibration/generated

Calibration (indexer/calibration.py) reads each corpus's fusion off held-out sentences. A held-out
sentence shares its document's exact words, which a query somebody writes does not: pseudo-queries
overrate BM25 (hence the selection rule's shift of 0.1 to the encoder) and cannot see a BM25 that does
not stem. A query written by a model, in its own words, might not share that bias. This module writes
one query per document for the documents calibration samples (the same documents, from the same seed,
so that only the query differs) and stores them as JSONL, one file per collection:
``{"doc": N, "doc_id": ..., "query": ...}``. ``python -m experiments.calibration --pseudo-from DIR``
calibrates on them instead (the source scored as its whole text). ``--source title`` writes each document's
own title instead, the source scored as its body: a query somebody wrote, where a collection has titles.

Greedy decoding; the document is cut to its first ``--doc-tokens`` tokens. No qrels and no query of the
collection are read.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import benchmarks  # noqa: F401  (cache locations first)
from indexer import calibration as cal

SYSTEM = "You write short search queries."
PROMPT = ("Write one short search query (at most ten words) that a user would type to find the following text. "
          "Use your own words, not the text's. Answer with the query only.\n\nText: {text}")
# one worked example (written for this prompt, from no collection): shows a short query in other words
EXAMPLE_TEXT = ("Researchers measured how the rate at which enzymes work changed as the surrounding liquid was heated "
                "from 20 to 60 degrees, finding a peak near body temperature followed by a sharp decline.")
EXAMPLE = (EXAMPLE_TEXT, "effect of heat on enzyme speed")


def clean(generated: str) -> str:
    """The query in a generation: its first line, without quotes, a "Query:" label or list marks."""
    line = next((s for s in generated.strip().splitlines() if s.strip()), "")
    line = re.sub(r"^\s*(?:search\s+)?query\s*:\s*", "", line, flags=re.IGNORECASE)
    return line.strip().strip("\"'`*-• ").strip()


class QueryWriter:
    """An instruct model that writes one query per text; loaded once, for every collection of a run."""

    def __init__(self, model_name: str):
        """``model_name``: a registry name of embedder.models or a model directory."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from embedder.models import resolve_model

        directory = resolve_model(model_name).directory
        self.name = model_name
        self.tok = AutoTokenizer.from_pretrained(directory)
        self.tok.padding_side = "left"  # generation continues every row from its last token
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()

    def prompt(self, text: str, doc_tokens: int) -> str:
        """The prompt for ``text`` cut to its first ``doc_tokens`` tokens, after the worked example."""
        tok = self.tok
        cut = tok.decode(tok(text, add_special_tokens=False)["input_ids"][:doc_tokens])
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": PROMPT.format(text=EXAMPLE[0])},
            {"role": "assistant", "content": EXAMPLE[1]},
            {"role": "user", "content": PROMPT.format(text=cut)},
        ]
        if tok.chat_template is not None:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # a base model: the same turns as plain text, the answer left open
        return f"{SYSTEM}\n\n{messages[1]['content']}\nQuery: {EXAMPLE[1]}\n\n{messages[3]['content']}\nQuery:"

    def write(self, texts: list[str], batch_size: int, doc_tokens: int, new_tokens: int) -> list[str]:
        """One query per text (greedy decoding, at most ``new_tokens`` tokens, :func:`clean`)."""
        import torch
        from tqdm import tqdm

        prompts = [self.prompt(text, doc_tokens) for text in texts]
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # longest first: batches pad less
        by_index: dict[int, str] = {}
        with torch.inference_mode(), tqdm(total=len(prompts), desc=f"writing queries ({self.name})", unit="query") as bar:
            for at in range(0, len(order), batch_size):
                chunk = order[at:at + batch_size]
                enc = self.tok([prompts[i] for i in chunk], return_tensors="pt", padding=True)
                gen = self.model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=self.tok.pad_token_id)
                for i, row in zip(chunk, gen[:, enc["input_ids"].shape[1]:]):
                    by_index[i] = clean(self.tok.decode(row, skip_special_tokens=True))
                bar.update(len(chunk))
        return [by_index[i] for i in range(len(prompts))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.generated_queries", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", action="append", required=True, help="collections (benchmarks.datasets.resolve); repeatable")
    p.add_argument("--source", choices=("llm", "title"), default="llm",
                   help="llm: the model writes each query; title: the document's own title is its query and its body the text "
                        "the source is scored as (documents without a title are left out; no model)")
    p.add_argument("--model", default="smollm2-135m", help="an instruct model: a registry name of embedder.models or a directory")
    p.add_argument("--queries", type=int, default=cal.DEFAULT_QUERIES, help="documents per corpus (calibration's sample)")
    p.add_argument("--seed", type=int, default=cal.DEFAULT_SEED)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--doc-tokens", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", type=Path, required=True, help="a folder: COLLECTION.jsonl per collection (kept where it exists)")
    args = p.parse_args(argv)

    import torch

    from benchmarks.datasets import resolve

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    writer: QueryWriter | None = None  # loaded at the first collection that needs it
    for ds in (ds for spec in args.data for ds in resolve(spec)):
        target = args.out / f"{ds.name}.jsonl"
        if target.exists():
            print(f"{ds.name}: kept {target}", file=sys.stderr)
            continue
        texts = [d.text for d in ds.docs]
        docs = [q.doc for q in cal.pseudo_queries(texts, args.queries, args.seed)]
        t0 = time.perf_counter()
        if args.source == "title":
            rows = [{"doc": d, "doc_id": ds.docs[d].doc_id, "query": ds.docs[d].title, "rest": ds.docs[d].body} for d in docs
                    if (ds.docs[d].title or "").strip() and len((ds.docs[d].body or "").split()) >= cal.REST_WORDS]
        else:
            writer = writer or QueryWriter(args.model)
            queries = writer.write([texts[d] for d in docs], args.batch_size, args.doc_tokens, args.new_tokens)
            rows = [{"doc": d, "doc_id": ds.docs[d].doc_id, "query": q} for d, q in zip(docs, queries)]
        took = time.perf_counter() - t0
        if not rows:
            print(f"{ds.name}: no document has a title and a body; nothing written", file=sys.stderr)
            continue
        tmp = target.with_suffix(".tmp")
        with tmp.open("w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        tmp.replace(target)
        meta = {"source": args.source, "model": args.model if args.source == "llm" else None, "seed": args.seed,
                "documents": len(rows), "seconds": round(took, 1), "doc_tokens": args.doc_tokens, "new_tokens": args.new_tokens,
                "threads": args.threads}
        (args.out / f"{ds.name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{ds.name}: {len(rows)} queries in {took:.0f} s -> {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
