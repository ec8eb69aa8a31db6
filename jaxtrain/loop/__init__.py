"""The run's state and its phases, around the loop in jaxtrain/train.py: what a run of a config is,
worked out without a write (`resolution`: the config settled, the workdir checked, the data read,
the programs built; `--dry_run` shows it), the run's hold on its workdir and the files that say
what the run is (`workdir`), the state (`state`: what setup prepares, `Run`, and what the loop
carries from step to step, `Progress`), the way to the first step (`setup`: hooks, a time budget's
plan, checkpoints; init or restore beside the compiles, `warmup`: what compiles before the first
step, side by side), the batches placed on the devices ahead of the steps (`feed`), the steps'
metrics left on the device until a log line reads them (`step_metrics`: and the non-finite guard),
the end a time budget gives (`budget`) and the model chosen for it with
`model.size=auto` (`autosize`), how a run ends (`ending`: the result, the samples, a
signal's one line, the closing summary), and what a run would do, shown without running it
(`preview`: `--dry_run`).

May import: system, config, core, data, checkpoints, generation, measure, evals, trackers.
"""
