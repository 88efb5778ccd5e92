"""The prompt template's prefix, computed once.

Every text is embedded inside the same template (PromptEOL: ``This sentence: "[text]" means
in one word:"``), so under causal attention the keys and values of the template's prefix
tokens are the same for every text. :class:`PrefixCachedBody` computes them once and runs
only the text and the template's suffix; the exported runtimes (embedder/runtime.py) trace
this module, so the prefix is baked into their graph as constants. Where queries read another
template (``EmbedderConfig.query_prompt``), the cached prefix is the part both templates share
(``Embedder.shared_prefix``), so that one runtime serves documents and queries.

Only valid for causal attention: with bidirectional attention the prefix tokens see the
text, and their states differ per text.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def supports_prefix_cache(body: torch.nn.Module) -> bool:
    """Whether every attention layer keeps a plain (full, unbounded) key/value cache.

    Sliding-window layers (e.g. Gemma 3) drop old positions, so their prefix handling differs.
    """
    try:
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=body.config).layers)
    except Exception:  # noqa: BLE001 - an architecture transformers builds no cache for
        return False


class PrefixCachedBody(torch.nn.Module):
    """A decoder body (no LM head) that runs ``prefix_ids + input_ids`` while computing only ``input_ids``.

    ``forward(input_ids, attention_mask)`` takes the ids *after* the prefix (right-padded) and
    their mask, and returns the final hidden states of those positions, exactly as the full
    forward would (to float rounding: 1e-5 on values of ~60 for SmolLM2-135M).
    """

    def __init__(self, body: torch.nn.Module, prefix_ids: list[int]) -> None:
        super().__init__()
        if not prefix_ids:
            raise ValueError("PrefixCachedBody needs a non-empty prefix")
        if not supports_prefix_cache(body):
            raise ValueError(f"{type(body).__name__}: the prefix cache needs plain full-attention key/value layers")
        self.body = body
        self.prefix_len = len(prefix_ids)
        param = next(body.parameters())
        with torch.no_grad():
            out = body(input_ids=torch.tensor([prefix_ids], device=param.device), use_cache=True)
        cache = out.past_key_values
        # Buffers, so that .to(dtype/device) and tracing carry them along with the weights.
        for i, layer in enumerate(cache.layers):
            self.register_buffer(f"prefix_k{i}", layer.keys.detach().clone(), persistent=False)
            self.register_buffer(f"prefix_v{i}", layer.values.detach().clone(), persistent=False)
        self.n_layers = len(cache.layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        batch = input_ids.shape[0]
        kv = [
            (getattr(self, f"prefix_k{i}").expand(batch, -1, -1, -1), getattr(self, f"prefix_v{i}").expand(batch, -1, -1, -1))
            for i in range(self.n_layers)
        ]
        cache = DynamicCache(config=self.body.config)
        for layer, (k, v) in zip(cache.layers, kv):
            # Set the state directly: DynamicLayer.update would first concatenate onto an
            # empty tensor, an op the OpenVINO exporter cannot convert.
            layer.dtype, layer.device = k.dtype, k.device
            layer.keys, layer.values = k, v
            layer.is_initialized = True
        ones = torch.ones((batch, self.prefix_len), dtype=attention_mask.dtype, device=attention_mask.device)
        mask = torch.cat([ones, attention_mask], dim=1)
        return self.body(input_ids=input_ids, attention_mask=mask, past_key_values=cache, use_cache=False).last_hidden_state


class PlainBody(torch.nn.Module):
    """The decoder body as a module of (input_ids, attention_mask) -> last hidden states (for export)."""

    prefix_len = 0

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
