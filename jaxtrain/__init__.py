"""jaxtrain: train GPT-style language models with JAX and Flax, from a laptop CPU to many hosts.

The public surface, for notebooks and for unit tests of your own model and step changes:

    import jaxtrain as jt
    cfg = jt.tiny_config()                       # or jt.load_config("nano", **overrides)
    programs = jt.build(cfg, vocab_size=256)     # mesh, optimizer, jitted init/train/eval steps
    state = programs.init()
    state, metrics = programs.train_step(state, programs.place(jt.random_batch(cfg)))

Attributes load on first use, so `import jaxtrain` stays fast. Where things live (each folder's
`__init__` says what it holds and may import; a folder imports only folders listed before it):

    system/       processes, files, locks, signals, errors, the console: no other jaxtrain folder
    config/       every knob with its default, and its validation
    core/         the model, optimizer, pure steps, mesh, and `build` (the compiled programs)
    data/         documents, tokenizers, the chat format, the token cache, batches
    checkpoints/  orbax storage, choosing an intact checkpoint, save/resume, loading, HF weights
    generation/   decoding with a KV cache, completions, chat replies, the samples of a run
    measure/      what a run costs (memory, FLOPs) and how fast it goes
    evals/        the val loss, per-source losses, task scores: in a run and in `jaxtrain.eval`
    trackers/     hooks (`Hook`) and the ones every run has: metrics.jsonl, TensorBoard, W&B, ...
    loop/         the run's state and phases: setup, the feed, a time budget, the ending
    tools/        the commands beside training: sample, export, compare, sweep, eval, chat
    train.py      the loop itself (`jt.run`); __main__.py the `python -m jaxtrain` command
"""

import importlib

from jaxtrain.system import stack, startup

__version__ = "0.1.0"

startup.reexec()  # first of all in `python -m jaxtrain`: its allocator is chosen when it starts
stack.check()  # a flax too old for the installed jax: one line naming the fix, not flax's traceback
startup.early()  # before jax starts, in a notebook or script: the CPU's devices, as the CLI's
del stack, startup  # the public names are _EXPORTS'

_EXPORTS = {
    # configs
    "default_config": "jaxtrain.config.defaults", "load_config": "jaxtrain.config.loading",
    "override": "jaxtrain.config.loading", "validate": "jaxtrain.core.components",
    # your own components (docs/extending.md): registered, then named in the config
    "extend": "jaxtrain.core.components", "attention": "jaxtrain.core.registry",
    "mlp": "jaxtrain.core.registry", "norm": "jaxtrain.core.registry",
    "positions": "jaxtrain.core.registry", "block": "jaxtrain.core.registry",
    "model": "jaxtrain.core.registry", "optimizer": "jaxtrain.core.registry",
    "schedule": "jaxtrain.core.registry", "loss": "jaxtrain.core.registry",
    "Attend": "jaxtrain.core.blocks", "Attention": "jaxtrain.core.blocks",
    "Block": "jaxtrain.core.blocks", "Context": "jaxtrain.core.blocks",
    "Dense": "jaxtrain.core.layers", "decay_mask": "jaxtrain.core.optim",
    "param_groups": "jaxtrain.core.optim",
    # model and optimizer
    "GPT": "jaxtrain.core.model", "ModelConfig": "jaxtrain.core.model",
    "param_count": "jaxtrain.core.model", "flops_per_token": "jaxtrain.core.model",
    "make_optimizer": "jaxtrain.core.optim",
    # pure steps, and the programs a run compiles from them
    "TrainState": "jaxtrain.core.steps", "init_state": "jaxtrain.core.steps",
    "train_step": "jaxtrain.core.steps", "eval_step": "jaxtrain.core.steps",
    "loss_fn": "jaxtrain.core.steps",
    "build": "jaxtrain.core.programs", "Programs": "jaxtrain.core.programs",
    # test helpers
    "tiny_config": "jaxtrain.testing", "model_config": "jaxtrain.testing",
    "init": "jaxtrain.testing", "random_batch": "jaxtrain.testing",
    "split_batch": "jaxtrain.testing", "assert_trees_equal": "jaxtrain.testing",
    "assert_trees_close": "jaxtrain.testing", "restore": "jaxtrain.testing",
    "text_batches": "jaxtrain.data.windows",
    # runs
    "run": "jaxtrain.train", "RunResult": "jaxtrain.trackers.hooks", "Hook": "jaxtrain.trackers.hooks",
    "UserError": "jaxtrain.system.errors", "ConfigError": "jaxtrain.system.errors",
    "compare": "jaxtrain.tools.compare",
    "load_state": "jaxtrain.checkpoints.load", "load_tokenizer": "jaxtrain.checkpoints.load",
    "Checkpoints": "jaxtrain.checkpoints.store",
    "generate": "jaxtrain.generation.decode", "complete": "jaxtrain.generation.complete",
    "chat_reply": "jaxtrain.generation.reply",
    "evaluate": "jaxtrain.evals.scoring",
    "memory_estimate": "jaxtrain.measure.estimate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'jaxtrain' has no attribute {name!r}")


def __dir__():
  return __all__
