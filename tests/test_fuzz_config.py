"""Random values for every config field: a run trains, or exits 2 with one line naming the field.

Three layers. Every field in turn, in process: a value of each wrong type, and one past its
limit, is refused naming it. In process, many draws: random values of random types for a few
fields at a time on top of the tiny config, through `validate.validate` and everything that reads
the config before any compile. In subprocesses, a few draws: `python -m jaxtrain` for one step
with one field's value on the command line or from a config file; never a traceback, never a hang.

The draws are deterministic (derandomized, no example database). By default they fit a 2-core CI
machine (300 in process, 6 runs); JAXTRAIN_FUZZ_EXAMPLES=N draws N in process and N // 50 runs.
"""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import ml_collections
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxtrain.config import defaults, loading, validate
from jaxtrain.core import components, cpu, mesh, optim, programs, registry
from jaxtrain.core import model as model_lib
from jaxtrain.data import tokenizer
from jaxtrain.measure import estimate
from jaxtrain.system import startup
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("JAXTRAIN_FUZZ_EXAMPLES", "300"))
RUNS = max(6, EXAMPLES // 50)
RUN_TIMEOUT_S = 180
DEFAULTS = loading.flatten(defaults.default_config().to_dict())
HUGE = [2**31, 2**63, 10**12, 10**30, 10**400, -(10**12), -(2**63)]
ODD_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e-300, 1e300, -1e-3, 0.99999999, 1.0]
CHOICES = {**{k.field: tuple(registry.names(kind)) for kind, k in registry.KINDS.items()},
           "model.dtype": defaults.DTYPES, "model.attention": defaults.ATTENTION,
           "data.tokenizer": defaults.TOKENIZERS, "optim.loss_scaling": defaults.LOSS_SCALING,
           "model.remat": defaults.REMATS, "log.group_stats": defaults.GROUP_STATS,
           "log.wandb_mode": defaults.WANDB_MODES,
           "finetune.lora_targets": ("qkv", "qkv,out", "up, down", "qkv,out,up,down", "q,v")}
ODD_STRINGS = ["", " ", "nan", "-1", "1e9", "True", "auto ", "RMSNORM", "a:b", "host:", ":1",
               "localhost:1234", "10.0.0.1:99999999999", "é", "a\nb", "\x00"]

anything = st.one_of(
    st.integers(-3, 40), st.sampled_from(HUGE), st.floats(), st.sampled_from(ODD_FLOATS),
    st.booleans(), st.none(), st.text(max_size=8), st.sampled_from(ODD_STRINGS),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from("ab"), st.integers()),
)


def of_its_type(field: str) -> st.SearchStrategy:
  """Values of the field's own type, in and around its range: these reach past validation."""
  default = DEFAULTS[field]
  if isinstance(default, bool):
    return st.booleans()
  if isinstance(default, int):
    edges = [validate.LIMITS[field], validate.LIMITS[field] + 1] if field in validate.LIMITS else []
    return st.one_of(st.integers(-2, 64), st.sampled_from([default, 2 * default, *edges, *HUGE]))
  if isinstance(default, float):
    return st.one_of(st.floats(-1.0, 2.0), st.sampled_from([default, 10 * default, *ODD_FLOATS]))
  return st.sampled_from([*CHOICES.get(field, ()), *ODD_STRINGS])


def value_for(field: str) -> st.SearchStrategy:
  typed = of_its_type(field)  # two in three draws, and hypothesis's simplest choice
  return st.integers(0, 2).flatmap(lambda i: anything if i == 2 else typed)


# Fields whose checks compare them with others: a value drawn for one can be reported as a
# problem of another of its group.
GROUPS = [
    {"model.n_layers", "model.d_model", "model.n_heads", "model.mlp_ratio", "model.vocab_size",
     "model.tie_embeddings", "model.pos", "model.mlp", "model.seq_len", "train.batch_size"},
    {"mesh.data", "mesh.fsdp", "mesh.cpu_devices", "train.batch_size"},
    {"distributed.num_processes", "distributed.process_id", "distributed.coordinator_address",
     "train.batch_size"},
    {"data.prompt_field", "data.completion_field", "data.messages_field"},
    {"train.eval_tasks", "train.early_stop_metric"},  # a task metric names a task file
    {"finetune.lora_rank", "finetune.lora_targets", "init_from"},
]


