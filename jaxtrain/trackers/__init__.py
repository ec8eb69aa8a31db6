"""Hooks: what watches a run from outside the loop through the `Hook` protocol (`hooks`: `Hook`,
what a hook sees at the start, `RunView`, and at the end, `RunResult`; `Hooks`, what the loop
calls), and the hooks a run has (`standard`): the records file (`metrics_jsonl`: metrics.jsonl and
its loss plot), TensorBoard (`tensorboard_log`; its event files: `tfevents`), Weights & Biases
(`wandb_log`), the run's state for compare and sweep (`status`: status.json), early stopping
(`early_stop`) and a profile of a few steps (`profile`). Early stopping and profiling live here
too: they see the run only through the protocol, as any hook of a user's does, and the config
attaches them as it attaches W&B.

May import: system, config, core.
"""
