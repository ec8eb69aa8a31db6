"""model.size=auto: the rule is a pure function of the budget, the measured speed, the corpus and
fitted constants (tested without timing); a run says what it chose and why, writes it into
config.json and a resumed run keeps it; given fields are kept; conflicts are one error line."""

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

import jaxtrain as jt
from jaxtrain.core import model as model_lib
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.loop import autosize, preview
from jaxtrain.measure import size_rule, speed_probe
from jaxtrain.system import machine, measured
from jaxtrain.system.errors import ConfigError
from jaxtrain.trackers.hooks import Hook

ROOT = Path(__file__).resolve().parents[1]
FIT = ROOT / "benchmarks/results/2026-11-28-auto_size-zen4/fit.json"
BASE = model_lib.ModelConfig(vocab_size=66, n_layers=2, n_heads=3, d_model=96, seq_len=128,
                             mlp="relu2", tie_embeddings=False, canon=4, x0_mix=True)
# Seconds a step: 20 ms, plus 1 ms a layer, plus FLOPs at 40 GFLOP/s (model) and 100 (Muon).
SPEED = size_rule.SpeedModel((0.02, 0.001, 1 / 40e9, 1 / 100e9, 0.0), fixed_s=5.0,
                             compile_per_layer_s=1.0)


def _pick(budget_s: float, unique: int, speed=SPEED, fixed=None) -> size_rule.Option:
  shapes = size_rule.candidates(fixed or {}, 128, 24)
  return size_rule.choose(size_rule.options(BASE, shapes, speed, budget_s, unique))[0]


