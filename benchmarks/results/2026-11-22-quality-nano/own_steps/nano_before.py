"""nano: ~1M-parameter (1.02M) byte-level model on the Python standard library's source, CPU-sized.

python -m jaxtrain --config=configs/nano.py --jax_platforms=cpu
"""

from jaxtrain.config.defaults import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/nano"
  cfg.seed = 0

  cfg.model.n_layers = 5
  cfg.model.n_heads = 4
  cfg.model.d_model = 128
  cfg.model.seq_len = 128
  cfg.model.vocab_size = 0  # byte tokenizer: 256
  cfg.model.norm = "rmsnorm"
  cfg.model.pos = "rope"
  cfg.model.mlp = "swiglu"
  cfg.model.tie_embeddings = True
  cfg.model.dropout = 0.0

  cfg.train.batch_size = 16
  cfg.train.grad_accum = 1
  cfg.train.max_steps = 1000
  cfg.train.log_every = 20
  cfg.train.eval_every = 250
  cfg.train.eval_steps = 10
  cfg.train.checkpoint_every = 250
  cfg.train.keep_checkpoints = 2

  cfg.optim.lr = 3e-3
  cfg.optim.warmup_steps = 50
  cfg.optim.weight_decay = 0.1
  cfg.optim.clip_norm = 1.0

  cfg.data.path = ""  # the Python standard library's .py files, already on this machine
  cfg.data.tokenizer = "byte"

  cfg.sample.num_samples = 3
  cfg.sample.max_new_tokens = 200
  cfg.sample.temperature = 0.8
  return cfg
