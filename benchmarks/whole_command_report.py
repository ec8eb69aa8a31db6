"""whole_command.py's report: the issue's table on this CPU (nanoGPT, each tree, the goal and
whether it is met), then where each command's time goes, and a chart of the one-step commands'
phases."""

import statistics
from pathlib import Path

import reports

E_SHAPE = "configs/shakespeare_char_nanogpt.py"
NANO = "configs/nano.py"
GOALS = {"tokens": 1.5, "warm_over_floor": 1.5, "rss": 2.0, "val": 1.50, "end_s": 1.0}


def med(runs: list[dict], key: str) -> float | None:
  values = [r[key] for r in runs if r.get(key) is not None]
  return statistics.median(values) if values else None


def med_parts(runs: list[dict], key: str) -> dict:
  """{phase: median seconds} over runs, the phases in the order they came."""
  names = list(dict.fromkeys(n for r in runs for n in r.get(key, {})))
  return {n: statistics.median(r.get(key, {}).get(n) or 0.0 for r in runs) for n in names}


def _x(a: float | None, b: float | None) -> str:
  return f"{a / b:.2f}x" if a and b else "-"


def _met(ok: bool | None) -> str:
  return "-" if ok is None else "met" if ok else "MISSED"


def _s(x: float | None, digits: int = 1) -> str:
  return "-" if x is None else f"{x:.{digits}f}"


def _phases(parts: dict) -> str:
  return " + ".join(f"{n} {v:.1f}" for n, v in parts.items() if v >= 0.05)


def headline_rows(report: dict) -> list[list[str]]:
  """The issue's rows: [what, nanoGPT, each tree (and whether it meets the goal), goal]."""
  trees = [t["label"] for t in report["trees"]]
  rows = []

  def row(what: str, nanogpt: str, cells: list[tuple[str, bool | None]], goal: str) -> None:
    rows.append([what, nanogpt, *(f"{c} ({_met(ok)})" for c, ok in cells), goal])

  if steps := report.get("steps"):
    ng = (steps["nanogpt"] or {}).get("tokens_per_s")
    cells = []
    for t in trees:
      ours = steps["jaxtrain"][t][E_SHAPE]["warm"].get("tokens_per_s")
      cells.append((f"{ours:,.0f}, {_x(ours, ng)}" if ours else "-",
                    ours / ng >= GOALS["tokens"] if ours and ng else None))
    row("tokens/s at nanoGPT's CPU shape (4 x 128, T 64, B 12)", f"{ng:,.0f}" if ng else "-",
        cells, f">= {GOALS['tokens']}x")
  if rec := report.get("recipe"):
    ng_wall, ng_val = med(rec["nanogpt"], "wall_s"), med(rec["nanogpt"], "val")
    cells = []
    for t in trees:
      wall, val = med(rec["jaxtrain"][t], "wall_s"), med(rec["jaxtrain"][t], "val")
      ok = None if val is None or ng_wall is None else val <= GOALS["val"] and wall <= ng_wall
      cells.append((f"{_s(val, 4)} in {_s(wall)} s, {_x(wall, ng_wall)} its time", ok))
    row("the Shakespeare recipe as shipped, whole command, fresh HOME", ng_val and
        f"{ng_val:.4f} in {ng_wall:.1f} s" or "-", cells, f"val <= {GOALS['val']:.2f} in <= nanoGPT's time")
  if one := report.get("one_step"):
    floor_torch = statistics.median(one["floors"]["torch"]) if one["floors"]["torch"] else None
    floors = {t: statistics.median(one["floors"].get(t) or one["floors"]["jax"]) for t in trees}
    ng = {c: med(one["nanogpt"][c], "wall_s") for c in ("cold", "warm")}
    for config in report["args"]["configs"]:
      name = Path(config).stem
      cold = [med(one["jaxtrain"][t][config]["cold"], "wall_s") for t in trees]
      row(f"one step, whole command, cold (fresh HOME): {name}", _s(ng["cold"]),
          [(f"{w:.1f} s, {_x(w, ng['cold'])}", w <= ng["cold"] if ng["cold"] else None)
           for w in cold], "<= nanoGPT's")
      warm = [(med(one["jaxtrain"][t][config]["warm"], "wall_s"), floors[t]) for t in trees]
      row(f"the same, warm: {name}", f"{_s(ng['warm'])} ({_x(ng['warm'], floor_torch)} its "
          f"imports' {_s(floor_torch, 2)} s)" if ng["warm"] else "-",
          [(f"{w:.1f} s, {_x(w, f)} the imports' {f:.2f} s",
            w <= GOALS["warm_over_floor"] * f) for w, f in warm],
          f"<= {GOALS['warm_over_floor']}x the bare imports")
  ng_rss = [r["max_rss_mib"] for r in (report.get("recipe") or {}).get("nanogpt", [])] or \
      [((report.get("steps") or {}).get("nanogpt") or {}).get("max_rss_mib")]
  ng_rss = max((x for x in ng_rss if x), default=None)
  for cache in ("cold", "warm") if (steps := report.get("steps")) and ng_rss else ():
    cells = [(f"{(r := steps['jaxtrain'][t][NANO][cache]['max_rss_mib']):,.0f} MiB, "
              f"{_x(r, ng_rss)}", r <= GOALS["rss"] * ng_rss) for t in trees]
    row(f"peak RSS: nano, {report['args']['steps']} steps, {cache} (nanoGPT: its recipe)",
        f"{ng_rss:,.0f} MiB", cells, f"<= {GOALS['rss']}x")
  for cache in ("cold", "warm") if (steps := report.get("steps")) else ():
    ends = [steps["jaxtrain"][t][NANO][cache].get("after_last_step_s") for t in trees]
    row(f"the end of a nano run of {report['args']['steps']} steps, {cache} (after its last "
        "step's line: evaluation, checkpoint, samples, plot, summary)", "-",
        [(f"{_s(e)} s", None if e is None else e <= GOALS["end_s"]) for e in ends],
        f"<= {GOALS['end_s']:.0f} s")
  if (rec := report.get("recipe")) and ng_rss:
    cells = [(f"{(r := max(x['max_rss_mib'] for x in rec['jaxtrain'][t])):,.0f} MiB, "
              f"{_x(r, ng_rss)}", r <= GOALS["rss"] * ng_rss) for t in trees]
    row("peak RSS: the Shakespeare recipe", f"{ng_rss:,.0f} MiB", cells, f"<= {GOALS['rss']}x")
  return rows