def test_candidates_keep_given_fields_and_stay_in_the_aspect_band():
  free = size_rule.candidates({}, 128, 24)
  assert free and all(32 <= s.d_model / s.n_layers <= 64 for s in free)
  assert all(s.d_model // s.n_heads in (32, 64) for s in free)
  given = size_rule.candidates({"model.n_layers": 3, "train.batch_size": 8}, 128, 24)
  assert {s.n_layers for s in given} == {3} and {s.batch_size for s in given} == {8}
  assert len(given) == len(size_rule.WIDTHS)  # a given depth drops the band: every width
  assert size_rule.candidates({"model.n_heads": 7}, 128, 24) == []  # no width splits in 7


def test_repeated_tokens_are_worth_less_with_each_epoch():
  law = size_rule.LossLaw(e=1.0, a=10.0, alpha=0.3, b=10.0, beta=0.3, r=5.0)
  u = 1e6
  assert law.effective_tokens(0.5e6, u) == 0.5e6  # the first epoch is all new
  worth = [law.effective_tokens(k * u, u) - law.effective_tokens((k - 1) * u, u)
           for k in range(2, 30)]
  assert all(a > b > 0 for a, b in zip(worth, worth[1:]))
  assert law.effective_tokens(1e12, u) <= (1 + law.r) * u


def test_a_longer_budget_picks_a_larger_model_and_a_smaller_text_more_params_per_token():
  picks = [_pick(s, 1_000_000) for s in (60, 180, 600, 3600)]
  params = [p.params for p in picks]
  assert params == sorted(params) and params[0] < params[-1]
  assert all(p.tokens > 0 and math.isclose(p.epochs, p.tokens / 1e6) for p in picks)
  # Ten times the text at the same budget: no fewer tokens per parameter.
  small, large = _pick(600, 300_000), _pick(600, 30_000_000)
  assert small.tokens / small.params <= large.tokens / large.params


def test_within_the_flat_valley_the_smaller_model_wins():
  shapes = size_rule.candidates({}, 128, 24)
  opts = size_rule.options(BASE, shapes, SPEED, 600, 1_000_000)
  pick, near = size_rule.choose(opts)
  best = min(o.bpb for o in opts)
  assert pick.bpb <= best * (1 + size_rule.FLAT)
  assert not any(o.params < pick.params and o.bpb <= best * (1 + size_rule.FLAT) for o in opts)
  assert [o.params < pick.params for o in near] in ([True, False], [True], [False])


def test_the_speed_fit_is_the_least_squares_fit_with_no_negative_coefficient():
  from scipy.optimize import nnls

  rng = np.random.default_rng(0)
  for _ in range(200):
    a = rng.standard_normal((rng.integers(2, 9), 5)) * rng.uniform(0.01, 10, 5)
    b = rng.standard_normal(len(a)) + 1
    x = speed_probe.nonnegative_lstsq(a, b)
    assert np.all(x >= 0)
    assert np.linalg.norm(a @ x - b) <= np.linalg.norm(a @ nnls(a, b)[0] - b) + 1e-9
  # Unconstrained, b = 1 x the first column - 1 x the second; the second is left out instead.
  a = np.array([[1.0, 1.0], [1.0, 0.0], [1.0, -1.0]])
  assert speed_probe.nonnegative_lstsq(a, np.array([0.0, 1.0, 2.0])) == pytest.approx([1.0, 0.0])


def test_the_speed_fit_recovers_the_model_the_times_came_from():
  rows = [dict(r, compile_s=2.0 + 0.5 * r["layers"]) for r in _rows(SPEED)]
  fitted = speed_probe.fit(rows, 5)
  for s in size_rule.candidates({}, 128, 24):
    assert fitted.step_s(BASE, s) == pytest.approx(SPEED.step_s(BASE, s), rel=0.05)
  assert fitted.compile_per_layer_s == pytest.approx(0.5 * speed_probe.COMPILE_FACTOR)


@pytest.mark.slow
def test_the_law_is_the_one_fitted_to_the_measured_runs():
  # fit.json keeps the points the law was fitted to (each a run in runs.jsonl or an earlier
  # result); fitting them again gives the constants the rule uses.
  sys.path.insert(0, str(ROOT / "benchmarks"))
  import auto_size_fit

  saved = json.loads(FIT.read_text())
  for name, value in saved["law"].items():
    assert getattr(size_rule.LAW, name) == pytest.approx(value, rel=1e-3), name
  law, levels, _ = auto_size_fit.fit(saved["points"])
  for pt in saved["points"]:
    assert auto_size_fit.predict(law, pt, levels) == pytest.approx(
        auto_size_fit.predict(size_rule.LAW, pt, saved.get("levels")), rel=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--config.model.size=auto"], "config.model.size: is auto, which needs train.time_budget"),
    (["--config.model.size=big"], "config.model.size: 'big' is not auto or empty"),
    (["--config.model.size=auto", "--config.train.time_budget=1m", "--config.init_from=runs/x"],
     "config.model.size: is auto (a new model), but init_from='runs/x' gives the model"),
])
def test_a_conflict_is_one_error_line(args, message, tmp_path, corpus_file):
  res = run_cli("--config=configs/shakespeare_char.py", f"--config.data.path={corpus_file}",
                f"--config.workdir={tmp_path / 'run'}", *args)
  assert res.returncode == 2, res.stderr[-2000:]
  errors = [line for line in res.stderr.splitlines() if line.strip()]
  assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), res.stderr
  assert not (tmp_path / "run").exists()


def _seed_speed(cache: Path, corpus_file: Path, speed_rows: list[dict]) -> None:
  """The cache dir's probe rows for configs/shakespeare_char.py on this machine, as a probe on
  quiet cores writes them (the choice reads them instead of probing)."""
  cfg = jt.load_config(str(ROOT / "configs/shakespeare_char.py"))
  name = f"auto_speed:{measured.key(*speed_probe.architecture(cfg, 'cpu'))}"
  cache.mkdir(parents=True, exist_ok=True)
  (cache / measured.FILE).write_text(json.dumps({name: {
      "value": {"rows": speed_rows, "seconds": 60.0, "share_s": 600.0}, "time": time.time() - 7200,
      "load": 0.0}}))


