"""Data pipeline speed: tokenizing MB/s per tokenizer, and micro-batches per second the pipeline
delivers against what the train step consumes.

    python benchmarks/data_pipeline.py                  # the standard library's .py files
    python benchmarks/data_pipeline.py --path=docs.jsonl --repeats=5

Tokenizing: `jaxtrain.data.corpus.prepare` on an empty cache, as a first run does, for each tokenizer:
byte, char, a BPE trained on the corpus (4096 tokens, and GPT-2's 50257 as configs/gpt2_124m.py
trains), and each trained BPE again as a given tokenizer.json (encoding only, no training). MB/s
are the UTF-8 bytes of the documents over the wall time of `prepare` (every pass: reading,
training where there is one, encoding, writing the cache), the median of --repeats.

Pipeline: `jaxtrain.data.corpus.train_iterator` (grain, one reader thread, as a run uses it) at the
micro-batch shape of configs/nano.py, small.py and gpt2_124m.py, each on its own tokenizer's
corpus: micro-batches per second over --batches, the median of --repeats. Consumption: the
compiled train step's micro-batches per second, measured here on the CPU for nano and small
(gpt2_124m takes minutes a step on a laptop CPU: skipped unless --cpu-gpt2), and on an H100 as
benchmarks/results/2026-11-22-cpu_vs_gpu-h100 measured it (the median step there). Goal: BPE
tokenizing >= 5 MB/s, the pipeline >= 20x the consumption at every shape.
Writes data_pipeline.{json,md} to --out (default benchmarks/results/<date>-data_pipeline/).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "data_pipeline"
GOAL_BPE_MBS, GOAL_HEADROOM = 5.0, 20.0
H100 = ROOT / "benchmarks" / "results" / "2026-11-22-cpu_vs_gpu-h100" / "cpu_vs_gpu.json"
SHAPES = ("nano", "small", "gpt2_124m")


def tokenizing(path: str, repeats: int, scratch: Path, sampler) -> list[dict]:
  """Rows of MB/s per tokenizer; each run's token cache stays in scratch/<label>-<repeat>."""
  from jaxtrain.data import corpus as corpus_lib
  from jaxtrain.data import tokenizer
  from jaxtrain.testing import tiny_config

  rows, saved = [], {}
  kinds = [("byte", "byte", 0), ("char", "char", 0), ("bpe", "bpe 4096", 4096),
           ("bpe", "bpe 50257", 50257), ("json:4096", "tokenizer.json (bpe 4096)", 4096),
           ("json:50257", "tokenizer.json (bpe 50257)", 50257)]
  for kind, label, vocab in kinds:
    sampler.label = f"tokenize {label}"
    times, corpus = [], None
    for r in range(repeats):
      cfg = tiny_config(**{"data.path": path, "data.cache_dir": str(scratch / f"{label}-{r}"),
                           "data.tokenizer": saved.get(vocab, "") if kind.startswith("json")
                           else kind, "data.vocab_size": max(vocab, 257)})
      t0 = time.perf_counter()
      corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
      times.append(time.perf_counter() - t0)
    if kind == "bpe":
      saved[vocab] = str(scratch / f"bpe{vocab}.json")
      tokenizer.save(corpus.tokenizer, saved[vocab])
    median = statistics.median(times)
    rows.append({"tokenizer": label, "vocab_size": corpus.tokenizer.vocab_size,
                 "mb": corpus.n_bytes / 1e6, "tokens": len(corpus.tokens), "docs": corpus.n_docs,
                 "bytes_per_token": corpus.n_bytes / len(corpus.tokens), "times_s": times,
                 "median_s": median, "mb_per_s": corpus.n_bytes / 1e6 / median})
    print(f"tokenize {label}: {rows[-1]['mb_per_s']:.1f} MB/s ({median:.1f} s)", flush=True)
  return rows


def pipeline_rate(cfg, path: str, cache: Path, batches: int, repeats: int) -> tuple[float, list]:
  from jaxtrain.data import corpus as corpus_lib

  cfg.data.path, cfg.data.cache_dir = path, str(cache)
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
  rates = []
  for r in range(repeats):
    it = corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, seed=r)
    for _ in range(20):  # the reader thread started and its buffer full
      next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
      next(it)
    rates.append(batches / (time.perf_counter() - t0))
  return statistics.median(rates), rates


def cpu_step_rate(cfg, vocab: int, eot: int, steps: int = 8, budget_s: float = 30.0) -> float:
  """Micro-batches per second of the compiled train step on this CPU (one device): the median
  of up to `steps` steps after one warm-up, fewer past `budget_s`."""
  import jax
  import numpy as np

  from jaxtrain.core import programs

  p = programs.build(cfg, vocab, jax.devices()[:1], eot_id=eot)
  step = p.compile_train()
  state = p.init()
  rng = np.random.default_rng(0)
  batch = p.place({"tokens": rng.integers(0, vocab, p.batch_shape).astype(np.int32)})
  times, start = [], time.perf_counter()
  while len(times) < steps + 1 and (len(times) < 3 or time.perf_counter() - start < budget_s):
    t0 = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  return 1 / statistics.median(times[1:])


