"""Bits per byte of configs/nano.py with different tokenizers at equal wall time.

    python benchmarks/bpb_tokenizers.py --seconds=300                   # byte vs bpe 4096
    python benchmarks/bpb_tokenizers.py --seconds=300 --tokenizers=byte,bpe:512,bpe:4096

Each run trains nano on the same data (default: the standard library) for --seconds of training
time (a Hook stops it; tokenizing, compiling and evaluations do not count), then evaluates its
last state on the same validation documents: val_loss per token, and val_bpb, which compares
across tokenizers. Writes bpb_tokenizers.{json,md} to --out (default
benchmarks/results/<date>-bpb_tokenizers/).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "bpb_tokenizers"


def make_timer(seconds: float):
  from jaxtrain import train

  class StopAfter(train.Hook):
    """Stops once the run's training time (metrics' elapsed_s) passes `seconds`."""

    def __init__(self):
      self.elapsed = 0.0

    def on_log(self, step: int, record: dict) -> None:
      self.elapsed = record["elapsed_s"]

    def stop_reason(self) -> str | None:
      return f"{seconds:.0f} s of training" if self.elapsed >= seconds else None

  return StopAfter()


def final_eval(cfg, workdir: str) -> dict:
  """val_loss and val_bpb of the run's last state, on the eval batches a run uses."""
  import jax
  import numpy as np

  from jaxtrain.checkpoints import load
  from jaxtrain.core import steps
  from jaxtrain.data import corpus as corpus_lib

  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=lambda _: None)
  state = load.load_state(workdir)
  t = cfg.train
  val = corpus_lib.eval_sets(corpus, t.batch_size, cfg.model.seq_len, cfg.seed, t.eval_steps)[0]
  step = jax.jit(steps.eval_step)
  loss = float(np.mean([float(step(state, {"tokens": b["tokens"]})["loss"]) for b in val.batches]))
  return {"step": int(state.step), "val_loss": loss, "val_bpb": loss * val.bpb,
          "bytes_per_token": corpus.n_bytes / len(corpus.tokens),
          "vocab_size": corpus.tokenizer.vocab_size}


def one_run(spec: str, args, scratch: Path) -> dict:
  from jaxtrain import train
  from jaxtrain.config import loading

  kind, _, vocab = spec.partition(":")
  cfg = loading.load_config(str(ROOT / "configs" / "nano.py"), **{
      "workdir": str(scratch / spec.replace(":", "-")), "data.path": args.path,
      "data.tokenizer": kind, "data.vocab_size": int(vocab or 4096), "train.max_steps": 10**6,
      "train.eval_every": 10**6, "train.checkpoint_every": 10**6, "sample.num_samples": 0,
      "headless": True, "optim.decay_steps": args.decay_steps})
  t0 = time.time()
  result = train.run(cfg, show_progress=False, hooks=(make_timer(args.seconds),))
  row = {"tokenizer": spec, "train_steps": result.step, "tokens_per_sec": result.tokens_per_sec,
         "wall_s": time.time() - t0, **final_eval(cfg, result.workdir)}
  lines = [json.loads(x) for x in open(Path(result.workdir) / "metrics.jsonl")]
  row["train_s"] = max(r["elapsed_s"] for r in lines)
  row["text_mb_seen"] = (result.step * cfg.train.batch_size * cfg.model.seq_len
                         * row["bytes_per_token"] / 1e6)
  print(f"{spec}: step {row['step']}, val_loss {row['val_loss']:.4f}, val_bpb "
        f"{row['val_bpb']:.4f}", flush=True)
  return row


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--path", default="")
  parser.add_argument("--seconds", type=float, default=300)
  parser.add_argument("--tokenizers", default="byte,bpe:4096")
  parser.add_argument("--decay_steps", type=int, default=2000, help="cosine schedule length")
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  out = Path(args.out or reports.results_dir(NAME))
  load_before = os.getloadavg()
  with tempfile.TemporaryDirectory() as tmp, common.LoadSampler(lambda: [os.getpid()]) as sampler:
    rows = []
    for spec in args.tokenizers.split(","):
      sampler.label = spec
      rows.append(one_run(spec, args, Path(tmp)))
  report = {"benchmark": NAME, "timestamp": reports.timestamp(), "args": vars(args),
            "machine": reports.machine_info(),
            "load": reports.load_record(load_before, sampler), "rows": rows}
  table = reports.markdown_table(
      ["tokenizer", "vocab", "bytes/token", "train s", "steps", "text seen MB", "val_loss (nats/token)",
       "val_bpb"],
      [[r["tokenizer"], r["vocab_size"], f"{r['bytes_per_token']:.2f}", f"{r['train_s']:.0f}",
        r["step"], f"{r['text_mb_seen']:.1f}", f"{r['val_loss']:.4f}", f"{r['val_bpb']:.4f}"]
       for r in rows])
  md = "\n".join([
      f"# nano: bits per byte by tokenizer at equal training time ({report['timestamp']})", "",
      f"- {reports.cpu_line(report['machine'])}",
      f"- data: {args.path or 'the standard library'}; {args.seconds:.0f} s of training each, "
      f"cosine schedule over {args.decay_steps} steps, then one evaluation of the last state on "
      "the same validation documents",
      f"- load: {reports.load_line(report['load'])}", "", table, "",
      f"val_bpb = val_loss / ln 2 x target tokens / their UTF-8 bytes (ln 2 = {math.log(2):.4f}).",
      ""])
  print(md)
  reports.write(out, NAME, report, md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
