"""Evaluation, in a training run and of a saved one (`python -m jaxtrain.eval`, whose flags are
tools/eval.py's); docs/layout.md says what each module holds.

May import: system, config, core, data, checkpoints, generation, measure.
"""
