"""small: ~11M-parameter byte-level model on the Python standard library. A GPU, or a patient CPU.

python -m jaxtrain --config=configs/small.py

Its 5000 steps take minutes on a GPU and hours on a laptop CPU: there, give it the time you have
instead, and the schedule ends on time (docs/time-budget.md):

python -m jaxtrain --config=configs/small.py --jax_platforms=cpu --config.train.time_budget=10m
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/small"

  cfg.model.n_layers = 6
  cfg.model.n_heads = 6
  cfg.model.d_model = 384
  cfg.model.seq_len = 256

  cfg.train.batch_size = 64
  cfg.train.max_steps = 5000
  cfg.train.log_every = 20
  cfg.train.eval_every = 500
  cfg.train.checkpoint_every = 500

  cfg.optim.warmup_steps = 200
  return cfg
