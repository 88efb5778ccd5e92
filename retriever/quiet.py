"""Keeping library chatter (progress bars, deprecation warnings, info logs) out of a query's output.

Loading the model prints a "Loading weights" progress bar and transformers' FutureWarnings;
they are useful while an index builds, noise in front of search results. ``search-index``,
``serve`` and the demo's query part load inside :func:`quiet_libraries`.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence transformers' and huggingface_hub's progress bars, their logs below ERROR and
    every Python warning inside the block; restored on exit."""
    restore = []
    try:
        from transformers.utils import logging as hf_logging

        verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        restore.append(lambda: (hf_logging.set_verbosity(verbosity), hf_logging.enable_progress_bar() if bars else None))
    except ImportError:  # transformers absent: nothing of it to silence
        pass
    try:
        from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        was_disabled = are_progress_bars_disabled()
        disable_progress_bars()
        restore.append(lambda: None if was_disabled else enable_progress_bars())
    except ImportError:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for undo in reversed(restore):
            undo()
