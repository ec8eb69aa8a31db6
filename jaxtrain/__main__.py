"""`python -m jaxtrain --config=configs/nano.py [--config.a.b=v ...] [--jax_platforms=cpu]`."""

import logging as std_logging
import os
import sys
import warnings

from jaxtrain import allocator

if __name__ == "__main__":
  allocator.reexec()  # first of all: the allocator is chosen when a process starts

import jax  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxtrain.errors import UserError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py).",
                                          lock_config=True)


def _fail(message: str) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _unknown_field(argv: list[str]) -> str | None:
  """The first `--config.a.b=v` override that names no field, with the closest real names."""
  import difflib

  from jaxtrain.config import default_config

  known = set(_dotted(default_config().to_dict()))
  for arg in argv:
    if arg.startswith("--config."):
      name = arg[len("--config."):].split("=")[0]
      if name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=2)
        hint = f"did you mean {' or '.join('--config.' + c for c in close)}?" if close else \
            "the fields are listed in jaxtrain/config.py"
        return f"--config.{name} is not a config field; {hint}"
  return None


def _dotted(d: dict, prefix: str = ""):
  for key, value in d.items():
    if isinstance(value, dict):
      yield from _dotted(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def _drop_orbax_errors(record: std_logging.LogRecord) -> bool:
  # The loop turns a failed checkpoint write into one line that says what to do; orbax's own
  # log of it is a traceback from a background thread.
  return not ("/orbax/" in record.pathname and record.levelno >= std_logging.ERROR)


def _quiet_closed_loop(unraisable) -> None:
  # After a failed async save, tensorstore's callbacks still post to orbax's closed event loop
  # from C++ threads; each would print a traceback that says nothing to the user.
  if unraisable.exc_type is RuntimeError and "Event loop is closed" in str(unraisable.exc_value):
    return
  sys.__unraisablehook__(unraisable)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parser, but a bad flag is one line and exit status 2, like every other bad input."""
  for arg in argv:
    if arg.startswith("--config="):
      path = arg.split("=", 1)[1].split(":")[0]
      if not os.path.isfile(path):
        _fail(f"config file {path} not found; pass --config=configs/nano.py or another file "
              "in configs/")
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    _fail(f"{message}; see --helpfull for every flag, or the config file for every field")
  except Exception as e:  # raised by ml_collections for unknown fields or a broken config file
    _fail(_unknown_field(argv) or f"the config could not be loaded ({type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}); fix the config file or the override")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; flags look like --config.train.max_steps=100")
  cfg = _CONFIG.value
  if cfg is None:
    _fail("no config given; pass --config=configs/nano.py (or another file in configs/)")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax and grain log every save at INFO
    # A failed background checkpoint write is reported once, as one line, by the loop; asyncio
    # would also dump its traceback as a "task exception never retrieved".
    std_logging.getLogger("asyncio").setLevel(std_logging.CRITICAL)
    std_logging.getLogger("absl").addFilter(_drop_orbax_errors)
    # A compile-cache entry that cannot be written (or read back whole) only means compiling
    # again: jax then does so by itself.
    warnings.filterwarnings("ignore", message="Error (writing|reading) persistent compilation cache")
    sys.unraisablehook = _quiet_closed_loop
  from jaxtrain import preload, runtime  # after flag parsing: --jax_platforms must be set first

  try:
    runtime.init_cpu_lapack()
    preload.start(cfg)  # a restart's programs load while the training loop and flax import
    from jaxtrain import train

    result = train.run(cfg)
  except UserError as e:
    preload.abandon()
    print(f"error: {e}", file=sys.stderr)
    # Pending saves were already finished or abandoned by the loop. Exiting at once keeps
    # orbax's background threads from printing tracebacks while the interpreter shuts down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(e.exit_code)
  except KeyboardInterrupt:  # before training started: nothing to save yet
    preload.abandon()
    print("interrupted before the first step; nothing was saved", file=sys.stderr)
    sys.exit(130)
  if result.stopped_by:
    print(f"to resume: python -m jaxtrain {' '.join(sys.argv[1:])}")
  sys.exit(result.exit_code)


if __name__ == "__main__":
  jax.config.config_with_absl()
  app.run(main, flags_parser=_parse_flags)
