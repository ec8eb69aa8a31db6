"""The commands beside training, each `python -m jaxtrain.<command>` through a two-line module at
the package's top; `cli` is what every command shares (docs/layout.md says what each module holds).

May import: every folder above (system, config, core, data, checkpoints, generation, serving,
measure, evals, trackers, loop).
"""
