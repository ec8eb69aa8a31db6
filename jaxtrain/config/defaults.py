"""Every field of a run's config: what it is, its default, the values it may take, and what a few
of them mean together (`mlp_width`, `dynamic_loss_scaling`, `higher_is_better`).

`configs/*.py` start from `default_config()` and set only what differs from it
(tests/test_config_files.py checks it). `default_config()` is locked: a name it lacks (a typo)
fails where it is written, and `loading.load_config` names the file, the line and the nearest field.
"""

import math

import ml_collections

import jaxtrain.config.extensions as extensions  # the module, not the package's __init__

# model.norm, pos, mlp, attention_variant, block, arch, optim.name, schedule and loss_term name
# components of a registry (core/registry.py), built-in or an extension's (`extend`): no list here.
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION = ("auto", "xla", "cudnn")  # the attention kernel (model.attention), not a component
SIZES = ("", "auto")
TOKENIZERS = ("byte", "char", "bpe", "gpt2")  # or the path of a tokenizer.json
DATA_FORMATS = ("auto", "text", "uint16", "llmc")
LOSS_SCALING = ("auto", "dynamic", "off")
REMATS = ("none", "dots", "full")
WANDB_MODES = ("online", "offline")
GROUP_STATS = ("groups", "layers", "none")
# train.eval_tasks' numbers, task/<file stem>/<metric>; accuracies are better higher, losses lower.
TASK_METRICS = ("loss", "bpb", "exact_match", "mc_accuracy")
HIGHER_IS_BETTER = ("exact_match", "mc_accuracy")
LORA_TARGETS = ("qkv", "out", "up", "down")  # each block's attention and MLP linear layers
# data.path of a recipe that trains on the user's own file: a run not given one stops before any
# work, saying what the file holds and where to get one (validate.py).
REQUIRED = "<required>"
TINY_SHAKESPEARE = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