def one_step_tables(report: dict) -> list[str]:
  one = report["one_step"]
  rows, summary_rows = [], []
  for t in report["trees"]:
    for config in report["args"]["configs"]:
      for cache in ("cold", "warm"):
        runs = one["jaxtrain"][t["label"]][config][cache]
        label = [t["label"], Path(config).stem, cache]
        ph, co = med_parts(runs, "phases"), med_parts(runs, "compiles")
        rows.append([*label, f"{med(runs, 'wall_s'):.2f} ({', '.join(_s(r['wall_s'], 2) for r in runs)})",
                     _s(med(runs, "to_first_step_s"), 2), _s(med(runs, "cpu_s")),
                     f"{med(runs, 'max_rss_mib'):,.0f}", _phases(ph),
                     ", ".join(f"{n} {v:.2f}" for n, v in co.items())])
        summary_rows.append([*label, _phases(med_parts(runs, "summary"))])
  for cache in ("cold", "warm") if one["nanogpt"]["cold"] else ():
    runs = one["nanogpt"][cache]
    rows.append(["nanoGPT", "train_shakespeare_char (CPU)", cache,
                 f"{med(runs, 'wall_s'):.2f} ({', '.join(_s(r['wall_s'], 2) for r in runs)})",
                 _s(med(runs, "to_first_step_s"), 2), _s(med(runs, "cpu_s")),
                 f"{med(runs, 'max_rss_mib'):,.0f}", _phases(med_parts(runs, "phases")), "-"])
  floors = one["floors"]
  return [
      "## One step, whole command (medians of the rounds, seconds)", "",
      f"Bare imports: `python -c \"import jax, flax, optax, orbax.checkpoint, grain\"` "
      f"{statistics.median(floors['jax']):.2f} s ({', '.join(f'{x:.2f}' for x in floors['jax'])})"
      + "".join(f"; with {t}: {statistics.median(v):.2f} s" for t, v in floors.items()
                if t not in ("jax", "torch"))
      + (f"; `python -c \"import torch, numpy\"` {statistics.median(floors['torch']):.2f} s"
         if floors["torch"] else ""), "",
      reports.markdown_table(["side", "config", "cache", "wall s (runs)", "to first step s",
                              "CPU s", "peak RSS MiB", "phases (from its lines)",
                              "compiles (jax's log)"], rows), "",
      "jaxtrain's phases, each to the line that ends it: to first line (python, the allocator's "
      "re-exec, imports, config, platform), data and build (tokenizing where the cache is cold, "
      "the programs built), compiles (to \"starting a new run\": the train step's compile, init "
      "beside it), first step, evaluation (with the eval step's compile), samples (their "
      "programs' compile and the text), plot and summary, to exit (the last checkpoint's wait "
      "comes before the samples, inside evaluation's span at one step). nanoGPT's: start-up "
      "(python, torch, data, model, to the line before its first evaluation), eval, checkpoints, "
      "train, to exit.", "",
      "jaxtrain's own `time:` line (medians):", "",
      reports.markdown_table(["side", "config", "cache", "phases"], summary_rows), ""]


