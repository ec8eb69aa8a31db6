"""What the training loop (jaxtrain/train.py) calls around its steps: hooks (`hooks`: the Hook
protocol; `early_stop`, `status`, `tblog`,
`wandb_log`), what a run prints (`console`, `summary`), measures
(`monitor`, `memory`, `estimate`: FLOPs, peaks and memory) and writes (`metrics`).

May import: system, config, core, data, checkpoints, generation.
"""
