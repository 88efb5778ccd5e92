"""Markdown reports and plots from results JSON files; ``BENCHMARKS.md`` is generated here only.

- :mod:`~benchmarks.report.document`: BENCHMARKS.md, the results' INDEX.md, README.md's results table and
  the plots (``generate``);
- :mod:`~benchmarks.report.headline`: which results the headline shows, its tables and the cost plot;
- :mod:`~benchmarks.report.runs`: each beir-eval run's own report.md;
- :mod:`~benchmarks.report.tables`: the section of a study's table;
- :mod:`~benchmarks.report.classification`: the cls-eval section;
- :mod:`~benchmarks.report.markdown`: the formatters they share.
"""
from __future__ import annotations

from benchmarks.report.document import RESULTS_DIR, find_results, generate, write_if_changed
from benchmarks.report.runs import render_run
from benchmarks.report.tables import render_table_section

__all__ = ["RESULTS_DIR", "find_results", "generate", "render_run", "render_table_section", "write_if_changed"]