def _speed(model: size_rule.SpeedModel | None, rows: int = len(speed_probe.PROBES),
           here: bool = False):
  """What `speed_probe.speed_model` gives: `model`, from a probe of `rows` shapes, cached or
  measured by this run (`here`)."""
  value = {"rows": [{}] * rows, "seconds": 60.0, "share_s": 60.0}
  return lambda *args, **kwargs: (model, measured.Measured(value, time.time() - 60, 0.0, here))


def _but_load(lines: list[str]) -> list[str]:
  """`lines` but the one a busy machine adds (a cached probe read while others use the cores)."""
  return [line for line in lines if "of the cores busy now" not in line]


def _rows(speed: size_rule.SpeedModel) -> list[dict]:
  """Probe rows of PROBES as the probe writes them, their step times `speed`'s."""
  shapes = [size_rule.Shape(n, d, d // 32, 128, 24) for n, d in speed_probe.PROBES]
  return [{"shape": dataclasses.asdict(s), "features": size_rule.features(BASE, s, 5),
           "step_s": speed.step_s(BASE, s), "layers": s.n_layers, "compile_s": 1.0,
           "cached": False, "seconds": 2.0} for s in shapes]


@pytest.mark.slow
def test_the_dry_run_says_what_it_would_choose_and_why(tmp_path, corpus_file):
  cache = tmp_path / "cache"
  _seed_speed(cache, corpus_file, _rows(SPEED))
  res = run_cli("--config=configs/shakespeare_char.py", f"--config.data.path={corpus_file}",
                f"--config.workdir={tmp_path / 'run'}", "--config.model.size=auto",
                "--config.train.time_budget=10m", "--dry_run", env={"JAXTRAIN_CACHE": str(cache)})
  assert res.returncode == 0, res.stderr[-2000:]
  said = [line for line in _but_load(res.stdout.splitlines()) if "model.size=auto" in line
          or line.startswith("  rejected")]
  assert said[0].startswith("model.size=auto: ") and "params" in said[0] and "epochs" in said[0]
  assert "predicted val" in said[0] and len(said) >= 2 and "predicted val" in said[1]
  assert "this machine's speed, measured 2h00m ago, reused from the cache" in said[0]
  assert not (tmp_path / "run").exists()


class _StopAt(Hook):
  def __init__(self, step: int):
    self.at = step

  def on_step(self, step, state):
    self.at_now = step

  def stop_reason(self):
    return "test stop" if getattr(self, "at_now", 0) >= self.at else None


@pytest.mark.slow
def test_a_run_writes_its_choice_and_a_resume_keeps_it(tiny, tmp_path, monkeypatch):
  # Small context and batch given (kept), depth and width chosen. A machine this slow trains only
  # small candidates; a resume on a machine 1000x faster keeps the choice.
  slow = size_rule.SpeedModel((0.05, 0.01, 1 / 2e8, 1 / 2e8, 0.0), 20.0, 0.1)
  fast = size_rule.SpeedModel((5e-5, 1e-5, 1 / 1e12, 1 / 1e12, 0.0), 1.0, 0.1)
  tiny.model.size, tiny.train.time_budget, tiny.sample.num_samples = "auto", "30s", 0
  explicit = ("model.seq_len", "train.batch_size")
  monkeypatch.setattr(speed_probe, "speed_model", _speed(slow))
  first = jt.run(tiny, show_progress=False, explicit=explicit, hooks=(_StopAt(2),))
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  shape = (saved["model"]["n_layers"], saved["model"]["d_model"], saved["model"]["n_heads"])
  assert first.step == 2 and saved["model"]["size"] == "auto"
  assert saved["model"]["seq_len"] == 32 and saved["train"]["batch_size"] == 8  # kept as given
  assert shape[1] <= 128
  monkeypatch.setattr(speed_probe, "speed_model", _speed(fast))
  again, lines, _ = autosize.resolve(tiny, 30.0, explicit, t_start=time.time())
  assert (again.model.n_layers, again.model.d_model, again.model.n_heads) == shape
  assert "never chooses again" in lines[0]
  fresh = tiny.copy_and_resolve_references()
  fresh.workdir = str(tmp_path / "fresh")
  chosen, _, _ = autosize.resolve(fresh, 30.0, explicit, t_start=time.time())
  # Where it would choose otherwise:
  assert (chosen.model.n_layers, chosen.model.d_model, chosen.model.n_heads) != shape


def test_a_given_field_is_kept_and_an_impossible_one_is_an_error(tiny, monkeypatch):
  monkeypatch.setattr(speed_probe, "speed_model", _speed(SPEED))
  tiny.model.size, tiny.train.time_budget = "auto", "10m"
  tiny.model.n_layers = 3
  cfg, lines, _ = autosize.resolve(tiny, 600.0, ("model.n_layers",), t_start=time.time())
  assert cfg.model.n_layers == 3 and "kept as given: model.n_layers" in lines[0]
  assert cfg.model.seq_len == autosize.CONTEXT and cfg.train.batch_size == autosize.BATCH
  tiny.model.n_heads = 7
  with pytest.raises(ConfigError, match="config.model.size: is auto, but no candidate shape has "
                     "model.n_layers=3, model.n_heads=7"):
    autosize.resolve(tiny, 600.0, ("model.n_layers", "model.n_heads"), t_start=time.time())


@pytest.mark.slow
def test_the_corpus_is_read_once_and_handed_on(tiny, monkeypatch, capsys):
  # The choice counts the corpus's tokens; the run (here its dry run) trains on that same read.
  monkeypatch.setattr(speed_probe, "speed_model", _speed(SPEED))
  reads, prepare = [], corpus_lib.prepare
  monkeypatch.setattr(corpus_lib, "prepare", lambda data, *a, **k: reads.append(data.path)
                      or prepare(data, *a, **k))
  tiny.model.size, tiny.train.time_budget = "auto", "10m"
  preview.dry_run(tiny, ("model.seq_len", "train.batch_size"))
  assert reads == [tiny.data.path] and "model.size=auto: " in capsys.readouterr().out


def test_a_char_vocabulary_of_thousands_of_symbols_becomes_bytes(tiny, tmp_path, monkeypatch):
  monkeypatch.setattr(speed_probe, "speed_model", _speed(SPEED))
  rng = np.random.default_rng(0)
  text = "".join(chr(0x4E00 + int(i)) for i in rng.integers(0, 2000, 40_000))
  (tmp_path / "zh.txt").write_text("\n".join(text[i:i + 80] for i in range(0, len(text), 80)))
  tiny.data.path, tiny.data.tokenizer = str(tmp_path / "zh.txt"), "char"
  tiny.model.size, tiny.train.time_budget = "auto", "10m"
  cfg, lines, corpus = autosize.resolve(tiny, 600.0, t_start=time.time())
  assert cfg.data.tokenizer == "byte" and corpus.tokenizer.name == "byte"
  assert lines[0].startswith("model.size=auto: data.tokenizer=byte: a char vocabulary of 2002 "
                             "symbols")  # the text's 2000, a line end and the end-of-text
  kept, lines, corpus = autosize.resolve(tiny, 600.0, ("data.tokenizer",), t_start=time.time())
  assert kept.data.tokenizer == "char" and corpus.tokenizer.name == "char"  # as given


def test_a_text_the_budget_sees_at_most_4_times_becomes_bpe(tiny, tmp_path, monkeypatch):
  # ~1.4 MB of code-like text and 30 seconds: the pick sees it less than 4 times in bytes, so it
  # trains on a BPE learned from it; given a tokenizer, or on a small text, the bytes stay.
  monkeypatch.setattr(speed_probe, "speed_model", _speed(SPEED))
  rng = np.random.default_rng(0)
  words = np.array(["def ", "return ", "self.", "import ", "class ", "x", "y", " = ", " + ", "(",
                    "):\n", "\n    ", "if ", "for ", " in ", "range(", "None", "0", "1", ", "])
  (tmp_path / "code.txt").write_text("".join(rng.choice(words, 400_000)))
  tiny.data.path, tiny.data.tokenizer = str(tmp_path / "code.txt"), "byte"
  tiny.model.size, tiny.train.time_budget = "auto", "30s"
  cfg, lines, corpus = autosize.resolve(tiny, 30.0, t_start=time.time())
  assert (cfg.data.tokenizer, cfg.data.vocab_size) == ("bpe", autosize.BPE_VOCAB)
  assert corpus.tokenizer.name == "bpe" and corpus.n_bytes / len(corpus.tokens) > 2
  said = [line for line in lines if "data.tokenizer=bpe" in line]
  assert said and "epochs of this text in bytes (at most 4)" in said[0], lines
  assert "--config.data.tokenizer=byte keeps it" in said[0]
  kept, _, corpus = autosize.resolve(tiny, 30.0, ("data.tokenizer",), t_start=time.time())
  assert kept.data.tokenizer == "byte" and corpus.tokenizer.name == "byte"  # as given
  tiny.data.path = str(tmp_path / "small.txt")
  (tmp_path / "small.txt").write_text("".join(rng.choice(words, 20_000)))
  small, _, corpus = autosize.resolve(tiny, 30.0, t_start=time.time())
  assert small.data.tokenizer == "byte" and corpus.tokenizer.name == "byte"  # seen many times


def test_a_probe_cut_too_short_for_a_fit_leaves_the_configs_model(tiny, monkeypatch):
  monkeypatch.setattr(speed_probe, "speed_model", _speed(None, rows=1, here=True))
  tiny.model.size, tiny.train.time_budget = "auto", "1m"
  cfg, lines, _ = autosize.resolve(tiny, 60.0, t_start=time.time())
  assert (cfg.model.n_layers, cfg.model.d_model) == (tiny.model.n_layers, tiny.model.d_model)
  assert lines == [f"model.size=auto: 1m00s of the budget measured 1 shape of the speed probe, "
                   f"too few to choose from: the config's model, {tiny.model.n_layers}x"
                   f"{tiny.model.d_model}, trains (a longer budget measures more, once)"]


def test_a_probe_cut_short_holds_for_shapes_up_to_its_largest():
  rows = _rows(SPEED)[:3]
  partial = speed_probe.fit(rows, 5)
  assert partial.max_flops == max(r["features"][2] for r in rows)
  opts = size_rule.options(BASE, size_rule.candidates({}, 128, 24), partial, 3600, 10**6)
  assert opts and all(size_rule.features(BASE, o.shape, 0)[2] <= partial.max_flops for o in opts)
  assert speed_probe.fit(_rows(SPEED), 5).max_flops == math.inf  # every shape: the whole probe
  assert speed_probe.fit(rows + rows, 5).max_flops < math.inf  # six rows, three shapes


@pytest.mark.slow
def test_the_probe_keeps_to_its_share_and_a_later_one_takes_up_what_it_left(tiny, tmp_path,
                                                                             monkeypatch):
  # A share too short for one shape measures none. A probe cut short (two shapes here) is read as
  # it is by a run whose share holds no more; one whose share holds more measures the shapes left.
  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path))
  monkeypatch.setattr(measured, "_here", {})
  said = []
  model, found = speed_probe.speed_model(tiny, 66, "cpu", 0.0, said.append)
  assert model is None and found.value["rows"] == [] and found.here
  assert said == [f"model.size=auto: measuring this machine's speed on 7 shapes, in at most 0.0s "
                  f"(once: cached in {tmp_path / measured.FILE})"]  # its own 2x32, then PROBES
  assert found.value["seconds"] < 5  # stopped at its deadline, at once
  rows = json.loads(json.dumps([dict(r, seconds=0.001) for r in _rows(SPEED)[:2]]))
  cached = json.loads((tmp_path / measured.FILE).read_text())
  for entry in cached.values():
    entry.update(value={"rows": rows, "seconds": 1.0, "share_s": 0.005}, load=0.0)
  (tmp_path / measured.FILE).write_text(json.dumps(cached))
  monkeypatch.setattr(measured, "_here", {})
  model, found = speed_probe.speed_model(tiny, 66, "cpu", 0.005, said.append)
  said = _but_load(said)
  assert not found.here and found.value["rows"] == rows and len(said) == 1
  assert model.max_flops == rows[1]["features"][2]  # two shapes: a fit up to the larger
  monkeypatch.setattr(measured, "_here", {})
  model, found = speed_probe.speed_model(tiny, 66, "cpu", 0.01, said.append)
  assert found.here and found.value["rows"] == rows  # the two kept; none more in 0.01 s
  assert said[-1].startswith("model.size=auto: measuring this machine's speed on 5 more shapes")


