"""The training loop. Side effects live here: files, console, checkpoints, signals.

Per optimizer step: `grad_accum` micro-batches through the jitted `train_step`. The previous
step's metrics are read only after the next step is queued, so the host never stalls the device.
"""

import concurrent.futures
import dataclasses
import math
import os
import re
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxtrain import (allocator, aot, checkpoint, config, data, estimate, logger, optim,
                      preload, runtime, sample, sharding, signals, steps)
from jaxtrain import model as model_lib
from jaxtrain import tokenizer as tokenizer_lib
from jaxtrain import workdir as workdir_lib
from jaxtrain.errors import ConfigError, UserError

VERSION = "0.1.0"
MAX_DROPPED_IN_A_ROW = 10  # with skip_nonfinite: past this, skipping is not going to recover
# Dispatches queued ahead of the device within one step (micro-batches, eval batches). XLA:CPU
# deadlocked in a cross-device all-reduce with 50-100 two-device steps queued (sometimes at 50,
# always at 100); a few ahead already keep the device busy.
MAX_IN_FLIGHT = 4


def _throttle(results: list) -> None:
  """Waits for the dispatch MAX_IN_FLIGHT back, so no more than that many are queued."""
  if len(results) > MAX_IN_FLIGHT:
    jax.block_until_ready(results[-MAX_IN_FLIGHT - 1])


@dataclasses.dataclass
class RunResult:
  workdir: str
  step: int
  train_loss: float | None
  val_loss: float | None
  tokens_per_sec: float | None
  wall_s: float
  samples: list[str]
  stopped_by: str | None = None  # "SIGTERM" or "SIGINT" when a signal ended the run early
  exit_code: int = 0


class NonFiniteLoss(UserError):
  exit_code = 3


def resolve_vocab(cfg: ml_collections.ConfigDict, tok) -> int:
  want = cfg.model.vocab_size
  if want == 0:
    return tok.vocab_size
  if want < tok.vocab_size:
    raise ConfigError("model.vocab_size", f"{want} is smaller than the {tok.name} tokenizer's "
                      f"{tok.vocab_size} tokens", "pass --config.model.vocab_size=0 (automatic)")
  return want


def run(cfg: ml_collections.ConfigDict, *, show_progress: bool = True) -> RunResult:
  """Trains `cfg` in `cfg.workdir`, resuming from its latest checkpoint if there is one."""
  config.validate(cfg)
  platform = runtime.setup(cfg)
  workdir = Path(cfg.workdir).expanduser()
  existed = workdir.exists()
  try:
    return _run(cfg, platform, show_progress)
  except UserError:
    # A run that failed before writing anything leaves no empty directory behind.
    if not existed and workdir.is_dir() and not any(workdir.iterdir()):
      workdir.rmdir()
    raise


