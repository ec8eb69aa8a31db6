"""What a run says about itself: before its first step, the data, the model, its compute and
memory; after its first steps, its speed; at its end, a summary: the best val loss and its step,
the tokens seen, and where the time went (`Timeline`)."""

import contextlib
import math
import time

import jax
import ml_collections

from jaxtrain.core import lora, optim
from jaxtrain.core import model as model_lib
from jaxtrain.core.programs import Programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.measure import estimate
from jaxtrain.measure.speed import Speed
from jaxtrain.system import fmt
from jaxtrain.system.console import Console


def describe(out: Console, cfg: ml_collections.ConfigDict, corpus: corpus_lib.Corpus,
             programs: Programs) -> None:
  tok, mc = corpus.tokenizer, programs.model_cfg
  where = corpus_lib.describe(cfg.data.mixture or cfg.data.path)
  if corpus.about:  # token files
    out.print(f"data: {where}: {corpus.about}")
  else:
    out.print(f"data: {where}: {corpus.n_files} file(s), {fmt.count(corpus.n_docs)} documents, "
              f"{fmt.count(corpus.n_bytes)}B -> {fmt.count(len(corpus.tokens))} {tok.name} tokens "
              f"(train {fmt.count(len(corpus.train))}, val {fmt.count(len(corpus.val))})")
  if corpus.mask is not None and corpus_lib.is_chat(cfg.data):
    out.print(f"data: chat records ({cfg.data.messages_field!r}): "
              f"{fmt.count(int(corpus.mask.sum()))} of the tokens (assistant turns and their "
              "end-of-turn tokens) count in the loss; records see only themselves")
  elif corpus.mask is not None:
    out.print(f"data: prompt/completion records ({cfg.data.prompt_field!r}, "
              f"{cfg.data.completion_field!r}): {fmt.count(int(corpus.mask.sum()))} of the tokens "
              "(completions and their end-of-text) count in the loss; records see only themselves")
  for note in corpus.notes:
    out.print(f"data: {note}")
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  abstract = programs.abstract
  n_params, n_trained = lora.count(abstract.params), lora.count(abstract.trainable())
  adapters = abstract.lora
  opt_flops = optim.flops_per_step(programs.optimizer, abstract.trainable())
  out.print(f"model: {fmt.count(n_params)} params, "
            + (f"{fmt.count(n_trained)} of them trained (LoRA rank {adapters.rank}, alpha "
               f"{adapters.alpha:g} on {','.join(adapters.targets)}), " if adapters else "") +
            f"{fmt.count(model_lib.flops_per_token(mc))} train FLOPs/token"
            + (f", {fmt.count(opt_flops)} optimizer FLOPs/step" if opt_flops else "")
            + f", vocab {mc.vocab_size}, {B * k * T} tokens/step ({B} x {T} x {k} micro-batches)")
  out.print(f"compute: {mc.dtype} (params and optimizer float32), attention {mc.attention} "
            f"({programs.attention_why})"
            + (f"; XLA options {programs.compiler_options}" if programs.compiler_options else "")
            + ("; one gradient all-reduce" if programs.one_allreduce else ""))
  line, warning = estimate.memory_report(mc, B, k, list(programs.mesh.devices.flat),
                                         programs.mesh.shape["fsdp"], n_params, n_trained)
  out.print(line)
  if warning:
    out.print(f"WARNING: {warning}")


def speed_line(speed: Speed, flops_dtype: str, steps_left: int) -> str:
  """The first speed reading, with the peak its MFU is measured against."""
  _, peak = estimate.peak_flops(jax.devices(), flops_dtype)
  return (f"speed: {fmt.count(speed.tokens_per_sec)} tokens/s, "
          f"{fmt.count(speed.flops_per_sec)}FLOP/s = {speed.mfu or 0:.1%} MFU (of {peak}); "
          f"ETA for the remaining {steps_left} steps: {fmt.duration(speed.eta_s)}")


class Timeline:
  """Where a start of a run spends its wall time: seconds per phase, added as each ends. The
  training steps are the rest, so the parts add up to the wall time."""

  PHASES = ("start-up", "compile", "train", "eval", "checkpoints", "samples", "plot")

  def __init__(self):
    self.seconds = dict.fromkeys(self.PHASES, 0.0)

  def add(self, phase: str, seconds: float) -> None:
    self.seconds[phase] += seconds

  @contextlib.contextmanager
  def timing(self, phase: str):
    t = time.perf_counter()
    try:
      yield
    finally:
      self.add(phase, time.perf_counter() - t)

  def line(self, wall: float, resumed: bool) -> str:
    """`time: 1m05s = start-up 3.2s + compile 5.1s + train 50.0s + eval 4.0s + ...`: start-up is
    reading the data and building the programs; compile includes the first step (and init or
    restore); eval and checkpoints include their own compile and the wait for their writes;
    plot: what the loss plot, drawn beside the samples, took past them."""
    parts = dict(self.seconds, train=0.0)
    parts["train"] = max(wall - sum(parts.values()), 0.0)
    shown = " + ".join(f"{name} {fmt.duration(parts[name])}" for name in self.PHASES
                       if parts[name] >= 0.05 or name == "train")
    return f"time{' of this start' if resumed else ''}: {fmt.duration(wall)} = {shown}"


def closing(records: list[dict], step: int, tokens_per_step: int) -> str:
  """`summary: best val loss 2.1567 at step 300 | 614.40k tokens seen (300 steps x 2048)`, from
  metrics.jsonl's records (every start's), for the lines at a run's end."""
  evals = [(r["val_loss"], r["step"]) for r in records if isinstance(r.get("step"), int)
           and isinstance(r.get("val_loss"), int | float) and math.isfinite(r["val_loss"])]
  best = min(evals, default=None)
  return ((f"summary: best val loss {best[0]:.4f} at step {best[1]}" if best else
           "summary: no evaluation") +
          f" | {fmt.count(step * tokens_per_step)} tokens seen ({step} steps x {tokens_per_step})")
