"""What the training loop (jaxtrain/train.py) calls around its steps: hooks (`hooks`: the Hook
protocol; `early_stop`, `profile`, `status`, `tblog`, `wandb_log`), what a run prints (`console`,
`summary`), measures (`monitor`, `memory`, `estimate`: FLOPs, peaks and memory; `budget`: the
steps a time budget holds; `progress`: what the loop carries from step to step), feeds (`feed`:
batches placed on the devices ahead of the steps), evaluates
(`sources`: each source's val loss in a data mixture; `tasks`: `train.eval_tasks`' task scores)
and writes (`metrics`), and how it ends (`ending`: the result, the run's files, the samples, an
interrupt's one line).

May import: system, config, core, data, checkpoints, generation.
"""
