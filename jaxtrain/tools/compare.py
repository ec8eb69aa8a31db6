"""`python -m jaxtrain.compare RUN... [--out=D] [--by=METRIC] [--baseline=RUN]`: runs side by side,
best first: the config fields that differ and have an effect, losses, task accuracies, speed and
time, each run's difference to a baseline; where runs differ only in their seed, the spread across
seeds; a warning where they trained different steps or tokens or paid different compile times
(tools/ablation.py); with --out also compare.md and loss plots. How runs are ranked, and which
fields are shown: docs/tools.md.
"""

import shutil
import sys
from pathlib import Path

from absl import flags

from jaxtrain.config import defaults
from jaxtrain.system import fmt, invocation
from jaxtrain.system.errors import UserError
from jaxtrain.tools import ablation, cli, runs

_COMMAND = invocation.command("jaxtrain.compare")
USAGE = (f"usage: {_COMMAND} RUN... [--out=DIR] [--by=METRIC] [--baseline=RUN]\n"
         "Runs side by side, best first: the config fields that differ, losses, task "
         "accuracies, speed and time.")
RUN_HELP = ("RUN", "A run's directory, a glob of them, or a directory of runs (a sweep's root).")
# Fields that say nothing about a result: where it was written, how it was logged or sampled.
NOT_SHOWN = ("workdir", "headless", "data.cache_dir", "data.allow_changed", "train.log_every",
             "train.checkpoint_every", "train.keep_checkpoints", "allow_changed_extend")
# extension_sources: kept beside a config in config.json (the extensions' files), not a field.
NOT_SHOWN_SECTIONS = ("sample.", "distributed.", "extension_sources.")
_MUON_ONLY = ("optim.matrix_lr", "optim.momentum", "optim.muon_ns_steps")
# A field with no effect on a run, by that run's config: not compared, shown as "-" for it.
NO_EFFECT = {"data.vocab_size": lambda c: c.get("data.tokenizer", "bpe") != "bpe",
             "optim.decay_fraction": lambda c: c.get("optim.schedule", "wsd") != "wsd",
             "optim.min_lr_ratio": lambda c: c.get("optim.schedule") == "constant",
             "model.rope_theta": lambda c: c.get("model.pos", "rope") != "rope",
             **{f: (lambda c: c.get("optim.name", "muon") != "muon") for f in _MUON_ONLY}}
# What the tokens are: where these differ, a loss per token does not compare; bits per byte does.
DATA_FIELDS = ("data.path", "data.text_field", "data.tokenizer", "data.vocab_size",
               "data.val_fraction", "model.vocab_size")
COLUMNS = ("params", "steps", "best val", "final val", "val bpb", "tok/s", "time", "state")
_MISSING = object()


# The fields that name a component (core/registry.py's KINDS): an extension's options,
# ext.<component>.<option>, have an effect only on a run that names that component.
COMPONENT_FIELDS = ("model.norm", "model.pos", "model.mlp", "model.attention_variant", "model.block",
                    "model.arch", "optim.name", "optim.schedule", "optim.loss_term")


def effective(info: runs.RunInfo, field: str):
  """The run's value of `field`, or _MISSING where the field has no effect on that run."""
  if field.startswith("ext.") and \
      field.split(".")[1] not in {info.config.get(f) for f in COMPONENT_FIELDS}:
    return _MISSING
  no_effect = NO_EFFECT.get(field)
  return _MISSING if no_effect is not None and no_effect(info.config) else \
      info.config.get(field, _MISSING)


def differences(infos: list[runs.RunInfo], among=None) -> list[str]:
  """The config fields (of `among`, else all) whose values, where they have an effect, are not the
  same in every run; in config order."""
  fields = list(dict.fromkeys(f for info in infos for f in info.config))
  shown = [f for f in fields if f not in NOT_SHOWN and not f.startswith(NOT_SHOWN_SECTIONS)]
  return [f for f in (among if among is not None else shown)
          if len({repr(effective(info, f)) for info in infos} - {repr(_MISSING)}) > 1
          or len({effective(info, f) is _MISSING for info in infos}) > 1]


