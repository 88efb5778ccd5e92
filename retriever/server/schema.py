"""The HTTP API's types: requests (checked; unknown fields refused) and responses (the OpenAPI schema at /openapi.json)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, create_model

from indexer.channels import CHANNEL_SPECS
from retriever.retriever import MODES

HIT_FIELDS = ("rank", "id", "score", "title", "snippet", "channels", "highlight", "matched", "matched_ids", "matched_terms")
# the default leaves out the raw forms of the explanation (token ids, BM25 stems: for tools, about half of a k=10 answer)
DEFAULT_FIELDS = ("rank", "id", "score", "title", "snippet", "channels", "highlight", "matched")
EXPLAINED = frozenset(("snippet", "highlight", "matched", "matched_ids", "matched_terms"))  # fields that need the explanation
HitField = Literal["rank", "id", "score", "title", "snippet", "channels", "highlight", "matched", "matched_ids", "matched_terms", "all"]
FIELDS_HELP = (f"per-hit fields to return, of {', '.join(HIT_FIELDS)}, or 'all'; default {', '.join(DEFAULT_FIELDS)} "
               "(matched_ids and matched_terms, the raw token ids and BM25 stems, only when asked). Leaving out snippet, "
               "highlight and the matched fields skips the explanation, the costliest part of a search after encoding")

FILTER_HELP = ('metadata filter, all conditions together: {"field": value} (equal; a list-valued field contains it), '
               '{"field": [v1, v2]} (any of), {"field": {"gte": a, "lt": b}} (a range); fields: /info metadata_fields')


def finite_weight(value: float) -> float:
    """A fusion weight as a float: refused (422 naming it) where it is beyond float's range."""
    try:
        weight = float(value)
    except OverflowError:
        raise ValueError("number out of range (a weight must be a finite number >= 0)") from None
    if not (weight >= 0 and weight < float("inf")):
        raise ValueError("a weight must be a finite number >= 0")
    return weight


def unicode_text(value: str) -> str:
    """Refuse a lone surrogate (no tokenizer encodes one, and no UTF-8 answer could echo it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start + 1} (not valid Unicode text)") from None
    return value


Weight = Annotated[StrictFloat | StrictInt, AfterValidator(finite_weight)]
Text = Annotated[StrictStr, AfterValidator(unicode_text)]


def chosen_fields(fields: list[str] | None) -> tuple[str, ...]:
    """The hit fields to answer, in :data:`HIT_FIELDS` order."""
    if fields is None:
        return DEFAULT_FIELDS
    if "all" in fields:
        return HIT_FIELDS
    return tuple(f for f in HIT_FIELDS if f in fields)


def split_fields(value: str | None) -> list[str] | None:
    """GET's ``fields=id,score,title`` as a list (checked by :class:`SearchRequest`)."""
    return None if value is None else [f.strip() for f in value.split(",") if f.strip()]


# ------------------------------------------------------------------ requests
class Fusion(BaseModel):
    """A hybrid setting for one request (default: the index's)."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["minmax", "max", "rrf"] = "minmax"
    weights: dict[StrictStr, Weight] = Field(description="channel -> weight (>= 0)")
    rrf_k: StrictInt = Field(60, ge=1, le=10_000)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Text = Field(description="the query text (blank: no hits)")
    k: StrictInt = Field(10, description="hits wanted, 1..max_k (see /info)")
    offset: StrictInt = Field(0, description="hits to skip (pagination): the page is ranks offset+1 .. offset+k; offset + k <= max_window (see /info)")
    mode: StrictStr | None = Field(None, description=f"one of {', '.join(MODES)} the index has; default hybrid (see /info)")
    fusion: Fusion | None = None
    fields: list[HitField] | None = Field(None, description=FIELDS_HELP)
    filter: dict[str, Any] | None = Field(None, description=FILTER_HELP)


class SearchQuery(BaseModel):
    """GET /search's query parameters (unknown ones are refused, as POST refuses unknown fields)."""

    model_config = ConfigDict(extra="forbid")
    q: Text = Field(description="the query text")
    k: int = Field(10, description="hits wanted, 1..max_k")
    offset: int = Field(0, description="hits to skip (pagination)")
    mode: str | None = Field(None, description="search mode (default: the index's)")
    fields: str | None = Field(None, description="comma-separated per-hit fields (see POST /search)")
    filter: str | None = Field(None, description="a metadata filter as JSON (see POST /search)")


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[Text] = Field(description="queries, at most max_batch (see /info)")
    k: StrictInt = 10
    offset: StrictInt = 0
    mode: StrictStr | None = None
    fusion: Fusion | None = None
    fields: list[HitField] | None = Field(None, description=FIELDS_HELP)
    filter: dict[str, Any] | None = Field(None, description=FILTER_HELP)


