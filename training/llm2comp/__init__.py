"""LLM2Comp (../shared/papers/llm2comp.txt): recipes (``recipe``) and the trainer of the CTKD
compression pre-training and the unsupervised contrastive stages (``trainer``). The objectives
are training/objectives/ctkd.py and contrastive.py; the console script training/cli/llm2comp.py.
"""