@pytest.mark.slow
def test_a_cached_probe_is_slowed_by_the_load_now(tiny, tmp_path, monkeypatch):
  # Speeds cached on quiet cores, read while other processes keep every core busy: the steps are
  # counted at the share left to the run (MIN_SHARE here, the cores all taken), and it is said.
  monkeypatch.setenv("JAXTRAIN_CACHE", str(tmp_path))
  monkeypatch.setattr(measured, "_here", {})
  speed_probe.speed_model(tiny, 66, "cpu", 0.0, lambda line: None)
  cached = json.loads((tmp_path / measured.FILE).read_text())
  rows = json.loads(json.dumps(_rows(SPEED)))
  for entry in cached.values():
    entry.update(value={"rows": rows, "seconds": 1.0, "share_s": 60.0}, load=0.0)
  (tmp_path / measured.FILE).write_text(json.dumps(cached))
  monkeypatch.setattr(measured, "_here", {})
  quiet = speed_probe.fit(rows, 0)
  busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
          for _ in range(machine.cores())]
  try:
    time.sleep(0.5)
    said = []
    model, found = speed_probe.speed_model(tiny, 66, "cpu", 60.0, said.append)
  finally:
    for p in busy:
      p.kill()
  assert not found.here and len(said) == 1 and said[0].startswith(
      "model.size=auto: other processes keep ") and said[0].endswith(
      f"its steps are counted at {speed_probe.MIN_SHARE:.0%} of them"), said
  assert model.coef == pytest.approx([c / speed_probe.MIN_SHARE for c in quiet.coef])


