"""BTMR fine-to-coarse token matryoshka learning (btmr-multiple-tokens §3.2): recipes and layout
(``recipe``), sequences, group attention mask and forward pass (``sequences``), and the trainer
(``trainer``). The contrastive objective is training/objectives/matryoshka.py; the console script
training/cli/btmr.py.
"""
