"""One-off studies (sweeps, tables, scale runs), one module per study, each run as
``python -m benchmarks.studies.NAME``. A study uses the product's public API (datasets, runs,
metrics, results_file, tables, systems, suite) and never imports another study; import-linter
checks both (setup.cfg). Each writes a results file under benchmarks/results/ that
``beir-eval report`` renders into BENCHMARKS.md.
"""
