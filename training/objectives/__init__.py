"""The training objectives, one file each: what a trainer minimises, apart from where its batches come from.

- ``text2token``: KL of the LM head's reading of the pooled state to sparse token targets
  (Text2Token Eq. 11): :func:`~training.objectives.text2token.text2token_loss`.
- ``contrastive``: InfoNCE with in-batch and hard negatives and same-text masking, the one
  contrastive loss of every pairs stage (supervised pairs, spans, SimCSE views, BTMR groups):
  :func:`~training.objectives.contrastive.pair_loss`, with :class:`GradCache` and :class:`Temperature`;
  beside it, :func:`~training.objectives.contrastive.listwise_kl`, the KL of the anchor -> candidates
  softmax to a teacher's (issue 30).
- ``ctkd``: LLM2Comp's continuation task with knowledge distillation (memory states as a soft
  prefix of the frozen decoder): :func:`~training.objectives.ctkd.ctkd_loss`.
- ``matryoshka``: BTMR's InfoNCE over <BMT> group prefixes:
  :func:`~training.objectives.matryoshka.matryoshka_contrastive`.

One signature. An objective is a function ``<name>_loss(inputs, supervision, *settings) -> Tensor``:

1. *inputs*, first: what the network produced for the batch, as tensors with gradients (pooled
   states ``(B, d)``, or group states ``(B, U, k, d)``); or the :class:`~embedder.encoder.Embedder`
   itself where the objective must run part of the network (Text2Token reads the frozen LM head,
   CTKD runs the frozen decoder over the memory states);
2. *supervision*: what the inputs are pulled towards (sparse target distributions, the partner
   states of a pair, continuation token ids);
3. *settings*: temperature, symmetry, texts for same-text masking (keywords with defaults);
4. it returns float32 losses, one per example, shape ``(B,)``, not reduced: the trainer reduces
   (a mean over the batch, accumulated over micro-batches, masked or weighted). The one
   exception is ``matryoshka_contrastive``, whose average also runs over group prefixes and
   unit pairs; it returns that scalar mean (the reduction order BTMR was measured with).

An objective holds no optimizer, data order or checkpoint: those are the trainers'
(training/<method>/trainer.py) and the shared loop's (training/loop.py).
"""
