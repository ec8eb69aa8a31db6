"""`python -m jaxtrain --dry_run`: what a run of this config would do, without doing it. The
resolved config, then what a run says before its first step (data, model, compute, the memory
estimate against what this machine or container has), how the process started (what chose its
platform, devices, allocator and XLA flags), then its plan: steps, tokens, FLOPs,
evaluations, checkpoints, where it would resume. Nothing is compiled or trained, and nothing is
written in the workdir; the data is read (and tokenized into the shared cache, as a run would)."""

import textwrap
from collections.abc import Collection

import jax
import ml_collections

from jaxtrain.config import defaults, loading
from jaxtrain.core import model, optim, programs
from jaxtrain.loop import resolution
from jaxtrain.measure import estimate
from jaxtrain.system import fmt, startup
from jaxtrain.system.console import Console

# Model FLOPs utilization the recipes reach (benchmarks/results/): the dry run's time.
REALISTIC_MFU = 0.4


def config_lines(cfg: ml_collections.ConfigDict, width: int = 100) -> list[str]:
  """Every field of `cfg`, a section a paragraph, each field that differs from its default
  marked with `*`."""
  values = loading.flatten(cfg.to_dict())
  default = loading.flatten(defaults.default_config().to_dict())
  sections: dict[str, list[str]] = {"": []}  # the top-level fields first
  for name, value in values.items():
    section, _, field = name.rpartition(".")
    mark = "*" if default.get(name, object()) != value else ""
    sections.setdefault(section, []).append(f"{field}={value!r}{mark}")
  lines = ["config, resolved (* differs from the default):"]
  for section, fields in sections.items():
    head = f"  {section}: " if section else "  "
    lines += textwrap.wrap(" ".join(fields), width, initial_indent=head,
                           subsequent_indent=" " * len(head), break_long_words=False)
  return lines


def _count(start: int, end: int, every: int) -> int:
  """The steps in (start, end] that are multiples of `every`, and `end` itself."""
  return end // every - start // every + (end % every != 0 and end > start)


def plan_lines(cfg: ml_collections.ConfigDict, built: programs.Programs, train_tokens: int,
               start: int) -> list[str]:
  """The run's plan from step `start`: steps, tokens and FLOPs, evaluations, checkpoints,
  samples, the time its steps take here (at REALISTIC_MFU of the devices' peak). With a time
  budget the steps are the run's to decide."""
  t, T = cfg.train, cfg.model.seq_len
  per_step = t.batch_size * t.grad_accum * T
  flops_token = model.flops_per_token(built.model_cfg)
  opt_flops = optim.flops_per_step(built.optimizer, built.abstract.trainable())
  if t.time_budget:
    return [f"plan: train.time_budget={t.time_budget}: the steps are decided at run time (the run "
            f"times its first steps, start-up included, then fits train.max_steps and the "
            f"schedule to the budget); {per_step} tokens and "
            f"{per_step * flops_token + opt_flops:.3g} FLOPs a step; an evaluation every "
            f"{t.eval_every} steps and at the end, a checkpoint every {t.checkpoint_every} steps, "
            "at the end and at each new best val loss"]
  steps = t.max_steps - start
  tokens = steps * per_step
  flops = tokens * flops_token + steps * opt_flops
  epochs = f" ({tokens / train_tokens:.2f} epochs of the train split)" if train_tokens else ""
  lines = [f"plan: {steps} steps{f' (from step {start})' if start else ''} x {per_step} tokens = "
           f"{fmt.count(tokens)} tokens{epochs}, {flops:.3g} FLOPs ({fmt.count(flops_token)}/token"
           + (f" + {fmt.count(opt_flops)}/step for the optimizer" if opt_flops else "") + ")",
           f"evaluations: {_count(start, t.max_steps, t.eval_every)} (every {t.eval_every} steps "
           f"and at step {t.max_steps}), each on {t.eval_steps} batches of {t.batch_size} x {T} "
           "tokens",
           f"checkpoints: {_count(start, t.max_steps, t.checkpoint_every)} (every "
           f"{t.checkpoint_every} steps and at step {t.max_steps}), and one at each new best val "
           f"loss; the newest {t.keep_checkpoints} kept"]
  if cfg.sample.num_samples:
    lines.append(f"samples: {cfg.sample.num_samples} of {cfg.sample.max_new_tokens} tokens at "
                 "the end")
  # The peak: a known GPU's datasheet, else this machine's measured matmul peak (from the cache).
  peak, source = estimate.peak_flops(list(built.mesh.devices.flat), built.model_cfg.dtype)
  seconds = flops / (peak * REALISTIC_MFU)
  return lines + [f"time: about {fmt.duration(seconds)} of training steps here, at "
                  f"{REALISTIC_MFU:.0%} MFU (what the recipes reach) of {source}; start-up, "
                  "compiles, evaluations and checkpoints come on top"]


def dry_run(cfg: ml_collections.ConfigDict, explicit: Collection[str] = ()) -> None:
  """Prints what a run of `cfg` would do (process 0), as `python -m jaxtrain --dry_run` does: the
  run's own resolution (loop/resolution.py), without its claim on the workdir."""
  settled = resolution.settle(cfg, explicit)
  cfg = settled.cfg
  out = Console(enabled=jax.process_index() == 0, headless=True)
  for line in config_lines(cfg):
    out.print(line)
  res = resolution.resolve(settled, out)
  out.print(startup.describe(startup.decision()))
  start, t = res.resume_step, cfg.train
  if start >= t.max_steps and not t.time_budget:
    out.print(f"resume: {res.workdir} holds a checkpoint of step {start}, at or past "
              f"train.max_steps={t.max_steps}: a run would have nothing to train")
  else:
    if start:
      out.print(f"resume: a run would resume from the checkpoint of step {start} in {res.workdir}")
    for line in plan_lines(cfg, res.programs, len(res.corpus.train), start):
      out.print(line)
  out.print(f"dry run: nothing was compiled or trained, and nothing was written in {res.workdir}")
