"""finetune_lora: teach a trained model a task from prompt/completion records with LoRA: only
low-rank adapters beside the attention projections train, the model's own params stay as they are.

python -m jaxtrain.export --workdir=runs/nano --out=hf/nano   # or any Llama/GPT-2 directory
python -m jaxtrain --config=configs/finetune_lora.py --config.data.path=examples/finetune/routes.jsonl \
    [--config.init_from=hf/nano|runs/nano]
python -m jaxtrain.eval --workdir=runs/lora --data=examples/finetune/held_out.jsonl
python -m jaxtrain.export --workdir=runs/lora --out=hf/lora   # adapters merged: a plain model

The model fields come from the source (the Hugging Face config.json, or the run's config.json);
the data must use its tokenizer (byte for nano). Each adapter adds (lora_alpha / lora_rank) x A B
to its layer; A and B (and their AdamW moments) are all that trains and all the optimizer
holds. See docs/finetune.md. Only what differs from default_config() is set here.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/lora"
  cfg.init_from = "hf/nano"  # a Hugging Face Llama/GPT-2 directory, or a run's workdir
  cfg.finetune.lora_rank = 8
  cfg.data.path = "<required>"  # the user's records: --config.data.path=...
  cfg.data.prompt_field = "prompt"
  cfg.data.completion_field = "completion"
  cfg.train.max_steps = 500
  cfg.train.eval_every = 100
  cfg.train.checkpoint_every = 100
  cfg.train.early_stop_patience = 3  # stop once val loss on completions stops improving
  cfg.optim.lr = 3e-3  # adapters start at zero: a higher lr than a full fine-tune's
  cfg.optim.warmup_steps = 20
  cfg.sample.num_samples = 0  # unconditional samples say little here; sample --prompts does
  return cfg
