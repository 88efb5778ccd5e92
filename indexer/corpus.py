"""Streaming corpus readers: BEIR folders, generic JSONL and TSV, with precise errors.

Every problem is reported as ``CorpusError`` naming the file, the line and the field.
Policy for documents whose title and text are both empty: they are skipped with a warning
and counted (an empty text has no key tokens; embedding the bare prompt would give it the
same aligned tokens as every other empty document). Pass ``on_empty="error"`` to refuse
them instead.
"""
from __future__ import annotations

import json
import logging
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


FORMATS = ("beir", "jsonl", "tsv", "files")


class CorpusError(ValueError):
    """Bad input in a corpus file; the message names the file, line and field."""

    def __init__(self, path: Path | str, line: int | None, field_name: str | None, problem: str) -> None:
        where = f"{path}" + (f":{line}" if line is not None else "")
        what = f" field {field_name!r}:" if field_name else ""
        super().__init__(f"{where}:{what} {problem}")
        self.path, self.line, self.field, self.problem = str(path), line, field_name, problem

    def __reduce__(self):  # rebuilt from its parts, so that it crosses process boundaries (build workers)
        return (CorpusError, (self.path, self.line, self.field, self.problem))


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str  # title and body joined by a space: what gets embedded
    # what the index stores of it (indexer/stored_documents.py): the title and body apart, and
    # every other field of its JSONL object (a BEIR "metadata" object's fields lifted up)
    title: str | None = field(default=None, compare=False)
    body: str | None = field(default=None, compare=False)
    metadata: dict | None = field(default=None, compare=False)


def join_title(title: str | None, body: str) -> str:
    """The text a document is embedded and BM25-analysed as: its title, a space, its body."""
    return f"{title} {body}".strip() if title else body


@dataclass
class CorpusSpec:
    """Where a corpus is and how to read it.

    fmt: "beir" (a folder with corpus.jsonl), "jsonl", "tsv" (id<TAB>text) or "files" (a
    folder of text files, one document each: its path under the folder is its id, its content
    its text; hidden files and folders are left out); guessed from the path when None. For JSONL, the id field defaults to "_id" then "id", the text
    field to "text" then "contents", the title field to "title" (optional).
    """

    path: Path
    fmt: str | None = None
    id_field: str | None = None
    text_field: str | None = None
    title_field: str | None = "title"
    on_empty: str = "skip"
    n_read: int = field(default=0, init=False)
    n_empty: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        check_regular(self.path, folder_ok=True)  # before the name is read: a pipe's name says nothing
        if self.fmt is None:
            self.fmt = guess_format(self.path)
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown corpus format {self.fmt!r} ({', '.join(FORMATS)})")
        if self.on_empty not in ("skip", "error"):
            raise ValueError("on_empty must be 'skip' or 'error'")
        if self.fmt != "files":
            check_regular(self.file)
        elif not self.path.is_dir():
            raise CorpusError(self.path, None, None, "format 'files' needs a folder of text files")

    @property
    def file(self) -> Path:
        """The file read (for "files": the folder)."""
        return self.path / "corpus.jsonl" if self.fmt == "beir" else self.path

    def __iter__(self) -> Iterator[Document]:
        self.n_read = self.n_empty = 0
        seen: dict[str, int] = {}
        reader = {"tsv": _read_tsv, "files": _read_files}.get(self.fmt, self._read_jsonl)
        for lineno, doc in reader(self.file):
            if doc.doc_id in seen:
                raise CorpusError(self.file, lineno, "id", f"duplicate id {doc.doc_id!r} (first on line {seen[doc.doc_id]})")
            seen[doc.doc_id] = lineno
            if not doc.text.strip():
                if self.on_empty == "error":
                    raise CorpusError(self.file, lineno, "text", f"empty text for id {doc.doc_id!r}")
                log.warning("%s:%d: skipping document %r with empty text", self.file, lineno, doc.doc_id)
                self.n_empty += 1
                continue
            self.n_read += 1
            yield doc

    def describe(self) -> dict:
        return {"path": str(self.path), "format": self.fmt, "n_empty_skipped": self.n_empty}

    def _read_jsonl(self, file: Path) -> Iterator[tuple[int, Document]]:
        for lineno, line in _lines(file):
            if not line.strip():
                continue
            obj = _parse_line(file, lineno, line)
            yield lineno, document_from_object(obj, file, lineno, self.id_field, self.text_field, self.title_field)


