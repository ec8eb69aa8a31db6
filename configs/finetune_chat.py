"""finetune_chat: teach a model to chat from chat records (.jsonl or .parquet).

python -m jaxtrain --config=configs/finetune_chat.py --config.data.path=examples/finetune/chats.jsonl \
    [--config.init_from=runs/nano]
python -m jaxtrain.chat --workdir=runs/chat
python -m jaxtrain.export --workdir=runs/chat --out=hf/chat

Each record `{"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}]}` is
one document in the chat format (docs/finetune.md, Chat): each message its role's token, its
content and <|end|>. Only the assistant turns (their content and <|end|>) count in the loss and in
val_loss/val_bpb; records packed into one window do not see each other (document masks). From a
text run (init_from) the four chat tokens get new embeddings at the mean of the source's. A
context of 256 tokens holds a few turns of byte-level text. Only what differs from
default_config() is set here.
"""

from jaxtrain.config import default_config


def get_config():
  cfg = default_config()
  cfg.workdir = "runs/chat"
  cfg.data.path = "<required>"  # the user's records: --config.data.path=...
  cfg.data.messages_field = "messages"
  cfg.model.seq_len = 256
  cfg.train.max_steps = 500
  cfg.train.eval_every = 100
  cfg.train.checkpoint_every = 100
  cfg.train.early_stop_patience = 3  # stop once val loss on assistant turns stops improving
  cfg.optim.warmup_steps = 20
  cfg.sample.num_samples = 0  # unconditional samples say little here; python -m jaxtrain.chat does
  return cfg
