"""shakespeare_char_gpu: nanoGPT's GPU Shakespeare shape (6 x 384, context 256, batch 64) on one GPU.

python -m jaxtrain --config=configs/shakespeare_char_gpu.py --config.data.path=path/to/input.txt

nanoGPT's config/train_shakespeare_char.py trains this shape for 5000 iterations with AdamW and
dropout 0.2; this recipe keeps the shape and its dropout (the text is small: without it the model
overfits) and adds what trains faster per step in configs/shakespeare_char.py: Muon on the hidden
matrices, a warmup then a linear decay to zero, QK-norm, ReLU^2 MLPs, an untied head, output
projections that start at zero, and bfloat16 compute. Its step count has not yet been tuned on a
GPU: benchmarks/gpu_side_by_side.py measures its wall time to nanoGPT's final val loss.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/shakespeare_char_gpu"

  cfg.model.n_layers = 6
  cfg.model.n_heads = 6
  cfg.model.d_model = 384
  cfg.model.seq_len = 256
  cfg.model.mlp = "relu2"
  cfg.model.qk_norm = True
  cfg.model.tie_embeddings = False
  cfg.model.zero_init_out = True
  cfg.model.dropout = 0.2
  cfg.model.dtype = "bfloat16"

  cfg.train.batch_size = 64
  cfg.train.max_steps = 2500
  cfg.train.log_every = 50
  cfg.train.eval_every = 250
  cfg.train.checkpoint_every = 2500

  cfg.optim.name = "muon"
  cfg.optim.lr = 6e-3  # AdamW: embeddings, head, norms
  cfg.optim.schedule = "wsd"
  cfg.optim.decay_fraction = 1.0  # after warmup, a straight line down...
  cfg.optim.min_lr_ratio = 0.0  # ...to zero
  cfg.optim.b2 = 0.99

  cfg.data.path = "<required>"  # any UTF-8 text file, e.g. Tiny Shakespeare: --config.data.path=...
  cfg.data.tokenizer = "char"
  return cfg