def _run(cfg: ml_collections.ConfigDict, platform: str, show_progress: bool) -> RunResult:
  t_start = time.time()
  process, n_processes = jax.process_index(), jax.process_count()
  is_main = process == 0
  out = logger.Console(enabled=is_main and show_progress, headless=cfg.headless)
  devices = jax.devices()
  config.validate_for_devices(cfg, len(devices), n_processes, platform)
  mesh = sharding.make_mesh(cfg, devices)
  workdir = workdir_lib.check(cfg.workdir)
  runtime.barrier("jaxtrain: workdir checked")  # every process looked before any writes
  workdir_lib.create(workdir)
  out.print(f"jaxtrain {VERSION} | workdir {workdir} | {platform} x{len(devices)} "
            f"(mesh data={mesh.shape['data']} fsdp={mesh.shape['fsdp']}) | jax {jax.__version__}"
            + (f" | {allocator.in_use()} allocator" if platform == "cpu" else ""))

  corpus = data.prepare(cfg.data, show_progress=out.use_bar, log=out.print)
  data.check_lengths(corpus, cfg.model.seq_len, cfg.data.val_fraction)
  tok = corpus.tokenizer
  out.print(f"data: {data.describe(cfg.data.path)}: {corpus.n_files} file(s), "
            f"{logger.fmt_count(corpus.n_bytes)}B -> {logger.fmt_count(len(corpus.tokens))} "
            f"{tok.name} tokens (train {logger.fmt_count(len(corpus.train))}, val "
            f"{logger.fmt_count(len(corpus.val))})")
  for note in corpus.notes:
    out.print(f"data: {note}")

  mc = model_lib.ModelConfig.from_config(cfg.model, resolve_vocab(cfg, tok))
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  tokens_per_step = B * k * T
  abstract = steps.abstract_state(cfg, mc)
  n_params = sum(x.size for x in jax.tree.leaves(abstract.params))
  out.print(f"model: {logger.fmt_count(n_params)} params, "
            f"{logger.fmt_count(model_lib.flops_per_token(mc))} train FLOPs/token, vocab "
            f"{mc.vocab_size}, {tokens_per_step} tokens/step ({B} x {T} x {k} micro-batches)")

  impl, why = model_lib.resolve_attention(cfg.model.attention, mc.dtype, T, mc.n_heads,
                                          mc.head_dim)
  out.print(f"compute: {mc.dtype} (params and optimizer float32), attention {impl} ({why})")
  line, warning = estimate.memory_report(cfg, mc, devices, mesh.shape["fsdp"], n_params)
  out.print(line)
  if warning:
    out.print(f"WARNING: {warning}")

  shardings = sharding.state_shardings(abstract, mesh)
  ckpts = checkpoint.Checkpoints(str(workdir), cfg.train.keep_checkpoints)
  train_iter = data.train_iterator(corpus, cfg, process, n_processes)
  metrics_file = logger.MetricsFile(workdir / "metrics.jsonl", enabled=is_main)
  run_meta = {"jaxtrain_version": VERSION, "data_fingerprint": corpus.fingerprint,
              "tokenizer": tok.to_json(), "config": cfg.to_dict()}

  try:
    return _train(cfg, out, mesh, workdir, corpus, mc, abstract, shardings, ckpts, train_iter,
                  metrics_file, run_meta, t_start)
  except UserError:
    try:  # a save that was going well before the error still completes
      ckpts.close()
    except Exception:  # the error was the save itself: the previous checkpoint stays the latest
      pass
    raise


