"""`model.size="auto"`: the model's shape chosen for the run's time budget, before jax starts
(the chosen batch decides how the CPU is split into devices), and said in the run's first lines.

A new run reads its corpus (handed on: the run reads it once) and this machine's speed model
(measure/speed_probe.py: a probe of at most PROBE_SHARE of the time left, or its cached result),
and lets measure/size_rule.py choose for the time left of the budget after it. A char vocabulary
too large for small models becomes bytes, and a text the pick would train at most BPE_EPOCHS times
through becomes a BPE (the shape chosen again for it); a probe cut too short to fit leaves the
recipe's model.
The fields it sets (`FIELDS`) go into config.json like any other, so a resumed run takes them from
there and never chooses again. A field the user set (`explicit`) is kept and the rest chosen
around it; where no candidate fits it, that is one `error:` line.
"""

import time
from collections.abc import Callable, Collection
from pathlib import Path

import ml_collections

from jaxtrain.config import loading, validate
from jaxtrain.core import model as model_lib
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenizer
from jaxtrain.measure import size_rule, speed_probe
from jaxtrain.system import fmt, machine, measured, paths, startup
from jaxtrain.system.errors import ConfigError

# Learning rates of the recipe the law was fitted with (configs/shakespeare_char.py): Muon's
# update has the same size at every width (its LR transfers across widths), and the AdamW groups'
# 1e-2 was a flat optimum in its ablations (benchmarks/results/2026-11-24-quality-zen4-zloss/).
LRS = {"optim.matrix_lr": 0.04, "optim.lr": 1e-2}
FIELDS = (*size_rule.SHAPE_FIELDS, *LRS, "data.tokenizer", "data.vocab_size")
CONTEXT, BATCH = 128, 24  # the recipe's: context 192-256 at the same tokens per step was no better
PROBE_SHARE = 0.25  # of the budget's time left: the most the speed probe may take
CHAR_VOCAB_MAX = 1024  # a larger char vocabulary becomes bytes (4x the 256 byte ids)
# A text the budget trains at most 4 times through (repeats up to ~4 epochs are worth nearly as
# much as new text: Muennighoff et al., arXiv 2305.16264) is learned faster in BPE tokens: a step
# then sees 2-3x the bytes. On a text the budget repeats more, the chars win: BPE's rarer tokens
# overfit. 5-minute runs of 2x128 (benchmarks/results/2026-12-07-auto_size-zen5-tokenizers): code
# in bytes 1.48 bits per byte, BPE 512 1.26, BPE 2048 1.18; Tiny Shakespeare in chars 2.12, BPE
# 512 2.32.
BPE_EPOCHS, BPE_VOCAB = 4.0, 2048


def resolve(cfg: ml_collections.ConfigDict, budget_s: float, explicit: Collection[str] = (),
            say: Callable[[str], None] = print, t_start: float | None = None
            ) -> tuple[ml_collections.ConfigDict, list[str], corpus_lib.Corpus | None]:
  """(`cfg` with the chosen fields set, the lines that say what was chosen and why, the corpus
  read for it); `cfg` itself where model.size is not "auto". `budget_s`: train.time_budget's
  seconds, counted from `t_start` (default: the process's start)."""
  if cfg.model.size != "auto":
    return cfg, [], None
  workdir = Path(str(cfg.workdir)).expanduser()
  if paths.is_run(workdir) and (workdir / "config.json").is_file():  # a resumed run's own choice
    saved = loading.flatten(paths.read_json(workdir / "config.json"))
    values = {f: saved[f] for f in FIELDS if f in saved and f not in explicit}
    cfg = loading.override(cfg.copy_and_resolve_references(), **values)
    m = cfg.model
    return cfg, [f"model.size=auto: {m.n_layers}x{m.d_model} ({m.n_heads} heads, context "
                 f"{m.seq_len}, batch {cfg.train.batch_size}), as the run chose when it started "
                 f"({workdir / 'config.json'}); a resumed run never chooses again"], None
  if all(f in explicit for f in size_rule.SHAPE_FIELDS):
    return cfg, ["model.size=auto: the shape is given in full on the command line "
                 f"({', '.join(size_rule.SHAPE_FIELDS)}): nothing to choose"], None
  left = lambda: budget_s - (time.time() - t_start if t_start is not None  # noqa: E731
                             else machine.process_age_s())
  cfg, corpus, lines = _corpus(cfg, explicit, say)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer)
  fixed = {f: validate.get(cfg, f) for f in size_rule.SHAPE_FIELDS if f in explicit}
  shapes = size_rule.candidates(fixed, CONTEXT, BATCH)
  # The run's fields but the shape: a probed shape's train step is then the very one a run of it
  # compiles (and reads from the compile cache the probe filled).
  rates = {f: v for f, v in LRS.items() if cfg.optim.name == "muon" and f not in explicit}
  cfg = loading.override(cfg.copy_and_resolve_references(), **rates)
  base = model_lib.ModelConfig.from_config(cfg.model, vocab)
  speed, found, why = _speed(cfg, base, shapes, corpus, left(), say)
  left_s = left()
  if speed is None:
    return cfg, [*lines, why], corpus
  pick, near = _choose(cfg, base, shapes, speed, left_s, corpus, fixed)
  if _bpe_pays(cfg, corpus, explicit, pick):
    cfg, corpus, line = _to_bpe(cfg, corpus, pick, say)
    lines.append(line)
    base = model_lib.ModelConfig.from_config(
        cfg.model, tokenizer.model_vocab_size(cfg.model.vocab_size, corpus.tokenizer))
    left_s = left()
    pick, near = _choose(cfg, base, shapes, speed, left_s, corpus, fixed)
  cfg = loading.override(cfg, **{f: v for f, v in pick.shape.fields().items()
                                  if f not in explicit})
  # What was chosen and why, and the nearest candidates rejected.
  probed = f" (the speed probe took {fmt.duration(found.value['seconds'])} of it)" * found.here
  s = pick.shape
  lrs = (f", Muon lr {cfg.optim.matrix_lr:g}, AdamW lr {cfg.optim.lr:g}"
         if cfg.optim.name == "muon" else f", lr {cfg.optim.lr:g}")
  kept = f"; kept as given: {', '.join(fixed)}" if fixed else ""
  lines.append(f"model.size=auto: {s.name} ({s.n_heads} heads, context {s.seq_len}, batch "
               f"{s.batch_size}{lrs}) for the {fmt.duration(left_s)} left of train.time_budget="
               f"{cfg.train.time_budget}{probed}: {_said(pick)} (of the "
               f"{fmt.count(len(corpus.train))} train tokens; this machine's speed, measured "
               f"{found.said()}){kept}")
  for o in near:
    why = "more params than the time trains well" if o.params > pick.params \
        else "fewer params than the time can train"
    lines.append(f"  rejected {o.shape.name}: {_said(o)} ({why})")
  return cfg, lines, corpus


