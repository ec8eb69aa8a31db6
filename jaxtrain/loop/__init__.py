"""The run's state and its phases, around the loop in jaxtrain/train.py: the state (`state`: what
setup prepares, `Run`, and what the loop carries from step to step, `Progress`), the way to the
first step (`setup`: the workdir, data, programs and hooks; init or restore beside the compiles,
`warmup`: what compiles before the first step, side by side), the batches placed on the devices
ahead of the steps (`feed`), the steps' metrics left on the device until a log line reads them
(`step_metrics`: and the non-finite guard), the end a time budget gives (`budget`), the model
chosen for it with `model.size=auto` (`autosize`), how a run ends (`ending`: the result, the
run's files, the samples, a signal's one line, the closing summary), and what a run would do,
shown without running it (`preview`: `--dry_run`).

May import: system, config, core, data, checkpoints, generation, measure, evals, trackers.
"""
