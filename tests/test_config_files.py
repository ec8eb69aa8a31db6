"""Config files are recipes held to the defaults' schema: each sets only what differs from the
defaults, an unknown name in a file, a ConfigDict or an override is refused with the nearest real
one, a file that fails to load says where in one line, a fine-tune takes its model from the run
it starts from, and every model and optimizer switch is set by a recipe or names its measured
result (the config gate)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest
from conftest import with_root_on_path

import jaxtrain as jt
from jaxtrain.config import defaults, loading, schema, validate
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import runs

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.py"))


def restated(path: Path, monkeypatch) -> list[str]:
  """The fields that `path`'s get_config assigns the value they already hold (a default)."""
  found = []
  original = ml_collections.ConfigDict.__setitem__

  def recording(self, key, value):
    if key in self and not isinstance(value, dict | ml_collections.ConfigDict) \
        and type(self[key]) is type(value) and self[key] == value:
      found.append(f"{key}={value!r}")
    original(self, key, value)

  with monkeypatch.context() as m:
    m.setattr(ml_collections.ConfigDict, "__setitem__", recording)
    loading.load_config(str(path))
  return found


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_configs_set_only_what_differs_from_the_defaults(path, monkeypatch):
  assert restated(path, monkeypatch) == [], f"{path.name} restates defaults; drop those lines"


def test_a_restated_default_is_found(tmp_path, monkeypatch):
  path = write(tmp_path, 'cfg.model.n_layers = 2\n  cfg.model.norm = "rmsnorm"\n  cfg.seed = 0')
  assert restated(path, monkeypatch) == ["norm='rmsnorm'", "seed=0"]


def write(tmp_path: Path, body: str, name: str = "recipe.py") -> Path:
  path = tmp_path / name
  path.write_text("import ml_collections\nfrom jaxtrain.config import default_config\n\n\n"
                  f"def get_config():\n  cfg = default_config()\n  {body}\n  return cfg\n")
  return path


@pytest.mark.parametrize("body,field,nearest", [
    ("cfg.train.max_step = 30", "train.max_step", "train.max_steps"),
    ("cfg.work_dir = 'runs/x'", "work_dir", "workdir"),
    ("cfg.model.tie_embedings = False", "model.tie_embedings", "model.tie_embeddings"),
    ("cfg.data.tokeniser = 'char'", "data.tokeniser", "data.tokenizer"),
    ("cfg.trian.max_steps = 30", "trian", "train"),
    ("cfg['optim']['learning_rate'] = 1e-3", "optim.learning_rate", "optim.lr"),
])
def test_an_unknown_field_in_a_file_names_the_file_line_and_nearest_field(tmp_path, body, field,
                                                                           nearest):
  path = write(tmp_path, body)
  with pytest.raises(ConfigError) as e:
    jt.load_config(str(path))
  assert e.value.field == field
  assert str(e.value) == (f"config.{field}: is not a config field ({path}, line 7); did you mean "
                          f"{nearest}?")


def test_unknown_names_are_refused_however_the_config_was_built(tmp_path):
  flat = loading.flatten(tiny_config().to_dict())
  scratch = ml_collections.ConfigDict(json.loads(json.dumps(tiny_config().to_dict())))
  scratch.train.max_step = 30  # unlocked: ml_collections itself takes it
  with pytest.raises(ConfigError, match=r"^config\.train\.max_step: is not a config field; "
                     r"did you mean train\.max_steps\?$"):
    validate.validate(scratch)
  path = tmp_path / "scratch.py"
  path.write_text("import ml_collections\n\n\ndef get_config():\n  return ml_collections.ConfigDict("
                  f"{json.dumps(scratch.to_dict())}".replace("false", "False").replace("true", "True")
                  + ")\n")
  with pytest.raises(ConfigError, match=rf"config\.train\.max_step: is not a config field \(set in "
                     rf"{path}\); did you mean train\.max_steps\?"):
    jt.load_config(str(path))
  with pytest.raises(ConfigError, match=r"config\.optim\.learning_rate: .* did you mean optim\.lr\?"):
    jt.load_config(str(CONFIGS[0]), **{"optim.learning_rate": 1e-3})
  with pytest.raises(ConfigError, match="config.model.n_layers.deep: is not a config field"):
    loading.override(tiny_config(), **{"model.n_layers.deep": 1})
  assert loading.flatten(validate.validate(tiny_config()) or tiny_config().to_dict()) == flat


@pytest.mark.parametrize("body,kind,message", [
    ("cfg.model.n_layers = undefined_name", "NameError", "name 'undefined_name' is not defined"),
    ("raise KeyError('a \"quoted\"\\nkey')", "KeyError", 'a "quoted" key'),
    ("cfg.train.max_steps = 'many'", "TypeError", "Could not override field 'max_steps'"),
    ("def (", "SyntaxError", "invalid syntax"),
])
def test_a_file_that_fails_to_load_says_where_in_one_readable_line(tmp_path, body, kind, message):
  path = write(tmp_path, body)
  with pytest.raises(UserError) as e:
    jt.load_config(str(path))
  text = str(e.value)
  assert text.startswith(f"the config file {path}, line 7 does not load: {kind}: "), text
  assert message in text and "\n" not in text and "\\" not in text, text