# ------------------------------------------------------------------ responses
class HitOut(BaseModel):
    """One hit; only the fields asked for (``fields``) are present."""

    rank: int | None = Field(None, description="1-based rank over the whole result list (offset included)")
    id: str | None = Field(None, description="the document's id in the corpus")
    score: float | None = Field(None, description="the fused (hybrid) or channel score")
    title: str | None = Field(None, description="the document's title (null: none)")
    snippet: str | None = Field(None, description="about 280 characters of the text near the first matched word (null: no corpus)")
    channels: dict[str, float] | None = Field(None, description="each channel's share of a hybrid score")
    highlight: list[str] | None = Field(None, description="the matched words to highlight")
    matched: dict[str, float] | None = Field(None, description="matched words (BM25 terms prefixed bm25:) -> contribution")
    matched_ids: dict[str, float] | None = Field(None, description="matched aligned-token ids -> contribution (raw)")
    matched_terms: dict[str, float] | None = Field(None, description="matched BM25 terms as stored -> contribution (raw)")


class SearchResponse(BaseModel):
    query: str
    mode: str
    offset: int
    k: int
    total: int = Field(description="see total_relation")
    total_relation: Literal["eq", "gte", "pool"] = Field(description=(
        "eq: exactly `total` documents matched the query at all in the channel searched (every document, for a dense channel); "
        "gte: at least `total` (counting stops at 1,000); pool: hybrid, `total` is the size of the candidate pool fused "
        "(each channel's top 100 together), a bound: hits are ranked, and pages reach, only within it"))
    took_ms: float = Field(description="this query's search: its share of the encoding forward (shared with the queries "
                                       "encoded with it), its channel searches, fusion and explanations; not queueing or HTTP")
    generation: str = Field(description="the index generation that answered")
    hits: list[HitOut]


class BatchResponse(BaseModel):
    mode: str
    took_ms: float = Field(description="the whole batch's search time")
    generation: str
    results: list[SearchResponse]


class Health(BaseModel):
    status: Literal["ok"]
    documents: int = Field(description="documents in the generation served")
    generation: str = Field(description="the generation served (the directory the index path points at)")


class ErrorOut(BaseModel):
    detail: str = Field(description="what was wrong, in one line")


# what /info says of each channel (its row's ``info``, indexer/channels.py), under its manifest key: a
# sentence encoder's name, BM25's record...; null where the index lacks it
_ChannelInfo = create_model("_ChannelInfo", **{
    s.manifest_key: (str | None if s.info else dict[str, Any] | None, Field(None, description=f"{s.doc}; null: none"))
    for s in CHANNEL_SPECS if s.info is not None
})


class Info(_ChannelInfo):
    model_config = ConfigDict(extra="allow")
    index: str = Field(description="the index path served (a link to its generations)")
    generation: str = Field(description="the generation answering now")
    loaded_at: str = Field(description="when that generation was loaded (UTC)")
    documents: int = Field(description="documents in that generation")
    channels: list[str]
    modes: list[str]
    default_mode: str
    fusion: dict[str, Any]
    fusion_source: str | None = None  # why these weights: calibrated on this corpus, the profile's fixed setting, given
    describe: str
    settings: dict[str, Any] | None = Field(None, description="each search setting chosen for this index (profile, query_encoder, fusion, "
                                            "feedback, sparse_pruning, backend): its value and why (retriever/settings.py)")
    model: dict[str, Any]
    adapter: dict[str, Any] | None = Field(description="the adapter: its name and sha256 (no local path); null: the raw backbone")
    metadata_fields: list[str] = Field(description="the fields a filter can name (the documents' metadata)")
    writable: bool = Field(description="whether POST /documents and DELETE /documents/{id} are served (serve --writable)")
    runtime: dict[str, Any]
    query_encoder: str | None
    profile: str | None
    feedback: dict[str, Any] | None
    sparse_pruning: dict[str, Any] | None = Field(None, description="the aligned-token channel searched pruned (serve --sparse-pruning): "
                                                  "keep_mass and depth; null: exact")
    backend: str
    snippets: str
    reload: dict[str, Any] = Field(description="follows_index, poll_s, reloads so far, the last failed load (null: none)")
    batching: dict[str, Any] = Field(description="search lanes and how many requests shared a forward")
    limits: dict[str, Any]
    uptime_s: float


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": what} for status, what in (
        (401, "missing or wrong API key (when the server has one)"), (413, "body too large"),
        (422, "invalid request (the detail names the field)"), (503, "busy: queued past --queue-timeout (Retry-After)"))
}


class DocumentsRequest(BaseModel):
    """POST /documents (``serve --writable``): documents to add or replace, ids to delete, in one update."""

    model_config = ConfigDict(extra="forbid")
    documents: list[dict[str, Any]] = Field(default_factory=list, description=(
        'documents as a JSONL corpus line holds them: {"_id", "title"?, "text", any metadata field...}; an id already '
        "indexed is replaced"))
    delete: list[Text] = Field(default_factory=list, description="ids to delete (an id not indexed is reported in not_found)")


class UpdateOut(BaseModel):
    added: int
    replaced: int
    deleted: int
    not_found: list[str]
    documents: int = Field(description="documents in the index after the update")
    generation: str = Field(description="the generation the update published (where nothing was published: the index's current one)")
    serving: str = Field(description="the generation this server answers from now (the update's, once loaded)")
    seconds: float
    encode_seconds: float
    published: bool = Field(True, description="false: the update changed nothing (only ids that are not indexed to delete), nothing was written")
