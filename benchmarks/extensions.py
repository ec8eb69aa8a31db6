"""What an extension costs, measured against the anchors (issue 60): the lines a user writes and
the files touched for the three examples of docs/extending.md (a sliding window, optax's Lion, a
1 - sqrt schedule) in jaxtrain (examples/extend/), nanoGPT (edits of model.py and train.py: the
diffs in the results folder's anchors/, applied and run) and levanter (register_subclass in the
user's own files: anchors/levanter_*.py, written to its API at 9263f81e, not run); and whether a
model built of a user's components is the built-in model's very program (the results folder's
twins.py: the built-in attention and SwiGLU written again as a user would): the lowered StableHLO
text of the train step, and the compiled program with its source-location metadata left out.

    python benchmarks/extensions.py [--out=DIR]
"""

import argparse
import hashlib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reports  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "2026-12-07-extensions"
EXAMPLES = {"a sliding window": ("window.py", "window"), "optax's Lion": ("lion.py", "lion"),
            "a 1 - sqrt schedule": ("sqrt_decay.py", "sqrt_decay")}
ENTRY_LINES = 5  # levanter_train.py with one component's import: the user's own entry point


def code_lines(text: str) -> int:
  """Lines of code: not blank, not a comment, not in a docstring."""
  text = re.sub(r'^\s*("""|\'\'\')(.|\n)*?\1', "", text, count=1)  # the module's docstring
  return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def diff_counts(diff: str) -> tuple[int, int]:
  """(lines a diff writes: added or changed, files it touches)."""
  written = sum(1 for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
  return written, len(re.findall(r"^diff --git ", diff, flags=re.M))


def anchors(folder: Path) -> list[dict]:
  rows = []
  for example, (ours, name) in EXAMPLES.items():
    nano_lines, nano_files = diff_counts((folder / "anchors" / f"nanogpt_{name}.diff").read_text())
    lev = code_lines((folder / "anchors" / f"levanter_{name}.py").read_text())
    rows.append({"example": example,
                 "jaxtrain": {"lines": code_lines((ROOT / "examples" / "extend" / ours).read_text()),
                              "files": f"1 new (examples/extend/{ours}), 0 of jaxtrain's"},
                 "nanoGPT": {"lines": nano_lines, "files": f"{nano_files} of nanoGPT's edited"},
                 "levanter": {"lines": lev + ENTRY_LINES,
                              "files": "2 new (the component, an entry point), 0 of levanter's"}})
  return rows


def _stripped(compiled_text: str) -> str:
  """A compiled HLO module's text without what names source files: the stack-frame tables and the
  ids and metadata that point into them."""
  text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n(.*\n)*?(?=\n)", "\n",
                compiled_text)
  return re.sub(r"(, )?(metadata=\{[^}]*\}|stack_frame_id=\d+)", "", text)


def same_program(twins: Path, shapes: dict[str, dict]) -> list[dict]:
  import jax

  import jaxtrain as jt
  from jaxtrain.core import programs

  jt.extend(str(twins))
  rows = []
  for shape, overrides in shapes.items():
    digests = {}
    for side, parts in (("built-in", {}), ("extension", {"model.attention_variant": "twin_causal",
                                                         "model.mlp": "twin_swiglu"})):
      cfg = jt.load_config("nano", **{"extend": str(twins), **overrides, **parts})
      lowered = programs.build(cfg, 256, jax.devices()).lower_train()
      digests[side] = (hashlib.sha256(lowered.as_text().encode()).hexdigest(),
                       hashlib.sha256(_stripped(lowered.compile().as_text()).encode()).hexdigest())
    rows.append({"shape": shape, **{f"{side} {what}": d[i][:16] for side, d in digests.items()
                                    for i, what in enumerate(("lowered", "compiled"))},
                 "same lowered": digests["built-in"][0] == digests["extension"][0],
                 "same compiled": digests["built-in"][1] == digests["extension"][1]})
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=str(RESULTS))
  out = Path(parser.parse_args().out)
  rows = anchors(RESULTS)
  programs_rows = same_program(RESULTS / "twins.py", {
      "nano (2 x 96, context 128)": {},
      "GPT-2 small's layers (12 x 768, 12 heads, context 256)": {
          "model.n_layers": 12, "model.d_model": 768, "model.n_heads": 12, "model.seq_len": 256,
          "train.batch_size": 4}})
  machine = reports.machine_info()
  md = "\n".join([
      "| example | jaxtrain: lines, files | nanoGPT: lines, files | levanter: lines, files |",
      "|---|---|---|---|",
      *(f"| {r['example']} | {r['jaxtrain']['lines']}, {r['jaxtrain']['files']} | "
        f"{r['nanoGPT']['lines']}, {r['nanoGPT']['files']} | {r['levanter']['lines']}, "
        f"{r['levanter']['files']} |" for r in rows),
      "", "| shape | same lowered train step | same compiled program |", "|---|---|---|",
      *(f"| {r['shape']} | {r['same lowered']} ({r['built-in lowered']}) | {r['same compiled']} "
        f"({r['built-in compiled']}) |" for r in programs_rows),
      "", reports.cpu_line(machine), ""])
  print(md)
  reports.write(out, "extensions", {"machine": machine, "anchors": rows, "programs": programs_rows},
                md)


if __name__ == "__main__":
  main()
