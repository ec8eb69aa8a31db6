"""finetune_task: teach a model a task from prompt/completion records (.jsonl or .parquet).

python -m jaxtrain --config=configs/finetune_task.py --config.data.path=examples/finetune/routes.jsonl \
    [--config.init_from=runs/nano]
python -m jaxtrain.sample --workdir=runs/task --prompts=examples/finetune/prompts.jsonl --temperature=0
python -m jaxtrain.eval --workdir=runs/task --data=examples/finetune/held_out.jsonl --out=runs/task/eval.json

With --config.train.eval_tasks=examples/finetune/held_out.jsonl the same task scores
(task/held_out/exact_match, ...) come at every evaluation of the run, and
--config.train.early_stop_metric=task/held_out/exact_match stops it once exact match stops rising.

Each record `{"prompt": ..., "completion": ...}` is one document: its prompt, its completion and
an end-of-text token. Only the completions (and their end-of-text) count in the loss and in
val_loss/val_bpb; records packed into one window do not see each other (document masks). See
docs/finetune.md. Only what differs from default_config() is set here.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/task"
  cfg.data.path = "<required>"  # the user's records: --config.data.path=...
  cfg.data.prompt_field = "prompt"
  cfg.data.completion_field = "completion"
  cfg.train.max_steps = 500
  cfg.train.eval_every = 100
  cfg.train.checkpoint_every = 100
  cfg.train.early_stop_patience = 3  # stop once val loss on completions stops improving
  cfg.optim.warmup_steps = 20
  cfg.sample.num_samples = 0  # unconditional samples say little here; sample --prompts does
  return cfg
