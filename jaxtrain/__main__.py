"""`python -m jaxtrain --config=configs/nano.py [--config.a.b=v ...] [--jax_platforms=cpu]`."""

import contextlib
import shlex
import sys
import textwrap

from jaxtrain.system import exiting, invocation, signals

if __name__ == "__main__":  # restarted under its allocator already (jaxtrain/__init__.py)
  exiting.install()
  exiting.quiet_broken_pipe()

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxtrain import train  # noqa: E402
from jaxtrain.config import defaults, loading, schema  # noqa: E402
from jaxtrain.system.errors import UserError  # noqa: E402
from jaxtrain.tools.cli import fail, parse_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config, the memory estimate and "
                             "the plan of the run, without training or writing to the workdir.")


HELP = """usage: {command} --config=FILE [--config.SECTION.FIELD=VALUE ...] [--jax_platforms=cpu]

Trains the model FILE describes in its workdir, resuming from the workdir's newest checkpoint.

flags:
  --config=FILE                 a config file (configs/nano.py), or a recipe's name (nano)
  --config.SECTION.FIELD=VALUE  sets one field of that config, e.g. --config.train.max_steps=100
  --dry_run                     the resolved config, memory estimate and plan (steps, tokens,
                                FLOPs, evaluations, checkpoints); nothing trained or written
  --jax_platforms=cpu|cuda|tpu  where to run (default: a GPU or TPU when there is one, else cpu)
  --help                        this list; --helpfull: every flag of absl and JAX as well

SECTION: {sections}.
Every field with its default: {defaults} (--dry_run prints a config's fields)
{recipes}"""


def _help() -> str:
  shipped = loading.shipped_configs()
  sections = [k for k, v in defaults.default_config().items() if hasattr(v, "keys")]
  recipes = (f"Recipes, in {shipped}: {', '.join(loading.recipe_names())}" if shipped else
             "Recipes: none here; the configs/ folder of the jaxtrain repository holds them")
  recipes = textwrap.fill(recipes, 100, break_long_words=False, break_on_hyphens=False)  # paths whole
  return HELP.format(recipes=recipes, sections=", ".join(sections), command=invocation.command(),
                     defaults=defaults.__file__)  # the installed file, in a wheel too


