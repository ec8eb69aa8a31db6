"""The user's own code named in `extend` (docs/extending.md): Python files or importable modules
whose code registers components with jaxtrain's decorators. Each is loaded once per process (again
where its file changed), and its source recorded by path and sha256 (`record`: config.json's
"extension_sources"), so that a resume sees changed code (`changed`). An exception raised in the
user's code is told by the user's own frames (`user_frames`), not jaxtrain's or JAX's.
"""

import dataclasses
import hashlib
import importlib
import importlib.util
import linecache
import os
import sys
import sysconfig
import traceback
from pathlib import Path

from jaxtrain.system.errors import ConfigError, UserError

# config.json's key for the extensions' sources: {spec: {"path": ..., "sha256": ...}}
SOURCES_KEY = "extension_sources"
_PACKAGE = str(Path(__file__).resolve().parents[1])  # jaxtrain/
_LIBRARIES = tuple({os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"],
                                                  sysconfig.get_paths()["purelib"],
                                                  sysconfig.get_paths()["platlib"])})


@dataclasses.dataclass(frozen=True)
class Source:
  spec: str  # as `extend` gives it: a file's path or a module's dotted name
  path: str  # the file, absolute
  sha256: str


_LOADED: dict[str, Source] = {}  # by absolute path: what this process ran


def specs(extend: str) -> list[str]:
  """The files and modules `extend` names, in order, without repeats."""
  return list(dict.fromkeys(s.strip() for s in extend.split(",") if s.strip()))


def digest(path: str) -> str:
  return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _is_file_spec(spec: str) -> bool:
  return spec.endswith(".py") or "/" in spec or os.sep in spec or os.path.isfile(spec)


def locate(spec: str, recorded: str | None = None) -> str:
  """The absolute path of the file `spec` names: a file (from the working directory, else the
  `recorded` path of a saved run), or an importable module's."""
  if _is_file_spec(spec):
    for path in (os.path.expanduser(spec), recorded):
      if path and os.path.isfile(path):
        return os.path.abspath(path)
    raise ConfigError("extend", f"{spec} not found (from {os.getcwd()})", "pass the path of your "
                      "Python file (e.g. --config.extend=my_ideas.py) or an importable module's name")
  try:
    found = importlib.util.find_spec(spec)
  except (ImportError, ValueError):
    found = None
  if found is None or not found.origin or not os.path.isfile(found.origin):
    raise ConfigError("extend", f"{spec!r} is neither a file (from {os.getcwd()}) nor an importable "
                      "module", "pass a .py file's path, or a module on the Python path")
  return os.path.abspath(found.origin)


def load(extend: str, recorded: dict | None = None) -> list[Source]:
  """Runs each file or module `extend` names, once (again where its file changed since), so that
  its components register; `recorded`: a saved run's sources, where a file is looked for when its
  relative path is not found from here. A file that does not run is a UserError naming its line."""
  loaded = []
  for spec in specs(extend):
    path = locate(spec, ((recorded or {}).get(spec) or {}).get("path"))
    sha = digest(path)
    known = _LOADED.get(path)
    if known is None or known.sha256 != sha:
      _run(spec, path)
      _LOADED[path] = Source(spec, path, sha)
    loaded.append(dataclasses.replace(_LOADED[path], spec=spec))
  return loaded


def _run(spec: str, path: str) -> None:
  try:
    if _is_file_spec(spec):
      name = f"jaxtrain_extend_{Path(path).stem}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
      module_spec = importlib.util.spec_from_file_location(name, path)
      module = importlib.util.module_from_spec(module_spec)
      module_spec.loader.exec_module(module)
    elif spec in sys.modules:
      importlib.reload(sys.modules.get(spec))  # changed since this process imported it
    else:
      importlib.import_module(spec)
  except UserError as e:  # jaxtrain's own refusal (a name taken twice): said as it is
    raise UserError(f"extend: {spec}: {e}") from None
  except Exception as e:  # whatever the user's code raised
    raise code_error(e, f"extend: {spec} does not load", f"fix {Path(path).name}") from None


def loaded_files() -> set[str]:
  return set(_LOADED)


def record(sources: list[Source]) -> dict:
  """What config.json keeps of the extensions: each one's file and the sha256 of its text."""
  return {s.spec: {"path": s.path, "sha256": s.sha256} for s in sources}


def saved_config(cfg) -> dict:
  """What a run keeps of its config (config.json, a checkpoint's metadata): its fields and, where
  it names extensions, their sources (SOURCES_KEY)."""
  saved = cfg.to_dict()
  if cfg.get("extend"):
    saved[SOURCES_KEY] = record(load(cfg.extend))
  return saved


def changed(saved: dict, now: dict) -> list[str]:
  """The extension files whose code is not what a saved run (`saved`: its `record`) ran: changed,
  no longer named, or there now and not then."""
  then = {v["path"]: v["sha256"] for v in saved.values()}
  current = {v["path"]: v["sha256"] for v in now.values()}
  return [f"{Path(p).name} ({'changed' if p in current else 'no longer in extend'})"
          for p in then if current.get(p) != then[p]] + \
      [f"{Path(p).name} (new)" for p in current if p not in then]


def is_user_file(filename: str) -> bool:
  """Whether a frame's file is the user's: not jaxtrain's, not Python's or an installed library's."""
  if not filename or filename.startswith("<frozen"):
    return False
  real = os.path.realpath(filename)
  return not real.startswith(_PACKAGE + os.sep) and not real.startswith(_LIBRARIES)


def user_frames(e: BaseException) -> list[traceback.FrameSummary]:
  """The frames of `e`'s traceback (its cause's too) in the user's own files, outermost first."""
  frames = []
  seen: set[int] = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    frames = [f for f in traceback.extract_tb(e.__traceback__) if is_user_file(f.filename)] or frames
    e = e.__cause__ or e.__context__
  return frames


def _short(filename: str) -> str:
  """A file's path as a person reads it: from the working directory, where that is shorter."""
  try:
    return min(filename, os.path.relpath(filename), key=len)
  except ValueError:  # another drive
    return filename


def code_error(e: BaseException, what: str, fix: str) -> UserError:
  """A UserError for an exception raised in the user's code: one line (what failed, where: the
  innermost of the user's frames, the exception, the fix), then those frames as Python shows them."""
  frames = user_frames(e)
  message = " ".join(str(e).split()) or type(e).__name__
  message = message.split(" See https://")[0]  # JAX's errors end in a link to their page
  if isinstance(e, SyntaxError) and e.filename:
    frames = [traceback.FrameSummary(e.filename, e.lineno or 0, "<module>",
                                     line=(e.text or "").strip())]
    message = e.msg
  where = f" ({_short(frames[-1].filename)}, line {frames[-1].lineno}, in {frames[-1].name})" \
      if frames else ""
  lines = [f"{what}{where}: {type(e).__name__}: {message[:400]}; {fix}"]
  for f in frames:
    lines.append(f'  File "{_short(f.filename)}", line {f.lineno}, in {f.name}')
    code = (f.line or linecache.getline(f.filename, f.lineno)).strip()
    if code:
      lines.append(f"    {code}")
  return UserError("\n".join(lines))
