"""The training console scripts, one thin module each (argparse, then calls into the library):

- ``text2token``: ``train-text2token``;  ``llm2comp``: ``train-llm2comp``;  ``btmr``: ``train-btmr``;
- ``sts``: ``sts-eval``;  ``diagnose``: ``text2token-diagnose``;
- ``readings``: ``python -m training.cli.readings`` (Eq. 17's readings compared on a corpus);
- ``common``: what they share (process set-up, argument groups, recipe overrides, the error exit).
"""
