"""Validation loss against wall time and training FLOPs: real `python -m jaxtrain` runs on one
corpus, side by side.

Each run is a command line (a config file and overrides); it runs to its own `train.max_steps`, or, with
`--budget_s`, to as many steps as fit that wall time (measured by a short probe run of the same command
first: start-up, seconds per step and per eval), or, with `--budget_flops`, to as many steps as fit that
many training FLOPs (counted, so the same on every machine). Wall time counts from the command's start to
its exit, start-up included. Training FLOPs are the model's matmul FLOPs per token (the trainer's `train
FLOPs/token`: 6N plus attention) times the tokens trained, plus the optimizer's matmul FLOPs per step
(Muon's Newton-Schulz iterations) times the steps; evaluation is not counted. The report has each run's
final and best val loss, steps, TFLOPs, tokens/s and wall time, medians over seeds, and a plot of val loss
against TFLOPs (with `--budget_flops`) or wall time. Runs go one after another, never together, so each has
the machine to itself; the background load is sampled and recorded.

    python benchmarks/quality.py --data=../shared/data/tinyshakespeare.txt --seeds=1 \
        --run "nanogpt_layout=configs/shakespeare_char_nanogpt.py" \
        --run "recipe=configs/shakespeare_char.py" \
        --run "recipe_adamw=configs/shakespeare_char.py --config.optim.name=adamw"
    python benchmarks/quality.py --data=../shared/data/tinyshakespeare.txt --seeds=3 \
        --budget_flops=nanogpt --run "recipe=configs/shakespeare_char.py"

On a machine others share, `--lock=FILE` holds an exclusive flock on FILE around each run (and the matmul
peak's measurement) alone, so that timed work of others' that takes the same lock waits for it, and it for
theirs, without holding the machine for the whole grid.
"""

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402
from nanogpt_recipe import NANOGPT, NANOGPT_ARGS, NANOGPT_NAME, nanogpt_flops, result, run_nanogpt  # noqa: E402

CHILDREN: list[int] = []  # the run going on, for the load sampler
PROBE_STEPS = 100


@contextlib.contextmanager
def held(lock: str | None):
  """An exclusive flock on the file `lock` (None: none) while the block runs."""
  with open(lock or os.devnull, "a") as f:  # closing the file releases the lock, on errors too
    if lock:
      fcntl.flock(f, fcntl.LOCK_EX)
    yield


def run_once(args: list[str], data: str | None, seed: int, workdir: Path) -> dict:
  cmd = [sys.executable, "-m", "jaxtrain", "--jax_platforms=cpu", *args, f"--config.seed={seed}",
         *([f"--config.data.path={data}"] if data else []), f"--config.workdir={workdir}",
         "--config.headless=True", "--config.sample.num_samples=0"]
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  CHILDREN[:] = [proc.pid]
  _, stderr = proc.communicate()
  wall = time.perf_counter() - start
  CHILDREN.clear()
  if proc.returncode != 0:
    raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}: {stderr[-2000:]}")
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  evals = [(x["elapsed_s"], x["step"], x["val_loss"]) for x in lines if "val_loss" in x]
  bpb = [x.get("val_bpb") for x in lines if "val_loss" in x]  # None where bytes are unknown
  train = [x for x in lines if x.get("tokens_per_sec")]
  saved = json.loads((workdir / "config.json").read_text())
  m, d = saved["model"], saved["data"]
  vocab = f" {d['vocab_size']}" if d["tokenizer"] == "bpe" else ""
  return result(wall, evals, final_bpb=bpb[-1] if bpb else None,
                evals_bpb=bpb if None not in bpb else None,
                model=f"{m['n_layers']}x{m['d_model']} {d['tokenizer']}{vocab}",
                train_clock=[(x["step"], x["elapsed_s"]) for x in train],
                tokens_per_sec=statistics.median(x["tokens_per_sec"] for x in train) if train
                else None)


def _config(args: list[str], data: str | None = None):
  """A run's config as `python -m jaxtrain` builds it from `args` (the file, then each
  `--config.x=y` override, parsed by the type of the field it sets) and the corpus."""
  from jaxtrain.config import loading, validate

  cfg = loading.load_config(args[0].partition("=")[2])
  for arg in args[1:]:
    field, _, text = arg.removeprefix("--config.").partition("=")
    kind = type(validate.get(cfg, field))
    value = text in ("True", "true", "1") if kind is bool else text if kind is str else kind(text)
    loading.override(cfg, **{field: value})
  if data:
    loading.override(cfg, **{"data.path": data})
  validate.validate(cfg)
  return cfg


