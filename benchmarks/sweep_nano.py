"""A real sweep on this machine: nano, learning rate x depth, through `python -m jaxtrain.sweep`.

    python benchmarks/sweep_nano.py --root=runs/sweep --config.train.max_steps=600

Runs the sweep (finished runs are skipped, so a second call only rewrites the report), samples
the machine's load meanwhile, and writes to --out (default benchmarks/results/<date>-sweep-nano/):
sweep.json (machine, load, command, each run's numbers), sweep.md (the comparison table with the
CPU and load lines) and the sweep's two plots. Extra `--config.*` / `--sweep=` arguments go to the
sweep; without --sweep it sweeps optim.lr=1e-3,3e-3 x model.n_layers=2,4.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import reports  # noqa: E402

from jaxtrain.tools import compare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _family(pid: int) -> list[int]:
  """`pid` and its descendants (the sweep's runs), from /proc."""
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    out.append(p)
    try:
      for task in os.listdir(f"/proc/{p}/task"):
        todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
    except OSError:
      pass
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default="runs/sweep")
  parser.add_argument("--out", default=str(reports.results_dir("sweep-nano")))
  args, extra = parser.parse_known_args()
  sweeps = [a for a in extra if a.startswith("--sweep=")] or [
      "--sweep=optim.lr=1e-3,3e-3", "--sweep=model.n_layers=2,4"]
  cmd = [sys.executable, "-m", "jaxtrain.sweep", "--config=configs/nano.py", *sweeps,
         f"--root={args.root}", "--jax_platforms=cpu",
         *(a for a in extra if not a.startswith("--sweep="))]
  print("$", " ".join(cmd[1:]), flush=True)
  load_before = os.getloadavg()
  t0 = time.time()
  proc = subprocess.Popen(cmd, cwd=ROOT)
  with common.LoadSampler(lambda: _family(proc.pid), interval_s=2.0) as sampler:
    code = proc.wait()
  wall = time.time() - t0
  load = reports.load_record(load_before, sampler)
  root = ROOT / args.root
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  infos = compare.compare([str(root)], out, print_fn=lambda _: None)
  table = (out / "compare.md").read_text()
  rows = [{"run": info.path.name, "state": info.state, "step": info.step,
           "params": info.status.get("params"), "best_val_loss": info.best("val_loss"),
           "final_val_loss": info.final("val_loss"), "final_train_loss": info.final("loss"),
           "median_tokens_per_sec": info.median_speed(), "training_s": info.wall_s(),
           "config": {k: info.config[k] for k in compare.differences(infos)}} for info in infos]
  machine = reports.machine_info()
  report = {"timestamp": reports.timestamp(), "command": cmd[1:], "exit_status": code,
            "sweep_wall_s": round(wall, 1), "machine": machine, "load": load, "runs": rows}
  reports.write(out, "sweep", report, (
      f"# nano sweep, {reports.timestamp()}\n\n`python {' '.join(cmd[1:])}`: exit status {code}, "
      f"{wall / 60:.1f} min for the call (runs skipped as finished cost nothing).\n\n"
      f"{reports.cpu_line(machine)}\n\n{reports.load_line(load)}\n\n{table}\n"
      "![loss against step](loss_vs_step.png)\n\n![loss against time](loss_vs_time.png)\n"))
  for png in ("loss_vs_step.png", "loss_vs_time.png"):
    if (root / png).exists() and root / png != out / png:
      shutil.copy(root / png, out / png)
  print(f"copied the loss plots into {out}")
  sys.exit(code)


if __name__ == "__main__":
  main()