def _train(cfg, out, mesh, workdir, corpus, mc, abstract, shardings, ckpts, train_iter,
           metrics_file, run_meta, t_start) -> RunResult:
  is_main = jax.process_index() == 0
  process, n_processes = jax.process_index(), jax.process_count()
  tok = corpus.tokenizer
  k, B, T = cfg.train.grad_accum, cfg.train.batch_size, cfg.model.seq_len
  tokens_per_step = B * k * T
  latest = ckpts.latest_step()

  def prepare_state() -> tuple[steps.TrainState, float, float]:
    """(state, training seconds so far, best val loss so far): a fresh start or the latest save."""
    if latest is None:
      state = start_init()
      out.print("starting a new run at step 0")
      return state, 0.0, math.inf
    meta = ckpts.read_meta(latest)
    _check_resumable(meta, run_meta, cfg, out)
    state = ckpts.restore(latest, abstract, shardings, train_iter)
    position = train_iter.get_state()["next_index"]
    if position != latest * k:
      raise UserError(f"checkpoint {latest} in {ckpts.directory} is inconsistent (data position "
                      f"{position}, expected {latest * k}); move that step's directory away to "
                      "resume from an earlier one")
    dropped = metrics_file.drop_after(latest)
    out.print(f"resumed from checkpoint {ckpts.directory / str(latest)} at step {latest}"
              + (f" (dropped {dropped} metric lines past it)" if dropped else ""))
    return state, meta.get("elapsed_s", 0.0), meta.get("best_val_loss") or math.inf

  # Everything besides shapes that the init, train and eval programs depend on (aot's cache key).
  program_key = {"model": cfg.model.to_dict(), "optim": cfg.optim.to_dict(), "seed": cfg.seed,
                 "train": {f: cfg.train[f] for f in ("grad_accum", "max_steps", "skip_nonfinite")},
                 "model_config": repr(mc), "batch_shape": [B, T + 1]}
  t_compile = time.time()
  programs_before = len(aot.USED)
  # Init (or a restore) runs beside the train step's tracing and compiling: XLA compiles, and
  # orbax reads, without holding the GIL. Init is lowered first, on this thread: its tracing is
  # short, and its compile then overlaps the train step's tracing rather than its compile.
  if latest is None:
    start_init = sharding.lower_init(lambda: steps.init_state(cfg, mc), abstract, mesh,
                                     program_key)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    pending = pool.submit(prepare_state)
    train_fn, eval_fn = sharding.jit_steps(abstract, mesh, program_key)
    state, elapsed_before, best_val = pending.result()
  preload.release()
  if is_main:
    workdir_lib.write_json(workdir / "config.json", cfg.to_dict())
    workdir_lib.write_json(workdir / workdir_lib.RUN_FILE,
                           {k_: v for k_, v in run_meta.items() if k_ != "config"})
    tokenizer_lib.save(tok, str(workdir / "tokenizer.json"))

  eval_set = [sharding.global_batch(b, mesh) for b in data.eval_batches(corpus, cfg, process,
                                                                        n_processes)]
  schedule = jax.jit(optim.lr_schedule(cfg.optim, cfg.train.max_steps))  # one compile, not ten
  max_steps = cfg.train.max_steps
  checkpoint_bytes = sum(x.nbytes for x in jax.tree.leaves(state.arrays()))

  def evaluate(state) -> float:
    losses = []
    for b in eval_set:
      losses.append(eval_fn(state, b)["loss"])
      _throttle(losses)
    return float(np.mean(jax.device_get(losses)))

  dropped_in_a_row = 0

  def check(step: int, micro: list[dict]) -> float:
    """The step's mean micro-batch loss; non-finite stops the run unless skipping is on."""
    nonlocal dropped_in_a_row
    host = jax.device_get(micro)
    loss = float(np.mean([m["loss"] for m in host]))
    grad_norm = float(np.mean([m["grad_norm"] for m in host]))
    if math.isfinite(loss) and math.isfinite(grad_norm):
      dropped_in_a_row = 0
      return loss
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
    overflow = config.dynamic_loss_scaling(cfg) and math.isfinite(loss)  # loss scaling handles it
    if not cfg.train.skip_nonfinite and not overflow:
      raise NonFiniteLoss(
          f"{what} at step {step}: stopped, and the last good checkpoint is kept. Likely causes: "
          "too high a learning rate (lower --config.optim.lr or raise optim.warmup_steps) or bad "
          "data; --config.train.skip_nonfinite=True drops such steps instead")
    dropped_in_a_row += 1
    if overflow:
      out.print(f"step {step}: gradients overflowed; step dropped, loss scale now "
                f"{float(host[-1]['loss_scale']):g}")
    else:
      out.print(f"step {step}: {what}, update dropped ({int(host[-1]['skipped'])} dropped so far)")
    if dropped_in_a_row >= MAX_DROPPED_IN_A_ROW:
      raise NonFiniteLoss(f"{dropped_in_a_row} steps in a row up to step {step} were non-finite "
                          "and dropped; stopped. Lower --config.optim.lr or check the data")
    return loss

  def save(state, val: float | None, best: float, elapsed: float) -> None:
    step = int(state.step)
    if not bool(_all_finite(state.params)):
      raise NonFiniteLoss(f"parameters became non-finite by step {step}: stopped without saving "
                          "them; the last good checkpoint is kept. Lower --config.optim.lr")
    free, needed = shutil.disk_usage(ckpts.directory).free, 1.1 * checkpoint_bytes + 2**20
    if runtime.any_process(free < needed):  # before writing: the last checkpoint stays whole
      raise UserError(f"not enough disk space for the checkpoint of step {step} in "
                      f"{ckpts.directory} (needs ~{logger.fmt_count(needed)}B, "
                      f"{logger.fmt_count(free)}B free); free some space, then "
                      f"{_resume_hint(ckpts)}")
    meta = dict(run_meta, elapsed_s=elapsed, best_val_loss=best if best < math.inf else None)
    _saving(ckpts, lambda: ckpts.save(state, train_iter, meta, val_loss=val), step)

  step = int(state.step)
  last_loss, last_val, tok_per_sec, stopped_by = None, None, None, None
  flops_per_token = model_lib.flops_per_token(mc)
  speed_reported = False
  if step >= max_steps:
    out.print(f"this run already reached step {step} (train.max_steps={max_steps}); raise "
              "--config.train.max_steps to train further")
  with signals.GracefulStop() as stop:
    if step < max_steps:
      out.start(max_steps, step)
      t_run = time.time()
      pending = None  # the newest step's metrics, still on the device
      first = True
      while step < max_steps:
        micro = []
        for _ in range(k):
          state, m = train_fn(state, sharding.global_batch(next(train_iter), mesh))
          micro.append(m)
          _throttle(micro)
        step += 1
        if first:
          jax.block_until_ready(micro)
          out.print(f"compiled and ran the first step in {time.time() - t_compile:.1f}s"
                    + (" (its programs loaded from the cache during start-up)"
                       if preload.taken() else ""))
          preload.remember(cfg, aot.USED[programs_before:])
          t_mark, step_mark, first = time.perf_counter(), step, False
        if pending is not None:  # the previous step is done or nearly: reading it costs no stall
          last_loss = check(*pending)
        pending = (step, micro)

        evaluate_now = step % cfg.train.eval_every == 0 or step == max_steps
        save_now = step % cfg.train.checkpoint_every == 0 or step == max_steps
        if runtime.any_process(stop.requested is not None):  # all processes stop at one step
          stopped_by = stop.requested or "SIGTERM"
          save_now = True
        if step % cfg.train.log_every == 0 or evaluate_now or save_now:
          last_loss, pending = check(*pending), None  # waits for this step
          now = time.perf_counter()
          sec_per_step = (now - t_mark) / (step - step_mark) if step > step_mark else 0.0
          if step > step_mark:
            tok_per_sec = tokens_per_step / sec_per_step
          t_mark, step_mark = now, step
          elapsed = elapsed_before + time.time() - t_run
          lr = float(schedule(step - 1))
          mfu = None
          if tok_per_sec:
            peak, peak_source = estimate.peak_flops(jax.devices()[0], mc.dtype)
            mfu = tok_per_sec * flops_per_token / (peak * estimate.peak_units(jax.devices()))
            if not speed_reported:
              speed_reported = True
              out.print(f"speed: {logger.fmt_count(tok_per_sec)} tokens/s, "
                        f"{logger.fmt_count(tok_per_sec * flops_per_token)}FLOP/s = {mfu:.1%} "
                        f"MFU (of {logger.fmt_count(peak)}FLOP/s x {estimate.peak_units(jax.devices())}, "
                        f"{peak_source}); "
                        f"ETA for the remaining {max_steps - step} steps: "
                        f"{logger.fmt_time((max_steps - step) * sec_per_step)}")
          out.progress(step, max_steps, last_loss, lr, tok_per_sec or 0.0, elapsed,
                       (max_steps - step) * sec_per_step)
          _saving(ckpts, ckpts.check, step)  # a background write that failed is reported now
          grad_norm = float(np.mean(jax.device_get([m["grad_norm"] for m in micro])))
          metrics_file.write(step=step, loss=last_loss, lr=lr, grad_norm=grad_norm,
                             tokens_per_sec=tok_per_sec, mfu=mfu, elapsed_s=round(elapsed, 3))
        val = None
        if evaluate_now:
          val = last_val = evaluate(state)
          out.print(f"eval step {step}: val loss {val:.4f} | perplexity "
                    f"{math.exp(min(val, 50)):.2f}")
          metrics_file.write(step=step, val_loss=val, val_ppl=math.exp(min(val, 50)),
                             elapsed_s=round(elapsed_before + time.time() - t_run, 3))
          if val < best_val:
            best_val, save_now = val, True  # the best model so far is always on disk
        if save_now:
          stop.saving = True
          save(state, val, best_val, elapsed_before + time.time() - t_run)
          if stopped_by:
            _finish_saving(ckpts, step)
          stop.saving = False
        if stopped_by:
          break
        if evaluate_now or save_now:
          t_mark = time.perf_counter()  # eval and save time does not count against tokens/s
      if pending is not None:
        last_loss = check(*pending)
      out.close()
    stop.saving = True
    _finish_saving(ckpts, step)
    stop.saving = False

  if stopped_by:
    out.print(f"{stopped_by}: stopped at step {step}; checkpoint saved in "
              f"{ckpts.directory / str(step)}. Run the same command again to resume.")
    return RunResult(str(workdir), step, last_loss, last_val, tok_per_sec, time.time() - t_start,
                     [], stopped_by, stop.exit_code)
  params = _gather(state.params)  # every process takes part; process 0 samples
  samples = _write_samples(cfg, state.replace(params=params), corpus, workdir, out) \
      if is_main else []
  if is_main:
    png = logger.plot_losses(workdir / "metrics.jsonl", workdir / "loss.png")
    if png:
      out.print(f"loss curves: {png}")
  wall = time.time() - t_start
  out.print(f"done: step {step} | train loss {_fmt(last_loss)} | val loss {_fmt(last_val)} | "
            f"wall {logger.fmt_time(wall)} | workdir {workdir}")
  return RunResult(str(workdir), step, last_loss, last_val, tok_per_sec, wall, samples)


