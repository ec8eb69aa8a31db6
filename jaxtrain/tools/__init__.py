"""The commands beside training, each `python -m jaxtrain.X` through a two-line module at the
package's top: `sample`, `export`, `compare`, `sweep`, `eval` (in `evaluate`: task scores),
`chat` (talk with a chat model); `runs` reads runs on disk for compare and sweep; `cli` is what
every command shares (flags, one-line errors).

May import: every folder above (system, config, core, data, checkpoints, generation, loop).
"""
