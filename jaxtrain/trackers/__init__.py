"""Hooks: what watches a run from outside the loop through the `Hook` protocol (`hooks`: `Hook`,
`RunView`, `RunResult`; `Hooks`, what the loop calls), and the hooks a run has (`standard`):
metrics.jsonl and its loss plot (`metrics_jsonl`), TensorBoard (`tensorboard_log`, `tfevents`),
Weights & Biases (`wandb_log`), status.json for compare and sweep (`status`), early stopping
(`early_stop`) and a profile of a few steps (`profile`): these two see the run only through the
protocol, as a user's hook does.

May import: system, config, core.
"""