def run_tables(report: dict) -> list[str]:
  out = []
  if rec := report.get("recipe"):
    rows = [["nanoGPT", _s(r["val"], 4), _s(r["wall_s"]), f"{r['tokens_per_s'] or 0:,.0f}",
             f"{r['max_rss_mib']:,.0f}", _phases(r["phases"])] for r in rec["nanogpt"]]
    rows += [[t, _s(r["val"], 4), _s(r["wall_s"]), f"{r['tokens_per_s'] or 0:,.0f}",
              f"{r['max_rss_mib']:,.0f}", _phases(r["summary"])]
             for t, runs in rec["jaxtrain"].items() for r in runs]
    out += ["## The Shakespeare recipe, whole commands", "",
            reports.markdown_table(["side", "final val", "wall s", "tokens/s", "peak RSS MiB",
                                    "phases (jaxtrain: its `time:` line)"], rows), ""]
  if steps := report.get("steps"):
    rows = [["nanoGPT", "its CPU recipe's shape", f"{steps['nanogpt']['tokens_per_s']:,.0f}",
             f"{steps['nanogpt']['max_rss_mib']:,.0f}", _s(steps["nanogpt"]["wall_s"])]] \
        if steps["nanogpt"] else []
    rows += [[t, f"{Path(c).stem}, {cache}", f"{r['tokens_per_s'] or 0:,.0f}",
              f"{r['max_rss_mib']:,.0f}", _s(r["wall_s"])]
             for t, by in steps["jaxtrain"].items() for c, runs in by.items()
             for cache, r in runs.items()]
    out += [f"## {report['args']['steps']} steps", "",
            reports.markdown_table(["side", "config", "tokens/s (median)", "peak RSS MiB",
                                    "wall s"], rows), "",
            "cold: from a fresh HOME (the peak RSS holds the compile's); warm: the same HOME "
            "again. Tokens/s in the headline: the warm run's.", ""]
  return out


def markdown(report: dict) -> str:
  m = report["machine"]
  trees = [t["label"] for t in report["trees"]]
  a = report["args"]
  return "\n".join([
      f"# jaxtrain and nanoGPT, whole commands on {reports.cpu_tag(m)} ({report['timestamp']})",
      "", f"- {reports.cpu_line(m)}; python {m['python']}, jax {m['versions']['jax']}, torch "
      f"{m['versions']['torch']}; allocator of jaxtrain's runs: {report['allocator']}",
      "- trees: " + "; ".join(f"{t['label']} = {t['commit']}" for t in report["trees"]),
      f"- nanoGPT: `(in {a['nanogpt']}) {' '.join(report['nanogpt_command'])}`"
      " (one step: `--max_iters=1`)" if a["nanogpt"] else "- nanoGPT: not run (no --nanogpt)",
      f"- jaxtrain: `python -m jaxtrain --config=C --jax_platforms=cpu --config.headless=True "
      f"--jax_log_compiles=true [--config.data.path={a['data']}]` (one step: "
      "`--config.train.max_steps=1`)",
      f"- parts: {', '.join(a['parts'])}; one step: {a['runs']} alternating round(s); load: "
      f"{reports.load_line(report['load'])}", "",
      reports.markdown_table(["", "nanoGPT", *trees, "goal"], headline_rows(report)), "",
      *(one_step_tables(report) if "one_step" in report else []), *run_tables(report)])


def chart(report: dict, path: Path) -> None:
  """One stacked bar per one-step command and cache: its phases, spawn to exit."""
  if "one_step" not in report:
    return
  one, plt = report["one_step"], reports.pyplot()
  bars = [(f"{t['label']} {Path(c).stem} {cache}",
           med_parts(one["jaxtrain"][t["label"]][c][cache], "phases"))
          for t in report["trees"] for c in report["args"]["configs"] for cache in ("cold", "warm")]
  bars += [(f"nanoGPT {cache}", med_parts(one["nanogpt"][cache], "phases"))
           for cache in ("cold", "warm") if one["nanogpt"][cache]]
  names = list(dict.fromkeys(n for _, ph in bars for n in ph))
  colour = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
  fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(bars)))
  shown = set()
  for j, (_, ph) in enumerate(bars):  # each bar's phases in its own order
    left = 0.0
    for n, seconds in ph.items():
      ax.barh(j, seconds, left=left, color=colour[n], label=None if n in shown else n)
      shown.add(n)
      left += seconds
  ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=7)
  ax.invert_yaxis()
  ax.set_xlabel("seconds from spawn to exit (median of the rounds)")
  ax.set_title(f"one-step commands by phase; {reports.machine_name(report['machine'])}, "
               f"{reports.cpu_tag(report['machine'])}", fontsize=9)
  ax.legend(fontsize=6, ncol=4, loc="lower right")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
