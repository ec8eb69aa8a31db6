"""jaxtrain: train GPT-style language models with JAX and Flax, from a laptop CPU to many hosts.

The public surface, for notebooks and for unit tests of your own model and step changes:

    import jaxtrain as jt
    cfg = jt.tiny_config()                       # or jt.load_config("configs/nano.py", **overrides)
    programs = jt.build(cfg, vocab_size=256)     # mesh, optimizer, jitted init/train/eval steps
    state = programs.init()
    state, metrics = programs.train_step(state, programs.place(jt.random_batch(cfg)))

Attributes load on first use, so `import jaxtrain` stays fast.
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # configs
    "default_config": "jaxtrain.config", "load_config": "jaxtrain.config",
    "override": "jaxtrain.config", "validate": "jaxtrain.validation",
    # model and optimizer
    "GPT": "jaxtrain.model", "ModelConfig": "jaxtrain.model", "param_count": "jaxtrain.model",
    "flops_per_token": "jaxtrain.model", "make_optimizer": "jaxtrain.optim",
    # pure steps, and the programs a run compiles from them
    "TrainState": "jaxtrain.steps", "init_state": "jaxtrain.steps", "train_step": "jaxtrain.steps",
    "eval_step": "jaxtrain.steps", "loss_fn": "jaxtrain.steps",
    "build": "jaxtrain.programs", "Programs": "jaxtrain.programs",
    # test helpers
    "tiny_config": "jaxtrain.testing", "model_config": "jaxtrain.testing",
    "init": "jaxtrain.testing", "random_batch": "jaxtrain.testing",
    "split_batch": "jaxtrain.testing", "assert_trees_equal": "jaxtrain.testing",
    "assert_trees_close": "jaxtrain.testing",
    # runs
    "run": "jaxtrain.train", "RunResult": "jaxtrain.train", "Hook": "jaxtrain.train",
    "load_state": "jaxtrain.checkpoint",
    "load_tokenizer": "jaxtrain.checkpoint", "Checkpoints": "jaxtrain.checkpoint",
    "generate": "jaxtrain.sample",
    "memory_estimate": "jaxtrain.estimate",
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