_DEFAULTS = dict(
    workdir="runs/default",  # checkpoints, metrics.jsonl, config.json, samples.txt
    seed=0,  # params, dropout and the order of training windows all follow from it
    headless=False,  # True: one plain log line per train.log_every steps instead of a bar
    # A new run starts from these params (then step 0, a fresh optimizer): a jaxtrain run's workdir
    # (its newest intact checkpoint) or a Hugging Face Llama/GPT-2 directory; "": a random init.
    init_from="",
    # Python files (my_ideas.py) or importable modules, comma-separated, whose code registers
    # components with jaxtrain's decorators (@jt.mlp("name"), ...: docs/extending.md); the fields
    # below that name a component then take theirs. "": the built-in components only.
    extend="",
    allow_changed_extend=False,  # True: resume even though an extension's code changed since
    finetune=dict(
        # > 0: LoRA; only low-rank adapters (A [d_in, r], B [r, d_out]) beside each targeted layer
        # train, and have optimizer state; the base params stay as init_from gave them. 0: off
        lora_rank=0,
        lora_alpha=16.0,  # an adapter adds (lora_alpha / lora_rank) * x A B to x W
        lora_targets="qkv,out",  # layers of each block that get adapters: qkv, out, up, down
    ),
    model=dict(
        # "auto": with train.time_budget, depth, width, heads, context, batch and learning rates are
        # chosen for the budget, this machine's speed and the corpus (loop/autosize.py); fields given on
        # the command line are kept. "": the model as set.
        size="",
        n_layers=4,
        n_heads=4,
        d_model=128,
        seq_len=128,  # context length in tokens
        vocab_size=0,  # 0: take it from the tokenizer (256 for byte, corpus size for char)
        # The components, each a name of the registry: a built-in one or an extension's (`extend`)
        norm="rmsnorm",  # rmsnorm | layernorm (neither has a bias)
        pos="rope",  # rope | learned | none (no positions: the causal mask alone tells order)
        mlp="swiglu",  # swiglu | gelu | relu2 (relu(x)^2, ungated)
        attention_variant="causal",  # causal: softmax attention over every earlier position
        block="prenorm",  # prenorm: x + attention(norm(x)), then x + mlp(norm(x))
        arch="gpt",  # the whole model: gpt (embeddings, model.n_layers blocks, a final norm, head)
        mlp_ratio=4.0,  # hidden width / d_model for gelu; swiglu uses 2/3 of it (same params)
        tie_embeddings=True,  # output projection shares the token embedding
        dropout=0.0,
        rope_theta=10000.0,
        dtype="float32",  # compute dtype; params and optimizer state stay float32
        # The kernel of the causal attention: auto | xla | cudnn ("auto": cudnn on GPU when it applies)
        attention="auto",
        n_kv_heads=0,  # key/value heads; 0: n_heads; a divisor of n_heads: grouped-query
        qk_norm=False,  # True: queries and keys scaled to unit RMS per head
        zero_init_out=False,  # True: attention and MLP output projections start at zero
        doc_mask=False,  # True: tokens attend only within their document (else packed)
        # Memory for compute: what each block keeps for the backward pass; none: everything, dots: its
        # matmul outputs (the rest is recomputed), full: its input only (the block runs twice)
        remat="none",
        x0_mix=False,  # True: each layer after the first adds a learned multiple of the embeddings
        canon=0,  # > 0: causal depthwise convolutions this wide before attention and the MLP
        loss_chunk=0,  # > 0: cross-entropy this many tokens at a time (no whole-batch logits)
        # True: logits in the compute dtype, their gradient written in the same pass (no float32 logits)
        fused_loss=False,
    ),
    train=dict(
        batch_size=16,  # sequences per micro-batch, over all devices and processes
        grad_accum=1,  # micro-batches per optimizer step (optax.MultiSteps)
        max_steps=1000,  # optimizer steps
        time_budget="",  # e.g. "10m": train that long; the run then chooses max_steps (loop/budget.py)
        log_every=10,
        eval_every=200,
        eval_steps=20,  # validation batches per evaluation (the same batches every time)
        checkpoint_every=200,
        keep_checkpoints=2,  # the latest ones; the best by val loss is kept on top
        skip_nonfinite=False,  # True: drop updates whose loss or gradients are inf/nan
        # True: the same numbers on every rerun and resume on GPUs too (XLA's deterministic ops and
        # attention; slower). CPU steps are deterministic either way.
        deterministic=False,
        early_stop_patience=0,  # stop after this many evaluations without a new best; 0: off
        # What early stopping watches: val_loss, val_bpb or a task metric (task/<stem>/exact_match, ...)
        early_stop_metric="val_loss",
        # Held-out .jsonl files ("a.jsonl,b.jsonl") scored at every evaluation: task/<file stem>/loss,
        # bpb, exact_match (greedy completions), mc_accuracy; "": none
        eval_tasks="",
        eval_tasks_limit=64,  # records of each file scored (its first ones); 0: all
        profile_steps=0,  # > 0: a jax.profiler trace of this many steps, into workdir/profile/
    ),
    optim=dict(
        name="adamw",  # adamw | muon (Muon on hidden matrices, AdamW on the rest)
        schedule="cosine",  # cosine | wsd (warmup, stable, linear decay) | constant
        lr=1e-3,  # peak learning rate, after warmup (with muon: norms and other vectors)
        min_lr_ratio=0.1,  # cosine or wsd decay ends at lr * min_lr_ratio
        decay_fraction=0.2,  # wsd: the last fraction of the steps decays linearly
        matrix_lr=0.02,  # muon: peak lr of the hidden matrices
        momentum=0.95,  # muon: momentum of the hidden matrices (Nesterov)
        muon_ns_steps=5,  # muon: Newton-Schulz iterations that orthogonalize each update
        warmup_steps=100,
        decay_steps=0,  # 0: decay over train.max_steps
        weight_decay=0.1,  # on matrices only; never on norms or vectors
        z_loss=0.0,  # adds z_loss x mean(log Z^2) of the logits to the training loss; 0: off
        loss_term="",  # an extension's loss term (@jt.loss) added to the training loss; "": none
        clip_norm=1.0,  # gradient norm limit; 0 turns clipping off
        b1=0.9,
        b2=0.95,
        eps=1e-8,
        loss_scaling="auto",  # auto (dynamic for float16, else off) | dynamic | off
    ),
    data=dict(
        # text, .jsonl or .parquet files: a file, directory or glob; "": Python's stdlib; "<required>":
        # the user's to give (a recipe's data)
        path="",
        # What data.path's files are: auto (token ids where all are .bin files, or nanoGPT's train.bin
        # and val.bin are: llm.c's shards where they have its header, else flat uint16; else text) |
        # text | uint16 (flat uint16 ids, nanoGPT's .bin) | llmc (llm.c's shards)
        format="auto",
        mixture="",  # "books/*.txt:3,notes.jsonl:1": sources (as data.path) drawn by weight; "": off
        text_field="text",  # the .jsonl field or .parquet column that holds each document
        # Both set: prompt/completion records (.jsonl/.parquet), each one document (prompt, completion,
        # end-of-text); only completions (and their end-of-text) count in the loss and in val_loss.
        prompt_field="",
        completion_field="",
        # Set: chat records (.jsonl/.parquet), this field a list of {"role", "content"} messages, in the
        # chat format of jaxtrain/data/chat_format.py; only assistant turns count in the loss. "": off.
        messages_field="",
        tokenizer="byte",  # byte | char | bpe (trained on the corpus) | gpt2 | a tokenizer.json path
        vocab_size=4096,  # tokens of the bpe vocabulary, end-of-text included (>= 257)
        val_fraction=0.1,  # the last part of the token stream is held out for validation
        cache_dir="",  # tokenized corpora; "": $JAXTRAIN_CACHE or ~/.cache/jaxtrain
        allow_changed=False,  # True: resume even though the data differs from the run's
    ),
    sample=dict(
        num_samples=3,  # printed and written to workdir/samples.txt at the end
        max_new_tokens=256,
        temperature=0.8,
        top_k=0,  # 0: sample from the whole distribution
        prompt="",  # "": start from a random stretch of validation text
    ),
    mesh=dict(
        data=-1,  # data-parallel axis size; -1: all devices left after the other axes
        fsdp=1,  # params and optimizer state sharded over this many devices
        cpu_devices=0,  # on CPU: XLA devices to split the cores into; 0: auto; 1: one
    ),
    distributed=dict(
        coordinator_address="",  # host:port of process 0; "": single process or Slurm
        num_processes=0,  # 0: from the environment (Slurm) or 1
        process_id=-1,  # -1: from the environment (Slurm) or 0
        timeout_s=300,  # how long to wait for every process to join, or for a silent one
    ),
    log=dict(
        # Per-group gradient norm, param norm and update/param ratio every train.log_every steps:
        # groups (embedding, attention, mlp, norms, head) | layers (each block's groups apart) | none
        group_stats="groups",
        wandb=False,  # True: also log to Weights & Biases (pip install 'jaxtrain[wandb]')
        wandb_project="jaxtrain",  # $WANDB_PROJECT wins
        wandb_mode="online",  # online | offline (sync later: wandb sync); $WANDB_MODE wins
    ),
)


