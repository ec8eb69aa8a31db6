"""How a run ends, and what it leaves in its workdir: the result (`RunResult`), the files that
describe the run (config.json, run.json, tokenizer.json, legs.jsonl), the samples and loss plot
of a finished run, and the one line for a run stopped by a signal, in the loop or outside it."""

import concurrent.futures
import json
import sys
import time
from pathlib import Path

import jax
import ml_collections

from jaxtrain.checkpoints.store import Checkpoints
from jaxtrain.core.steps import TrainState
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.generation import samples
from jaxtrain.loop import budget
from jaxtrain.loop.state import Progress, Run
from jaxtrain.measure import summary
from jaxtrain.system import fmt, paths, runtime, signals
from jaxtrain.trackers import metrics_jsonl
from jaxtrain.trackers.hooks import RunResult

LEGS_FILE = "legs.jsonl"  # one line per leg of the run: where it started, what changed


def write_run_files(workdir: Path, cfg: ml_collections.ConfigDict, run_meta: dict, tok,
                    start_step: int = 0, changes: tuple[str, ...] = ()) -> None:
  """The files that say what the run is, as of the leg that starts at `start_step`: config.json
  holds that leg's config, legs.jsonl one line per leg with the config changes it brought."""
  paths.write_json(workdir / "config.json", cfg.to_dict())
  paths.write_json(workdir / paths.RUN_FILE, {k: v for k, v in run_meta.items() if k != "config"})
  tokenizer_lib.save(tok, str(workdir / "tokenizer.json"))
  with open(workdir / LEGS_FILE, "a", encoding="utf-8") as f:
    f.write(json.dumps({"start_step": start_step, "max_steps": cfg.train.max_steps,
                        "changes": list(changes), "time": round(time.time(), 3)}) + "\n")


def record_end(r: Run, end: int) -> None:
  """A time budget's new end: the run's train.max_steps from here on, in config.json and in the
  checkpoints saved next."""
  cfg = budget.with_end(r.cfg, end)
  r.saving.set_config(cfg)
  if jax.process_index() == 0:
    paths.write_json(r.workdir / "config.json", cfg.to_dict())


def finish(r: Run, p: Progress, state: TrainState, speed: float | None) -> RunResult:
  """Samples and the loss plot (process 0), then the closing line."""
  try:
    params = runtime.host_copy(state.params)  # every process takes part; process 0 samples
    is_main = jax.process_index() == 0
    r.phase = "sampling"
    # The plot (mostly matplotlib's import) is drawn beside the samples, which wait on XLA.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      plot = pool.submit(metrics_jsonl.plot_losses, r.workdir / metrics_jsonl.FILE,
                         r.workdir / "loss.png") if is_main else None
      with p.timeline.timing("samples"):
        texts = samples.write_samples(
            r.cfg.sample, r.cfg.model.seq_len, r.cfg.seed, state.replace(params=params),
            r.corpus.val, r.corpus.tokenizer, r.workdir, r.out) if is_main else []
      with p.timeline.timing("plot"):
        png = plot.result() if plot else None
    if png:
      r.out.print(f"loss curves: {png}")
  except KeyboardInterrupt as e:  # training is done and saved: the samples are what is lost
    return interrupted(e, r, r.workdir, r.t_start, p.end)
  wall = time.time() - r.t_start
  r.out.print(f"done: step {p.step} | train loss {_fmt(p.pending.last_loss)} | val loss "
              f"{_fmt(p.last_val)} | wall {fmt.duration(wall)} | workdir {r.workdir}")
  _summary(r, p, wall)
  return RunResult(str(r.workdir), p.step, p.pending.last_loss, p.last_val, speed, wall, texts,
                   max_steps=p.end)


def stopped(r: Run, p: Progress, by: str, speed: float | None) -> RunResult:
  """A run the loop stopped on a signal (its own, or another process's: every process of the
  run exits with the same status), saved at the step it stopped at."""
  r.out.print(f"{by}: stopped at step {p.step}; checkpoint saved in "
              f"{r.saving.ckpts.directory / str(p.step)}. Run the same command again to resume.")
  _summary(r, p, time.time() - r.t_start)
  return RunResult(str(r.workdir), p.step, p.pending.last_loss, p.last_val, speed,
                   time.time() - r.t_start, [], by, signals.EXIT_CODES[by], p.end)


def _summary(r: Run, p: Progress, wall: float) -> None:
  """The run's story in two lines (process 0): its best val loss and tokens, then where this
  start's time went."""
  if jax.process_index() != 0:
    return
  t = r.cfg.train
  records = paths.read_jsonl(r.workdir / metrics_jsonl.FILE)
  r.out.print(summary.closing(records, p.step, t.batch_size * t.grad_accum * r.cfg.model.seq_len))
  r.out.print(p.timeline.line(wall, resumed=p.elapsed_before > 0))


def already_done(r: Run, step: int) -> RunResult:
  """A run restarted at or past its last step: nothing is trained, sampled or written."""
  r.out.print(f"this run already reached step {step} (train.max_steps={r.cfg.train.max_steps}): "
              f"nothing to train, and nothing in {r.workdir} was changed; raise "
              "--config.train.max_steps to train further")
  return RunResult(str(r.workdir), step, None, None, None, time.time() - r.t_start, [],
                   max_steps=r.cfg.train.max_steps)


def interrupted(e: KeyboardInterrupt, r: Run | None, workdir: Path, t_start: float,
                max_steps: int | None = None) -> RunResult:
  """SIGINT or SIGTERM outside the training loop (which stops at a step and saves): one line
  on what is on disk. `r` is None while the run is still being set up; `max_steps`: the loop's
  end, where the loop has run."""
  name = signals.name_of(e)
  signals.handled()
  phase = "preparing the run" if r is None else r.phase
  saved = _complete_steps(workdir)
  step = saved[-1] if saved else 0
  if r is not None and r.phase == "sampling":
    what = (f"training had finished and its checkpoint of step {step} is saved; the samples "
            "were not written")
  else:
    what = (f"nothing new was saved; the checkpoint of step {step} is intact and a restart "
            "resumes from it" if saved else "nothing was saved; a restart begins afresh")
  print(f"{name} while {phase}: stopped; {what}", file=sys.stderr, flush=True)
  return RunResult(str(workdir), step, None, None, None, time.time() - t_start, [], name,
                   signals.EXIT_CODES[name], max_steps)


def remove_stub(workdir: Path, existed: bool, fresh: bool, r: Run | None) -> None:
  """A new run refused or stopped before its first step (a bad init_from, data that does not
  fit, Ctrl-C while compiling) leaves nothing that looks like a run behind; the libraries' log
  stays if a note points to it."""
  if fresh and jax.process_index() == 0:
    keep = ("logs",) if r is not None and r.log is not None and r.log.errors else ()
    paths.remove_stub(workdir, keep=keep, remove_dir=not existed)


def _complete_steps(workdir: Path) -> list[int]:
  if not (workdir / "checkpoints").is_dir():
    return []
  ckpts = Checkpoints(str(workdir), read_only=True)
  try:
    return ckpts.complete_steps()
  finally:
    ckpts.close()


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"
