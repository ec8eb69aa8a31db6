"""The public surface: `import jaxtrain` is cheap, every exported name resolves, and the documented
unit-test example (docs/testing-api.md) passes as written, using nothing but that surface and jax."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import not_public

import jaxtrain

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "docs" / "testing-api.md"]
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "grain", "ml_collections", "matplotlib")


@pytest.mark.slow
def test_import_is_cheap_and_loads_jax_on_first_use():
  probe = (
      "import json, sys\n"
      f"heavy = {HEAVY!r}\n"
      "loaded = lambda: sorted({m.split('.')[0] for m in sys.modules} & set(heavy))\n"
      "import jaxtrain\n"
      "at_import = loaded()\n"
      "version = jaxtrain.__version__\n"
      "jaxtrain.train_step\n"
      "print(json.dumps([at_import, version, loaded()]))\n")
  out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr
  at_import, version, after_use = json.loads(out.stdout.splitlines()[-1])
  assert at_import == [], f"`import jaxtrain` imported {at_import} eagerly"
  assert version == jaxtrain.__version__
  assert "jax" in after_use  # the probe does see heavy imports: the empty list above is real


def test_every_exported_name_resolves():
  assert len(jaxtrain.__all__) == len(set(jaxtrain.__all__))
  missing = [name for name in jaxtrain.__all__ if getattr(jaxtrain, name, None) is None]
  assert not missing, f"jaxtrain.__all__ names that do not resolve: {missing}"
  assert set(jaxtrain.__all__) <= set(dir(jaxtrain))
  namespace: dict = {}
  exec("from jaxtrain import *", namespace)
  assert set(jaxtrain.__all__) <= set(namespace)
  with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
    jaxtrain.not_a_name  # noqa: B018


def _test_blocks(markdown: str) -> list[str]:
  blocks = re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)
  return [b for b in blocks if "def test_" in b and "jaxtrain" in b]


def readme_example() -> tuple[Path, str]:
  """The first unit-test example of the README, or else of the testing page."""
  for path in DOCS:
    if blocks := _test_blocks(path.read_text(encoding="utf-8")):
      return path, blocks[0]
  pytest.fail(f"no python test block in {[p.name for p in DOCS]}")


def test_readme_example_uses_only_the_public_api():
  path, code = readme_example()
  imports = {a.name.split(".")[0] for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Import)
             for a in node.names} | {node.module.split(".")[0] for node in ast.walk(ast.parse(code))
                                     if isinstance(node, ast.ImportFrom)}
  assert imports <= {"jax", "jaxtrain"}, f"{path.name} imports {imports - {'jax', 'jaxtrain'}}"
  assert "jt." in code, f"{path.name}'s example does not use jaxtrain"
  assert not not_public(code), f"{path.name}: not public: {not_public(code)}"


def test_the_public_names_check_sees_the_insides():
  code = ("import jaxtrain as jt\nimport jaxtrain.core.model\nfrom jaxtrain.data import tokenizer\n"
          "from jaxtrain import GPT, testing\n%load_ext tensorboard\njt.generate\njt.core\n")
  assert not_public(code) == ["import jaxtrain.core.model", "from jaxtrain.data import tokenizer",
                              "from jaxtrain import testing", "jt.core"]


@pytest.mark.slow
def test_readme_example_passes_as_written(tmp_path):
  path, code = readme_example()
  (tmp_path / "test_example.py").write_text(code, encoding="utf-8")
  # Its own pytest.ini: the example runs as in a user's project, without this repo's conftest.
  (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
  out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_example.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0 and re.search(r"\b1 passed\b", out.stdout), \
      f"the example from {path.name} failed:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}"


@pytest.mark.newest
def test_load_config_takes_a_recipe_by_name_and_a_path_from_the_working_directory(tmp_path,
                                                                                  monkeypatch):
  monkeypatch.chdir(tmp_path)  # not the repository's root: configs/nano.py is not here
  nano = jaxtrain.load_config("nano", **{"train.max_steps": 7})
  assert nano.to_dict() == jaxtrain.load_config(str(ROOT / "configs" / "nano.py"),
                                                **{"train.max_steps": 7}).to_dict()
  (tmp_path / "mine.py").write_text((ROOT / "configs" / "nano.py").read_text())
  assert jaxtrain.load_config("mine.py").to_dict() == jaxtrain.load_config("nano").to_dict()
  with pytest.raises(jaxtrain.UserError, match=r"^config file configs/nano.py not found \(from "
                     rf"{tmp_path}\); pass load_config\(\"nano\"\) \(the recipe .*nano.py\)$"):
    jaxtrain.load_config("configs/nano.py")
  with pytest.raises(jaxtrain.UserError, match="^load_config: pass a recipe's name or a config "
                     r"file's path, not int: e\.g\. load_config\(\"nano\"\)$"):
    jaxtrain.load_config(3)


@pytest.fixture(scope="module")
def tiny_state():
  from jaxtrain.data.tokenizer import ByteTokenizer

  return jaxtrain.init(jaxtrain.tiny_config()), ByteTokenizer()


@pytest.mark.slow
@pytest.mark.newest
def test_generate_takes_text_or_ids_in_every_documented_shape(tiny_state):
  state, tok = tiny_state
  greedy = {"temperature": 0.0}
  ids = tok.encode("The")
  one = jaxtrain.generate(state, ids, 5, **greedy)  # int[P] -> int32[P + 5]
  assert one.shape == (len(ids) + 5,) and one.dtype == np.int32 and (one[:len(ids)] == ids).all()
  two = jaxtrain.generate(state, np.stack([ids, ids[::-1]]), 5, **greedy)  # int[B, P]
  assert two.shape == (2, len(ids) + 5) and (two[0] == one).all()
  assert jaxtrain.generate(state, [list(map(int, ids))], 5, **greedy).tolist() == [one.tolist()]
  text = jaxtrain.generate(state, "The", 5, tokenizer=tok, **greedy)  # str -> str
  assert text == tok.decode(one) and text.startswith("The")
  texts = jaxtrain.generate(state, ["The", "A longer one"], 5, tokenizer=tok, **greedy)
  assert texts == [text, jaxtrain.generate(state, "A longer one", 5, tokenizer=tok, **greedy)]


@pytest.mark.newest
@pytest.mark.parametrize("prompts, kwargs, message", [
    ("The", {}, "a text prompt needs the run's tokenizer: pass tokenizer=jt.load_tokenizer"),
    (["a", "b"], {}, "a text prompt needs the run's tokenizer"),
    ("The", {"tokenizer": "byte"}, "a text prompt needs the run's tokenizer"),
    ([[1, 2], [3]], {}, "the prompts' rows differ in length; a prompt is text"),
    (np.zeros((1, 2, 3), np.int32), {}, r"a prompt is text .* not ndarray of int32, shape \(1, 2, 3\)"),
    ([0.5, 1.5], {}, r"a prompt is text .* not list of float64, shape \(2,\)"),
    (None, {}, "a prompt is text .* not NoneType"),
    ([300], {}, r"token ids must be in 0\.\.255, the model's vocabulary \(these run 300\.\.300\)"),
    (np.zeros((1, 0), np.int32), {}, "a prompt needs at least one token"),
    ([1], {"n_new": -1}, "n_new=-1 is not a count of tokens; pass an int >= 0"),
])
def test_generate_refuses_anything_else_in_one_line(tiny_state, prompts, kwargs, message):
  state, _ = tiny_state
  with pytest.raises(jaxtrain.UserError, match=f"^generate: {message}") as e:
    jaxtrain.generate(state, prompts, kwargs.pop("n_new", 3), **kwargs)
  assert "\n" not in str(e.value)
  with pytest.raises(jaxtrain.UserError, match="^generate continues with a train state, not str"):
    jaxtrain.generate("runs/nano", [1], 3)


@pytest.mark.slow
@pytest.mark.newest
def test_model_and_model_config_are_built_as_documented():
  from flax import nnx

  c = jaxtrain.ModelConfig(n_layers=1, n_heads=2, d_model=16, seq_len=8)  # by keyword
  default = jaxtrain.default_config().model
  shape = lambda m: (m.n_layers, m.n_heads, m.d_model, m.seq_len)  # noqa: E731
  assert shape(jaxtrain.ModelConfig()) == shape(default) and jaxtrain.ModelConfig().vocab_size == 256
  model = jaxtrain.GPT(c)  # rngs: a seed, 0 by default
  assert model(np.zeros((2, 8), np.int32)).shape == (2, 8, 256)
  same = nnx.state(jaxtrain.GPT(c, nnx.Rngs(0)), nnx.Param)
  jaxtrain.assert_trees_equal(nnx.state(model, nnx.Param), same)
  with pytest.raises(TypeError, match="positional"):
    jaxtrain.ModelConfig(256, 2)
  with pytest.raises(jaxtrain.UserError, match=r"^config.model.d_model: 30 is not divisible by "
                     "model.n_heads=4; make d_model a multiple of n_heads$"):
    jaxtrain.GPT(jaxtrain.ModelConfig(d_model=30))
  with pytest.raises(jaxtrain.UserError, match="^config.model.n_layers: must be int, got '2'"):
    jaxtrain.GPT(jaxtrain.ModelConfig(n_layers="2"))
  with pytest.raises(jaxtrain.UserError, match="^GPT takes a ModelConfig, not dict"):
    jaxtrain.GPT({"n_layers": 2})


@pytest.mark.slow
@pytest.mark.newest
def test_text_batches_feed_eval_step_every_token_once(tiny_state):
  state, tok = tiny_state
  text = "A text of my own, to score the model on. " * 9
  batches = jaxtrain.text_batches(text, tok, seq_len=32, batch_size=4)
  assert {b["tokens"].shape for b in batches} == {(4, 33)}  # one shape: one compile
  targets = np.concatenate([b["tokens"][:, 1:][b["weights"] > 0] for b in batches])
  assert (targets == tok.encode(text)[1:]).all()  # every token after the first, once, in order
  losses = [float(jaxtrain.eval_step(state, b)["loss"]) for b in batches]
  weights = [float(b["weights"].sum()) for b in batches]
  whole = [jaxtrain.eval_step(state, b) for b in jaxtrain.text_batches(text, tok, 32, 64)]
  assert len(whole) == 1 and np.isclose(np.average(losses, weights=weights), whole[0]["loss"])
  docs = jaxtrain.text_batches(["one", "two"], tok, 4, 1)  # documents end with end-of-text
  read = [int(t) for b in docs for t in b["tokens"][0, 1:][b["weights"][0] > 0]]
  assert read == [*tok.encode("one")[1:], tok.eot_id, *tok.encode("two"), tok.eot_id]
  for args, message in [((["x"], tok, 0), "seq_len=0; pass an int >= 1"),
                        (("", tok, 8), "the text is 0 token"),
                        ((b"bytes", tok, 8), "takes text, a str or a list of str, not bytes"),
                        (("text", "byte", 8), "encodes with a tokenizer, not str")]:
    with pytest.raises(jaxtrain.UserError, match=message):
      jaxtrain.text_batches(*args)
