"""small: ~11M-parameter byte-level model on the Python standard library. A GPU, or a patient CPU.

python -m jaxtrain --config=configs/small.py
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/small"
  cfg.seed = 0

  cfg.model.n_layers = 6
  cfg.model.n_heads = 6
  cfg.model.d_model = 384
  cfg.model.seq_len = 256
  cfg.model.vocab_size = 0  # byte tokenizer: 256
  cfg.model.norm = "rmsnorm"
  cfg.model.pos = "rope"
  cfg.model.mlp = "swiglu"
  cfg.model.tie_embeddings = True
  cfg.model.dropout = 0.0

  cfg.train.batch_size = 64
  cfg.train.grad_accum = 1
  cfg.train.max_steps = 5000
  cfg.train.log_every = 20
  cfg.train.eval_every = 500
  cfg.train.eval_steps = 20
  cfg.train.checkpoint_every = 500
  cfg.train.keep_checkpoints = 2

  cfg.optim.lr = 1e-3
  cfg.optim.warmup_steps = 200
  cfg.optim.weight_decay = 0.1
  cfg.optim.clip_norm = 1.0

  cfg.data.path = ""  # the Python standard library's .py files
  cfg.data.tokenizer = "byte"
  return cfg
