"""The 5-minute CPU track: how well a model learns Tiny Shakespeare in 5 minutes of this CPU.

    curl -o input.txt https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
    python benchmarks/track.py --data=input.txt --config=configs/shakespeare_char.py \
        --config.model.size=auto

The rules, the same for every entry:
- the text is Tiny Shakespeare as char-rnn has it (its sha256 is checked: another text runs, but
  is no record); its last 10% of bytes validate (the cut jaxtrain's data.val_fraction=0.1 makes,
  at a byte, so the same text for every tokenizer), the rest trains;
- an entry is the arguments (all but this script's own) of one `python -m jaxtrain` command,
  run whole with `--config.train.time_budget=5m`, from spawning it to its exit, from an empty
  compile cache and an empty jaxtrain cache (a tokenizer learned, a speed probe measured: inside
  the 5 minutes); it may take no more than the budget and 2% (`--budget`);
- the score is the bits per byte of its last checkpoint over the whole validation text, measured
  after it the same way for every entry: windows of the model's context, one after another, each
  token predicted once (`jt.text_batches`), nats summed over the tokens, divided by the bytes and
  ln 2.
Nothing else may run meanwhile (`--lock=FILE` takes that file's exclusive lock for the run); the
result names the CPU (lscpu's family and model) and the other processes' share of the machine.
Writes track.{json,md} to --out and prints the README's records table row.
"""

import argparse
import fcntl
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import common  # noqa: E402  (after the path above)
import reports  # noqa: E402

NAME = "track"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
VAL_FRACTION = 0.1
OVER = 0.02  # an entry may end this much past the budget


def validation_text(raw: bytes) -> bytes:
  """The held-out tail of the text: what jaxtrain's data.val_fraction cut leaves (one document)."""
  import numpy as np

  from jaxtrain.data import heldout

  _, offset = heldout.cut(np.array([len(raw)]), VAL_FRACTION)
  return raw[offset:]


def score(workdir: Path, val: bytes, env: dict) -> dict:
  """Bits per byte of the run's newest checkpoint over `val`, in a process of its own."""
  code = f"""
import json, math, sys
import numpy as np
import jaxtrain as jt
state, tok = jt.load_state({str(workdir)!r}), jt.load_tokenizer({str(workdir)!r})
text = open({str(workdir / 'track_val.txt')!r}, encoding="utf-8", errors="replace").read()
batches = jt.text_batches(text, tok, state.model_cfg.seq_len)
nats = sum(float(jt.eval_step(state, b)["loss"]) * float(b["weights"].sum()) for b in batches)
tokens = sum(float(b["weights"].sum()) for b in batches)
print(json.dumps({{"nats": nats, "tokens": tokens, "step": int(state.step)}}))
"""
  (workdir / "track_val.txt").write_bytes(val)
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True)
  if out.returncode:
    raise SystemExit(f"error: scoring {workdir} failed: {out.stderr.strip().splitlines()[-1:]}")
  got = json.loads(out.stdout.strip().splitlines()[-1])
  return {"val_bpb": round(got["nats"] / (len(val) * math.log(2)), 4), "val_tokens": got["tokens"],
          "val_bytes": len(val), "step": got["step"]}


def run_entry(args, entry: list[str]) -> dict:
  """The entry's whole command under the rules; its score and what it ran with."""
  scratch = Path(tempfile.mkdtemp(prefix="jaxtrain-track-"))
  workdir = scratch / "run"
  cmd = [sys.executable, "-m", "jaxtrain", *entry, f"--config.data.path={Path(args.data).resolve()}",
         f"--config.train.time_budget={args.budget}", f"--config.workdir={workdir}",
         "--config.headless=True", "--config.data.val_fraction=0.1"]
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAXTRAIN_CACHE=str(scratch / "cache"),
             JAX_COMPILATION_CACHE_DIR=str(scratch / "xla"))
  lock = open(args.lock, "a") if args.lock else None
  try:
    if lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
    with common.LoadSampler(common.ours) as sampler:
      t0 = time.perf_counter()
      proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
      wall = time.perf_counter() - t0
  finally:
    if lock:
      lock.close()
  lines = proc.stdout.splitlines()
  if proc.returncode:
    raise SystemExit(f"error: the entry exited {proc.returncode}: "
                     f"{(proc.stderr.strip().splitlines() or lines or [''])[-1]}")
  return {"command": " ".join(["python -m jaxtrain", *entry]), "wall_s": round(wall, 1),
          "others_pct": sampler.summary()["all"]["other_pct"]["mean"],
          "first_lines": [x for x in lines if x.startswith(("model.size=auto", "model:", "data:",
                                                             "time budget"))][:8],
          "workdir": workdir, "env": env}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
  p.add_argument("--data", required=True, help="Tiny Shakespeare (input.txt)")
  p.add_argument("--budget", default="5m", help="the track's wall time (another is no record)")
  p.add_argument("--name", default="", help="the entry's name in the table")
  p.add_argument("--lock", default="", help="hold this file's exclusive lock through the run")
  p.add_argument("--out", default="", help="results folder (default: dated, named by CPU kind)")
  args, entry = p.parse_known_args()
  entry = [a for a in entry if a != "--"]
  from jaxtrain.system import fmt

  raw = Path(args.data).read_bytes()
  sha = hashlib.sha256(raw).hexdigest()
  machine = reports.machine_info()
  result = run_entry(args, entry)
  result.update(score(result.pop("workdir"), validation_text(raw), result.pop("env")))
  budget_s = fmt.parse_duration(args.budget)
  why_not = [why for bad, why in (
      (sha != TINY_SHAKESPEARE_SHA256, f"the text is not Tiny Shakespeare (sha256 {sha[:12]}...)"),
      (args.budget != "5m", f"the budget is {args.budget}, not 5m"),
      (result["wall_s"] > budget_s * (1 + OVER), f"it took {result['wall_s']}s, over "
                                                 f"{budget_s * (1 + OVER):.0f}s")) if bad]
  result.update(name=args.name or " ".join(entry), record=not why_not, not_a_record=why_not,
                cpu=reports.cpu_name(machine), cores=machine["cores_available"],
                jax=machine["versions"]["jax"], date=reports.timestamp()[:10])
  row = (f"| {result['val_bpb']:.4f} | {result['name']} | `{result['command']}` | "
         f"{result['cpu']}, {result['cores']} cores | {result['wall_s']:.0f} s | {result['date']} |")
  out = Path(args.out or reports.results_dir(f"{NAME}-{reports.cpu_tag(machine)}"))
  md = "\n".join([f"# The 5-minute CPU track: {result['name']}", "", reports.cpu_line(machine), "",
                  "| val bpb | entry | command | CPU | wall | date |", "|---|---|---|---|---|---|",
                  row, "", f"Other processes' share of the machine meanwhile: "
                  f"{result['others_pct']}%.", ""]
                 + [f"Not a record: {why}." for why in why_not])
  reports.write(out, NAME, {"machine": machine, "result": result}, md + "\n")
  print(f"val {result['val_bpb']:.4f} bits/byte in {result['wall_s']:.0f}s"
        + (f"; not a record: {'; '.join(why_not)}" if why_not else ""))
  print(row)


if __name__ == "__main__":
  main()