def run_flops(args: list[str], data: str | None) -> dict | None:
  """`count_flops` of a run; None for model.size=auto, whose run chooses (then `saved_flops`)."""
  cfg = _config(args, data)
  return None if cfg.model.size == "auto" else count_flops(cfg)


def saved_flops(workdir: Path) -> dict:
  """The training FLOPs per step of the run in `workdir`, as it resolved its config."""
  from jaxtrain.config import loading
  return count_flops(loading.from_saved(json.loads((workdir / "config.json").read_text())))


def count_flops(cfg) -> dict:
  """Training FLOPs per optimizer step as the trainer's model line counts them: the model's
  FLOPs per token x its tokens per step, + the optimizer's FLOPs per step."""
  import jax

  from jaxtrain.core import model as model_lib
  from jaxtrain.core import optim, programs
  from jaxtrain.data import corpus as corpus_lib
  from jaxtrain.data import tokenizer as tokenizer_lib

  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda *_: None)
  vocab = tokenizer_lib.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  built = programs.build(cfg, vocab, jax.devices("cpu")[:1])  # nothing compiled: shapes only
  per_token = model_lib.flops_per_token(built.model_cfg)
  tokens = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.seq_len
  optimizer = optim.flops_per_step(built.optimizer, built.abstract.params)
  return {"model_flops_per_token": per_token, "tokens_per_step": tokens,
          "optimizer_flops_per_step": optimizer, "flops_per_step": per_token * tokens + optimizer}


