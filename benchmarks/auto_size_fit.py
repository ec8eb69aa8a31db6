"""Fits `model.size=auto`'s loss law (jaxtrain/measure/size_rule.py, `LossLaw`) to the hand-picked
runs of benchmarks/auto_size.py, and says how well it predicts them.

    python benchmarks/auto_size_fit.py --earlier --corpora=shakespeare,austen,code \
        --runs=benchmarks/results/2026-11-28-auto_size-zen4/runs.jsonl \
        --runs=benchmarks/results/2026-12-07-auto_size-emerald-rapids/runs.jsonl

Each finished hand-picked run (a hand shape, a tier, the recipe's shape) of the named corpora is a
point: N (the block matrices and output head, as size_rule counts them), D (the tokens it
trained), U (the train split's unique tokens), both counted in bytes of text (the corpus's bytes
per token: 1 for characters of ASCII text, ~2 for a BPE of 512), and its final val bits per byte.
The law is fitted by least squares on log bpb with a robust (soft L1) loss from a grid of starting
points, keeping the best (Hoffmann et al.'s approach 3). Writes fit.json (beside the last
--runs): the constants, each point with its prediction, the leave-one-out error of each point,
and of each text left out whole (fitted on the others: its error, and its error once its own
level is taken out, which is what ranks its shapes); prints the `LossLaw(...)` to paste into
size_rule.py (tests check they agree).
"""

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxtrain.core import model as model_lib  # noqa: E402
from jaxtrain.measure import size_rule  # noqa: E402

NAMES = ("e", "a", "alpha", "b", "beta", "r")
RESULTS = ROOT / "benchmarks/results"
# Runs of the same recipe (configs/shakespeare_char.py, z-loss) on Tiny Shakespeare kept from
# earlier work, each seed a point: (folder/quality.json, run, layers, width, heads).
EARLIER = (("2026-11-24-quality-zen4-zloss/side_by_side", "recipe", 2, 96, 3),
           ("2026-11-27-side_by_side-zen5-nanogpt-time", "recipe_60s", 2, 96, 3),
           ("2026-11-27-side_by_side-zen5-nanogpt-time-65s", "recipe_65s", 2, 96, 3),
           ("2026-11-24-quality-zen4-zloss/context_layers", "z_l3", 3, 96, 3))
SHAKESPEARE_TRAIN = 1_003_854  # tokens of the train split (chars; the last 10% validate)


def earlier_runs() -> list[dict]:
  """EARLIER as runs.jsonl rows (steps of 24 x 128 tokens)."""
  rows = []
  for folder, name, layers, width, heads in EARLIER:
    for r in json.loads((RESULTS / folder / "quality.json").read_text())["runs"][name]["results"]:
      rows.append({"corpus": "shakespeare", "budget": f"{folder}:{name}", "shape": f"{layers}x{width}",
                   "exit": 0, "val_bpb": r["final_bpb"], "layers": layers, "width": width,
                   "n_heads": heads, "seq_len": 128, "tokens": r["steps"] * 24 * 128,
                   "train_tokens": SHAKESPEARE_TRAIN, "vocab": 66})
  return rows


def points(runs: list[dict], corpora: set[str]) -> list[dict]:
  """(N, D, U, bpb) of every finished hand-picked run of `corpora` (D and U in tokens; `bpt`, the
  corpus's bytes per token)."""
  out = []
  for r in runs:
    if r["corpus"] not in corpora or r["shape"] == "auto" or r["exit"] or not r.get("val_bpb") \
        or r.get("noisy"):
      continue
    base = model_lib.ModelConfig(vocab_size=int(r.get("vocab") or 66), n_layers=r["layers"],
                                 n_heads=r["n_heads"], d_model=r["width"], seq_len=r["seq_len"],
                                 mlp="relu2", tie_embeddings=False, canon=4, x0_mix=True)
    out.append({"corpus": r["corpus"], "budget": r["budget"], "shape": r["shape"],
                "n": model_lib.matmul_param_count(base), "d": r["tokens"],
                "u": r["train_tokens"], "bpt": r.get("bytes_per_token") or 1.0,
                "bpb": r["val_bpb"]})
  return out


def _law(theta) -> size_rule.LossLaw:
  return size_rule.LossLaw(*theta)


def predict(law: size_rule.LossLaw, pt: dict) -> float:
  """The law's bits per byte for a point, its tokens counted in bytes of text."""
  bpt = pt.get("bpt", 1.0)
  return law.bpb(pt["n"], pt["d"] * bpt, pt["u"] * bpt)


