"""Sentence classification on frozen embeddings (``cls-eval``).

- :mod:`~benchmarks.classification.evaluation`: tasks and the protocol (logistic regression, CV);
- :mod:`~benchmarks.classification.fusion_boosting`: Token Fusion Boosting of the per-prefix classifiers;
- :mod:`~benchmarks.classification.run`: encode (cached), evaluate every task, write the results file;
- :mod:`~benchmarks.classification.cli`: the ``cls-eval`` command line.
"""
