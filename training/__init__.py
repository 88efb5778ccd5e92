"""Text2Token training (../shared/papers/text2token.txt): turn a backbone and an unlabeled
corpus into an embedder whose pooled embedding, read through the frozen LM head, predicts
the text's key tokens. The result is a LoRA adapter folder that ``build-index --adapter``,
``Retriever`` and ``Embedder.load(model, adapter=DIR)`` load by path.

Every method is laid out the same way: ``<method>/recipe.py`` (what decides a run),
``<method>/trainer.py`` (its stages' steps and data) and ``cli/<method>.py`` (its console
script), for text2token, llm2comp and btmr. Shared by all of them:

- ``objectives/``: one file per loss with one signature (text2token, contrastive, ctkd, matryoshka);
- ``recipe`` (the fields every recipe shares), ``loop`` (the one training loop: LoRA, optimizer,
  checkpoints and resume, progress, loss curve), ``adapter_io`` (the adapter folder);
- data: ``texts`` (corpus documents), ``pairs`` (supervised pairs files), ``corpus_pairs`` (spans
  and sentences of a document), ``target_cache`` (sparse token targets, their cache, the texts'
  fingerprint);
- evaluation: ``sts`` (Spearman on STS pairs), ``diagnostics`` (aligned tokens, Hit@K/LAR/GAR, PC variation);
- ``cli/``: the console scripts, thin.

This package re-exports the Text2Token recipe types (training/text2token/recipe.py).
"""

from training.text2token.recipe import CPU_RECIPE, RECIPES, DataTargetConfig, ModelTargetConfig, Recipe, Stage

__all__ = ["CPU_RECIPE", "RECIPES", "DataTargetConfig", "ModelTargetConfig", "Recipe", "Stage"]