@pytest.mark.parametrize("name,expected", [
    ("optim.learning_rate", ["optim.lr"]), ("train.max_step", ["train.max_steps"]),
    ("trian.max_steps", ["train.max_steps"]), ("work_dir", ["workdir"]),
    ("model.nlayers", ["model.n_layers"]), ("train.lr", ["optim.lr"]),
    ("model.layers", ["model.n_layers"]), ("data.tokeniser", ["data.tokenizer"]),
])
def test_the_nearest_field_is_suggested(name, expected):
  assert schema.nearest(name, loading.field_names())[:len(expected)] == expected
  assert schema.nearest("zzzzqqq", loading.field_names()) == []


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
  env = with_root_on_path()
  return subprocess.run([sys.executable, "-m", "jaxtrain", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)


def one_line(result: subprocess.CompletedProcess) -> str:
  assert result.returncode == 2, result.stdout + result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, \
      result.stderr
  return lines[0]


@pytest.mark.slow
def test_the_command_line_names_bad_config_input_in_one_line(tmp_path):
  bad = write(tmp_path, "cfg.model.tie_embedings = False")
  assert one_line(cli(f"--config={bad}", f"--config.workdir={tmp_path / 'run'}")) == (
      f"error: config.model.tie_embedings: is not a config field ({bad}, line 7); did you mean "
      "model.tie_embeddings?")
  assert "--config=FILE is missing" in one_line(cli(f"--config.workdir={tmp_path / 'run'}"))
  line = one_line(cli("--config=configs/nano.py", cwd=tmp_path))
  assert f"pass --config=nano (the recipe {ROOT / 'configs' / 'nano.py'})" in line
  assert one_line(cli("--config=nan", cwd=tmp_path)).startswith(
      f"error: config file nan not found (from {tmp_path}); pass --config=nano (the recipe ")
  # A recipe that trains on the user's file, run without one: where to get it, before any work.
  line = one_line(cli("--config=shakespeare_char", f"--config.workdir={tmp_path / 'run'}",
                      cwd=tmp_path))
  assert line.startswith("error: config.data.path: is not given (this recipe trains on text of "
                         "yours); pass --config.data.path=input.txt") and defaults.TINY_SHAKESPEARE in line
  assert not (tmp_path / "run").exists()
  # A recipe's name works from any directory: nano's 3 heads refuse a width of 100.
  assert "divisible by model.n_heads=3" in one_line(
      cli("--config=nano", "--config.model.d_model=100", f"--config.workdir={tmp_path / 'run'}",
          cwd=tmp_path))
  assert "did you mean --config.optim.lr?" in one_line(
      cli("--config=configs/nano.py", "--config.optim.learning_rate=1e-3"))
  assert not (tmp_path / "run").exists()
  shown = cli("--help")
  assert shown.returncode == 0 and shown.stderr == "", shown.stderr
  flags = [line.split()[0] for line in shown.stdout.splitlines() if line.startswith("  --")]
  assert flags == ["--config=FILE", "--config.SECTION.FIELD=VALUE", "--dry_run",
                   "--jax_platforms=cpu|cuda|tpu", "--help"]


@pytest.fixture(scope="module")
def source(corpus_file, tmp_path_factory) -> Path:
  """A finished tiny run with an untied head and zero-init outputs, as nano has."""
  workdir = tmp_path_factory.mktemp("source") / "run"
  jt.run(tiny_config(**{"workdir": str(workdir), "data.path": str(corpus_file), "headless": True,
                        "model.tie_embeddings": False, "model.zero_init_out": True,
                        "train.max_steps": 2, "train.checkpoint_every": 2, "train.eval_every": 2,
                        "sample.num_samples": 0}), show_progress=False)
  return workdir


def finetune(source: Path, corpus_file: Path, workdir: Path, **model) -> ml_collections.ConfigDict:
  """A fine-tune config as configs/finetune_shakespeare.py writes one: no model field."""
  cfg = loading.load_config(str(ROOT / "configs" / "finetune_shakespeare.py"), **model)
  return loading.override(cfg, **{
      "workdir": str(workdir), "init_from": str(source), "data.path": str(corpus_file),
      "headless": True, "train.max_steps": 1, "train.eval_every": 1, "train.eval_steps": 1,
      "train.batch_size": 8, "sample.num_samples": 0})


@pytest.mark.slow
def test_a_finetune_takes_its_model_from_the_run_it_starts_from(source, corpus_file, tmp_path):
  result = jt.run(finetune(source, corpus_file, tmp_path / "tuned", **{"model.dropout": 0.1}),
                  show_progress=False)
  assert result.step == 1
  theirs = json.loads((source / "config.json").read_text())["model"]
  ours = json.loads((tmp_path / "tuned" / "config.json").read_text())["model"]
  assert ours == {**theirs, "dropout": 0.1}  # what the run trained with, dropout as set
  # Resumed, it derives from its own config.json: the source may be gone by then.
  again = finetune(tmp_path / "gone", corpus_file, tmp_path / "tuned", **{"model.dropout": 0.1})
  assert jt.run(loading.override(again, **{"train.max_steps": 2}), show_progress=False).step == 2
  assert json.loads((tmp_path / "tuned" / "config.json").read_text())["model"] == ours


@pytest.mark.slow
def test_a_finetune_that_sets_other_model_fields_names_every_one(source, corpus_file, tmp_path):
  cfg = finetune(source, corpus_file, tmp_path / "tuned", **{"model.n_layers": 5})
  with pytest.raises(UserError) as e:  # tie_embeddings=True is its default, but set explicitly
    jt.run(cfg, show_progress=False, explicit=["model.tie_embeddings", "workdir"])
  assert str(e.value) == (
      f"init_from: {source} has model.n_layers=2, this config 5; model.tie_embeddings=False, this "
      "config True; drop those settings (a model field left unset takes the source's value) or "
      "pass --config.model.n_layers=2 --config.model.tie_embeddings=False")
  assert not (tmp_path / "tuned").exists()


@pytest.mark.slow
def test_a_finetune_refused_at_start_leaves_no_run_behind(source, corpus_file, tmp_path):
  cfg = finetune(source, corpus_file, tmp_path / "tuned", **{"data.tokenizer": "char"})
  with pytest.raises(UserError, match="another tokenizer"):  # found once setup wrote its files
    jt.run(cfg, show_progress=False)
  assert not (tmp_path / "tuned").exists()
  with pytest.raises(UserError, match="no jaxtrain run"):  # so compare lists nothing
    runs.find([str(tmp_path)])


@pytest.mark.slow
def test_the_finetune_command_line_refuses_other_model_fields_in_one_line(source, corpus_file,
                                                                          tmp_path):
  line = one_line(cli("--config=configs/finetune_shakespeare.py", f"--config.init_from={source}",
                      f"--config.data.path={corpus_file}", f"--config.workdir={tmp_path / 't'}",
                      "--config.model.tie_embeddings=True", "--config.model.d_model=64"))
  assert line.startswith(f"error: init_from: {source} has model.d_model=32, this config 64; "
                         "model.tie_embeddings=False, this config True; ")
  assert not (tmp_path / "t").exists()


def _switches() -> list[str]:
  """The model's and optimizer's switches: the fields that turn a part on or off or choose among
  kinds (True/False, named choices) and the numbers whose default (0 or -1) leaves a part off or
  to another field."""
  cfg = defaults.default_config()
  return [f"{section}.{name}" for section in ("model", "optim")
          for name, value in cfg[section].items() if isinstance(value, bool | str) or value in (0, -1)]


def _set_by_recipes() -> set[str]:
  default = loading.flatten(defaults.default_config().to_dict())
  found = set()
  for path in CONFIGS:
    flat = loading.flatten(loading.load_config(str(path)).to_dict())
    found |= {name for name, value in flat.items() if value != default[name]}
  return found


def _gate_rows() -> dict[str, str]:
  """docs/config.md's table under "The config gate": {each field a row names: the row}."""
  text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
  section = text.split("\n## The config gate\n", 1)[1].split("\n## ", 1)[0]
  rows = {}
  for line in section.splitlines():
    if line.startswith("| `"):
      rows |= dict.fromkeys(re.findall(r"`((?:model|optim)\.\w+)`", line.split("|")[1]), line)
  return rows


def _missing_evidence(row: str) -> list[str]:
  """What a row names that does not exist: a results folder it links, a test
  (`tests/test_x.py::test_name`); "nothing" where it names neither."""
  results = re.findall(r"\]\((\.\./benchmarks/results/[^)#]+)", row)
  tests = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", row)
  if not results and not tests:
    return ["nothing"]
  return [link for link in results if not (ROOT / "docs" / link).exists()] + \
      [f"{path}::{name}" for path, name in tests
       if not (ROOT / path).exists() or f"def {name}(" not in (ROOT / path).read_text()]


def test_every_switch_is_set_by_a_recipe_or_names_its_result():
  """The config gate (docs/config.md): a model or optimizer switch no shipped recipe sets stays
  only with the measured result that keeps it (or, for one a kind of data needs, its test)."""
  rows, recipes = _gate_rows(), _set_by_recipes()
  unset = [field for field in _switches() if field not in recipes]
  assert {"model.qk_norm", "model.canon", "optim.name"} <= set(_switches())
  assert "model.n_layers" not in _switches() and "optim.lr" not in _switches()
  assert [field for field in unset if field not in rows] == [], "not in docs/config.md's gate"
  wrong = {field: bad for field in unset if (bad := _missing_evidence(rows[field]))}
  assert wrong == {}, f"rows of docs/config.md's gate that name no result that exists: {wrong}"
  assert sorted(set(rows) - set(unset)) == [], "rows for fields a recipe sets, or no switch"