# The options of the extension components registered in this process: ext.<component>.<option>,
# filled as they register (core/registry.py), so that a config of theirs is validated, shown and
# set as any other field is.
_EXT: dict[str, dict] = {}


def declare_options(component: str, options: dict) -> None:
  """Makes `options` ({name: default}) fields of every config from now on, as ext.<component>."""
  _EXT[component] = dict(options)


def default_config(extend: str = "") -> ml_collections.ConfigDict:
  """Every field at its default. `extend`: the user's files (or modules) to load first, so that
  their components' options are fields too, and `extend` set to them (a config file that sets
  `cfg.ext.<component>.<option>` starts from `default_config(extend="my_ideas.py")`)."""
  if extend:
    extensions.load(extend)
  # New fields: only in _DEFAULTS (or an extension's options); any other name fails.
  ext = {k: dict(v) for k, v in _EXT.items()}
  return ml_collections.ConfigDict({**_DEFAULTS, "extend": extend, "ext": ext}).lock()


def higher_is_better(metric: str) -> bool:
  """Whether a larger value of a metric (val_loss, task/<stem>/exact_match, ...) is better."""
  return metric.rsplit("/", 1)[-1] in HIGHER_IS_BETTER


def mlp_width(mlp: str, mlp_ratio: float, d_model: int) -> int:
  """The MLP's hidden width. SwiGLU has three matrices instead of two: 2/3 of the width keeps the
  parameter count, rounded up to a multiple of 8."""
  if mlp != "swiglu":
    return int(mlp_ratio * d_model)
  return 8 * math.ceil(2 / 3 * mlp_ratio * d_model / 8)


def dynamic_loss_scaling(loss_scaling: str, dtype: str) -> bool:
  """Whether `optim.loss_scaling` turns dynamic loss scaling on for compute in `dtype`."""
  if loss_scaling == "auto":
    return dtype == "float16"
  return loss_scaling == "dynamic"
