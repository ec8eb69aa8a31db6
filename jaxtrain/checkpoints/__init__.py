"""A run's saved state: orbax storage with checksums (`store`), choosing the newest intact checkpoint
and setting damaged ones aside (`recover`), saving and resuming in the loop (`lifecycle`: `Saving`,
which also says when a checkpoint is due), reading a trained run outside the loop (`load`:
`load_state`, `load_tokenizer`, `--step=latest|best|N`, its saved config's fields), starting from
another run or a Hugging Face model (`init_from`, `hf`), and what an export writes and checks
(`targets`: the table of what each target maps; `hf`, `hf_modeling`, `gguf_file`; `forward`,
`export_check`).

May import: system, config, core, data.
"""