def related(fields) -> set[str]:
  return set(fields).union(*(g for g in GROUPS if g & set(fields)))


def with_values(values: dict) -> ml_collections.ConfigDict:
  """The tiny config with `values` set by dotted name, whatever their types: a config file can
  build its ConfigDict from scratch, and a run's config.json comes back with JSON's types."""
  flat = loading.flatten(tiny_config().to_dict())
  flat.update(values)
  return ml_collections.ConfigDict(nest(flat))


def nest(flat: dict) -> dict:
  nested: dict = {}
  for key, value in flat.items():
    *path, leaf = key.split(".")
    node = nested
    for part in path:
      node = node.setdefault(part, {})
    node[leaf] = value
  return nested


# One wrong value of each type, and nan for the number fields (an int passes for a float).
WRONG = [True, 3, 2**31, 0.5, math.nan, "1", None, [1], {"a": 1}]


@pytest.mark.parametrize("field", sorted(DEFAULTS))
def test_every_field_refuses_wrong_types_and_values_past_its_limit(field):
  kind = type(DEFAULTS[field])
  wrong = [v for v in WRONG if type(v) is not kind and not (kind is float and v == 3)]
  wrong += [validate.LIMITS[field] + 1] if field in validate.LIMITS else []
  for value in wrong:
    with pytest.raises(ConfigError) as e:
      components.validate(with_values({field: value}))
    assert e.value.field == field and "\n" not in str(e.value), (value, str(e.value))


def _alarm(signum, frame):
  raise TimeoutError("a config value made the checks before compiling take over 20 s (a hang)")


def reads_before_compile(cfg: ml_collections.ConfigDict) -> None:
  """What a run does with its config before the first compile, less files and data (a random
  path could name anything on this machine, "/" included: those run in subprocesses below)."""
  startup.cpu_device_count(cfg, cores=2)
  cpu.step_flops(cfg)
  devices = jax.devices()[:1]
  mesh.check_devices(cfg.mesh, cfg.train.batch_size, devices, cfg.model.dtype)
  vocab = tokenizer.model_vocab_size(cfg.model.vocab_size, tokenizer.ByteTokenizer())
  model_lib.flops_per_token(model_lib.ModelConfig.from_config(cfg.model, vocab))
  optim.make_optimizer(cfg.optim, max_steps=cfg.train.max_steps).transformation()
  float(optim.lr_schedule(cfg.optim, cfg.train.max_steps)(0))
  if cfg.model.n_layers <= 64:  # tracing hundreds of layers takes seconds, and is no different
    p = programs.build(cfg, vocab, devices, eot_id=255)  # traces init; compiles nothing
    estimate.memory_estimate(p.model_cfg, cfg.train.batch_size, cfg.train.grad_accum)


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_value_of_any_field_is_valid_or_named(data):
  fields = data.draw(st.lists(st.sampled_from(sorted(DEFAULTS)), min_size=1, max_size=3,
                              unique=True))
  values = {f: data.draw(value_for(f), label=f) for f in fields}
  cfg = with_values(values)
  old = signal.signal(signal.SIGALRM, _alarm)
  signal.alarm(20)
  try:
    try:
      components.validate(cfg)
    except ConfigError as e:
      message = str(e)
      assert e.field in related(values), (values, message)
      assert message.startswith(f"config.{e.field}: ") and "\n" not in message, message
      event("refused by validate.validate")
      return
    try:
      reads_before_compile(cfg)
      event("valid: built")
    except UserError as e:  # a field that only the devices can judge (mesh, dtype)
      assert "\n" not in str(e) and getattr(e, "field", None) in related(values), str(e)
      event("valid: refused by the devices")
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# The subprocess runs: a one-step tiny run, one field drawn at a time. Integers are small (a
# valid one must train quickly) or past their limit; paths stay inside the run's directory, or
# name places no one can write.
TINY = {"train.max_steps": 1, "model.n_layers": 2, "model.d_model": 32, "model.n_heads": 4,
        "model.seq_len": 32, "train.batch_size": 8, "train.eval_steps": 2, "train.log_every": 1,
        "sample.num_samples": 1, "sample.max_new_tokens": 4, "headless": True, "workdir": "run",
        "data.path": "corpus.txt"}
