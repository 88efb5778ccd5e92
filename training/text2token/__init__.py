"""Text2Token (../shared/papers/text2token.txt): recipes (``recipe``), the data-driven and model-derived
targets (``targets_data``: Eq. 12-17, ``targets_model``: Eq. 18-19, ``readings``: Eq. 17's readings
compared), and the trainer of the Text2Token and contrastive pairs stages (``trainer``). The loss is
training/objectives/text2token.py; the console script training/cli/text2token.py.
"""
