"""`model.size="auto"`: the model's shape chosen for the run's time budget, before jax starts
(the chosen batch decides how the CPU is split into devices), and said in the run's first lines.

A new run reads its corpus and this machine's speed model (measure/speed_probe.py) and lets
measure/size_rule.py choose for the time left of the budget. The fields it sets (`FIELDS`) go
into config.json like any other, so a resumed run takes them from there and never chooses again.
A field the user set (`explicit`) is kept and the rest chosen around it; where no candidate fits
it, that is one `error:` line.
"""

import time
from collections.abc import Callable, Collection
from pathlib import Path

import ml_collections

from jaxtrain.config import loading, validate
from jaxtrain.core import model as model_lib
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenizer
from jaxtrain.loop import budget
from jaxtrain.measure import size_rule, speed_probe
from jaxtrain.system import allocator, fmt, paths
from jaxtrain.system.errors import ConfigError

# Learning rates of the recipe the law was fitted with (configs/shakespeare_char.py): Muon's
# update has the same size at every width (its LR transfers across widths), and the AdamW groups'
# 1e-2 was a flat optimum in its ablations (benchmarks/results/2026-11-24-quality-zen4-zloss/).
LRS = {"optim.matrix_lr": 0.04, "optim.lr": 1e-2}
FIELDS = (*size_rule.SHAPE_FIELDS, *LRS)
CONTEXT, BATCH = 128, 24  # the recipe's: context 192-256 at the same tokens per step was no better


def platform() -> str:
  """The platform the run will use, before jax starts: the first of --jax_platforms, else a GPU
  where CUDA is installed."""
  import jax

  first = (jax.config.jax_platforms or "").split(",")[0]
  return first or ("gpu" if allocator.cuda_installed() else "cpu")


def resolve(cfg: ml_collections.ConfigDict, explicit: Collection[str] = (),
            say: Callable[[str], None] = print,
            t_start: float | None = None) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(`cfg` with the chosen fields set, the lines that say what was chosen and why); `cfg`
  itself where model.size is not "auto". `t_start`: when the budget's clock started (default:
  the process's start)."""
  if cfg.model.size != "auto":
    return cfg, []
  workdir = Path(str(cfg.workdir)).expanduser()
  if paths.is_run(workdir) and (workdir / "config.json").is_file():
    return _recorded(cfg, workdir, explicit)
  if all(f in explicit for f in size_rule.SHAPE_FIELDS):
    return cfg, ["model.size=auto: the shape is given in full on the command line "
                 f"({', '.join(size_rule.SHAPE_FIELDS)}): nothing to choose"]
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=say,
                              vocab_size=cfg.model.vocab_size)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  speed = speed_probe.speed_model(cfg, vocab, platform(), say)
  spent = time.time() - t_start if t_start is not None else budget.process_age_s()
  left_s = fmt.parse_duration(cfg.train.time_budget) - spent
  fixed = {f: validate.get(cfg, f) for f in size_rule.SHAPE_FIELDS if f in explicit}
  shapes = size_rule.candidates(fixed, CONTEXT, BATCH)
  base = model_lib.ModelConfig.from_config(cfg.model, vocab)
  opts = size_rule.options(base, shapes, speed, left_s, len(corpus.train))
  if not opts:
    raise _none_fits(cfg, fixed, shapes, left_s)
  pick, near = size_rule.choose(opts)
  values = pick.shape.fields() | {f: v for f, v in LRS.items() if cfg.optim.name == "muon"}
  cfg = loading.override(cfg.copy_and_resolve_references(),
                         **{f: v for f, v in values.items() if f not in explicit})
  return cfg, describe(pick, near, left_s, len(corpus.train), fixed, cfg)


def _none_fits(cfg, fixed: dict, shapes: list, left_s: float) -> ConfigError:
  if not shapes:
    given = ", ".join(f"{f}={v}" for f, v in fixed.items())
    return ConfigError("model.size", f"is auto, but no candidate shape has {given} (model.n_heads "
                       "must divide a width and leave an even head size)",
                       "set the other shape fields too, or leave these to model.size=auto")
  return ConfigError("train.time_budget", f"{cfg.train.time_budget} leaves {fmt.duration(left_s)}"
                     " after start-up, too little to compile and train any candidate model",
                     "pass a longer budget, e.g. --config.train.time_budget=2m")


def _said(o: size_rule.Option) -> str:
  return (f"{fmt.count(o.params)} params, {fmt.count(o.tokens)} tokens = {o.epochs:.1f} epochs "
          f"at {fmt.count(o.tokens_per_s)} tok/s, predicted val {o.bpb:.3f} bits/byte")


def describe(pick: size_rule.Option, near: list[size_rule.Option], left_s: float, unique: int,
             fixed: dict, cfg: ml_collections.ConfigDict) -> list[str]:
  """What was chosen and why, and the nearest candidates rejected."""
  s = pick.shape
  lrs = (f", Muon lr {cfg.optim.matrix_lr:g}, AdamW lr {cfg.optim.lr:g}"
         if cfg.optim.name == "muon" else f", lr {cfg.optim.lr:g}")
  kept = f"; kept as given: {', '.join(fixed)}" if fixed else ""
  lines = [f"model.size=auto: {s.name} ({s.n_heads} heads, context {s.seq_len}, batch "
           f"{s.batch_size}{lrs}) for the {fmt.duration(left_s)} left of "
           f"train.time_budget={cfg.train.time_budget}: {_said(pick)} (of the "
           f"{fmt.count(unique)} train tokens; this machine's measured speed){kept}"]
  for o in near:
    why = "more params than the time trains well" if o.params > pick.params \
        else "fewer params than the time can train"
    lines.append(f"  rejected {o.shape.name}: {_said(o)} ({why})")
  return lines


def _recorded(cfg: ml_collections.ConfigDict, workdir: Path,
              explicit: Collection[str]) -> tuple[ml_collections.ConfigDict, list[str]]:
  """A resumed run's own choice, from its config.json."""
  saved = loading.flatten(paths.read_json(workdir / "config.json"))
  values = {f: saved[f] for f in FIELDS if f in saved and f not in explicit}
  cfg = loading.override(cfg.copy_and_resolve_references(), **values)
  m = cfg.model
  return cfg, [f"model.size=auto: {m.n_layers}x{m.d_model} ({m.n_heads} heads, context "
               f"{m.seq_len}, batch {cfg.train.batch_size}), as the run chose when it started "
               f"({workdir / 'config.json'}); a resumed run never chooses again"]
