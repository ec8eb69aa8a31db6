"""finetune_shakespeare: fine-tune a finished jaxtrain run on Tiny Shakespeare, or on any UTF-8 text
given by data.path.

python -m jaxtrain --config=configs/nano.py                       # first: the run to start from
python -m jaxtrain --config=configs/finetune_shakespeare.py \
    --config.data.path=path/to/tinyshakespeare.txt [--config.init_from=runs/nano]

The new run starts at step 0 with a fresh optimizer from the source run's newest intact checkpoint
(or from a Hugging Face directory that `python -m jaxtrain.export` wrote from it). This file sets no
model field: each `model.*` field not set on the command line takes the source run's value (from its
config.json, recorded in this run's). A `--config.model.*` that changes the params' shapes or
meaning is refused with every differing field named. The data must use the source's tokenizer
(byte for nano). Short warmup and schedule: the params are trained already; early stopping ends the
run once val loss stops improving.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/finetune_shakespeare"
  cfg.init_from = "runs/nano"  # a run's workdir, or an exported Hugging Face directory

  cfg.train.max_steps = 300
  cfg.train.log_every = 20
  cfg.train.eval_every = 50
  cfg.train.eval_steps = 10
  cfg.train.checkpoint_every = 50
  cfg.train.early_stop_patience = 3  # 3 evaluations (150 steps) without a new best: stop

  cfg.optim.warmup_steps = 20  # short: the params are trained already

  cfg.data.path = "<required>"  # any UTF-8 text, e.g. Tiny Shakespeare: --config.data.path=...

  cfg.sample.num_samples = 2
  cfg.sample.max_new_tokens = 200
  cfg.sample.prompt = "ROMEO:"
  return cfg