def document_from_object(
    obj: dict, file: Path | str, lineno: int | None, id_field: str | None = None, text_field: str | None = None, title_field: str | None = "title",
) -> Document:
    """One document from a JSON object as a JSONL corpus holds it (also what the Python API and
    the server's write endpoint take); CorpusError naming ``file`` (or the request), the line
    (or position) and the field. Field defaults as in :class:`CorpusSpec`."""
    if not isinstance(obj, dict):
        raise CorpusError(file, lineno, None, "expected a JSON object")
    doc_id = _field(obj, file, lineno, id_field, ("_id", "id"), "id")
    text = _field(obj, file, lineno, text_field, ("text", "contents"), "text")
    title = obj.get(title_field) if title_field else None
    if title is not None and not isinstance(title, str):
        raise CorpusError(file, lineno, title_field, f"expected a string, got {type(title).__name__}")
    if title is not None:
        _check_encodable(title, file, lineno, title_field)
    used = {title_field, *((id_field,) if id_field else ("_id", "id")), *((text_field,) if text_field else ("text", "contents"))}
    metadata = _metadata(obj, used)
    problem = metadata_problem(metadata)
    if problem is not None:
        raise CorpusError(file, lineno, problem[0], f"document {str(doc_id)!r}: {problem[1]}")
    return Document(str(doc_id), join_title(title, text), title, text, metadata)


# Metadata nested deeper than this (objects and lists within each other) is refused: no filter reads past a
# field's list of values, and a stored line must be written and read back by any JSON reader.
MAX_METADATA_DEPTH = 32


def metadata_problem(metadata: object) -> tuple[str, str] | None:
    """(field, problem) of the first value of ``metadata`` that strict JSON cannot hold, None when
    it can: a number that is not finite (NaN, Infinity; a literal such as 1e400 parses to
    Infinity), a key that is not a string, a value that is no JSON type, nesting deeper than
    :data:`MAX_METADATA_DEPTH`. Walked without recursion. The field is dotted (``a.b``; ``a[2]``)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "metadata", f"expected a JSON object, got {type(metadata).__name__}"
    stack: list[tuple[str, object, int]] = [(str(k), v, 1) if isinstance(k, str) else ("metadata", k, -1) for k, v in metadata.items()]
    while stack:
        name, value, depth = stack.pop()
        if depth < 0:
            return name, f"key {value!r} is not a string"
        if isinstance(value, float) and not math.isfinite(value):
            return name, f"{value!r} is not a finite number (JSON has no NaN or Infinity; a literal beyond float's range, such as 1e400, reads as Infinity)"
        if value is None or isinstance(value, (str, bool, int, float)):
            continue
        if not isinstance(value, (dict, list)):
            return name, f"a {type(value).__name__} is not a JSON value"
        if depth >= MAX_METADATA_DEPTH:
            return name, f"nested more than {MAX_METADATA_DEPTH} levels deep"
        if isinstance(value, dict):
            stack += [(f"{name}.{k}", v, depth + 1) if isinstance(k, str) else (name, k, -1) for k, v in value.items()]
        else:
            stack += [(f"{name}[{j}]", v, depth + 1) for j, v in enumerate(value)]
    return None


def _metadata(obj: dict, used: set) -> dict | None:
    """A JSONL object's fields besides id, title and text; a nested "metadata" object (BEIR's)
    is lifted up, the object's own fields winning."""
    nested = obj.get("metadata")
    out = dict(nested) if isinstance(nested, dict) else {}
    out.update((k, v) for k, v in obj.items() if k not in used and not (k == "metadata" and isinstance(v, dict)))
    return out or None