# What a run's validation loss counts, the heading of each kind's group. The rule of
# data.corpus.loss_scope, read from the flat config: importing the data pipeline takes a second.
SCOPES = ("every token", "completions", "assistant turns")


def scope(info: runs.RunInfo) -> str:
  """What the run's val_loss and val_bpb count: every token, or only the completions of
  prompt/completion records, or only the assistant turns of chat records."""
  c = info.config
  if c.get("data.prompt_field") and c.get("data.completion_field"):
    return SCOPES[1]
  return SCOPES[2] if c.get("data.messages_field") else SCOPES[0]


def groups(infos: list[runs.RunInfo], by: str | None) -> list[list[runs.RunInfo]]:
  """The runs whose numbers rank together: one group, unless validation losses are ranked and
  they count different tokens (those do not compare, per token or per byte); then one group a
  kind, in SCOPES' order."""
  kinds = sorted({scope(info) for info in infos}, key=SCOPES.index)
  if (by or "").startswith("task/") or len(kinds) == 1:
    return [list(infos)]
  return [[info for info in infos if scope(info) == kind] for kind in kinds]


def rank_key(info: runs.RunInfo, key: str = "val_loss") -> tuple:
  """Lower is better: the best `key` (val_loss, val_bpb; an accuracy negated), or else the last
  train loss."""
  best = info.best(key)
  if best is not None:
    return (0, -best if defaults.higher_is_better(key) else best)
  loss = info.final("loss") if key == "val_loss" else None
  return (1, loss) if loss is not None else (2, 0.0)


def names(infos: list[runs.RunInfo]) -> list[str]:
  """Each run's directory name; the whole path where two runs share a name."""
  short = [info.path.name for info in infos]
  return short if len(set(short)) == len(short) else [str(info.path) for info in infos]


def _value(v) -> str:
  if isinstance(v, float):
    return f"{v:g}"
  return "-" if v is None else str(v)


def _loss(x: float | None) -> str:
  return "-" if x is None else f"{x:.4f}"


def source_keys(infos: list[runs.RunInfo]) -> list[str]:
  """The per-source validation losses of data.mixture runs (val/<source>/loss), then the task
  accuracies of train.eval_tasks (task/<name>/exact_match, mc_accuracy), first seen first."""
  keys = list(dict.fromkeys(k for info in infos for r in info.evals for k in r))
  return [k for k in keys if k.startswith("val/") and k.endswith("/loss")] + \
      [k for k in keys if k.startswith("task/") and defaults.higher_is_better(k)]


def column(key: str) -> str:
  """A per-source or task column's heading: `val books`, `held/exact_match`."""
  return key.removeprefix("task/") if key.startswith("task/") else f"val {key.split('/')[1]}"


def rows(infos: list[runs.RunInfo], fields: list[str],
         sources: list[str] = ()) -> list[list[str]]:
  """One row a run: name, differing fields, COLUMNS, then the final values of `sources`."""
  out = []
  for name, info in zip(names(infos), infos):
    params = info.status.get("params")
    speed, wall = info.median_speed(), info.wall_s()
    state = "done" if info.finished else info.state
    out.append([name, *(_value(None if (v := effective(info, f)) is _MISSING else v)
                        for f in fields),
                fmt.count(params) if params else "-", f"{info.step}/{_value(info.max_steps)}",
                _loss(info.best("val_loss")), _loss(info.final("val_loss")),
                _loss(info.final("val_bpb")), fmt.count(speed) if speed else "-",
                fmt.duration(wall) if wall is not None else "-", state,
                *(_loss(info.final(k)) for k in sources)])
  return out


def _pack(items: list[str], width: int, indent: str = "   ") -> list[str]:
  """`items` two spaces apart, as many a line as fit in `width`; an item is never split."""
  lines: list[str] = []
  for item in items:
    if lines and len(lines[-1]) + 2 + len(item) <= width:
      lines[-1] += "  " + item
    else:
      lines.append(indent + item)
  return lines


