"""build-index --profile: each build profile holds what its search profile reads (issue 53)."""
from __future__ import annotations

import pytest

from indexer import channel_set
from indexer.build_profiles import BUILD_PROFILES, DEFAULT_BUILD_PROFILE, get_build_profile
from indexer.compact import DOC_ID_ENCODINGS, IMPACT_BITS
from retriever.profiles import DEFAULT_PROFILE, PROFILES, auto_profile


def test_each_build_profile_holds_its_search_profiles_channels():
    # listed in the indexer (the retriever sits above it): kept equal to what each search profile weighs
    for name in ("fast", "best"):
        assert set(channel_set.PROFILE_CHANNELS[name]) == set(PROFILES[name].channels), name
    assert set(channel_set.PROFILE_CHANNELS["both"]) == set(PROFILES["fast"].channels) | set(PROFILES["best"].channels)
    assert set(BUILD_PROFILES) == set(channel_set.PROFILE_CHANNELS) and DEFAULT_BUILD_PROFILE == DEFAULT_PROFILE == "fast"
    for profile in BUILD_PROFILES.values():
        assert profile.doc_ids in DOC_ID_ENCODINGS and profile.impact_bits in IMPACT_BITS
    # fast is the small one (4 bits, bit-packed); best keeps 8 bits, which 4 cost up to 0.0039 nDCG@10
    assert (BUILD_PROFILES["fast"].impact_bits, BUILD_PROFILES["fast"].doc_ids) == (4, "bitpacked")
    assert BUILD_PROFILES["best"].impact_bits == BUILD_PROFILES["both"].impact_bits == 8
    with pytest.raises(ValueError, match="fast, best, both"):
        get_build_profile("small")


@pytest.mark.parametrize("installed, profile, want", [
    ({None, "mpnet"}, "fast", ("bm25", "encoder")),  # no LLM (issue 71)
    ({None, "mpnet"}, "best", ("bm25", "encoder2")),
    ({None, "mpnet"}, "both", ("bm25", "encoder", "encoder2")),
    ({None}, "fast", ("bm25", "encoder")),
    ({None}, "best", channel_set.WITH_ENCODER),  # best's fallback reads the LLM's dense channel and MiniLM
    ({None}, "both", channel_set.WITH_ENCODER),
    (set(), "fast", channel_set.WITHOUT_ENCODER),
    (set(), "best", channel_set.WITHOUT_ENCODER),
])
def test_profile_channels_fall_back_with_what_is_installed(monkeypatch, installed, profile, want):
    names = {None if n is None else channel_set.DEFAULT_SETTINGS["encoder2"] for n in installed}
    monkeypatch.setattr(channel_set, "encoder_available", lambda name=None: name in names)
    assert channel_set.default_channels(profile) == want
    assert channel_set.resolve(None, profile=profile)[0] == want
    with pytest.raises(ValueError, match="profile"):
        channel_set.default_channels("small")


def test_auto_profile_searches_an_index_at_the_profile_it_was_built_for():
    assert auto_profile(channel_set.PROFILE_CHANNELS["fast"]) == "fast"
    assert auto_profile(channel_set.PROFILE_CHANNELS["best"]) == "best"  # no MiniLM: built for best
    assert auto_profile(channel_set.PROFILE_CHANNELS["both"]) == "fast"  # the default where both fit
    assert auto_profile(channel_set.WITH_ENCODER) == "fast"
    assert auto_profile(channel_set.WITHOUT_ENCODER) is None  # an index of an earlier default: searched as built