def test_a_probe_may_take_only_what_a_better_shape_could_repay():
  # The most a probe may take: the best shape trained in what it leaves is predicted better, by
  # FLAT, than the fallback trained in the whole time. None where the fallback is the best already.
  shapes = size_rule.candidates({}, 128, 24)
  u = 1_000_000
  for budget in (60, 600, 3600):
    opts = size_rule.options(BASE, shapes, SPEED, budget, u)
    best = size_rule.choose(opts)[0].shape
    assert size_rule.repayable_s(BASE, shapes, SPEED, budget, u, best, budget / 4) == 0.0
  small = size_rule.Shape(2, 64, 2, 128, 24)  # a fallback far too small for long budgets
  repay = [size_rule.repayable_s(BASE, shapes, SPEED, b, u, small, b) for b in (300, 600, 3600)]
  assert 0 < repay[0] < repay[1] < repay[2] < 3600
  kept = size_rule.options(BASE, [small], SPEED, 600, u)[0].bpb
  after = min(o.bpb for o in size_rule.options(BASE, shapes, SPEED, 600 - repay[1], u))
  assert after == pytest.approx(kept * (1 - size_rule.FLAT), rel=1e-3)
  assert size_rule.repayable_s(BASE, shapes, SPEED, 600, u, small, 10.0) == 10.0  # at most


