"""Readable explanations (retriever/explain.py): byte-level BPE tokens shown as words."""
from __future__ import annotations

import pytest

from retriever.explain import SYMBOLS, TokenExplainer, merge, term_sources, term_words


@pytest.fixture(scope="module")
def byte_bpe():
    """A GPT-2-style byte-level BPE tokenizer (the real backbone's kind), trained in-process so
    that "argparse" is one word, "Schubert" splits into a word start and an inner piece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    sentences = ["argparse parses command line options", "the Command line", "use argparse and parse"] * 30
    sentences += ["Schumann Schubert Schulz", "intelligence and intelligent agents"] * 3 + ["hello world"] * 5 + ["plot x and x"] * 5
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def one(tokenizer, token: str) -> int:
    i = tokenizer.convert_tokens_to_ids(token)
    assert i is not None and i != tokenizer.unk_token_id, token
    return i


def test_word_initial_and_inner_forms_of_a_word_merge_with_summed_contribution(byte_bpe):
    e = TokenExplainer(byte_bpe)
    assert e.marks_word_starts
    assert e.piece(one(byte_bpe, "Ġargparse")) == ("argparse", True)
    assert e.piece(one(byte_bpe, "argparse")) == ("argparse", False)
    words = e.words([one(byte_bpe, "Ġargparse"), one(byte_bpe, "argparse"), one(byte_bpe, "ĠCommand"), one(byte_bpe, "Ġcommand")],
                    [1.0, 0.5, 0.25, 0.5], "argparse command")
    assert words == {"argparse": 1.5, "command": 0.75}
    assert sum(words.values()) == pytest.approx(2.25)  # entries still add up to the score
    # a query word is spelled as the query spells it, whatever the token's case
    assert e.words([one(byte_bpe, "ĠCommand"), one(byte_bpe, "Ġcommand")], [1.0, 1.0], "COMMAND line") == {"COMMAND": 2.0}


def test_an_inner_form_joins_the_word_initial_form_that_matched_too(byte_bpe):
    e = TokenExplainer(byte_bpe)
    inner, start = one(byte_bpe, "argparse"), one(byte_bpe, "Ġargparse")
    assert e.words([inner], [1.0], "who") == {"…argparse": 1.0}  # alone: the inside of some word
    assert e.words([inner, start], [1.0, 0.5], "who") == {"argparse": 1.5}  # beside its word-initial form: that word
    schu_inner, schu_start = one(byte_bpe, "Schu"), one(byte_bpe, "ĠSchu")
    vocab = {"command"}
    e = TokenExplainer(byte_bpe, known_word=lambda w: w in vocab)
    assert e.words([schu_inner, schu_start], [1.0, 1.0], "who") == {"Schu…": 2.0}  # fragments of one piece: one entry


def test_a_lone_letter_is_a_fragment_unless_the_query_has_it(byte_bpe):
    e = TokenExplainer(byte_bpe)
    letter = "x"
    g = [one(byte_bpe, "Ġx")]
    assert e.piece(g[0]) == (letter, True)
    assert e.words(g, [1.0], "gzip") == {letter + "…": 1.0}
    assert e.words(g, [1.0], f"vitamin {letter}") == {letter: 1.0}


def test_fragments_are_marked_and_symbols_grouped(byte_bpe):
    e = TokenExplainer(byte_bpe)
    pieces = ids(byte_bpe, " Schwarzkopf")  # unseen in training: a word start and inner pieces
    assert len(pieces) >= 2 and byte_bpe.convert_ids_to_tokens(pieces[0]).startswith("Ġ")
    inner = pieces[-1]
    comma, e_acute = ids(byte_bpe, ",")[0], ids(byte_bpe, " é")  # é: two bytes, two tokens
    words = e.words([inner, comma, *e_acute], [0.5, 0.25, 0.125, 0.125], "composers")
    inner_text = e.piece(inner)[0]
    assert words == {"…" + inner_text: 0.5, SYMBOLS: 0.5}


def test_a_word_start_unknown_to_the_corpus_is_a_fragment(byte_bpe):
    vocab = {"argpars", "command", "schubert"}
    e = TokenExplainer(byte_bpe, known_word=lambda w: w.rstrip("s") in vocab or w in vocab)
    start = one(byte_bpe, "ĠSchu")  # the start of Schubert, Schulz
    start_text = e.piece(start)[0]
    assert start_text == "Schu"
    assert e.words([start, one(byte_bpe, "Ġcommand")], [2.0, 1.0], "who") == {start_text + "…": 2.0, "command": 1.0}
    # a query word is a word whatever the corpus says
    assert e.words([start], [1.0], f"about {start_text}") == {start_text: 1.0}


def test_a_tokenizer_without_word_start_marks_keeps_pieces_as_words(tiny_tokenizer):
    e = TokenExplainer(tiny_tokenizer)
    assert not e.marks_word_starts
    cat, dog = ids(tiny_tokenizer, "cat")[0], ids(tiny_tokenizer, "dog")[0]
    assert e.words([cat, dog], [1.0, 2.0], "cat") == {"dog": 2.0, "cat": 1.0}


def test_merge_and_bm25_terms_as_query_words():
    assert merge([("Parse", 1.0), ("parse", 2.0), ("x", 0.5)]) == {"Parse": 3.0, "x": 0.5}

    stems = {"parsing": "pars", "options": "option", "the": None}

    def stem(word: str) -> list[str]:
        s = stems.get(word.lower(), word.lower())
        return [s] if s else []

    assert term_words(["pars", "option"], "Parsing the options", stem) == ["parsing", "options"]
    assert term_words(["Ġzebra"], "cat", stem, decode=lambda t: t.lstrip("Ġ")) == ["zebra"]
    # the map a HitExplainer keeps per query text gives the same words
    sources = term_sources("Parsing the options", stem)
    assert sources == {"pars": "parsing", "option": "options"}
    assert term_words(["option", "pars"], "Parsing the options", stem, sources=sources) == ["options", "parsing"]


@pytest.mark.slow
def test_the_real_backbone_tokenizer_decodes_to_words(default_model):
    from transformers import AutoTokenizer

    from embedder.models import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(default_model).directory)
    e = TokenExplainer(tok, known_word=lambda w: w in {"argparse", "command", "intelligence"})
    words = e.words(ids(tok, " argparse Command") + ids(tok, "argparse command") + ids(tok, " Schubert"), [1.0] * 9, "argparse")
    assert "argparse" in words and "Command" in words and not any("Ġ" in w for w in words)
    assert words["Command"] == pytest.approx(2.0)  # "ĠCommand" and "command" (inner) are one word
    assert "Schu…" in words  # SmolLM2 splits Schubert as ĠSchu + bert
