"""`python -m jaxtrain --dry_run`: what a run of this config would do, without doing it. The
resolved config, then what a run says before its first step (data, model, compute, the memory
estimate against what this machine or container has), then its plan: steps, tokens, FLOPs,
evaluations, checkpoints, where it would resume. Nothing is compiled or trained, and nothing is
written in the workdir; the data is read (and tokenized into the shared cache, as a run would)."""

import textwrap
from collections.abc import Collection
from pathlib import Path

import jax
import ml_collections

from jaxtrain import __version__
from jaxtrain.checkpoints import init_from
from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.config import defaults, loading, validate
from jaxtrain.core import cpu, mesh, model, optim, programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenfiles, tokenizer
from jaxtrain.evals import tasks
from jaxtrain.loop import autosize
from jaxtrain.measure import summary
from jaxtrain.system import fmt, paths, runtime
from jaxtrain.system.console import Console


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
  samples. With a time budget the steps are the run's to decide."""
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
  epochs = f" ({tokens / train_tokens:.2f} epochs of the train split)" if train_tokens else ""
  lines = [f"plan: {steps} steps{f' (from step {start})' if start else ''} x {per_step} tokens = "
           f"{fmt.count(tokens)} tokens{epochs}, {tokens * flops_token + steps * opt_flops:.3g} "
           f"FLOPs ({fmt.count(flops_token)}/token"
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
  return lines


def _resume_step(workdir: Path) -> int:
  """The newest complete checkpoint's step in `workdir` (0: none), read without a write."""
  if not (workdir / "checkpoints").is_dir():
    return 0
  ckpts = Checkpoints(str(workdir), read_only=True)
  try:
    return max(ckpts.complete_steps(), default=0)
  finally:
    ckpts.close()


def dry_run(cfg: ml_collections.ConfigDict, explicit: Collection[str] = ()) -> None:
  """Prints what a run of `cfg` would do (process 0), as `python -m jaxtrain --dry_run` does."""
  validate.validate(cfg)
  cfg, taken = init_from.resolve(cfg, explicit)
  validate.validate(cfg)
  cfg, chosen = autosize.resolve(cfg, explicit)  # the run's own choice (it probes once if needed)
  cpu.split_cpu(cfg)
  platform = runtime.setup(cfg)
  out = Console(enabled=jax.process_index() == 0, headless=True)
  for line in config_lines(cfg) + chosen:
    out.print(line)
  if taken:
    out.print(f"init_from: from {cfg.init_from}, {', '.join(taken)}")
  eval_tasks = tasks.load(cfg)
  devices = jax.devices()
  mesh.check_devices(cfg.mesh, cfg.train.batch_size, devices, cfg.model.dtype)
  workdir = paths.check_workdir(cfg.workdir)
  data_axis, fsdp_axis = mesh.mesh_shape(cfg.mesh, len(devices))
  out.print(f"jaxtrain {__version__} | dry run | workdir {workdir} | {platform} x{len(devices)} "
            f"(mesh data={data_axis} fsdp={fsdp_axis}) | jax {jax.__version__}")
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=out.print,
                           vocab_size=cfg.model.vocab_size)
  corpus_lib.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  tokenfiles.check_run(cfg, corpus.tokenizer)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  built = programs.build(cfg, vocab, devices, eot_id=corpus.tokenizer.eot_id)
  summary.describe(out, cfg, corpus, built)
  tasks.describe(eval_tasks, cfg.train.eval_tasks_limit, out.print)
  start = _resume_step(workdir)
  if start >= cfg.train.max_steps and not cfg.train.time_budget:
    out.print(f"resume: {workdir} holds a checkpoint of step {start}, at or past "
              f"train.max_steps={cfg.train.max_steps}: a run would have nothing to train")
  else:
    if start:
      out.print(f"resume: a run would resume from the checkpoint of step {start} in {workdir}")
    for line in plan_lines(cfg, built, len(corpus.train), start):
      out.print(line)
  out.print(f"dry run: nothing was compiled or trained, and nothing was written in {workdir}")
