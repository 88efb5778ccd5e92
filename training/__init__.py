"""Text2Token training (../shared/papers/text2token.txt): turn a backbone and an unlabeled
corpus into an embedder whose pooled embedding, read through the frozen LM head, predicts
the text's key tokens. The result is a LoRA adapter folder that ``build-index --adapter``,
``Retriever`` and ``Embedder.load(model, adapter=DIR)`` load by path.

Modules: recipe (the fields every recipe shares), config (Text2Token recipes), targets_data
(Eq. 12-17), targets_model (Eq. 18-19), target_cache (sparse cached targets), loss (Eq. 11),
loop (the one training loop: LoRA, optimizer, checkpoints and resume, progress, loss curve),
trainer (the Text2Token and pairs stages), llm2comp_* and btmr_trainer (the other objectives'
stages, recipes and scripts), adapter_io (the adapter folder), diagnostics (aligned tokens,
Hit@K/LAR/GAR, PC variation), sts (Spearman on STS pairs), cli_common (what the training
scripts share), cli (console scripts).
"""

from training.config import CPU_RECIPE, RECIPES, DataTargetConfig, ModelTargetConfig, Recipe, Stage

__all__ = ["CPU_RECIPE", "RECIPES", "DataTargetConfig", "ModelTargetConfig", "Recipe", "Stage"]
