"""The commands gpu_side_by_side.py runs, one per side and part, and what it reads from them.

Both sides read the same token files, written once into `<out>/tokens/`: uniform random ids over
GPT-2's 50257 (what nanoGPT's throughput runs read) and real text written as ids by a 50257-entry
BPE (Zipf-distributed, as users' data is). Each kind is a nanoGPT-style directory of `train.bin`
and `val.bin` (flat uint16 ids), which nanoGPT reads as `data/<dataset>/` and jaxtrain as
`data.path`. nanoGPT's checkout is used as it is; only its `data/` directory gets links to them.
"""

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GPT2_VOCAB = 50257
TOKEN_KINDS = ("random", "text")
GPT2 = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024}
SMOKE_GPT2 = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}
WARMUP = 10  # nanoGPT iterations past its compiles, dropped from its throughput


@dataclasses.dataclass
class Setup:
  """What every command needs: where to write, the checkouts, the text, and the scale."""

  out: Path
  data: Path  # Tiny Shakespeare's input.txt
  nanogpt: Path | None  # None: jaxtrain's side only
  smoke: bool
  batch: int
  steps: int
  jaxtrain_flags: list[str]
  wheels: Path | None = None  # carried wheels: pip installs from them alone (gpu_install.py)
  extra: str = "cuda13-local"  # pyproject.toml's extra that the install part asks for

  @property
  def shape(self) -> dict:
    return SMOKE_GPT2 if self.smoke else GPT2


def timed(cmd: list[str], cwd: Path, log: Path, env: dict | None = None,
          check: bool = True) -> tuple[float, list[tuple[float, str]], int]:
  """Runs `cmd`; (wall s, [(s since start, line)] of its output, exit status), the output also
  written to `log`. A failing command stops the benchmark unless `check` is False."""
  start, lines = time.perf_counter(), []
  log.parent.mkdir(parents=True, exist_ok=True)
  with log.open("w") as out:
    out.write(" ".join(cmd) + "\n")
    out.flush()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(env or os.environ, PYTHONUNBUFFERED="1"))
    for line in proc.stdout:
      lines.append((time.perf_counter() - start, line.rstrip()))
      out.write(line)
  status = proc.wait()
  if check and status != 0:
    raise SystemExit(f"error: {' '.join(cmd)} exited {status}; its output: {log}")
  return time.perf_counter() - start, lines, status