def _parse_line(file: Path, lineno: int, line: str) -> dict:
    """One JSONL line as an object; every way it can fail is a CorpusError naming the line."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        # some of json's messages end in "at" already ("Invalid control character at")
        raise CorpusError(file, lineno, None, f"malformed JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})") from None
    except RecursionError:
        raise CorpusError(file, lineno, None, "JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (sys.int_info.default_max_str_digits)
        raise CorpusError(file, lineno, None, f"unreadable JSON value ({exc})") from None
    if not isinstance(obj, dict):
        raise CorpusError(file, lineno, None, "expected a JSON object")
    return obj


def _check_encodable(value: str, file: Path, lineno: int, name: str) -> None:
    """Refuse lone surrogates (a JSON escape such as \\ud800 decodes to one): no tokenizer can
    encode them, and as an id they could not be written out with the hits."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CorpusError(file, lineno, name, f"lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start + 1} (not valid Unicode text)") from None


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO or pipe",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def check_regular(path: Path, folder_ok: bool = False) -> None:
    """Refuse a corpus that is not a regular file (after links), or a folder where ``folder_ok``.

    A corpus is read more than once (hashed for the resume key, counted for the progress bar,
    then indexed; the server reads it twice), so a pipe (``--corpus <(cat docs.jsonl)``,
    ``/dev/stdin``) would be used up by the first read, and a FIFO with no writer would hang the
    reader. A path that does not exist is left to the reader's own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if stat.S_ISREG(mode) or (folder_ok and stat.S_ISDIR(mode)):
        return
    kind = _KINDS.get(stat.S_IFMT(mode), "a special file")
    raise CorpusError(path, None, None, f"not a regular file ({kind}): a corpus is read more than once (hashed to resume a build, "
                                        "then indexed), which a stream cannot be; write it to a file first")


def open_corpus_file(path: Path):
    """``path`` opened for reading in binary, only if it is a regular file: opened non-blocking
    (a FIFO with no writer does not hang the open) and checked on the descriptor that is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            check_regular(path)  # the message (the path may have changed since; then say it here)
            raise CorpusError(path, None, None, f"not a regular file ({_KINDS.get(stat.S_IFMT(mode), 'a special file')})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def guess_format(path: Path) -> str:
    if path.is_dir():
        if (path / "corpus.jsonl").exists():
            return "beir"
        if next(iter(text_files(path)), None) is not None:
            return "files"
        raise CorpusError(path, None, None, "a folder must hold corpus.jsonl (BEIR layout) or text files (one document each)")
    if not path.exists():
        raise CorpusError(path, None, None, "no such file or folder")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix in (".tsv", ".txt"):
        return "tsv"
    raise CorpusError(path, None, None, "cannot tell the format from the name (.jsonl, .tsv or a BEIR folder)")


def _lines(file: Path) -> Iterator[tuple[int, str]]:
    # Decoded line by line so that a bad byte is reported with its line number.
    with open_corpus_file(file) as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(file, lineno, None, f"not valid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None


def _field(obj: dict, file: Path, lineno: int, name: str | None, defaults: tuple[str, ...], role: str) -> str:
    names = (name,) if name else defaults
    for n in names:
        if n in obj:
            value = obj[n]
            if isinstance(value, float) and role == "id" and not math.isfinite(value):  # 1e400, NaN: not an id ("inf", "nan")
                raise CorpusError(file, lineno, n, f"{value!r} is not a finite number (JSON has no NaN or Infinity; 1e400 reads as Infinity)")
            if isinstance(value, (int, float)) and role == "id" and not isinstance(value, bool):
                try:
                    value = str(value)
                except ValueError as exc:  # an integer too long to print
                    raise CorpusError(file, lineno, n, f"unusable numeric id ({exc})") from None
            if not isinstance(value, str):
                raise CorpusError(file, lineno, n, f"expected a string, got {type(value).__name__}")
            if role == "id" and not value.strip():
                raise CorpusError(file, lineno, n, "empty id")
            _check_encodable(value, file, lineno, n)
            return value
    raise CorpusError(file, lineno, "/".join(names), f"missing {role} field")


def text_files(folder: Path) -> list[Path]:
    """The documents of a "files" corpus: every regular file under ``folder`` (links to files
    included), hidden ones (a part starting with ".") left out, sorted by path."""
    out = []
    for path in Path(folder).rglob("*"):
        rel = path.relative_to(folder)
        if not any(part.startswith(".") for part in rel.parts) and path.is_file():
            out.append(rel)
    return sorted(out, key=lambda r: r.as_posix())


def _read_files(folder: Path) -> Iterator[tuple[int, Document]]:
    for number, rel in enumerate(text_files(folder), start=1):
        path = folder / rel
        check_regular(path)
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise CorpusError(path, line, None, f"not valid UTF-8 (byte {raw[exc.start]:#04x}); a 'files' corpus holds text files") from None
        if "\x00" in text:
            raise CorpusError(path, None, None, "a NUL byte: not a text file (a 'files' corpus holds text files)")
        text = text.strip()
        yield number, Document(rel.as_posix(), text, None, text)


def _read_tsv(file: Path) -> Iterator[tuple[int, Document]]:
    for lineno, line in _lines(file):
        line = line.rstrip("\r\n")
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise CorpusError(file, lineno, "text", "expected id<TAB>text")
        if not parts[0].strip():
            raise CorpusError(file, lineno, "id", "empty id")
        text = " ".join(parts[1:])
        yield lineno, Document(parts[0], text, None, text)


def read_queries(file: Path) -> dict[str, str]:
    """BEIR queries.jsonl as {query id: text}, in file order; bad lines raise CorpusError
    naming the file, line and field."""
    out: dict[str, str] = {}
    with open(file, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise CorpusError(file, lineno, None, "not valid UTF-8") from None
            if not line.strip():
                continue
            obj = _parse_line(file, lineno, line)
            qid = obj.get("_id", obj.get("id"))
            if qid is None or str(qid).strip() == "":
                raise CorpusError(file, lineno, "_id", "missing or empty query id")
            text = obj.get("text")
            if not isinstance(text, str):
                raise CorpusError(file, lineno, "text", "missing query text" if text is None else f"expected a string, got {type(text).__name__}")
            if str(qid) in out:
                raise CorpusError(file, lineno, "_id", f"duplicate query id {qid!r}")
            out[str(qid)] = text
    return out
