"""What the training loop (jaxtrain/train.py) calls around its steps: hooks (`hooks`: the Hook
protocol; `early_stop`, `status`, `tblog`), what a run prints (`console`, `summary`), measures
(`monitor`, `memory`, `estimate`: FLOPs, peaks and memory), evaluates (`sources`: each
source's val loss in a data mixture) and writes (`metrics`).

May import: system, config, core, data, checkpoints, generation.
"""
