"""The commands beside training, each `python -m jaxtrain.<command>` through a two-line module at
the package's top: `sample`, `export`, `compare`, `sweep`, `eval` (its flags; the scoring is
evals/'s), `chat` (talk with a chat model); `runs` reads runs on disk for compare and
sweep; `cli` is what every command shares (absl flags, --help, one-line errors).

May import: every folder above (system, config, core, data, checkpoints, generation, measure,
evals, trackers, loop).
"""
