"""What every command shares (`python -m jaxtrain` and its tools): absl flags, and every bad input
as one line on stderr with exit status 2, never a traceback."""

import sys
from collections.abc import Callable
from typing import NoReturn

from absl import flags

from jaxtrain.system import exiting, signals
from jaxtrain.system.errors import UserError, first_line


def define_sampling_flags(module: str, temperature: float, seed_help: str) -> None:
  """The flags sample and chat share: how tokens are drawn, and from which checkpoint. They are
  `module`'s own, so its --help lists them."""
  own = {"module_name": module}
  flags.DEFINE_float("temperature", temperature, "0 is greedy (the likeliest token every time).",
                     lower_bound=0.0, **own)
  flags.DEFINE_integer("top_k", 0, "Sample from the k likeliest tokens only; 0: all.",
                       lower_bound=0, **own)
  flags.DEFINE_float("top_p", 1.0, "Sample from the likeliest tokens whose probability reaches "
                     "p (nucleus sampling); 1: all.", lower_bound=0.0, upper_bound=1.0, **own)
  flags.DEFINE_integer("seed", 0, seed_help, lower_bound=0, **own)
  flags.DEFINE_string("step", "latest", "Checkpoint: latest, best (lowest val loss) or a step.", **own)


def fail(message: str, code: int = 2) -> NoReturn:
  print(f"error: {message}", file=sys.stderr)
  exiting.exit_now(code)


HELP_FLAGS = ("--help", "-h", "--helpshort", "-?")
COMMON = (("--jax_platforms=cpu", "Run on the CPU even where a GPU is present."),
          ("--helpfull", "Every flag, the libraries' included."))


def flag_rows(module: str, values: dict[str, str] | None = None) -> list[tuple[str, str]]:
  """The absl flags `module` defined, as --help rows; `values`: what a flag's value looks like
  where its default does not say (`{"out": "DIR"}`: --out=DIR)."""
  rows = []
  for flag in flags.FLAGS.flags_by_module_dict().get(module, []):
    if flag.flag_type() == "bool":
      name = f"--[no]{flag.name}"
    elif values and flag.name in values:
      name = f"--{flag.name}={values[flag.name]}"
    else:
      name = f"--{flag.name}" + ("" if flag.default in (None, "") else f"={flag.default}")
    rows.append((name, " ".join(flag.help.split())))
  return rows


def parse_flags(argv: list[str], known_only: bool = False) -> list[str]:
  """absl's parser, but a bad flag is one line and exit status 2. Returns the arguments that are
  not flags (with argv[0]); with `known_only`, flags defined nowhere are among them too."""
  try:
    return flags.FLAGS(argv, known_only=known_only)
  except flags.Error as e:  # a config file's own error comes as a traceback: its last line says it
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    cause = f" {lines[-1]}" if "Traceback (most recent call last):" in lines else ""
    fail(f"{first_line(e)}{cause}; see --help for the flags")


def parse_args(argv: list[str], flag_values: flags.FlagValues, known_only: bool = False) -> list[str]:
  """`flag_values` parsed from `argv` (a command's arguments, without its name); returns the
  arguments that are not its flags. A bad flag is a UserError."""
  try:
    return flag_values(["", *argv], known_only=known_only)[1:]
  except flags.Error as e:
    raise UserError(f"{first_line(e)}; see --help for the flags") from None


def main(run: Callable[..., None], usage: str, module: str, *, args: bool = False,
         known_only: bool = False, uses_jax: bool = True, values: dict[str, str] | None = None,
         before: tuple[tuple[str, str], ...] = (), after: tuple[tuple[str, str], ...] = ()) -> None:
  """Parses the flags defined so far, then calls `run` (`run(args)` for a command that takes
  `args`), turning a UserError into one line. `--help` lists `module`'s flags (flag_rows) between
  the rows `before` and `after`: a command's arguments that are not its flags."""
  from absl import app, logging

  def body(argv: list[str]) -> None:
    if len(argv) > 1 and not args:
      fail(f"unexpected arguments {argv[1:]}; flags look like --workdir=runs/nano")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.ERROR)  # orbax warns that a read-only manager is read-only
    if uses_jax:
      from jaxtrain.system import runtime

      runtime.enable_compile_cache()  # the second sample of a run compiles nothing
    signals.raise_on_signals()  # SIGTERM too ends in one clean exit; a dropped signal is kept
    try:
      run(argv[1:]) if args else run()
      signals.check()  # one that Python dropped (in a gc callback) still ends the command as one
      exiting.exit_now(0)  # a command that installed exiting's handler ends here, at once
    except UserError as e:
      fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:
      print("", file=sys.stderr)
      sys.exit(signals.EXIT_CODES[signals.name_of(e)])

  def parse(argv: list[str]) -> list[str]:
    if any(arg in HELP_FLAGS for arg in argv[1:] if isinstance(arg, str)):  # usage, a line a flag
      rows = [*before, *flag_rows(module, values), *after, *(COMMON if uses_jax else ())]
      width = max(len(name) for name, _ in rows) + 2
      print("\n".join([usage, "", "flags:", *(f"  {name.ljust(width)}{text}" for name, text in rows)]))
      sys.exit(0)
    return parse_flags(argv, known_only=known_only)

  if uses_jax:
    import jax

    jax.config.config_with_absl()
  app.run(body, flags_parser=parse)