def _config_value(argv: list[str]) -> tuple[int, str | None]:
  """Where in argv the value of `--config=FILE[:argument]` or `--config FILE[:argument]` is, and
  the value; (-1, None) without one."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return i, arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return i + 1, argv[i + 1]
  return -1, None


def _explicit(argv: list[str]) -> list[str]:
  """The fields set on the command line (`--config.a.b=v`)."""
  return [a[len("--config."):].split("=")[0] for a in argv if a.startswith("--config.")]


def _refuse_unknown_field(argv: list[str]) -> None:
  """A `--config.a.b=v` override that names no field is refused, with the closest real names."""
  known = loading.field_names()
  for name in _explicit(argv):
    if name not in known:
      fail(f"--config.{name} is not a config field; {schema.suggestion(name, known, '--config.')}")


def _refuse_field_as_flag(argv: list[str]) -> None:
  """A `--NAME=v` that is no flag but the last name of config fields (`--max_steps=5`) is refused,
  with the overrides it likely means: absl would suggest two unrelated JAX flags."""
  fields = loading.field_names()
  for i, arg in enumerate(argv):
    if not arg.startswith("--") or arg.startswith(("--config", "--help")):
      continue
    name, eq, value = arg[2:].partition("=")
    if not name or name in flags.FLAGS:
      continue
    matches = [f for f in fields if f.rsplit(".", 1)[-1] == name]
    if matches:
      if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
        value = argv[i + 1]  # `--max_steps 5`
      shown = " or ".join(f"--config.{f}={value or '...'}" for f in matches)
      fail(f"--{name} is not a flag of {invocation.command()}; config fields are set as "
           f"--config.SECTION.FIELD=VALUE: did you mean {shown}?")


def _load_extensions(argv: list[str], in_file: str) -> None:
  """The user's code that `--config.extend=...` (or the config file's extend) names, run before
  the overrides are read: their components' options are fields (ext.<component>.<option>)."""
  given = [a.split("=", 1)[1] for a in argv if a.startswith("--config.extend=")]
  from jaxtrain.config import extensions

  extensions.load(given[-1] if given else in_file)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one line and exit status 2, like every other bad input; the
  config file is loaded (and its names checked) here first, so its errors are ours too."""
  if any(arg in ("--help", "-h", "-help", "--helpshort") for arg in argv[1:]):
    print(_help())
    exiting.exit_now(0)
  _refuse_field_as_flag(argv[1:])
  at, value = _config_value(argv)
  if value is None and _explicit(argv[1:]):
    fail("--config=FILE is missing: --config.* flags set fields of a config file's config; pass "
         "e.g. --config=nano (a recipe) or --config=configs/nano.py before them (see --help)")
  if value is not None:
    path, has_argument = value.split(":")[0], ":" in value
    found = loading.find_config(path)
    if found is None:
      fail(loading.missing_config(path))
    if found != path:  # a recipe's name: absl's flag loads the recipe's file
      flag = argv[at][:len(argv[at]) - len(value)]  # "--config=", or "" after "--config"
      argv = [*argv[:at], flag + found + value[len(path):], *argv[at + 1:]]
      path = found
    try:
      if not has_argument:  # get_config(argument): ml_collections loads it, validate checks it
        _load_extensions(argv[1:], loading.load_config(path).extend)
    except UserError as e:
      fail(str(e))
    _refuse_unknown_field(argv[1:])
  try:
    return parse_flags(argv)
  except Exception as e:  # raised by ml_collections for a value of the wrong type, and the like
    fail(f"the config could not be loaded ({type(e).__name__}: {schema.message_of(e)}); fix the "
         "config file or the override")


def _dry_run(cfg) -> None:
  """--dry_run: the libraries' logs stay off the terminal without a file in the workdir."""
  from jaxtrain.loop import preview

  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.ERROR)  # orbax warns that a read-only manager is read-only
  try:
    preview.dry_run(cfg, _explicit(sys.argv[1:]))
  except UserError as e:
    fail(str(e), e.exit_code)
  except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM while reading the data
    name = signals.name_of(e)
    print(f"{name}: dry run stopped", file=sys.stderr)
    exiting.exit_now(signals.EXIT_CODES[name])
  exiting.exit_now(0)


def main(argv: list[str]) -> None:
  signals.raise_on_signals()  # from here on, SIGTERM or Ctrl-C at any moment ends in one line
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]}; flags look like --config.train.max_steps=100")
  cfg = _CONFIG.value
  if cfg is None:
    fail("no config given; pass --config=nano (or another recipe, or a config file: see --help)")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax and grain log every save at INFO
  if _DRY_RUN.value:
    _dry_run(cfg)
  try:
    result = train.run(cfg, library_log=True, explicit=_explicit(sys.argv[1:]))
  except UserError as e:  # the run has finished or abandoned its checkpoint writes
    fail("; ".join([str(e), *getattr(e, "__notes__", [])]), e.exit_code)
  end = cfg.train.max_steps if result.max_steps is None else result.max_steps  # a budget's end
  # Step 0: nothing to resume; the last step: only where its evaluation was left.
  if result.stopped_by and 0 < result.step and (result.step < end or result.end_left):
    with contextlib.suppress(BrokenPipeError):  # stdout's reader left: this line is the one lost
      print(f"to resume: {invocation.command()} {shlex.join(sys.argv[1:])}", flush=True)
  exiting.exit_now(result.exit_code)

if __name__ == "__main__":
  jax.config.config_with_absl()
  app.run(main, flags_parser=_parse_flags)
