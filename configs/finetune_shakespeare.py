"""finetune_shakespeare: fine-tune a finished nano run (byte-level, so any text fits its vocabulary)
on Tiny Shakespeare, or on any UTF-8 text given by data.path.

python -m jaxtrain --config=configs/nano.py                       # first: the run to start from
python -m jaxtrain --config=configs/finetune_shakespeare.py \
    --config.data.path=path/to/tinyshakespeare.txt [--config.init_from=runs/nano]

The new run starts at step 0 with a fresh optimizer from runs/nano's newest intact checkpoint (or
from a Hugging Face Llama directory that `python -m jaxtrain.export` wrote from it). The model
fields must match the source run's: they are nano's here. Lower learning rate, short warmup and
schedule: the params are trained already. Early stopping ends it once val loss stops improving.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/finetune_shakespeare"
  cfg.init_from = "runs/nano"  # a run's workdir, or an exported Hugging Face directory
  cfg.seed = 0

  # nano's model, so that its params fit.
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
  cfg.train.max_steps = 300
  cfg.train.log_every = 20
  cfg.train.eval_every = 50
  cfg.train.eval_steps = 10
  cfg.train.checkpoint_every = 50
  cfg.train.early_stop_patience = 3  # 3 evaluations (150 steps) without a new best: stop

  cfg.optim.lr = 1e-3  # a third of nano's peak
  cfg.optim.warmup_steps = 20
  cfg.optim.weight_decay = 0.1
  cfg.optim.clip_norm = 1.0

  cfg.data.path = "data/tinyshakespeare.txt"  # any UTF-8 text: --config.data.path=...
  cfg.data.tokenizer = "byte"  # nano's: init_from refuses another tokenizer

  cfg.sample.num_samples = 2
  cfg.sample.max_new_tokens = 200
  cfg.sample.temperature = 0.8
  cfg.sample.prompt = "ROMEO:"
  return cfg
