"""The studies (sweeps, tables, scale runs): one module per study, each run from a checkout as
``python -m experiments.NAME``. Not part of the installed package (setup.cfg leaves experiments/
out of the wheel). A study uses the product's public API and benchmarks/ (datasets, runs, metrics,
results_file, tables, loco, systems, suite); it never imports another study, and nothing in
benchmarks/ or the product imports a study: import-linter checks both (setup.cfg). Each writes a
results file under benchmarks/results/ that ``beir-eval report`` renders into BENCHMARKS.md and
benchmarks/results/INDEX.md. Each study is named by a test (tests/test_study_smoke.py runs most of them
end to end on the tiny model; the others have test files of their own); a study whose verdict is in is deleted, its results kept
(benchmarks/results/README.md, "Deleted studies").
"""