def terminal_table(header: list[str], body: list[list[str]], width: int | None = None) -> str:
  """A table where it fits `width` (None: no limit), else a block of lines a run."""
  widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
  line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
  if width is None or sum(widths) + 2 * (len(widths) - 1) <= width:
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])
  n_config = header.index(COLUMNS[0]) - 1  # config fields are dotted: none is named as a column
  blocks = []
  for i, row in enumerate(body, start=1):
    pairs = [f"{h}={v}" for h, v in zip(header[1:1 + n_config], row[1:1 + n_config])]
    stats = [f"{h} {v}" for h, v in zip(header[1 + n_config:], row[1 + n_config:])]
    blocks.append("\n".join([f"{i}. {row[0]}", *_pack(pairs, width), *_pack(stats, width)]))
  return "\n".join(blocks)


def markdown_table(header: list[str], body: list[list[str]]) -> str:
  line = lambda r: "| " + " | ".join(c.replace("|", "\\|") for c in r) + " |"
  return "\n".join([line(header), "|" + "---|" * len(header), *map(line, body)])


def _plot(infos: list[runs.RunInfo], x_key: str, scale: float, xlabel: str, png: Path) -> Path:
  from matplotlib.figure import Figure  # not pyplot: no GUI backend, no figures left open

  fig = Figure(figsize=(8, 4.5), dpi=110)
  ax = fig.subplots()
  for i, (name, info) in enumerate(zip(names(infos), infos)):
    color = f"C{i % 10}"
    train = [r for r in info.train if r.get("loss") is not None and x_key in r]
    evals = [r for r in info.evals if x_key in r]
    if train:
      ax.plot([r[x_key] / scale for r in train], [r["loss"] for r in train], color=color, lw=0.8,
              alpha=0.35)
    label = name + ("" if info.finished else f" ({info.state})")
    if evals:
      ax.plot([r[x_key] / scale for r in evals], [r["val_loss"] for r in evals], "o-",
              color=color, lw=1.6, ms=3, label=label)
    elif train:
      ax.plot([], [], color=color, label=label + ", no eval yet")
  ax.set(xlabel=xlabel, ylabel="loss (nats/token)",
         title="validation loss (markers) and train loss (faint)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(png)
  return png


def plot(infos: list[runs.RunInfo], out: Path) -> list[Path]:
  """loss_vs_step.png and loss_vs_time.png in `out`, one colour a run."""
  minutes = max((info.wall_s() or 0 for info in infos), default=0) > 300
  return [_plot(infos, "step", 1, "optimizer step", out / "loss_vs_step.png"),
          _plot(infos, "elapsed_s", 60 if minutes else 1,
                f"training time ({'min' if minutes else 's'})", out / "loss_vs_time.png")]


def _why(key: str, by: str | None) -> str:
  if by is not None:
    return f"chosen with --by; {'higher' if defaults.higher_is_better(key) else 'lower'} is better"
  return ("bits per byte: the runs' tokenizers or data differ, so their losses per token do not "
          "compare") if key == "val_bpb" else "nats per token: the same tokens in every run"


def compare(patterns: list[str], out: Path | None = None, print_fn=print,
            width: int | None = None, by: str | None = None,
            baseline: str | None = None) -> list[runs.RunInfo]:
  """Prints the table (and writes compare.md and the plots to `out`); returns the runs, best
  first, runs whose val losses count other tokens (`groups`) ranked apart. `baseline`: the run
  (its directory's name or path) every run's difference is taken to."""
  infos = [runs.read(p) for p in runs.find(patterns)]
  base = ablation.find(infos, names(infos), baseline) if baseline else None
  if baseline and base is None:
    raise UserError(f"--baseline={baseline}: no run of these is named so (they are: "
                    f"{', '.join(names(infos))}); pass one of them")
  if by is not None and not any(info.values(by) for info in infos):
    known = sorted({k for info in infos for r in info.evals for k in r} - {"step", "elapsed_s"})
    raise UserError(f"--by={by}: no run has that metric in its evaluations (they have: "
                    f"{', '.join(known) or 'none yet'}); pass --by=<one of them>")
  ranked = []
  for group in groups(infos, by):
    # val_bpb where the runs' tokenizers or data differ: a loss per token then does not compare
    key = by or ("val_bpb" if differences(group, DATA_FIELDS) else "val_loss")
    ranked.append((key, sorted(group, key=lambda info: rank_key(info, key))))
  infos = [info for _, group in ranked for info in group]
  fields = differences(infos)
  sources = source_keys(infos)
  apart = len(ranked) > 1
  key_of = {id(info): key for key, group in ranked for info in group}
  header = ["run", *fields, *COLUMNS, *map(column, sources), *["val loss on"] * apart]
  body = [row + [scope(info)] * apart for row, info in zip(rows(infos, fields, sources), infos)]
  if base is not None:  # each run's difference to the baseline, in the key its group ranks by
    header.append(f"Δ to {names(infos)[infos.index(base)]}")
    for row, info in zip(body, infos):
      row.append(ablation.delta(info.best(key_of[id(info)]), base.best(key_of[id(info)])))
  if width is None and sys.stdout.isatty():  # a file or a pipe gets the table at any width
    width = shutil.get_terminal_size().columns
  print_fn(terminal_table(header, body, width))
  if apart:
    print_fn("note: " + ", ".join(f"{len(g)} run{'s' if len(g) > 1 else ''} on {scope(g[0])}"
                                  for _, g in ranked) +
             ": validation losses that count other tokens do not compare (per token or per "
             "byte), so each kind is ranked on its own (column 'val loss on')")
  for key, group in ranked:
    best = group[0]
    if best.best(key) is not None:
      name = names(infos)[infos.index(best)]
      print_fn(f"best{f' on {scope(best)}' if apart else ''}: {name} (best {key} "
               f"{best.best(key):.4f}); ranked by {key} ({_why(key, by)})")
  _fairness(infos, ranked[0][0], fields, base, print_fn, width)
  if out is not None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(markdown_table(header, body) + "\n", encoding="utf-8")
    pngs = plot(infos, out)
    print_fn(f"wrote {out / 'compare.md'}, {', '.join(str(p) for p in pngs)}")
  return infos


def _fairness(infos: list[runs.RunInfo], key: str, fields: list[str], base: runs.RunInfo | None,
              print_fn, width: int | None) -> None:
  """What keeps the table from misleading: the runs compared at equal steps where they trained
  different ones (with its warning), and the spread of runs that differ only in their seed."""
  for line in (ablation.unequal(infos), ablation.at_equal_steps(infos, names(infos), key)):
    if line:
      print_fn(line)
  groups = ablation.seed_groups(infos, fields)
  base_group = next((g for g in groups if base in g), None) if base is not None else groups[0]
  table = ablation.spread_table(groups, fields, key, base_group, lambda info, f: _value(
      None if (v := effective(info, f)) is _MISSING else v))
  if table is not None:
    print_fn(f"across seeds (runs alike but for their seed; Δ mean to "
             f"{'the baseline' if base is not None else 'the best run'}'s group, ± its standard "
             "error):")
    print_fn(terminal_table(*table, width=None))


def run(patterns: list[str]) -> None:
  f = flags.FLAGS
  if not patterns:
    raise UserError(f"no runs given; usage: {_COMMAND} RUN... [--out=DIR] (RUN: a "
                    "run's directory, a glob, or a directory of runs such as a sweep's root)")
  compare(patterns, Path(f.out).expanduser() if f.out else None, by=f.by or None,
          baseline=f.baseline or None)


def main() -> None:
  flags.DEFINE_string("out", "", "Also write the table as DIR/compare.md and the loss plots as "
                      "PNGs.")
  flags.DEFINE_string("by", "", "Rank by the best of this evaluation metric: val_loss, val_bpb, "
                      "task/<name>/exact_match, ... (accuracies: highest first). Default: val_bpb "
                      "where the runs' tokens differ, else val_loss.")
  flags.DEFINE_string("baseline", "", "A run (its directory's name) to take every run's difference "
                      "to: a column Δ, and the mean's difference of runs that differ only in seed.")
  cli.main(run, USAGE, __name__, args=True, uses_jax=False,
           values={"out": "DIR", "by": "METRIC", "baseline": "RUN"},
           before=(RUN_HELP,))
