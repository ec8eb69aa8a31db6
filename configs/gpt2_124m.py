"""gpt2_124m: the GPT-2 small shape (12 layers, 12 heads, 768 wide, 1024 context). GPU scale.

python -m jaxtrain --config=configs/gpt2_124m.py --jax_platforms=cuda

The tokenizer is a byte-level BPE of GPT-2's 50257 tokens, trained once on the training split
of the data (cached); the embedding is padded to 50304 rows so that parameters (124M) and FLOPs
match GPT-2 small. With GPT-2's own tokenizer.json at hand, pass
--config.data.tokenizer=path/to/tokenizer.json instead.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/gpt2_124m"

  cfg.model.n_layers = 12
  cfg.model.n_heads = 12
  cfg.model.d_model = 768
  cfg.model.seq_len = 1024
  cfg.model.vocab_size = 50304
  cfg.model.norm = "layernorm"
  cfg.model.pos = "learned"
  cfg.model.mlp = "gelu"
  cfg.model.dtype = "bfloat16"  # compute; params and optimizer state stay float32
  # The cross-entropy from bfloat16 logits, their gradient written in the same pass (core/loss.py):
  # never 3.3 GB of float32 logits at 16 x 1024 x 50304; gpu_side_by_side.py's variants A/B it
  cfg.model.fused_loss = True

  cfg.train.grad_accum = 8  # 16 x 1024 x 8 = 131k tokens per optimizer step
  cfg.train.max_steps = 20000
  cfg.train.eval_every = 500
  cfg.train.checkpoint_every = 1000

  cfg.optim.lr = 6e-4
  cfg.optim.warmup_steps = 700

  cfg.data.tokenizer = "bpe"
  cfg.data.vocab_size = 50257  # GPT-2's count: 256 bytes, 50000 merges, end-of-text
  return cfg