def h100_rates() -> dict:
  if not H100.exists():
    return {}
  results = json.loads(H100.read_text())["results"]
  return {r["config"]: 1 / statistics.median(r["step_times_s"]) for r in results
          if r.get("status") == "ok"}


def pipeline(args, scratch: Path, sampler) -> list[dict]:
  from jaxtrain.config import loading
  from jaxtrain.data import corpus as corpus_lib

  h100, rows = h100_rates(), []
  for shape in SHAPES:
    sampler.label = f"pipeline {shape}"
    cfg = loading.load_config(str(ROOT / "configs" / f"{shape}.py"))
    # The token cache the tokenizing runs above wrote for this tokenizer (same corpus and split).
    cache = scratch / ("byte-0" if cfg.data.tokenizer == "byte" else f"bpe {cfg.data.vocab_size}-0")
    rate, rates = pipeline_rate(cfg, args.path, cache, args.batches, args.repeats)
    row = {"shape": shape, "micro_batch": f"{cfg.train.batch_size} x {cfg.model.seq_len}",
           "tokenizer": cfg.data.tokenizer if cfg.data.tokenizer in ("byte", "char") else "bpe",
           "pipeline_per_s": rate, "pipeline_rates": rates, "cpu_step_per_s": None,
           "h100_step_per_s": h100.get(shape)}
    if shape != "gpt2_124m" or args.cpu_gpt2:
      sampler.label = f"train step {shape}"
      corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
      vocab = cfg.model.vocab_size or corpus.tokenizer.vocab_size
      cfg.model.dtype = "float32"  # bfloat16 matmuls are emulated on most CPUs
      row["cpu_step_per_s"] = cpu_step_rate(cfg, vocab, corpus.tokenizer.eot_id)
    for where in ("cpu", "h100"):
      step = row[f"{where}_step_per_s"]
      row[f"headroom_{where}"] = rate / step if step else None
    rows.append(row)
    print(f"pipeline {shape}: {rate:.0f} micro-batches/s; headroom CPU "
          f"{row['headroom_cpu'] or 0:.0f}x, H100 {row['headroom_h100'] or 0:.0f}x", flush=True)
  return rows


def markdown(report: dict) -> str:
  m, load = report["machine"], report["load"]
  fmt = lambda x, f="{:.1f}": "-" if x is None else f.format(x)
  tok_rows = [[r["tokenizer"], r["vocab_size"], f"{r['mb']:.1f}", f"{r['bytes_per_token']:.2f}",
               f"{r['median_s']:.2f} ({', '.join(f'{t:.2f}' for t in r['times_s'])})",
               f"{r['mb_per_s']:.1f}"] for r in report["tokenizing"]]
  pipe_rows = [[r["shape"], r["micro_batch"], r["tokenizer"], fmt(r["pipeline_per_s"], "{:,.0f}"),
                fmt(r["cpu_step_per_s"], "{:.2f}"), fmt(r["headroom_cpu"], "{:,.0f}x"),
                fmt(r["h100_step_per_s"], "{:.1f}"), fmt(r["headroom_h100"], "{:,.0f}x")]
               for r in report["pipeline"]]
  return "\n".join([
      f"# Data pipeline: tokenizing and batches ({report['timestamp']})", "",
      f"- {reports.cpu_line(m)}; python {m['python']}",
      f"- corpus: {report['corpus']}; {report['args']['repeats']} repeat(s), medians",
      f"- load: {reports.load_line(load)}", "",
      "## Tokenizing (data.prepare on an empty cache: every pass)", "",
      reports.markdown_table(["tokenizer", "vocab", "MB", "bytes/token", "median s (runs)",
                             "MB/s"], tok_rows), "",
      f"Goal: BPE tokenizing >= {GOAL_BPE_MBS} MB/s on 2 cores. 'bpe N' trains the vocabulary "
      "and then encodes; 'tokenizer.json' encodes with that vocabulary, given as a file.", "",
      "## Pipeline against the train step (micro-batches per second)", "",
      reports.markdown_table(["config", "micro-batch", "tokenizer", "pipeline /s", "CPU step /s",
                             "headroom (CPU)", "H100 step /s", "headroom (H100)"], pipe_rows), "",
      f"Goal: headroom >= {GOAL_HEADROOM:.0f}x at every shape. Pipeline: grain iterator, one reader "
      "thread, measured here; CPU step: this machine, float32, one device; H100 step: "
      f"{H100.relative_to(ROOT)} (median step, same configs).", ""])


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--path", default="", help="data.path ('': the standard library)")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--batches", type=int, default=2000)
  parser.add_argument("--cpu-gpt2", action="store_true", help="time gpt2_124m's step on the CPU")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  from jaxtrain.data.documents import describe

  out = Path(args.out or reports.results_dir(NAME))
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as tmp, common.LoadSampler(lambda: [os.getpid()]) as sampler:
    scratch = Path(tmp)
    tok_rows = tokenizing(args.path, args.repeats, scratch, sampler)
    pipe_rows = pipeline(args, scratch, sampler)
  report = {"benchmark": NAME, "timestamp": reports.timestamp(), "args": vars(args),
            "machine": reports.machine_info(), "corpus": describe(args.path),
            "load": reports.load_record(load_before, sampler),
            "tokenizing": tok_rows, "pipeline": pipe_rows}
  reports.write(out, NAME, report, markdown(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
