"""experiments.compute_ceiling: the FLOPs it counts for a document and what it reads."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from experiments.compute_ceiling import decoder_shapes, document_flops, naive_and_best

SMOLLM2_135M = SimpleNamespace(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                               num_key_value_heads=3, vocab_size=49152)


def test_the_linear_layers_are_the_decoders_weights():
    shapes = decoder_shapes(SMOLLM2_135M)
    weights = sum(i * o * n for i, o, n in shapes.values())
    # SmolLM2-135M: 30 blocks of q, o (576 x 576), k, v (576 x 192), gate, up (576 x 1536), down (1536 x 576)
    assert weights == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536)


def test_a_documents_flops_are_two_a_weight_a_token_plus_causal_attention_and_the_head():
    weights = sum(i * o * n for i, o, n in decoder_shapes(SMOLLM2_135M).values())
    flops = document_flops([3, 1], SMOLLM2_135M)
    linear = sum(v for k, v in flops.items() if k not in ("attention", "LM head (pooled)"))
    assert linear == pytest.approx(2 * weights * 4)
    assert flops["attention"] == pytest.approx(4 * 576 * 30 * (6 + 1))  # 3 tokens see 1+2+3 positions, 1 token 1
    assert flops["LM head (pooled)"] == pytest.approx(2 * 49152 * 576 * 2)


def test_the_naive_loop_is_read_from_an_encoder_speed_results_file(tmp_path):
    path = tmp_path / "speed.json"
    path.write_text(json.dumps({"columns": ["runtime", "dtype", "prefix cache", "docs/s"],
                                "rows": [["naive transformers loop", "fp32", "no", 3.5], ["engine: openvino", "fp32", "yes", 6.0]]}))
    naive, rows = naive_and_best(path)
    assert naive == 3.5
    assert rows == [("naive transformers loop fp32 no", 3.5), ("engine: openvino fp32 yes", 6.0)]
    assert naive_and_best(None) == (None, [])
