"""shakespeare_char: the character-level recipe that learns most per FLOP on a 2-core CPU.

python -m jaxtrain --config=configs/shakespeare_char.py --config.data.path=path/to/input.txt

The first 90% of the characters train, the last 10% validate. It trains as many FLOPs as nanoGPT's
CPU recipe (configs/shakespeare_char_nanogpt.py keeps that shape) in another shape: 2 layers 96
wide, context 128, batch 24, with a short causal convolution before attention and before the MLP
(each position sees the 3 before it directly) and the token embeddings mixed into the second
layer's input. From small-model speedruns: Muon on the hidden matrices (AdamW on embeddings, head,
norms and convolutions), warmup then a linear decay to zero, QK-norm, ReLU^2 MLPs, an untied head,
output projections that start at zero, and a small z-loss. To train for a time instead of a step
count: --config.train.time_budget=90s. The ablations and the side-by-side runs: benchmarks/results/
(the dated quality and flops folders).
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/shakespeare_char"

  cfg.model.n_layers = 2  # at equal FLOPs, 2 x 96 beats 2 x 128, 3 x 96 and 4 x 64
  cfg.model.d_model = 96
  cfg.model.n_heads = 3
  cfg.model.canon = 4  # each position sees the 3 before it before attention and the MLP
  cfg.model.x0_mix = True
  cfg.model.mlp = "relu2"
  cfg.model.qk_norm = True
  cfg.model.tie_embeddings = False
  cfg.model.zero_init_out = True

  cfg.train.batch_size = 24
  cfg.train.max_steps = 1400  # 7.9 TFLOP: nanoGPT's CPU recipe trains 7.93
  cfg.train.log_every = 20
  cfg.train.eval_every = 250
  cfg.train.checkpoint_every = 250

  cfg.optim.name = "muon"
  cfg.optim.matrix_lr = 0.04  # Muon, the blocks' matrices
  cfg.optim.lr = 1e-2  # AdamW: embeddings, head, norms, convolutions
  cfg.optim.schedule = "wsd"
  cfg.optim.decay_fraction = 1.0  # after warmup, a straight line down...
  cfg.optim.min_lr_ratio = 0.0  # ...to zero
  cfg.optim.warmup_steps = 30
  cfg.optim.b2 = 0.99  # small batches: a shorter second-moment memory
  cfg.optim.z_loss = 1e-4  # val 0.004-0.008 lower on each seed it was paired on

  cfg.data.path = "<required>"  # any UTF-8 text file, e.g. Tiny Shakespeare: --config.data.path=...
  cfg.data.tokenizer = "char"  # the characters of the text, plus end-of-text

  cfg.sample.num_samples = 2
  cfg.sample.max_new_tokens = 300
  return cfg
