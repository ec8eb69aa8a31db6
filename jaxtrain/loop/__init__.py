"""The run's state and its phases, around the loop in jaxtrain/train.py: what a run of a config is,
worked out without a write (`resolution`; `preview` shows it: `--dry_run`), the run's hold on its
workdir and its files (`workdir`), what setup prepares and the loop carries (`state`: `Run`,
`Progress`), the way to the first step (`setup`: hooks, a time budget's plan, checkpoints, init or
restore; `warmup`: what compiles before it), the batches placed ahead (`feed`), the steps' metrics
and the non-finite guard (`step_metrics`), the run's end (`budget`: its `Plan`, and a time
budget's measurement and pace), a budget's model (`autosize`: `model.size=auto`), and how a run
ends (`ending`: the result, the samples, the closing lines).

May import: system, config, core, data, checkpoints, generation, measure, evals, trackers.
"""
