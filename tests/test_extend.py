"""Your own components (docs/extending.md): registered as the built-ins are, chosen by the same
fields, their options config fields; a broken one is one line naming its file, line and fix; an
extension-built model compiles to the built-in's program, trains, resumes bit for bit, samples and
refuses a resume with changed code; the one-file GPT is the built-in model."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest
from conftest import ROOT, run_cli

import jaxtrain as jt
from jaxtrain import testing, train
from jaxtrain.checkpoints import store
from jaxtrain.config import defaults, extensions, loading
from jaxtrain.core import components, programs, registry
from jaxtrain.core import model as model_lib
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.generation import decode
from jaxtrain.loop import preview
from jaxtrain.system.errors import ConfigError, UserError

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

EXAMPLES = ROOT / "examples" / "extend"
# A user's file: the built-ins' twins (the same math, written in it), and components that break
# their contract each one way.
IDEAS = '''
import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxtrain as jt


@jt.attention("twin_causal")
def twin_causal(q, k, v, at):
  return at(q, k, v)


@jt.mlp("twin_swiglu")
class SwiGLU(nnx.Module):
  def __init__(self, c, rngs):
    F = 8 * math.ceil(2 / 3 * c.mlp_ratio * c.d_model / 8)
    init = jax.nn.initializers.normal(0.02)
    self.up = jt.Dense(c.d_model, 2 * F, dtype=jnp.dtype(c.dtype), kernel_init=init, rngs=rngs)
    self.down = jt.Dense(F, c.d_model, dtype=jnp.dtype(c.dtype), kernel_init=init, rngs=rngs)

  def __call__(self, x):
    gate, up = jnp.split(self.up(x), 2, axis=-1)
    return self.down(jax.nn.silu(gate) * up)


@jt.mlp("wide")
class Wide(nnx.Module):
  def __init__(self, c, rngs):
    self.up = nnx.Linear(c.d_model, 2 * c.d_model, use_bias=False, rngs=rngs)

  def __call__(self, x):
    return self.up(x)


@jt.norm("half")
class Half(nnx.Module):
  def __init__(self, c, rngs):
    pass

  def __call__(self, x):
    return x.astype(jnp.float16)


@jt.attention("peeks")
def peeks(q, k, v, at):
  if float(q.sum()) > 0:
    return at(q, k, v)
  return at(q, k, v)


def helper(x):
  return x.reshape(3, -1, 7)


@jt.norm("oops")
class Oops(nnx.Module):
  def __init__(self, c, rngs):
    pass

  def __call__(self, x):
    return helper(x)


@jt.optimizer("not_optax")
def not_optax(lr, o):
  return "adam"


@jt.loss("per_row")
def per_row(logits, targets):
  return jnp.zeros(targets.shape[:1])


@jt.loss("sharpen", weight=0.01)
def sharpen(logits, targets, *, weight):
  p = jax.nn.softmax(logits, axis=-1)
  return weight * jnp.sum(p * jnp.log(p + 1e-9), axis=-1)


@jt.block("parallel")
class Parallel(jt.Block):
  def __call__(self, x, ctx):
    h = self.norm1(x)
    return x + self.attn(h, ctx) + self.mlp(h)
'''


@pytest.fixture(scope="session")
def ideas(tmp_path_factory) -> str:
  path = tmp_path_factory.mktemp("ideas") / "my_ideas.py"
  path.write_text(IDEAS)
  jt.extend(str(path))
  return str(path)


def _first_line(e: BaseException) -> str:
  return str(e).splitlines()[0]


def test_the_built_ins_are_registered_as_an_extension_is(ideas):
  builtin = {kind: [n for n in registry.names(kind) if registry.get(kind, n).builtin]
             for kind in registry.KINDS}
  assert builtin == {"norm": ["rmsnorm", "layernorm"], "positions": ["rope", "learned", "none"],
                     "mlp": ["swiglu", "gelu", "relu2"], "attention": ["causal"],
                     "block": ["prenorm"], "model": ["gpt"], "optimizer": ["adamw", "muon"],
                     "schedule": ["cosine", "wsd", "constant"], "loss": []}
  for kind, names in builtin.items():  # each field's default is a built-in of its kind
    field = registry.KINDS[kind].field
    assert defaults.default_config()[field.split(".")[0]][field.split(".")[1]] in [*names, ""]
  assert all(getattr(jt, kind) is getattr(registry, kind) for kind in registry.KINDS)
  theirs = registry.get("mlp", "twin_swiglu")
  assert not theirs.builtin and theirs.source == ideas and theirs.line == 18
  with pytest.raises(UserError, match=r"^mlp 'swiglu' \(.*test_extend.py, line \d+\) is a built-in "
                     r"mlp; give it another name$"):
    jt.mlp("swiglu")(lambda c, rngs: None)
  with pytest.raises(UserError, match=r"^mlp 'wide' .* is registered by .*my_ideas.py, line 31; "
                     "give it another name$"):
    jt.mlp("wide")(lambda c, rngs: None)
  jt.extend(ideas)  # the same file again: nothing changes
  assert registry.get("mlp", "twin_swiglu") is theirs


def test_an_extensions_options_are_validated_shown_kept_and_set(ideas):
  window = str(EXAMPLES / "window.py")
  cfg = loading.load_config("nano", **{"extend": window, "model.attention_variant": "window"})
  cfg = components.validate(cfg)
  assert cfg.ext.window.size == 64  # the option's default, a field of every config now
  cfg = loading.override(cfg, **{"ext.window.size": 16})
  assert "  ext.window: size=16*" in preview.config_lines(cfg)
  mc = model_lib.ModelConfig.from_config(cfg.model, 256, cfg.ext)
  assert mc.options == (("window", (("size", 16),)),)
  typo = cfg.to_dict()  # as a config file could build it, or config.json bring it back
  typo["ext"]["window"]["size"] = "16"
  with pytest.raises(ConfigError) as e:
    components.validate(ml_collections.ConfigDict(typo))
  assert e.value.field == "ext.window.size" and "must be an integer" in str(e.value)
  saved = loading.flatten(loading.from_saved(cfg.to_dict()).to_dict())
  assert saved["ext.window.size"] == 16  # config.json's value comes back
  breaking, _ = loading.config_changes(cfg.to_dict(), loading.override(
      cfg.copy_and_resolve_references(), **{"ext.window.size": 32}).to_dict())
  assert breaking == ["ext.window.size: 16 -> 32"]  # an option's meaning is the extension's


@pytest.mark.parametrize("overrides, words", [
    ({"model.mlp": "widee"}, r"^config\.model\.mlp: 'widee' names no mlp here \(built-in: swiglu, "
     r"gelu, relu2; registered: .*wide \(.*my_ideas\.py, line 31\).*\); pass "
     r"--config\.model\.mlp=swiglu, or register yours: @jt\.mlp\('widee'\) in --config\.extend="),
    ({"model.mlp": "wide"}, r"^model\.mlp=wide: the mlp \(.*my_ideas\.py, line 31\) returned "
     r"float32\[2, 32, 64\], not float32\[2, 32, 32\] .*; make it return that$"),
    ({"model.norm": "half"}, r"^model\.norm=half: the norm \(.*, line 40\) returned "
     r"float16\[2, 32, 32\], not float32\[2, 32, 32\]"),
    ({"model.attention_variant": "peeks"}, r"^model\.attention_variant=peeks: the attention raised "
     r"\(.*my_ideas\.py, line 50, in peeks\): ConcretizationTypeError: .*; it is traced: use jnp "),
    ({"model.norm": "oops"}, r"^model\.norm=oops: the norm raised \(.*my_ideas\.py, line 56, in "
     r"helper\): TypeError: cannot reshape .*; fix my_ideas\.py$"),
    ({"optim.name": "not_optax"}, r"^optim\.name=not_optax: the optimizer \(.*, line 68\) returned "
     r"str, not an optax\.GradientTransformation"),
    ({"optim.loss_term": "per_row"}, r"^optim\.loss_term=per_row: the loss term .* returned "
     r"float32\[2\], not one value per target token, \[B, T\] = \[2, 32\]"),
    ({"optim.loss_term": "sharpen", "model.loss_chunk": 16}, r"^config\.model\.loss_chunk: is set, "
     r"and optim\.loss_term=sharpen needs the logits of every token; pass "),
])
def test_a_broken_component_is_one_line_naming_it_its_file_and_the_fix(ideas, overrides, words):
  cfg = jt.tiny_config(extend=ideas, **overrides)
  with pytest.raises(UserError) as e:
    components.trace(components.validate(cfg))
  assert re.search(words, _first_line(e.value)), _first_line(e.value)
  frames = str(e.value).splitlines()[1:]  # then the user's own frames, and no one else's
  assert all(ideas.rsplit("/", 1)[-1] in f or f.startswith("    ") for f in frames), frames


def test_an_exception_in_the_users_code_shows_their_frames_only(ideas):
  with pytest.raises(UserError) as e:
    components.trace(components.validate(jt.tiny_config(extend=ideas, **{"model.norm": "oops"})))
  shown = min(ideas, os.path.relpath(ideas), key=len)  # as a person reads it
  assert str(e.value).splitlines()[1:] == [
      f'  File "{shown}", line 65, in __call__', "    return helper(x)",
      f'  File "{shown}", line 56, in helper', "    return x.reshape(3, -1, 7)"]


@pytest.mark.parametrize("text, words", [
    ("import jaxtrain as jt\n\ndef broken(:\n  pass\n", r"^extend: \S*bad\.py does not load "
     r"\(.*bad\.py, line 3, in <module>\): SyntaxError: .*; fix bad\.py$"),
    ("import not_a_module_anywhere\n", r"^extend: \S*bad\.py does not load \(.*bad\.py, line 1, in "
     r"<module>\): ModuleNotFoundError: No module named 'not_a_module_anywhere'; fix bad\.py$"),
    (None, r"^config\.extend: .*missing\.py not found \(from .*\); pass the path of your Python "),
])
def test_a_file_that_does_not_load_is_one_line_with_its_line(tmp_path, text, words):
  path = tmp_path / ("bad.py" if text else "missing.py")
  if text:
    path.write_text(text)
  with pytest.raises(UserError) as e:
    components.validate(jt.tiny_config(extend=str(path)))
  assert re.search(words, _first_line(e.value)), _first_line(e.value)


@pytest.mark.slow
def test_a_sliding_window_sees_its_size_and_decodes_alike_with_and_without_the_cache():
  jt.extend(str(EXAMPLES / "window.py"))
  c = model_lib.ModelConfig(vocab_size=64, n_layers=1, n_heads=2, d_model=16, seq_len=16,
                            attention_variant="window", options=(("window", (("size", 4),)),))
  model = model_lib.GPT(c, 0)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 16), 0, 64)
  logits = model(tokens)
  far = model(tokens.at[:, 5].set((tokens[:, 5] + 1) % 64))  # 4 or more positions before 9..15
  np.testing.assert_array_equal(np.asarray(logits[:, 9:]), np.asarray(far[:, 9:]))
  assert not np.allclose(np.asarray(logits[:, 5:9]), np.asarray(far[:, 5:9]))
  state = jt.init(jt.tiny_config(**{"extend": str(EXAMPLES / "window.py"),
                                    "model.attention_variant": "window", "ext.window.size": 5}))
  prompt = np.arange(7, dtype=np.int32)
  cached = decode.generate(state, prompt, 60, temperature=0.0)  # past seq_len: the window restarts
  np.testing.assert_array_equal(cached, decode.generate(state, prompt, 60, temperature=0.0,
                                                        use_cache=False))


def test_an_extension_built_model_compiles_to_the_built_in_models_program(ideas):
  """The registry adds nothing to the step: the twins' train step lowers to the very program of
  the built-in model (benchmarks/results/2026-12-07-extensions: the compiled programs too)."""
  def lowered(**overrides) -> str:
    cfg = jt.tiny_config(extend=ideas, **overrides)
    return programs.build(cfg, 256, jax.devices()[:1]).lower_train().as_text()

  twins = lowered(**{"model.attention_variant": "twin_causal", "model.mlp": "twin_swiglu"})
  assert twins == lowered()
  assert lowered(**{"model.attention_variant": "twin_causal", "model.mlp": "gelu"}) != twins


@pytest.mark.slow
def test_lion_a_new_schedule_a_loss_term_and_a_block_train(ideas):
  for name in ("lion.py", "sqrt_decay.py"):
    jt.extend(str(EXAMPLES / name))
  cfg = jt.tiny_config(**{"extend": f"{ideas},{EXAMPLES / 'lion.py'},{EXAMPLES / 'sqrt_decay.py'}",
                          "optim.name": "lion", "optim.schedule": "sqrt_decay", "optim.lr": 3e-3,
                          "optim.warmup_steps": 2, "train.max_steps": 12, "model.block": "parallel",
                          "optim.loss_term": "sharpen"})
  cfg = components.validate(cfg)
  p = programs.build(cfg, 256, jax.devices()[:1])
  state, batch = p.init(), p.place(jt.random_batch(cfg, vocab_size=16))
  losses, lrs = [], []
  for _ in range(12):
    state, m = p.train_step(state, batch)
    losses.append(float(m["loss"]))
    lrs.append(float(m["lr"]))
  assert losses[-1] < losses[0] - 0.5  # it learns the one batch
  # warmup to the peak at step 2, then 1 - sqrt(progress), reaching 0 at step 12
  np.testing.assert_allclose(lrs, [1e-3, 2e-3, *(3e-3 * (1 - (i / 10) ** 0.5) for i in range(10))],
                             rtol=1e-5)
  assert state.opt_state[1][0].__class__.__name__ == "ScaleByLionState"


@pytest.mark.slow
def test_an_extension_trains_resumes_bit_for_bit_and_samples(corpus_file, tmp_path):
  """The docs' three examples at once, from the command line: a sliding window with optax's Lion
  and a new schedule, stopped by SIGINT and resumed, ends bit for bit where an uninterrupted run
  ends; it samples; changed code is refused on resume, or allowed by a flag."""
  window = tmp_path / "window.py"  # its own name: another test of this process has registered the example's
  window.write_text((EXAMPLES / "window.py").read_text().replace('("window"', '("my_window"'))
  assert '("my_window"' in window.read_text()
  extend = f"{window},{EXAMPLES / 'lion.py'},{EXAMPLES / 'sqrt_decay.py'}"
  args = lambda workdir, steps: [  # noqa: E731
      "--config=nano", "--jax_platforms=cpu", f"--config.extend={extend}",
      "--config.model.attention_variant=my_window", "--config.ext.my_window.size=8",
      "--config.optim.name=lion", "--config.optim.schedule=sqrt_decay", "--config.optim.lr=2e-3",
      f"--config.data.path={corpus_file}", f"--config.workdir={workdir}",
      f"--config.train.max_steps={steps}", "--config.model.n_layers=1", "--config.model.d_model=32",
      "--config.model.n_heads=2", "--config.model.seq_len=32", "--config.train.batch_size=4",
      "--config.train.log_every=1", "--config.train.eval_every=10", "--config.train.eval_steps=1",
      "--config.train.checkpoint_every=10", "--config.sample.num_samples=1",
      "--config.sample.max_new_tokens=8", "--config.optim.warmup_steps=2", "--config.headless=True"]
  whole = run_cli(*args(tmp_path / "whole", 24))
  assert whole.returncode == 0, whole.stderr[-2000:]
  assert re.search(r"^components: model\.attention_variant=my_window \(.*window\.py, line 10\), "
                   r"optim\.name=lion .*sampling extends a key-value cache$", whole.stdout, re.M)
  proc = subprocess.Popen([sys.executable, "-m", "jaxtrain", *args(tmp_path / "legs", 24)],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in proc.stdout:  # stopped by Ctrl-C once it trains
    if re.match(r"step +5/24 ", line):
      proc.send_signal(signal.SIGINT)
      break
  assert proc.wait(timeout=300) == 130
  legs = run_cli(*args(tmp_path / "legs", 24))
  assert legs.returncode == 0 and "resumed from checkpoint" in legs.stdout, legs.stdout[-2000:]
  testing.assert_trees_equal(_final(tmp_path / "whole"), _final(tmp_path / "legs"))
  sample = subprocess.run([sys.executable, "-m", "jaxtrain.sample", f"--workdir={tmp_path / 'legs'}",
                           "--max_new_tokens=8", "--prompt=The "], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
  assert sample.returncode == 0 and sample.stdout.strip().startswith("The "), sample.stderr[-2000:]
  saved = json.loads((tmp_path / "legs" / "config.json").read_text())
  assert saved["extension_sources"][str(window)]["sha256"] == extensions.digest(str(window))
  window.write_text(window.read_text() + "# changed\n")
  refused = run_cli(*args(tmp_path / "legs", 30))
  assert refused.returncode == 2 and refused.stderr.startswith(
      f"error: cannot resume {tmp_path / 'legs'}: the code of its extensions is not what the run "
      "ran: window.py (changed)"), refused.stderr
  allowed = run_cli(*args(tmp_path / "legs", 30), "--config.allow_changed_extend=True")
  assert allowed.returncode == 0 and "extension code: window.py (changed)" in allowed.stdout


@pytest.mark.slow
def test_reading_a_run_whose_extension_code_changed_says_so(tiny, tmp_path, capsys):
  """A run read (sample, export, jt.load_state) with other code than it trained with may compute
  another model: one warning line names the file and where the code it ran is kept; without the
  file, one error line says so."""
  ext = tmp_path / "wide_norm.py"
  ext.write_text("from flax import nnx\n\nimport jaxtrain as jt\n\n\n@jt.norm('changed_norm')\n"
                 "class Same(nnx.Module):\n  def __init__(self, c, rngs):\n    pass\n\n"
                 "  def __call__(self, x):\n    return x\n")
  cfg = loading.override(tiny, **{"extend": str(ext), "model.norm": "changed_norm",
                                  "train.max_steps": 2, "train.checkpoint_every": 2,
                                  "train.eval_every": 2, "sample.num_samples": 0})
  train.run(cfg, show_progress=False)
  capsys.readouterr()
  jt.load_state(cfg.workdir)
  assert "warning" not in capsys.readouterr().err
  ext.write_text(ext.read_text().replace("return x", "return 2 * x"))
  jt.load_state(cfg.workdir)
  assert capsys.readouterr().err.strip() == (
      f"warning: {cfg.workdir} is read with extension code other than the run ran: "
      "wide_norm.py (changed); its model may compute something else than it trained (what the run "
      f"ran is in {Path(cfg.workdir) / 'extend'}/)")
  ext.unlink()  # moved away: the commands that read a run take no --config.extend to name it
  with pytest.raises(UserError) as e:
    jt.load_state(cfg.workdir)
  assert str(e.value) == (f"{cfg.workdir} was trained with the extension {ext}, which is not there "
                          f"now; put it back (the code the run ran is in {Path(cfg.workdir) / 'extend'}/)")


@pytest.mark.slow
def test_init_from_a_run_with_an_extension_takes_its_code_and_options(corpus_file, tmp_path):
  """A fine-tune that takes a source run's model takes the code and options of its extension's
  component with it (where not set): the fine-tune computes what the source trained."""
  ext = tmp_path / "band.py"
  ext.write_text("import jaxtrain as jt\n\n\n@jt.attention('band', size=64)\n"
                 "def band(q, k, v, at, *, size):\n  return at(q, k, v, mask=at.distance < size)\n")
  jt.extend(str(ext))
  short = {"data.path": str(corpus_file), "headless": True, "train.max_steps": 2,
           "train.checkpoint_every": 2, "train.eval_every": 2, "sample.num_samples": 0}
  source = testing.tiny_config(**short, **{"workdir": str(tmp_path / "source"), "extend": str(ext),
                                           "model.attention_variant": "band", "ext.band.size": 4})
  train.run(source, show_progress=False)
  tune = testing.tiny_config(**short, **{"workdir": str(tmp_path / "tune"),
                                         "init_from": source.workdir})
  train.run(tune, show_progress=False)
  saved = json.loads((tmp_path / "tune" / "config.json").read_text())
  assert (saved["model"]["attention_variant"], saved["ext"]["band"], saved["extend"]) == (
      "band", {"size": 4}, str(ext))


def _final(workdir: Path) -> dict:
  saved = json.loads((workdir / "config.json").read_text())
  cfg = loading.from_saved(saved)
  corpus = corpus_lib.prepare(cfg.data, show_progress=False)
  p = programs.build(cfg, corpus.tokenizer.vocab_size)
  ckpts = store.Checkpoints(str(workdir), 2)
  it = corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed)
  state = testing.restore(ckpts, ckpts.latest_step(), p.abstract, p.shardings, it)
  ckpts.close()
  return jax.device_get(state.arrays())


@pytest.mark.slow
def test_a_bad_extension_stops_the_command_before_any_work(tmp_path, ideas):
  out = run_cli("--config=nano", f"--config.extend={ideas}", "--config.model.mlp=wide",
                f"--config.workdir={tmp_path / 'run'}", "--jax_platforms=cpu")
  assert out.returncode == 2 and out.stderr.splitlines()[0].startswith(
      "error: model.mlp=wide: the mlp ("), out.stderr
  assert len(out.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_one_file_gpt_is_the_built_in_model(corpus_file, tmp_path):
  """examples/extend/one_file_gpt.py, trained by the trainer from the seed of the built-in model's
  run: the same loss at step 100, to float rounding (the nano recipe's blocks, tiny)."""
  template = str(EXAMPLES / "one_file_gpt.py")
  jt.extend(template)
  losses = {}
  for arch in ("gpt", "one_file_gpt"):
    cfg = loading.load_config("nano", **{
        "extend": template, "model.arch": arch, "workdir": str(tmp_path / arch),
        "data.path": str(corpus_file), "model.d_model": 32, "model.n_heads": 2,
        "model.n_kv_heads": 1, "model.seq_len": 32, "train.batch_size": 4, "train.max_steps": 100,
        "train.log_every": 50, "train.eval_every": 100, "train.eval_steps": 1,
        "train.checkpoint_every": 100, "sample.num_samples": 0, "headless": True})
    result = train.run(cfg, show_progress=False)
    losses[arch] = (result.train_loss, result.val_loss)
  np.testing.assert_allclose(losses["one_file_gpt"], losses["gpt"], rtol=1e-5)
  assert losses["gpt"][1] < 3.0  # it learned (a byte model starts near ln 256 = 5.5)


@pytest.mark.slow
def test_the_one_file_gpt_resumes_bit_for_bit_and_compares(corpus_file, tmp_path):
  """The docs' one-file GPT from the command line: stopped by SIGINT and resumed, it ends bit for
  bit where an uninterrupted run ends, and jaxtrain-compare takes both runs."""
  args = lambda workdir: [  # noqa: E731
      "--config=nano", "--jax_platforms=cpu", f"--config.extend={EXAMPLES / 'one_file_gpt.py'}",
      "--config.model.arch=one_file_gpt", f"--config.data.path={corpus_file}",
      f"--config.workdir={workdir}", "--config.train.max_steps=16", "--config.model.d_model=32",
      "--config.model.n_heads=2", "--config.model.n_kv_heads=1", "--config.model.seq_len=32",
      "--config.train.batch_size=4", "--config.train.log_every=1", "--config.train.eval_every=8",
      "--config.train.eval_steps=1", "--config.train.checkpoint_every=4",
      "--config.sample.num_samples=0", "--config.headless=True"]
  whole = run_cli(*args(tmp_path / "whole"))
  assert whole.returncode == 0, whole.stderr[-2000:]
  proc = subprocess.Popen([sys.executable, "-m", "jaxtrain", *args(tmp_path / "legs")], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  for line in proc.stdout:  # stopped by Ctrl-C once it trains
    if re.match(r"step +5/16 ", line):
      proc.send_signal(signal.SIGINT)
      break
  assert proc.wait(timeout=600) == 130
  legs = run_cli(*args(tmp_path / "legs"))
  assert legs.returncode == 0 and "resumed from checkpoint" in legs.stdout, legs.stdout[-2000:]
  testing.assert_trees_equal(_final(tmp_path / "whole"), _final(tmp_path / "legs"))
  compared = subprocess.run([sys.executable, "-m", "jaxtrain.compare", str(tmp_path / "whole"),
                             str(tmp_path / "legs")], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
  assert compared.returncode == 0, compared.stderr[-2000:]
  rows = [line.split()[0] for line in compared.stdout.splitlines()[2:4]]
  assert sorted(rows) == ["legs", "whole"], compared.stdout


@pytest.mark.slow
def test_a_new_built_in_is_one_module_no_positions_is_causal():
  """`none` positions, added in core/layers.py alone: the model stays causal, with the params of
  RoPE's (which has none) and the causal mask as its only sense of order."""
  c = model_lib.ModelConfig(vocab_size=64, n_layers=2, n_heads=2, d_model=16, seq_len=12, pos="none")
  model = model_lib.GPT(c, 0)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 64)
  a, b = model(tokens), model(tokens.at[:, 7].set((tokens[:, 7] + 1) % 64))
  np.testing.assert_array_equal(np.asarray(a[:, :7]), np.asarray(b[:, :7]))
  assert model_lib.param_count(c) == model_lib.param_count(model_lib.ModelConfig(
      vocab_size=64, n_layers=2, n_heads=2, d_model=16, seq_len=12, pos="rope"))