def steps_for_flops(flops: dict, budget_flops: float, args: list[str]) -> int:
  """The most steps whose training FLOPs fit `budget_flops`."""
  steps = int(budget_flops // flops["flops_per_step"])
  if steps < 1:
    raise SystemExit(f"error: --budget_flops={budget_flops:g} is less than one step "
                     f"({flops['flops_per_step']:.3g} FLOPs) of {' '.join(args)}")
  return steps


def steps_for_budget(args: list[str], data: str | None, budget_s: float, workdir: Path) -> tuple[int, dict]:
  """The `train.max_steps` that make a run of `args` end about `budget_s` after its start, from a
  probe run of PROBE_STEPS steps (its own eval at the end): start-up, step and eval seconds."""
  probe = run_once([*args, f"--config.train.max_steps={PROBE_STEPS}",
                    f"--config.train.eval_every={PROBE_STEPS}",
                    f"--config.train.log_every={PROBE_STEPS // 10}"], data, 0, workdir)
  # Seconds per step from the log lines' clocks past the first interval, which also holds the
  # first step's compile and the one-off matmul-peak measurement of the speed line.
  (s0, t0), (s1, t1) = probe["train_clock"][1], probe["train_clock"][-1]
  step_s = (t1 - t0) / (s1 - s0)
  trained, evaled = t1, probe["evals"][-1][0]
  eval_s = max(evaled - trained, 0.0)
  startup_s = probe["wall_s"] - evaled  # before the first step and after the last
  every = _config(args).train.eval_every
  steps = int((budget_s - startup_s) / (step_s + eval_s / every))
  if steps < 1:
    raise SystemExit(f"error: --budget_s={budget_s} is shorter than one step plus start-up "
                     f"({startup_s + step_s:.1f} s) for {' '.join(args)}")
  return steps, {"startup_s": startup_s, "step_s": step_s, "eval_s": eval_s, "steps": steps}


def plot(path: Path, results: dict, flops: dict | None) -> None:
  """Val bits per byte (val loss where a run's bytes are unknown) against training TFLOPs (given
  each run's `flops`), else against wall time. Loss per token would put a BPE run on another scale
  than a char run's."""
  bytes_known = all(r.get("evals_bpb") for runs in results.values() for r in runs)

  def curve(r: dict, name: str) -> tuple[list[float], list[float]]:
    y = r["evals_bpb"] if bytes_known else [v for _, _, v in r["evals"]]
    if flops:
      return [s * r.get("flops", flops[name])["flops_per_step"] / 1e12 for _, s, _ in r["evals"]], y
    # elapsed_s counts from the first step; shift by start-up so the x axis is wall time
    startup = r.get("startup_s", r["wall_s"] - r["evals"][-1][0])
    return [t + startup for t, _, _ in r["evals"]], y

  reports.line_chart(path, {name: [curve(r, name) for r in runs] for name, runs in results.items()},
                     xlabel="training TFLOPs (model + optimizer)" if flops else
                     "wall time from command start (s)",
                     ylabel="val bits per byte" if bytes_known else "val loss")


def matmul_peak() -> float:
  """float32 matmul FLOP/s of this machine's CPU (the trainer's MFU reference), measured now,
  before any run, with the machine to itself."""
  import jax

  from jaxtrain.measure import estimate
  jax.config.update("jax_platforms", "cpu")
  return estimate.time_matmul("float32", 2048, 5)


def _mfu(runs: list[dict], flops: dict, peak: float) -> str:
  """Training FLOP/s (optimizer included) at each run's tokens/s over the matmul peak: the median."""
  rates = [(f := r.get("flops", flops))["flops_per_step"] / f["tokens_per_step"] * r["tokens_per_sec"]
           for r in runs]
  return f"{statistics.median(rates) / peak:.0%}"


def _tflops(run: dict, flops: dict) -> float:
  """The run's training TFLOPs: its own FLOPs per step (an auto run's choice), else `flops`'."""
  return run["steps"] * run.get("flops", flops)["flops_per_step"] / 1e12


def flops_table(report: dict) -> str:
  rows = [[name, f"{f['model_flops_per_token'] / 1e6:.3f}", f["tokens_per_step"],
           f"{f['model_flops_per_token'] * f['tokens_per_step'] / 1e9:.3f}",
           f"{f['optimizer_flops_per_step'] / 1e9:.3f}", f"{f['flops_per_step'] / 1e9:.3f}"]
          for name, f in report["flops"].items()]
  return reports.markdown_table(["run", "model MFLOPs/token", "tokens/step", "model GFLOPs/step",
                                 "optimizer GFLOPs/step", "GFLOPs/step"], rows)


def markdown(report: dict) -> str:
  rows = []
  for name, run in report["runs"].items():
    runs = run["results"]
    med = lambda key, runs=runs: statistics.median(r[key] for r in runs)
    bpb = [r["final_bpb"] for r in runs if r["final_bpb"] is not None]
    models = " / ".join(dict.fromkeys(r.get("model", "-") for r in runs))  # auto's, per seed
    rows.append([name, models, f"{med('final_val'):.4f}",
                 " ".join(f"{r['final_val']:.4f}" for r in runs),
                 f"{statistics.median(bpb):.4f}" if bpb else "-", runs[0]["steps"],
                 f"{_tflops(runs[0], report['flops'][name]):.2f}",
                 f"{med('tokens_per_sec'):,.0f}",
                 _mfu(runs, report["flops"][name], report["matmul_peak_flops"]),
                 f"{med('wall_s'):.1f}", " ".join(run["command"])])
  table = reports.markdown_table(["run", "model", "final val (median)", "each seed", "val bpb", "steps",
                                 "train TFLOPs", "tokens/s", "MFU", "wall s (median)", "command"],
                                 rows)
  budget_s, budget_flops = report["budget_s"], report["budget_flops"]
  steps = (f"steps set to fit {budget_s:g} s each" if budget_s else
           f"steps set to fit {budget_flops / 1e12:.3f} TFLOPs each" if budget_flops else
           "each config's own max_steps")
  corpus = report["data"] or "each config's own"
  nanogpt_tflops = NANOGPT["max_iters"] * report["nanogpt_flops"]["flops_per_step"] / 1e12
  return (f"# Val loss against wall time and training FLOPs ({reports.timestamp()})\n\n"
          f"{reports.cpu_line(report['machine'])}\n{reports.load_line(report['load'])}\n\n"
          f"corpus: {corpus}; seeds: {report['seeds']}; {steps}; nanoGPT's CPU recipe "
          f"({NANOGPT['max_iters']} iterations) trains {nanogpt_tflops:.3f} TFLOPs; MFU: training "
          f"FLOP/s at the median tokens/s over the float32 matmul peak measured before the runs, "
          f"{report['matmul_peak_flops'] / 1e9:.1f} GFLOP/s\n\n{table}\n\n"
          "Training FLOPs: model matmul FLOPs per token (6N + 12 x layers x T x d_model, as the "
          "trainer's `train FLOPs/token`) x tokens, plus the optimizer's matmul FLOPs per step "
          "(Muon's Newton-Schulz iterations) x steps; evaluation not counted.\n\n"
          f"{flops_table(report)}\n")


def _budget_flops(text: str | None) -> float | None:
  """`--budget_flops`: a number, or "nanogpt" for nanoGPT's CPU recipe's training FLOPs."""
  if text is None:
    return None
  if text == "nanogpt":
    return NANOGPT["max_iters"] * nanogpt_flops()["flops_per_step"]
  return float(text)


def set_budgets(specs: dict, opts, data: str | None, flops: dict, tmp: Path) -> dict:
  """Appends each jaxtrain run's `train.max_steps` for the budget; returns the probes' findings."""
  probes, budget_flops = {}, _budget_flops(opts.budget_flops)
  for name, args in specs.items():
    if name == NANOGPT_NAME:
      continue
    if budget_flops:
      steps = steps_for_flops(flops[name], budget_flops, args)
      print(f"{name}: {steps} steps fit {budget_flops / 1e12:.3f} TFLOPs "
            f"({flops[name]['flops_per_step'] / 1e9:.3f} GFLOPs/step)", flush=True)
    elif opts.budget_s:
      steps, probes[name] = steps_for_budget(args, data, opts.budget_s, tmp / f"{name}-probe")
      print(f"{name}: {steps} steps fit {opts.budget_s:g} s ({probes[name]})", flush=True)
    else:
      continue
    args.append(f"--config.train.max_steps={steps}")
  return probes


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--run", action="append", required=True,
                  help='"name=config.py --config.x=y ...": one per configuration')
  ap.add_argument("--data", default=None, help="the corpus every run trains on (default: each config's own)")
  ap.add_argument("--seeds", type=int, default=1)
  budget = ap.add_mutually_exclusive_group()
  budget.add_argument("--budget_s", type=float, default=None,
                      help="each run's wall-time budget: its max_steps is set to fit (default: its own)")
  budget.add_argument("--budget_flops", default=None, metavar="FLOPS",
                      help="each run's training-FLOP budget (e.g. 8e12, or nanogpt: its CPU "
                           "recipe's): its max_steps is set to fit")
  ap.add_argument("--nanogpt", default=None, metavar="DIR",
                  help="also run nanoGPT's own CPU recipe from this karpathy/nanoGPT checkout, "
                       "interleaved with the others, for each seed")
  ap.add_argument("--lock", default=None, metavar="FILE",
                  help="hold an exclusive flock on FILE around each run (a shared machine)")
  ap.add_argument("--name", default="quality")
  ap.add_argument("--out", default=None, help="default: benchmarks/results/<date>-<name>")
  opts = ap.parse_args()
  out = Path(opts.out) if opts.out else reports.results_dir(opts.name)
  out.mkdir(parents=True, exist_ok=True)
  words = {name: shlex.split(command) for name, _, command in (s.partition("=") for s in opts.run)}
  specs = {name: [f"--config={w[0]}", *w[1:]] for name, w in words.items()}  # config.py, overrides
  if opts.nanogpt:
    specs = {NANOGPT_NAME: [f"(in {opts.nanogpt})", "python", *NANOGPT_ARGS], **specs}
  results: dict[str, list[dict]] = {name: [] for name in specs}
  data = opts.data and os.path.abspath(opts.data)
  flops = {name: nanogpt_flops() if name == NANOGPT_NAME else run_flops(args, data)
           for name, args in specs.items()}
  with held(opts.lock):
    peak = matmul_peak()
  loadavg_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as tmp, common.LoadSampler(lambda: list(CHILDREN)) as load:
    if (opts.budget_s or opts.budget_flops) and None in flops.values():
      raise SystemExit("error: a model.size=auto run sizes itself to its own "
                       "--config.train.time_budget=..., not to --budget_s or --budget_flops")
    probes = set_budgets(specs, opts, data, flops, Path(tmp))
    for seed in range(opts.seeds):
      for name, args in specs.items():
        if name == NANOGPT_NAME:  # its seed is its own (1337); repeats measure its time
          with held(opts.lock):
            r = run_nanogpt(Path(opts.nanogpt).resolve(), out / f"nanogpt_{seed}.log", CHILDREN)
        else:
          workdir = Path(tmp) / f"{name}-{seed}"
          with held(opts.lock):
            r = run_once(args, data, seed, workdir)
          r["flops"] = flops[name] or saved_flops(workdir)  # auto: each seed chooses its own
        results[name].append(r)
        print(f"{name} seed {seed}: val {r['final_val']:.4f} (best {r['best_val']:.4f}) after "
              f"{r['steps']} steps, {_tflops(r, flops[name]):.2f} TFLOPs, in {r['wall_s']:.1f} s",
              flush=True)
  load_summary = reports.load_record(loadavg_before, load)
  report = {"machine": reports.machine_info(), "load": load_summary, "seeds": opts.seeds,
            "data": opts.data, "budget_s": opts.budget_s,
            "budget_flops": _budget_flops(opts.budget_flops), "probes": probes,
            "flops": {name: f or results[name][0]["flops"] for name, f in flops.items()},
            "nanogpt_flops": nanogpt_flops(), "matmul_peak_flops": peak,
            "runs": {name: {"command": specs[name], "results": results[name]} for name in specs}}
  text = markdown(report)
  print(text)
  reports.write(out, "quality", report, text,
                chart=lambda path: plot(path, results, flops if opts.budget_flops else None))


if __name__ == "__main__":
  main()
