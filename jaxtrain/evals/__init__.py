"""Evaluation, in a training run and of a saved one: what a run scores at each evaluation and when
(`validation`: the val loss on the same placed batches, each mixture source's, and the task scores;
`Validation.should_eval`), the task files of `train.eval_tasks` read and checked at setup and
scored at each evaluation (`tasks`), and the task scores themselves (`scoring`: loss, bpb, exact
match, multiple-choice accuracy of held-out records), also for `python -m jaxtrain.eval`
(`score_run`, `table`; the command's flags are tools/eval.py's).

May import: system, config, core, data, checkpoints, generation, measure.
"""
