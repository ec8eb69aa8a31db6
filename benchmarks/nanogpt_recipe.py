"""nanoGPT's CPU recipe for Tiny Shakespeare, the peer of the side-by-side benchmarks (quality.py,
whole_command.py): its command line, its model's FLOPs counted the way jaxtrain counts its own, and
one run of it in its checkout, read from the lines it prints."""

import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# As its README gives it (eval_iters 20 to match ours, a log line per iteration for its speed,
# dropout 0 as in the README's line).
NANOGPT = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12,
           "max_iters": 2000}
NANOGPT_VOCAB = 65  # the characters of tinyshakespeare.txt (its data/shakespeare_char/meta.pkl)
NANOGPT_BATCH, NANOGPT_BLOCK = NANOGPT["batch_size"], NANOGPT["block_size"]
NANOGPT_ARGS = ["train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
                "--eval_iters=20", "--log_interval=1", *(f"--{k}={v}" for k, v in NANOGPT.items()),
                f"--lr_decay_iters={NANOGPT['max_iters']}", "--dropout=0.0"]
NANOGPT_NAME = "nanoGPT itself"
NANOGPT_MODEL = f"{NANOGPT['n_layer']}x{NANOGPT['n_embd']} char"


def result(wall: float, evals: list[tuple], **more) -> dict:
  """One run's record from its wall time and its evaluations (elapsed s, step, val loss)."""
  return {"wall_s": wall, "final_val": evals[-1][2], "best_val": min(e[2] for e in evals),
          "steps": evals[-1][1], "evals": evals, **more}


def run_nanogpt(nanogpt_dir: Path, log: Path, children: list[int]) -> dict:
  """nanoGPT's own CPU recipe in its checkout (data/shakespeare_char prepared there): val loss
  against wall time from its printed evals, tokens/s from its per-iteration times. `children`
  holds its pid while it runs (for a load sampler)."""
  if not (nanogpt_dir / "data/shakespeare_char/train.bin").is_file():
    raise SystemExit(f"error: {nanogpt_dir}/data/shakespeare_char/train.bin is missing; run "
                     "python data/shakespeare_char/prepare.py there first")
  start, evals, iter_ms = time.perf_counter(), [], []
  with log.open("w") as out:
    proc = subprocess.Popen([sys.executable, *NANOGPT_ARGS], cwd=nanogpt_dir, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    children[:] = [proc.pid]
    for line in proc.stdout:
      out.write(line)
      if m := re.match(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", line):
        evals.append((time.perf_counter() - start, int(m[1]), float(m[2])))
      elif (m := re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", line)) and int(m[1]) > 0:
        iter_ms.append(float(m[2]))
  wall = time.perf_counter() - start
  children.clear()
  if proc.wait() != 0 or not evals:
    raise RuntimeError(f"nanoGPT exited {proc.returncode}; its output: {log}")
  # Tiny Shakespeare is ASCII: a char is a byte, and nats per char / ln 2 are bits per byte.
  return result(wall, [(t - evals[0][0], s, v) for t, s, v in evals],
                final_bpb=evals[-1][2] / math.log(2), model=NANOGPT_MODEL,
                evals_bpb=[v / math.log(2) for _, _, v in evals],
                tokens_per_sec=NANOGPT_BATCH * NANOGPT_BLOCK / (statistics.median(iter_ms) / 1000),
                startup_s=evals[0][0])


def nanogpt_flops() -> dict:
  """nanoGPT's CPU recipe counted as jaxtrain counts a run: its model (GPT-2 layout: LayerNorm,
  learned positions, GELU MLP 4x wide, tied embeddings) at NANOGPT's shape; AdamW has no
  matmuls."""
  from jaxtrain.core import model as model_lib

  mc = model_lib.ModelConfig(vocab_size=NANOGPT_VOCAB, n_layers=NANOGPT["n_layer"],
                             n_heads=NANOGPT["n_head"], d_model=NANOGPT["n_embd"],
                             seq_len=NANOGPT_BLOCK, norm="layernorm", pos="learned", mlp="gelu",
                             tie_embeddings=True)
  per_token, tokens = model_lib.flops_per_token(mc), NANOGPT_BATCH * NANOGPT_BLOCK
  return {"model_flops_per_token": per_token, "tokens_per_step": tokens,
          "optimizer_flops_per_step": 0, "flops_per_step": per_token * tokens}
