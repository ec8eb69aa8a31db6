"""How a run ends: its result (`RunResult`), the samples, loss plot and closing lines of a finished
run, and the one line for a run stopped by a signal, in the loop or outside it."""

import concurrent.futures
import sys
import time
from pathlib import Path

import jax

from jaxtrain.checkpoints import store
from jaxtrain.core.steps import TrainState
from jaxtrain.generation import samples
from jaxtrain.loop.state import Progress, Run
from jaxtrain.measure import summary
from jaxtrain.system import fmt, paths, runtime, signals
from jaxtrain.trackers import metrics_jsonl, status
from jaxtrain.trackers.hooks import RunResult


def finish(r: Run, p: Progress, state: TrainState, speed: float | None) -> RunResult:
  """Samples and the loss plot (process 0), then the closing line."""
  try:
    with p.timeline.timing("samples" if r.cfg.sample.num_samples else "loss plot"):
      r.ahead.wait()  # the samples' programs, the plot's import
    params = runtime.host_copy(state.params)  # every process takes part; process 0 samples
    is_main = jax.process_index() == 0
    # The plot (mostly matplotlib's import) is drawn beside the samples, which wait on XLA.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      plot = pool.submit(metrics_jsonl.plot_losses, r.workdir / metrics_jsonl.FILE,
                         r.workdir / "loss.png") if is_main else None
      # Counted as samples only where some are drawn: the time line never shows samples for none.
      with p.timeline.timing("samples" if r.cfg.sample.num_samples else "loss plot"):
        texts = samples.write_samples(
            r.cfg.sample, r.cfg.model.seq_len, r.cfg.seed, state.replace(params=params),
            r.corpus.val, r.corpus.tokenizer, r.workdir, r.out) if is_main else []
      with p.timeline.timing("loss plot"):
        png = plot.result() if plot else None
    if png:
      r.out.print(f"loss curves: {png}")
  except KeyboardInterrupt as e:  # training is done and saved: the samples are what is lost
    return interrupted(e, "sampling", r.workdir, r.t_start, p.end)
  wall = time.time() - r.t_start
  r.out.print(f"done: step {p.step} | train loss {_fmt(p.pending.last_loss)} | val loss "
              f"{_fmt(p.last_val)} | wall {fmt.duration(wall)} | workdir {r.workdir}")
  _summary(r, p, wall)
  return RunResult(str(r.workdir), p.step, p.pending.last_loss, p.last_val, speed, wall, texts,
                   max_steps=p.end, compile_s=p.timeline.seconds["compile"])


def stopped(r: Run, p: Progress, by: str, speed: float | None) -> RunResult:
  """A run the loop stopped on a signal (its own, or another process's: every process of the
  run exits with the same status), saved at the step it stopped at. At its last step, the
  signal came before the last evaluation was complete: a restart makes it, and the samples."""
  end_left = p.step >= p.end
  again = ("Run the same command again for the last evaluation and the samples." if end_left
           else "Run the same command again to resume.")
  r.out.print(f"{by}: stopped at step {p.step}; checkpoint saved in "
              f"{r.saving.ckpts.directory / str(p.step)}. {again}")
  _summary(r, p, time.time() - r.t_start)
  return RunResult(str(r.workdir), p.step, p.pending.last_loss, p.last_val, speed,
                   time.time() - r.t_start, [], by, signals.EXIT_CODES[by], p.end, end_left,
                   p.timeline.seconds["compile"])


def end_left(workdir: Path, step: int) -> bool:
  """Whether the run in `workdir` was stopped at `step`, its last, before its last evaluation
  (status.json says so): a restart then makes that evaluation and the samples."""
  info = status.read(workdir / paths.STATUS_FILE)
  return info.get("state") == "stopped" and bool(info.get("end_left")) and info.get("step") == step


def _summary(r: Run, p: Progress, wall: float) -> None:
  """The run's story in two lines (process 0): its best val loss and tokens, then where this
  start's time went."""
  if jax.process_index() != 0:
    return
  records = paths.read_jsonl(r.workdir / metrics_jsonl.FILE)
  r.out.print(summary.closing(records, p.step, p.meter.tokens_per_step))
  r.out.print(p.timeline.line(wall, resumed=p.elapsed_before > 0))


def already_done(r: Run, step: int) -> RunResult:
  """A run restarted at or past its last step: nothing is trained, sampled or written."""
  r.out.print(f"this run already reached step {step} (train.max_steps={r.plan.final}): "
              f"nothing to train, and nothing in {r.workdir} was changed; raise "
              "--config.train.max_steps to train further")
  return RunResult(str(r.workdir), step, None, None, None, time.time() - r.t_start, [],
                   max_steps=r.plan.final)


def interrupted(e: KeyboardInterrupt, phase: str, workdir: Path, t_start: float,
                max_steps: int | None = None) -> RunResult:
  """SIGINT or SIGTERM outside the training loop (which stops at a step and saves), while in
  `phase` ("preparing the run", "compiling", "training", "sampling"): one line on what is on disk.
  `max_steps`: the run's end, where it is known."""
  name = signals.name_of(e)
  signals.handled()
  saved = store.complete_steps(workdir)
  step = saved[-1] if saved else 0
  if phase == "sampling":
    what = (f"training had finished and its checkpoint of step {step} is saved; the samples "
            "were not written")
  else:
    what = (f"nothing new was saved; the checkpoint of step {step} is intact and a restart "
            "resumes from it" if saved else "nothing was saved; a restart begins afresh")
  print(f"{name} while {phase}: stopped; {what}", file=sys.stderr, flush=True)
  return RunResult(str(workdir), step, None, None, None, time.time() - t_start, [], name,
                   signals.EXIT_CODES[name], max_steps)


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"