def leave_one_text_out(pts: list[dict]) -> dict:
  """Per corpus: the law fitted to the other corpora's points, its error on this one's (rms of
  the relative errors), and the same once the text's own level is taken out (the mean log error:
  what ranks its shapes)."""
  out = {}
  for corpus in dict.fromkeys(p["corpus"] for p in pts):
    rest = [p for p in pts if p["corpus"] != corpus]
    if not rest:
      continue
    law, _ = fit(rest)
    mine = [p for p in pts if p["corpus"] == corpus]
    logs = np.array([np.log(predict(law, p) / p["bpb"]) for p in mine])
    rel = np.exp(logs) - 1
    ranked = np.exp(logs - logs.mean()) - 1
    out[corpus] = {"points": len(mine), "rms": round(float(np.sqrt(np.mean(rel**2))), 4),
                   "mean": round(float(rel.mean()), 4),
                   "rms_after_level": round(float(np.sqrt(np.mean(ranked**2))), 4)}
  return out


def fit(pts: list[dict]) -> tuple[size_rule.LossLaw, float]:
  """The law of least robust error on log bpb over a grid of starts; (law, its cost)."""
  from scipy.optimize import least_squares

  y = np.array([p["bpb"] for p in pts], float)

  def residuals(theta):
    law = _law(theta)
    pred = np.array([predict(law, p) for p in pts])
    return np.log(np.maximum(pred, 1e-9)) - np.log(y)

  # Bounds: E near the entropy of English text per byte (~1 bit); exponents as published fits
  # found them (0.2-0.8: Hoffmann et al., Muennighoff et al.); repeats worth 1-30 epochs.
  lower, upper = [0.5, 0.0, 0.15, 0.0, 0.15, 1.0], [2.0, 1e5, 0.8, 1e5, 0.8, 30.0]
  best = None
  for e, alpha, beta, r in itertools.product((0.8, 1.2), (0.2, 0.4), (0.2, 0.4), (2.0, 10.0)):
    start = [e, 10.0, alpha, 10.0, beta, r]
    try:
      res = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.01)
    except ValueError:
      continue
    if best is None or res.cost < best.cost:
      best = res
  return _law(best.x), float(best.cost)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--runs", action="append", default=[],
                 help="runs.jsonl (repeatable; default: 2026-11-28-auto_size-zen4's)")
  p.add_argument("--corpora", default="shakespeare", help="comma list: the corpora fitted on")
  p.add_argument("--budgets", default="", help="comma list: only these budgets (default: all)")
  p.add_argument("--earlier", action="store_true", help="add the recipe's earlier runs (EARLIER)")
  p.add_argument("--out", default="", help="fit.json (default: beside the last --runs)")
  args = p.parse_args()
  args.runs = args.runs or [str(RESULTS / "2026-11-28-auto_size-zen4/runs.jsonl")]
  runs = [json.loads(x) for f in args.runs for x in Path(f).read_text().splitlines()]
  if args.budgets:
    runs = [r for r in runs if r["budget"] in args.budgets.split(",")]
  if args.earlier:
    runs += earlier_runs()
  pts = points(runs, set(args.corpora.split(",")))
  law, cost = fit(pts)
  loo = []
  for i in range(len(pts)):
    other, _ = fit(pts[:i] + pts[i + 1:])
    loo.append(predict(other, pts[i]) / pts[i]["bpb"] - 1)
  for pt in pts:
    pt["predicted"] = round(predict(law, pt), 4)
  texts = leave_one_text_out(pts)
  rounded = {k: float(f"{v:.4g}") for k, v in dataclasses.asdict(law).items()}
  out = Path(args.out) if args.out else Path(args.runs[-1]).with_name("fit.json")
  out.write_text(json.dumps({"law": rounded, "cost": cost, "corpora": args.corpora,
                             "runs": args.runs, "earlier": args.earlier,
                             "budgets": args.budgets or "all", "points": pts,
                             "leave_one_out_rel_error": [round(x, 4) for x in loo],
                             "loo_rms": float(np.sqrt(np.mean(np.square(loo)))),
                             "leave_one_text_out": texts}, indent=1) + "\n")
  for pt, err in zip(pts, loo):
    print(f"{pt['corpus']} {pt['budget']} {pt['shape']}: bpb {pt['bpb']:.4f} fit "
          f"{pt['predicted']:.4f} leave-one-out {100 * err:+.2f}%")
  for corpus, e in texts.items():
    print(f"leave {corpus} out ({e['points']} points): rms {100 * e['rms']:.2f}%, mean "
          f"{100 * e['mean']:+.2f}%, rms after its level {100 * e['rms_after_level']:.2f}%")
  print(f"LAW = LossLaw({', '.join(f'{k}={v}' for k, v in rounded.items())})")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