def _gather(tree):
  """Host copies of possibly sharded (across processes, too) arrays."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  return multihost_utils.process_allgather(tree, tiled=True)


@jax.jit
def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _saving(ckpts: checkpoint.Checkpoints, action, step: int) -> None:
  """Runs a checkpoint action; a failed write becomes one line, the last good save intact."""
  try:
    action()
  except (OSError, ValueError, RuntimeError) as e:
    raise UserError(f"writing a checkpoint (by step {step}) in {ckpts.directory} failed "
                    f"({_os_reason(e)}); fix the cause (disk space, permissions), then "
                    f"{_resume_hint(ckpts)}") from None


def _os_reason(e: Exception) -> str:
  """The operating system's words for a failed write, also when tensorstore wraps them."""
  if getattr(e, "strerror", None):
    return e.strerror
  code = re.search(r"os_error_code='?(\d+)", str(e))
  if code:
    return f"{os.strerror(int(code.group(1)))}, errno {code.group(1)}"
  return str(e).splitlines()[0][:160] if str(e) else type(e).__name__


def _resume_hint(ckpts: checkpoint.Checkpoints) -> str:
  latest = ckpts.latest_step()
  if latest is None:
    return "run again (no checkpoint was saved yet)"
  return f"run again to resume from the intact checkpoint of step {latest}"