def _choose(cfg, base, shapes: list, speed: size_rule.SpeedModel, left_s: float,
            corpus: corpus_lib.Corpus, fixed: dict) -> tuple[size_rule.Option, list]:
  opts = size_rule.options(base, shapes, speed, left_s, len(corpus.train),
                           bytes_per_token=_bytes_per_token(corpus))
  if not opts:
    raise _none_fits(cfg, fixed, shapes, left_s)
  return size_rule.choose(opts)


def _bpe_pays(cfg: ml_collections.ConfigDict, corpus: corpus_lib.Corpus, explicit: Collection[str],
              pick: size_rule.Option) -> bool:
  """A text of chars or bytes (no tokenizer or vocabulary given) that the pick trains at most
  BPE_EPOCHS times through."""
  return (corpus.tokenizer.name in ("char", "byte") and corpus.n_bytes > 0 and not cfg.data.mixture
          and "data.tokenizer" not in explicit and "data.vocab_size" not in explicit
          and not cfg.model.vocab_size and pick.epochs <= BPE_EPOCHS)


def _to_bpe(cfg: ml_collections.ConfigDict, corpus: corpus_lib.Corpus, pick: size_rule.Option,
            say) -> tuple[ml_collections.ConfigDict, corpus_lib.Corpus, str]:
  """The config and corpus in a BPE of BPE_VOCAB tokens (learned once, then cached)."""
  cfg = loading.override(cfg.copy_and_resolve_references(),
                         **{"data.tokenizer": "bpe", "data.vocab_size": BPE_VOCAB})
  bpe = corpus_lib.prepare(cfg.data, show_progress=False, log=say)
  line = (f"model.size=auto: data.tokenizer=bpe, data.vocab_size={BPE_VOCAB}: the budget trains "
          f"{pick.epochs:.1f} epochs of this text in {corpus.tokenizer.name}s (at most "
          f"{BPE_EPOCHS:g}), and a BPE token holds {_bytes_per_token(bpe):.2f} bytes of it, so each "
          "step learns from more text; --config.data.tokenizer=" + corpus.tokenizer.name +
          " keeps it")
  return cfg, bpe, line