PATHS = {
    "workdir": ["run", "", " ", ".", "corpus.txt", "~/run", "run/../other", "a\nb", "\x00",
                "/proc/jaxtrain-fuzz/run"],
    "data.path": ["corpus.txt", "missing.txt", "*.txt", "*.none", ".", "~/corpus.txt", "a\nb",
                  "\x00", "/proc/jaxtrain-fuzz"],
    "data.cache_dir": ["", "cache", "corpus.txt", "~/cache", "a\nb", "\x00", "/proc/jaxtrain-fuzz"],
    "init_from": ["", "missing", "corpus.txt", ".", "~/run", "a\nb", "\x00", "/proc/jaxtrain-fuzz"],
    "train.eval_tasks": ["", "missing.jsonl", "corpus.txt", "corpus.txt,corpus.txt", ".", ",",
                         "a\nb", "\x00", "/proc/jaxtrain-fuzz"],
}


def run_value(field: str) -> st.SearchStrategy:
  default = DEFAULTS[field]
  if field in PATHS:
    typed = st.sampled_from(PATHS[field])
  elif isinstance(default, int) and not isinstance(default, bool):
    typed = st.one_of(st.integers(-2, 4), st.sampled_from([*HUGE, validate.LIMITS.get(field, 0) + 1]))
  elif isinstance(default, float):
    typed = st.one_of(st.floats(-1.0, 2.0), st.sampled_from([default, *ODD_FLOATS]))
  else:
    typed = of_its_type(field)
  return st.integers(0, 3).flatmap(lambda i: anything if i == 3 else typed)  # three in four typed


CONFIG_FILE = """import json

import ml_collections

from jaxtrain.config import loading


def get_config():
  flat = loading.flatten(loading.load_config({nano!r}).to_dict())
  flat.update(json.loads(open({values!r}).read()))
  nested = {{}}
  for key, value in flat.items():
    *path, leaf = key.split(".")
    node = nested
    for part in path:
      node = node.setdefault(part, {{}})
    node[leaf] = value
  return ml_collections.ConfigDict(nested)
"""


def jaxtrain_cli(field: str, value, on_command_line: bool, directory: Path) -> tuple[list, str]:
  """The arguments of a run with `field` set to `value`, and how the value was given."""
  given_values = {**TINY, field: value}
  if on_command_line and not (isinstance(value, str) and "\x00" in value):
    args = [f"--config={ROOT / 'configs' / 'nano.py'}"]
    args += [f"--config.{k}={v}" for k, v in given_values.items()]
    return args, "command line"
  (directory / "values.json").write_text(json.dumps(given_values))
  (directory / "fuzzed.py").write_text(CONFIG_FILE.format(
      nano=str(ROOT / "configs" / "nano.py"), values=str(directory / "values.json")))
  return [f"--config={directory / 'fuzzed.py'}"], "config file"


@settings(max_examples=RUNS, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.data())
@pytest.mark.slow
def test_a_run_with_any_value_trains_or_names_the_field(corpus_file, tmp_path_factory, data):
  field = data.draw(st.sampled_from(sorted(DEFAULTS)), label="field")
  value = data.draw(run_value(field), label="value")
  on_command_line = data.draw(st.booleans(), label="on the command line")
  directory = tmp_path_factory.mktemp("fuzz")
  (directory / "corpus.txt").write_bytes(corpus_file.read_bytes())
  args, how = jaxtrain_cli(field, value, on_command_line, directory)
  event(f"{field} from the {how}")
  env = dict(os.environ, PYTHONUNBUFFERED="1", HOME=str(directory),
             MPLCONFIGDIR=str(tmp_path_factory.getbasetemp() / "matplotlib"),  # one font cache
             WANDB_MODE="offline")  # a draw of log.wandb=True must not wait for a network
  try:
    proc = subprocess.run([sys.executable, "-m", "jaxtrain", "--jax_platforms=cpu", *args],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    pytest.fail(f"{field}={value!r} ({how}): no exit in {RUN_TIMEOUT_S} s")
  said = f"{field}={value!r} ({how}) exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr}"
  assert "Traceback" not in proc.stdout + proc.stderr, said
  if proc.returncode == 0:
    assert "done: step" in proc.stdout, said
    event("trained")
    return
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), said
  # The field by its full name, or by its own name where the message names its section.
  assert any(f in lines[0] or f.split(".")[-1] in lines[0] for f in related({field})), said
  event("exit 2, one line")
