"""`python -m jaxtrain --config=configs/nano.py [--config.a.b=v ...] [--jax_platforms=cpu]`."""

import difflib
import os
import sys

from jaxtrain.system import allocator, exiting

if __name__ == "__main__":
  allocator.reexec()  # first of all: the allocator is chosen when a process starts
  exiting.install()

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxtrain import train  # noqa: E402
from jaxtrain.config import defaults as config  # noqa: E402
from jaxtrain.system import signals  # noqa: E402
from jaxtrain.system.errors import UserError  # noqa: E402
from jaxtrain.tools import cli  # noqa: E402
from jaxtrain.tools.cli import fail  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)


def _unknown_field(argv: list[str]) -> str | None:
  """The first `--config.a.b=v` override that names no field, with the closest real names."""
  known = set(config.flatten(config.default_config().to_dict()))
  for arg in argv:
    if arg.startswith("--config."):
      name = arg[len("--config."):].split("=")[0]
      if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=2)
        hint = f"did you mean {' or '.join('--config.' + c for c in close)}?" if close else \
            "the fields are listed in jaxtrain/config.py"
        return f"--config.{name} is not a config field; {hint}"
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one line and exit status 2, like every other bad input."""
  for arg in argv:
    if arg.startswith("--config="):
      path = arg.split("=", 1)[1].split(":")[0]
      if not os.path.isfile(path):
        fail(f"config file {path} not found; pass --config=configs/nano.py or another file "
              "in configs/")
  try:
    return cli.parse_flags(argv, "see --helpfull for every flag, or the config file for every field")
  except Exception as e:  # raised by ml_collections for unknown fields or a broken config file
    fail(_unknown_field(argv) or f"the config could not be loaded ({type(e).__name__}: "
         f"{cli.first_line(e)}); fix the config file or the override")


def main(argv: list[str]) -> None:
  signals.raise_on_sigterm()  # from here on, SIGTERM at any moment ends in one line
  if len(argv) > 1:
    fail(f"unexpected arguments {argv[1:]}; flags look like --config.train.max_steps=100")
  cfg = _CONFIG.value
  if cfg is None:
    fail("no config given; pass --config=configs/nano.py (or another file in configs/)")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax and grain log every save at INFO
  try:
    result = train.run(cfg, library_log=True)
  except UserError as e:  # the run has finished or abandoned its checkpoint writes
    print("; ".join([f"error: {e}", *getattr(e, "__notes__", [])]), file=sys.stderr)
    exiting.exit_now(e.exit_code)
  if result.stopped_by and result.step < cfg.train.max_steps:
    try:
      print(f"to resume: python -m jaxtrain {' '.join(sys.argv[1:])}", flush=True)
    except BrokenPipeError:  # stdout's reader left: the line above is the only one lost
      pass
  exiting.exit_now(result.exit_code)

if __name__ == "__main__":
  jax.config.config_with_absl()
  app.run(main, flags_parser=_parse_flags)