def _seed_matmul(cache: Path, gflops: float) -> None:
  """This machine's numpy matmul speed as the cache dir holds it (the prior reads it)."""
  name = f"numpy_matmul:{measured.key(speed_probe.MATMUL_N)}"
  cache.mkdir(parents=True, exist_ok=True)
  file = cache / measured.FILE
  held = json.loads(file.read_text()) if file.exists() else {}
  held[name] = {"value": gflops, "time": time.time(), "load": 0.0}
  file.write_text(json.dumps(held))


def test_a_first_run_whose_budget_cannot_repay_a_probe_measures_nothing(tmp_path, monkeypatch):
  # An empty cache, a 1-minute budget, a text the law was never fitted on (generated, 1 MB): on a
  # machine as fast as the reference, a probe would cost more than a better shape could win back,
  # so none starts; the line says so before any of the budget is spent, and the config's own
  # model trains. A 1-hour budget would measure.
  rng = np.random.default_rng(1)
  words = ["".join(chr(97 + int(c)) for c in rng.integers(0, 26, n))
           for n in rng.integers(2, 9, 3000)]
  text = "\n".join(" ".join(words[i] for i in rng.integers(0, 3000, 12)) for _ in range(14000))
  (tmp_path / "held_out.txt").write_text(text)
  cache = tmp_path / "cache"
  monkeypatch.setenv("JAXTRAIN_CACHE", str(cache))
  monkeypatch.setattr(measured, "_here", {})
  _seed_matmul(cache, speed_probe.REFERENCE_GFLOPS)

  def no_probe(*args, **kwargs):
    raise AssertionError("a probe process was started")

  monkeypatch.setattr(speed_probe.subprocess, "Popen", no_probe)
  cfg = jt.load_config(str(ROOT / "configs/shakespeare_char.py"), **{
      "data.path": str(tmp_path / "held_out.txt"), "model.size": "auto",
      "train.time_budget": "1m", "workdir": str(tmp_path / "run")})
  said = []
  chosen, lines, _ = autosize.resolve(cfg, 60.0, say=said.append, t_start=time.time())
  assert (chosen.model.n_layers, chosen.model.d_model, chosen.model.n_heads) == (2, 96, 3)
  assert not [x for x in said if "model.size=auto" in x] and len(lines) == 1, lines
  assert lines[0].startswith("model.size=auto: no speed probe: on this machine (a matmul 1x the "
                             "reference's speed) measuring 2 shapes would take ~"), lines
  assert "the config's model, 2x96, trains (a budget of " in lines[0]
  assert "auto_speed" not in (cache / measured.FILE).read_text()
  with pytest.raises(AssertionError, match="a probe process was started"):
    autosize.resolve(cfg, 3600.0, say=said.append, t_start=time.time())


