"""shakespeare_char_nanogpt: nanoGPT's CPU recipe for Tiny Shakespeare, for speed comparisons.

python -m jaxtrain --config=configs/shakespeare_char_nanogpt.py --config.data.path=path/to/input.txt

nanoGPT's shape and layout (4 layers of 128, 4 heads, context 64, batch 12, 2000 iterations,
LayerNorm, learned positions, GELU, tied embeddings; jaxtrain has no biases), AdamW with warmup
and cosine decay. The first 90% of the characters train, the last 10% validate.
configs/shakespeare_char.py is the recipe that learns most in the same wall time.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/shakespeare_char_nanogpt"

  cfg.model.seq_len = 64
  cfg.model.norm = "layernorm"
  cfg.model.pos = "learned"
  cfg.model.mlp = "gelu"

  cfg.train.batch_size = 12
  cfg.train.max_steps = 2000
  cfg.train.log_every = 50
  cfg.train.eval_every = 250
  cfg.train.checkpoint_every = 500

  cfg.optim.b2 = 0.99  # small batches: a shorter second-moment memory

  cfg.data.path = "<required>"  # any UTF-8 text file, e.g. Tiny Shakespeare: --config.data.path=...
  cfg.data.tokenizer = "char"  # the characters of the text (65 for Tiny Shakespeare)

  cfg.sample.num_samples = 2
  cfg.sample.max_new_tokens = 300
  return cfg
