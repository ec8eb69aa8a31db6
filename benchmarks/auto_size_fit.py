"""Fits `model.size=auto`'s loss law (jaxtrain/measure/size_rule.py, `LossLaw`) to the runs of
benchmarks/auto_size.py, and says how well it predicts them.

    python benchmarks/auto_size_fit.py --earlier --corpora=shakespeare,austen,code \
        --runs=benchmarks/results/2026-11-28-auto_size-zen4/runs.jsonl \
        --runs=benchmarks/results/2026-12-07-auto_size-zen5/runs.jsonl \
        --runs=benchmarks/results/2026-12-07-auto_size-zen5-tokenizers/runs.jsonl \
        --runs=benchmarks/results/2026-12-07-auto_size-zen5-bpe/runs.jsonl \
        --same=code_bpe512=code --same=code_bpe2048=code --same=shakespeare_bpe512=shakespeare

Each finished run of the named corpora (a hand shape, a tier, the recipe's shape, auto's pick) is
a point: N (the block matrices and output head, as size_rule counts them), D (the tokens it
trained), U (the train split's unique tokens), both counted in bytes of text (the corpus's bytes
per token: 1 for characters of ASCII text, ~2 for a BPE of 512), and its final val bits per byte.
`--same=NAME=TEXT` counts a grid's corpus NAME as TEXT (the same text under another tokenizer).
Each text has its own level E (its bytes' entropy: code is more predictable than verse), the
other constants are shared; they are fitted by least squares on log bpb with a robust (soft L1)
loss from a grid of starting points, keeping the best (Hoffmann et al.'s approach 3). Writes
fit.json (beside the last --runs): the constants, each text's level, each point with its
prediction, the leave-one-out error of each point, and of each text left out whole (fitted on the
others: its error at the reference level, and its error once its own level is taken out, which is
what ranks its shapes); prints the `LossLaw(...)` to paste into size_rule.py (tests check they
agree).
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


def points(runs: list[dict], corpora: set[str], same: dict | None = None) -> list[dict]:
  """(N, D, U, bpb) of every finished run of `corpora` (D and U in tokens; `bpt`, the corpus's
  bytes per token), auto's picks too (each a shape that ran); `same`: a run's corpus name -> the
  text it is (a grid's name for one text under another tokenizer)."""
  out = []
  for r in runs:
    text = (same or {}).get(r["corpus"], r["corpus"])
    if text not in corpora or r["exit"] or not r.get("val_bpb") or r.get("noisy") \
        or not r.get("layers") or r.get("copied_from"):  # a row copied from another grid: once
      continue
    base = model_lib.ModelConfig(vocab_size=int(r.get("vocab") or 66), n_layers=r["layers"],
                                 n_heads=r["n_heads"], d_model=r["width"], seq_len=r["seq_len"],
                                 mlp="relu2", tie_embeddings=False, canon=4, x0_mix=True)
    out.append({"corpus": text, "budget": r["budget"], "shape": r["shape"],
                "tokenizer": (f"bpe {r.get('data_vocab')}" if r.get("tokenizer") == "bpe"
                              else r.get("tokenizer") or "char"),
                "n": model_lib.matmul_param_count(base), "d": r["tokens"],
                "u": r["train_tokens"], "bpt": r.get("bytes_per_token") or 1.0,
                "bpb": r["val_bpb"]})
  return out


def _law(theta, level: float) -> size_rule.LossLaw:
  return size_rule.LossLaw(level, *theta)


def predict(law: size_rule.LossLaw, pt: dict, levels: dict | None = None) -> float:
  """The law's bits per byte for a point, its tokens counted in bytes of text, at its text's own
  level (`levels`: text -> E) where one was fitted, else at the law's."""
  bpt = pt.get("bpt", 1.0)
  e = (levels or {}).get(pt["corpus"], law.e)
  return e - law.e + law.bpb(pt["n"], pt["d"] * bpt, pt["u"] * bpt)


def leave_one_text_out(pts: list[dict]) -> dict:
  """Per corpus: the law fitted to the other corpora's points, its error on this one's (rms of
  the relative errors, at the reference text's level), and the same once the text's own level
  is taken out (the mean log error: what ranks its shapes and tokenizers)."""
  out = {}
  for corpus in dict.fromkeys(p["corpus"] for p in pts):
    rest = [p for p in pts if p["corpus"] != corpus]
    if not rest:
      continue
    law, _, _ = fit(rest)
    mine = [p for p in pts if p["corpus"] == corpus]
    logs = np.array([np.log(predict(law, p) / p["bpb"]) for p in mine])
    rel = np.exp(logs) - 1
    ranked = np.exp(logs - logs.mean()) - 1
    out[corpus] = {"points": len(mine), "rms": round(float(np.sqrt(np.mean(rel**2))), 4),
                   "mean": round(float(rel.mean()), 4),
                   "rms_after_level": round(float(np.sqrt(np.mean(ranked**2))), 4)}
  return out


def fit(pts: list[dict]) -> tuple[size_rule.LossLaw, dict, float]:
  """The law of least robust error on log bpb over a grid of starts, each text at its own level
  E (the entropy of its bytes differs: code is more predictable than verse; a text's level
  ranks none of its shapes); (law at the reference text's level, {text: E}, its cost). The
  reference text is Tiny Shakespeare's where it is fitted, else the first."""
  from scipy.optimize import least_squares

  texts = list(dict.fromkeys(p["corpus"] for p in pts))
  ref = "shakespeare" if "shakespeare" in texts else texts[0]
  index = np.array([texts.index(p["corpus"]) for p in pts])
  y = np.array([p["bpb"] for p in pts], float)
  k = len(texts)

  def residuals(theta):
    law = _law(theta[k:], 0.0)
    pred = theta[index] + np.array([predict(law, p) for p in pts])
    return np.log(np.maximum(pred, 1e-9)) - np.log(y)

  # Bounds: E of a text's bytes between 0.3 and 3 bits; exponents as published fits found them
  # (0.2-0.8: Hoffmann et al., Muennighoff et al.); repeats worth 1-30 epochs.
  lower = [0.3] * k + [0.0, 0.15, 0.0, 0.15, 1.0]
  upper = [3.0] * k + [1e5, 0.8, 1e5, 0.8, 30.0]
  best = None
  for e, alpha, beta, r in itertools.product((0.8, 1.2), (0.2, 0.4), (0.2, 0.4), (2.0, 10.0)):
    start = [e] * k + [10.0, alpha, 10.0, beta, r]
    try:
      res = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.01)
    except ValueError:
      continue
    if best is None or res.cost < best.cost:
      best = res
  levels = {t: float(f"{best.x[i]:.4g}") for i, t in enumerate(texts)}
  return _law(best.x[k:], levels[ref]), levels, float(best.cost)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--runs", action="append", default=[],
                 help="runs.jsonl (repeatable; default: 2026-11-28-auto_size-zen4's)")
  p.add_argument("--corpora", default="shakespeare", help="comma list: the corpora fitted on")
  p.add_argument("--budgets", default="", help="comma list: only these budgets (default: all)")
  p.add_argument("--same", action="append", default=[],
                 help="NAME=TEXT: the runs of corpus NAME are of TEXT (repeatable)")
  p.add_argument("--earlier", action="store_true", help="add the recipe's earlier runs (EARLIER)")
  p.add_argument("--out", default="", help="fit.json (default: beside the last --runs)")
  args = p.parse_args()
  args.runs = args.runs or [str(RESULTS / "2026-11-28-auto_size-zen4/runs.jsonl")]
  runs = [json.loads(x) for f in args.runs for x in Path(f).read_text().splitlines()]
  if args.budgets:
    runs = [r for r in runs if r["budget"] in args.budgets.split(",")]
  if args.earlier:
    runs += earlier_runs()
  pts = points(runs, set(args.corpora.split(",")), dict(x.split("=", 1) for x in args.same))
  law, levels, cost = fit(pts)
  loo = []
  for i in range(len(pts)):
    other, their_levels, _ = fit(pts[:i] + pts[i + 1:])
    loo.append(predict(other, pts[i], their_levels) / pts[i]["bpb"] - 1)
  for pt in pts:
    pt["predicted"] = round(predict(law, pt, levels), 4)
  texts = leave_one_text_out(pts)
  rounded = {k: float(f"{v:.4g}") for k, v in dataclasses.asdict(law).items()}
  out = Path(args.out) if args.out else Path(args.runs[-1]).with_name("fit.json")
  out.write_text(json.dumps({"law": rounded, "levels": levels, "cost": cost, "corpora": args.corpora,
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
  print("levels (E of each text): " + ", ".join(f"{t} {e}" for t, e in levels.items()))
  print(f"LAW = LossLaw({', '.join(f'{k}={v}' for k, v in rounded.items())})")
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
