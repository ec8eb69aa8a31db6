"""nano: a ~0.27M-parameter byte-level model of the Python standard library's source, CPU-sized.

python -m jaxtrain --config=configs/nano.py --jax_platforms=cpu

Tuned for val bits per byte at ~11.6 TFLOP (a minute or two of a 2-core CPU): 2 layers 96 wide
trained for more steps beat 2 x 128 and 5 layers at the same FLOPs
(benchmarks/results/2026-11-22-quality-nano/, 2026-11-24-quality-zen4-zloss/), Muon on the
blocks' matrices, warmup then a straight decay to zero, an untied head, output projections that
start at zero. A BPE vocabulary learns more per FLOP still (--config.data.tokenizer=bpe
--config.data.vocab_size=1024), at the cost of training it first. It keeps the
Llama layout (RMSNorm, RoPE, SwiGLU, no QK-norm), so `python -m jaxtrain.export` writes it as
transformers' own LlamaForCausalLM.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/nano"

  cfg.model.n_layers = 2
  cfg.model.d_model = 96
  cfg.model.n_heads = 3
  cfg.model.tie_embeddings = False
  cfg.model.zero_init_out = True

  cfg.train.max_steps = 2800
  cfg.train.log_every = 20
  cfg.train.eval_every = 400
  cfg.train.eval_steps = 10
  cfg.train.checkpoint_every = 400

  cfg.optim.name = "muon"
  cfg.optim.matrix_lr = 0.04  # Muon, the blocks' matrices
  cfg.optim.lr = 1e-2  # AdamW: embeddings, head, norms
  cfg.optim.schedule = "wsd"
  cfg.optim.decay_fraction = 1.0  # after warmup, a straight line down...
  cfg.optim.min_lr_ratio = 0.0  # ...to zero
  cfg.optim.warmup_steps = 30
  cfg.optim.b2 = 0.99

  cfg.sample.max_new_tokens = 200
  return cfg
