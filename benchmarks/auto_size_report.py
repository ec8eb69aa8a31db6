"""benchmarks/auto_size.py's report from its runs.jsonl: per corpus and budget, the CPU tier, the
recipe's shape, the grid's best hand shape and the auto pick (val bits per byte, the mean of the
seeds each ran), every run, and val bits per byte against the budget."""

import statistics
from pathlib import Path

import reports

from jaxtrain.system import fmt

AUTO, RECIPE = "auto", "recipe"


def _ok(r: dict) -> bool:
  return r["exit"] == 0 and bool(r.get("val_bpb")) and bool(r["budget_s"]) and not r.get("noisy")


def _kind(shape: str) -> str:
  """auto, recipe, a hand shape (LxW) or a tier (by its name)."""
  return shape if shape in (AUTO, RECIPE) or "x" not in shape else "hand"


def _mean(rows: list[dict]) -> dict | None:
  """The shape's runs at one corpus and budget: the mean val bpb over its seeds, what it was."""
  if not rows:
    return None
  r = rows[0]
  bpbs = [x["val_bpb"] for x in rows]
  return {"shape": r["shape"], "pick": f"{r['layers']}x{r['width']}", "tokenizer": _tok(r),
          "bpb": round(statistics.fmean(bpbs), 4), "bpbs": bpbs,
          "seeds": [x.get("seed") for x in rows]}


def _tok(r: dict) -> str:
  tok = r.get("tokenizer") or "?"
  return f"bpe {r['data_vocab']}" if tok == "bpe" else tok


def summary(rows: list[dict]) -> list[dict]:
  """Per corpus and budget: each tier, the recipe, the best hand shape and auto, seed means;
  `auto_vs_best`: auto's bpb over the best of the rest, less 1."""
  out = []
  for corpus in dict.fromkeys(r["corpus"] for r in rows):
    for budget in dict.fromkeys(r["budget"] for r in rows if r["corpus"] == corpus and _ok(r)):
      here = [r for r in rows if (r["corpus"], r["budget"]) == (corpus, budget) and _ok(r)]
      means = [_mean([r for r in here if r["shape"] == s])
               for s in dict.fromkeys(r["shape"] for r in here)]
      auto = next((m for m in means if m["shape"] == AUTO), None)
      others = [m for m in means if m["shape"] != AUTO]
      hand = [m for m in others if _kind(m["shape"]) == "hand"]
      best = min(others, key=lambda m: m["bpb"], default=None)
      out.append({"corpus": corpus, "budget": budget, "auto": auto,
                  "recipe": next((m for m in means if m["shape"] == RECIPE), None),
                  "tiers": [m for m in others if _kind(m["shape"]) not in ("hand", RECIPE)],
                  "best_hand": min(hand, key=lambda m: m["bpb"], default=None),
                  "hand_shapes": len(hand), "best": best and best["shape"],
                  "auto_vs_best": round(auto["bpb"] / best["bpb"] - 1, 4) if auto and best
                  else None})
  return out


def _cell(m: dict | None, shape: bool = False) -> str:
  if not m:
    return "-"
  seeds = len(m["bpbs"])
  what = f"{m['pick']} {m['tokenizer']}: " if shape else ""
  spread = f" ({', '.join(f'{b:.4f}' for b in m['bpbs'])})" if seeds > 1 else ""
  return f"{what}**{m['bpb']:.4f}**{spread}"


def markdown(rows: list[dict], table: list[dict], machine: dict) -> str:
  lines = [f"# model.size=auto against hand-picked shapes at equal time budgets "
           f"({reports.timestamp()})", "", reports.cpu_line(machine), "",
           "Val bits per byte at the end of each whole command (the mean over the seeds; each "
           "seed's in brackets).", "",
           "| corpus | budget | tier | recipe's shape | best hand shape | auto pick | auto / best "
           "other - 1 |", "|---|---|---|---|---|---|---|"]
  for s in table:
    tiers = "; ".join(f"{m['shape']} ({_cell(m, True)})" for m in s["tiers"]) or "-"
    gap = f"{100 * s['auto_vs_best']:+.2f}%" if s["auto_vs_best"] is not None else "-"
    lines.append(f"| {s['corpus']} | {s['budget']} | {tiers} | {_cell(s['recipe'], True)} | "
                 f"{_cell(s['best_hand'], True)} | {_cell(s['auto'], True)} | {gap} |")
  lines += ["", "Every run (others: the other processes' share of the machine during it):", "",
            "| corpus | budget | shape | seed | tokenizer | params | steps | tokens | epochs | "
            "val bpb | val loss | wall s | others | exit |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    ok = r["exit"] == 0 and r.get("steps")
    lines.append(
        f"| {r['corpus']} | {r['budget']} | {r['shape']}"
        + (f" ({r['layers']}x{r['width']})" if ok and r["shape"] in (AUTO, RECIPE) else "")
        + f" | {r.get('seed', '-')} | {_tok(r) if ok else '-'}"
        + (f" | {fmt.count(r['params'])} | {r['steps']} | {fmt.count(r['tokens'])} | "
           f"{r['epochs']:.1f} | {r['val_bpb']:.4f} | {r['final_val']:.4f}" if ok
           else " | - | - | - | - | - | -")
        + f" | {r['wall_s']:.1f} | {r['load']['other_pct']['mean']}%"
        + f"{' (noisy: not counted)' * bool(r.get('noisy'))} | {r['exit']} |")
  return "\n".join(lines) + "\n"


def chart(rows: list[dict], path: Path) -> None:
  """Val bits per byte against the budget: a line per shape (seed means), per corpus."""
  plt = reports.pyplot()
  corpora = list(dict.fromkeys(r["corpus"] for r in rows if _ok(r))) or ["-"]
  fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4.5), squeeze=False)
  for ax, corpus in zip(axes[0], corpora):
    mine = [r for r in rows if r["corpus"] == corpus and _ok(r)]
    for i, shape in enumerate(dict.fromkeys(r["shape"] for r in mine)):
      budgets = sorted({r["budget_s"] for r in mine if r["shape"] == shape})
      pts = [(b / 60, statistics.fmean(r["val_bpb"] for r in mine
                                       if r["shape"] == shape and r["budget_s"] == b))
             for b in budgets]
      ax.plot(*zip(*pts), marker="o", label=shape, color="black" if shape == AUTO else f"C{i}",
              linewidth=2.5 if shape == AUTO else 1.2)
    ax.set_xscale("log")
    ax.set_xlabel("time budget (min, whole command)")
    ax.set_ylabel("final val bits per byte")
    ax.set_title(corpus)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