@pytest.mark.slow
def test_the_probe_compiles_the_train_step_a_run_of_its_shape_then_reads(tiny, tmp_path,
                                                                        monkeypatch):
  # The probe measures the config's own shape first, into the run's compile cache: a run of that
  # shape compiles no train step of its own (the one file of it is the probe's), and a probe
  # that finds it cached says so.
  xla = tmp_path / "xla"
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(xla))
  measured_ = _rows(SPEED)  # every other shape measured already
  said = []
  first = speed_probe.run_probe(tiny, 256, "cpu", 300.0, said.append, measured_, eot_id=255)
  new = first["rows"][len(measured_):]
  assert [(r["layers"], r["shape"]["d_model"], r["cached"]) for r in new] == [(2, 32, False)]
  steps = sorted(p.name for p in xla.glob("jit_train_step-*-cache"))
  assert len(steps) == 1
  again = speed_probe.run_probe(tiny, 256, "cpu", 300.0, said.append, measured_, eot_id=255)
  assert again["rows"][-1]["cached"] and "(from the compile cache)" in said[-1]
  config = tmp_path / "tiny_config.py"
  config.write_text("from jaxtrain.testing import tiny_config\n\n\ndef get_config():\n"
                    f"  return tiny_config(**{{'data.path': {tiny.data.path!r}}})\n")
  res = run_cli(f"--config={config}", f"--config.workdir={tmp_path / 'run'}",
                "--config.train.max_steps=2", "--config.sample.num_samples=0",
                "--config.headless=True", env={"JAX_COMPILATION_CACHE_DIR": str(xla)})
  assert res.returncode == 0, res.stderr[-2000:]
  assert sorted(p.name for p in xla.glob("jit_train_step-*-cache")) == steps