def write_tokens(s: Setup) -> dict:
  """The two kinds of token files in `<out>/tokens/<kind>/{train,val}.bin`; what each holds."""
  from jaxtrain.data import tokenizer as tokenizer_lib

  root = s.out / "tokens"
  n = 2**16 if s.smoke else 2**23
  ids = np.random.default_rng(0).integers(0, GPT2_VOCAB, n + n // 8, dtype=np.uint16)
  _write_split(root / "random", ids)
  text = s.data.read_text(encoding="utf-8")
  bpe = tokenizer_lib.train_bpe([text], 1024 if s.smoke else GPT2_VOCAB)
  _write_split(root / "text", np.asarray(bpe.encode(text), dtype=np.uint16))
  info = {}
  for kind in TOKEN_KINDS:
    train = np.fromfile(root / kind / "train.bin", dtype=np.uint16)
    counts = np.bincount(train, minlength=GPT2_VOCAB)
    top = np.sort(counts)[::-1]
    info[kind] = {"train_ids": int(train.size), "distinct": int((counts > 0).sum()),
                  "top10_share": float(top[:10].sum() / train.size)}
  return info


def _write_split(directory: Path, ids: np.ndarray) -> None:
  directory.mkdir(parents=True, exist_ok=True)
  cut = len(ids) * 9 // 10
  ids[:cut].tofile(directory / "train.bin")
  ids[cut:].tofile(directory / "val.bin")


def link_nanogpt_data(s: Setup) -> None:
  """nanoGPT's `data/jaxtrain_<kind>` -> our token files; Tiny Shakespeare prepared its way."""
  if not (s.nanogpt / "train.py").is_file():
    raise SystemExit(f"error: {s.nanogpt} is not a nanoGPT checkout (no train.py); pass --nanogpt=DIR")
  for kind in TOKEN_KINDS:
    link = s.nanogpt / "data" / f"jaxtrain_{kind}"
    if link.is_symlink() or link.exists():
      link.unlink()
    link.symlink_to(s.out / "tokens" / kind, target_is_directory=True)
  char = s.nanogpt / "data/shakespeare_char"
  if not (char / "train.bin").is_file():
    (char / "input.txt").write_bytes(s.data.read_bytes())
    subprocess.run([sys.executable, "prepare.py"], cwd=char, check=True, capture_output=True)


def _smoke_nanogpt(s: Setup) -> list[str]:
  return ["--device=cpu", "--compile=False", "--dtype=float32"] if s.smoke else []


def nanogpt_throughput(s: Setup, kind: str) -> dict:
  cmd = [sys.executable, "train.py", f"--dataset=jaxtrain_{kind}", f"--batch_size={s.batch}",
         "--gradient_accumulation_steps=1", f"--max_iters={s.steps}", "--eval_interval=1000000",
         "--eval_iters=1", "--log_interval=1", "--dropout=0.0", "--always_save_checkpoint=False",
         f"--out_dir={s.out / 'nanogpt_out'}", *[f"--{k}={v}" for k, v in s.shape.items()],
         *_smoke_nanogpt(s)]
  wall, lines, _ = timed(cmd, s.nanogpt, s.out / "logs" / f"nanogpt_throughput_{kind}.log")
  ms = [float(m[2]) for _, line in lines
        if (m := re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", line)) and int(m[1]) >= WARMUP]
  step_s = statistics.median(ms) / 1000
  return _row("nanoGPT", kind, s, step_s, wall, cmd)


def jaxtrain_gpt2(s: Setup, name: str, kind: str, steps: int, extra: tuple[str, ...] = ()) -> list[str]:
  """`python -m jaxtrain` on GPT-2 124M reading the `kind` token files."""
  cmd = [sys.executable, "-m", "jaxtrain", "--config=configs/gpt2_124m.py",
         f"--config.workdir={s.out / 'runs' / name}", f"--config.data.path={s.out / 'tokens' / kind}",
         "--config.data.tokenizer=byte", "--config.model.vocab_size=50304", "--config.headless=True",
         f"--config.train.batch_size={s.batch}", "--config.train.grad_accum=1",
         f"--config.train.max_steps={steps}", "--config.train.log_every=5",
         "--config.train.eval_every=100000", "--config.train.eval_steps=1",
         "--config.train.checkpoint_every=100000", "--config.sample.num_samples=0",
         *extra, *s.jaxtrain_flags]
  if s.smoke:
    names = ("n_layers", "n_heads", "d_model", "seq_len")
    cmd += ["--jax_platforms=cpu", "--config.model.dtype=float32",
            *[f"--config.model.{k}={v}" for k, v in zip(names, s.shape.values())]]
  return cmd


def jaxtrain_throughput(s: Setup, kind: str, name: str = "", extra: tuple[str, ...] = (),
                        xla_flags: str = "", check: bool = True) -> dict:
  """jaxtrain's tokens/s on the `kind` token files; a variant (`name`) adds flags to its command
  (`extra`) or to XLA_FLAGS. Unless `check`, a failing run is a row with its exit status."""
  import json

  name = name or f"throughput_{kind}"
  cmd = jaxtrain_gpt2(s, name, kind, s.steps, extra)
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip())
  wall, _, status = timed(cmd, ROOT, s.out / "logs" / f"jaxtrain_{name}.log", env=env, check=check)
  metrics = s.out / "runs" / name / "metrics.jsonl"
  records = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
  # Each reading is the pace since the one before; the first includes the steps just past compile.
  speeds = [r["tokens_per_sec"] for r in records if r.get("tokens_per_sec")][1:]
  if status or not speeds:
    return {"side": "jaxtrain", "tokens": kind, "batch": s.batch, "exit_status": status,
            "tokens_per_sec": 0.0, "wall_s": wall, "command": cmd, "xla_flags": xla_flags}
  tps = statistics.median(speeds)
  row = _row("jaxtrain", kind, s, s.batch * s.shape["block_size"] / tps, wall, cmd)
  return {**row, "xla_flags": xla_flags} if xla_flags else row


def _row(side: str, kind: str, s: Setup, step_s: float, wall: float, cmd: list[str]) -> dict:
  return {"side": side, "tokens": kind, "batch": s.batch, "step_ms": step_s * 1000,
          "tokens_per_sec": s.batch * s.shape["block_size"] / step_s, "wall_s": wall,
          "command": cmd}


def nanogpt_profile(s: Setup) -> Path | None:
  """nanoGPT's own bench.py with its torch.profiler schedule (5 traced steps) at our micro-batch,
  on `data/openwebtext/train.bin` (linked to the random tokens when it is not there)."""
  train_bin = s.nanogpt / "data" / "openwebtext" / "train.bin"
  if not train_bin.exists():
    if train_bin.is_symlink():  # a link left by an earlier run whose folder is gone
      train_bin.unlink()
    train_bin.parent.mkdir(parents=True, exist_ok=True)
    train_bin.symlink_to(s.out / "tokens" / "random" / "train.bin")
  log_dir = s.nanogpt / "bench_log"
  cmd = [sys.executable, "bench.py", "--profile=True", f"--batch_size={s.batch}",
         f"--block_size={s.shape['block_size']}", *_smoke_nanogpt(s)]
  if s.smoke:  # its real-data loader pins memory, which needs a GPU
    cmd.append("--real_data=False")
  timed(cmd, s.nanogpt, s.out / "logs" / "nanogpt_profile.log")
  from traces import find_trace
  trace = find_trace(log_dir, "*.pt.trace.json")
  if trace is None:
    return None
  target = s.out / "profiles" / "nanogpt" / trace.name
  target.parent.mkdir(parents=True, exist_ok=True)
  trace.replace(target)
  return target


def evals_of(lines: list[tuple[float, str]], pattern: str) -> list[tuple[float, int, float]]:
  """(s since the command started, step, val loss) of each eval line."""
  return [(t, int(m[1]), float(m[2])) for t, line in lines if (m := re.search(pattern, line))]