def _speed(cfg: ml_collections.ConfigDict, base: model_lib.ModelConfig, shapes: list,
           corpus: corpus_lib.Corpus, left_s: float, say
           ) -> tuple[size_rule.SpeedModel | None, measured.Measured | None, str]:
  """(this machine's speed model, the probe's record, "") where it is cached or a probe the
  budget can repay measures it; else (None, the record, the line that says why the config's own
  model trains). What the budget can repay, and what a probe would cost, are the prior's (the
  reference machine's speed scaled by this one's matmul speed): a budget that cannot repay a
  probe spends nothing on one."""
  prior, slower = speed_probe.prior(cfg)
  m = cfg.model
  own = size_rule.Shape(m.n_layers, m.d_model, m.n_heads, m.seq_len, cfg.train.batch_size)
  unique = len(corpus.train)
  bpt = _bytes_per_token(corpus)
  repay = size_rule.repayable_s(base, shapes, prior, left_s, unique, own, PROBE_SHARE * left_s,
                                bytes_per_token=bpt)
  first = speed_probe.probe_shapes(cfg)[:speed_probe.MIN_SHAPES]
  need = speed_probe.probe_cost(prior, base, cfg, first, slower)
  speed, found = speed_probe.speed_model(cfg, base.vocab_size, startup.platform()[0], repay,
                                         say, need, corpus.tokenizer.eot_id)
  if speed is not None:
    return speed, found, ""
  if found is not None and found.here:
    v = found.value
    return None, found, (
        f"model.size=auto: {fmt.duration(v['share_s'])} of the budget measured {len(v['rows'])} "
        f"shape{'s' * (len(v['rows']) != 1)} of the speed probe, too few to choose from: the "
        f"config's model, {m.n_layers}x{m.d_model}, trains (a longer budget measures more, once)")
  longer = _repaying_budget(base, shapes, prior, unique, own, need, left_s, bpt)
  return None, found, (
      f"model.size=auto: no speed probe: on this machine (a matmul {1 / slower:.2g}x the "
      f"reference's speed) measuring {len(first)} shapes would take ~{fmt.duration(need)}, more "
      f"than the {fmt.duration(repay)} of the {fmt.duration(left_s)} left that a better shape "
      f"could repay: the config's model, {m.n_layers}x{m.d_model}, trains"
      + (f" (a budget of {fmt.duration(longer)} or more measures it, once)" if longer else ""))


def _repaying_budget(base, shapes, prior, unique: int, own, need_s: float, left_s: float,
                     bpt: float) -> float | None:
  """The shortest budget (in steps of a quarter, up to a day) whose time left repays a probe
  that takes `need_s`, as the prior predicts; None where none does."""
  t = left_s
  while t < 86400:
    t *= 1.25
    if size_rule.repayable_s(base, shapes, prior, t, unique, own, PROBE_SHARE * t,
                             bytes_per_token=bpt) >= need_s:
      return t
  return None


def _bytes_per_token(corpus: corpus_lib.Corpus) -> float:
  """How many bytes of text a token of the corpus holds (the law counts bytes); 1 where unknown
  (token files)."""
  return corpus.n_bytes / len(corpus.tokens) if corpus.n_bytes and len(corpus.tokens) else 1.0


def _corpus(cfg: ml_collections.ConfigDict, explicit: Collection[str], say
            ) -> tuple[ml_collections.ConfigDict, corpus_lib.Corpus, list[str]]:
  """The corpus the choice counts, and the run reads: a char vocabulary of more than
  CHAR_VOCAB_MAX symbols, too large for the small models a budget trains, becomes bytes
  (unless data.tokenizer or model.vocab_size is given)."""
  corpus = corpus_lib.prepare(cfg.data, show_progress=False, log=say,
                              vocab_size=cfg.model.vocab_size)
  chars = tokenizer.model_vocab_size(0, corpus.tokenizer)
  if corpus.tokenizer.name != "char" or chars <= CHAR_VOCAB_MAX or cfg.model.vocab_size or \
      "data.tokenizer" in explicit:
    return cfg, corpus, []
  cfg = loading.override(cfg.copy_and_resolve_references(), **{"data.tokenizer": "byte"})
  line = (f"model.size=auto: data.tokenizer=byte: a char vocabulary of {chars} symbols is more "
          f"than the small models a budget trains can use (over {CHAR_VOCAB_MAX}); "
          "--config.data.tokenizer=char keeps it")
  return cfg, corpus_lib.prepare(cfg.data, show_progress=False, log=say), [line]


def _none_fits(cfg, fixed: dict, shapes: list, left_s: float) -> ConfigError:
  if not shapes:
    given = ", ".join(f"{f}={v}" for f, v in fixed.items())
    return ConfigError("model.size", f"is auto, but no candidate shape has {given} (model.n_heads "
                       "must divide a width and leave an even head size)",
                       "set the other shape fields too, or leave these to model.size=auto")
  return ConfigError("train.time_budget", f"{cfg.train.time_budget} leaves {fmt.duration(left_s)}"
                     " after start-up, too little to compile and train any candidate model",
                     "pass a longer budget, e.g. --config.train.time_budget=2m")


def _said(o: size_rule.Option) -> str:
  return (f"{fmt.count(o.params)} params, {fmt.count(o.tokens)} tokens = {o.epochs:.1f} epochs "
          f"at {fmt.count(o.tokens_per_s)} tok/s, predicted val {o.bpb:.3f} bits/byte")