def _finish_saving(ckpts: checkpoint.Checkpoints, step: int) -> None:
  _saving(ckpts, ckpts.close, step)


def _check_resumable(meta: dict, run_meta: dict, cfg: ml_collections.ConfigDict, out) -> None:
  breaking, harmless = config.config_changes(meta.get("config", {}), run_meta["config"])
  if meta.get("tokenizer") != run_meta["tokenizer"]:
    breaking.append("the tokenizer's vocabulary differs from the checkpoint's")
  if breaking:
    raise UserError(f"cannot resume {cfg.workdir} with this config: {'; '.join(breaking)}. "
                    "Change these back, or pass a new --config.workdir to start a fresh run")
  if meta.get("data_fingerprint") != run_meta["data_fingerprint"]:
    if not cfg.data.allow_changed:
      raise UserError(f"the data differs from the data {cfg.workdir} was trained on (fingerprint "
                      f"now {run_meta['data_fingerprint'][:12]}, then "
                      f"{str(meta.get('data_fingerprint'))[:12]}); pass "
                      "--config.data.allow_changed=True to resume on it anyway, or a new "
                      "--config.workdir")
    out.print("data: resuming on different data than before (data.allow_changed=True)")
  if harmless:
    out.print(f"config changes since the checkpoint: {'; '.join(harmless)}")


def _fmt(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"


def _write_samples(cfg, state, corpus, workdir, out) -> list[str]:
  s = cfg.sample
  if s.num_samples == 0 or s.max_new_tokens == 0:
    return []
  tok = corpus.tokenizer
  if s.prompt:
    ids = tok.encode(s.prompt).astype(np.int32)[-cfg.model.seq_len:]
    prompts = np.tile(ids, (s.num_samples, 1))
  else:
    prompts = sample.prompts_from_text(corpus.val, tokenizer_lib.newline_id(tok), s.num_samples,
                                       min(32, cfg.model.seq_len // 2), cfg.seed)
  t0 = time.time()
  ids = sample.generate(state, prompts, s.max_new_tokens, seq_len=cfg.model.seq_len,
                        temperature=s.temperature, top_k=s.top_k, seed=cfg.seed)
  texts = [tok.decode(row[:len(p)]) + "\u2502" + tok.decode(row[len(p):])
           for row, p in zip(ids, prompts)]
  step = int(state.step)
  with open(workdir / "samples.txt", "a", encoding="utf-8") as f:
    for i, text in enumerate(texts):
      f.write(f"=== step {step} sample {i} (prompt {len(prompts[i])} tokens, then "
              f"{s.max_new_tokens} sampled at temperature {s.temperature}) ===\n{text}\n")
  out.print(f"samples at step {step} ({time.time() - t0:.1f}s; the prompt ends at \u2502), also in "
            f"{workdir / 'samples.txt'}:")
  for i, text in enumerate(texts):
    out.print(f"--- sample {i} ---\n{text}")
  return texts
