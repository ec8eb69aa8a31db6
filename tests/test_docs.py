"""The docs stay true: CI runs the README's test command, no tracked file holds merge-conflict
markers, README.md and docs/ name every config field, their links resolve, the package's paths
and dotted names they give exist, and every command in their ```bash blocks runs as a new user
types it."""

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_layout import missing_names

from jaxtrain.config.defaults import default_config
from jaxtrain.system import fmt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Commands that cannot run here, each with the reason. Everything else in a ```bash block runs.
NOT_HERE = [
    (r"\bpip install\b", "installs packages from the network; .ci/run runs the README's install and "
                         "test command in a fresh environment"),
    (r"--jax_platforms=cuda", "needs an NVIDIA GPU and a CUDA build of jax"),
    (r"^srun\b", "needs a Slurm cluster"),
    (r"^(sbatch|sacct|apt-get|eval .*local-cluster|examples/slurm/)", "needs a Slurm cluster, "
     "installed as root (tests/test_slurm.py starts a one-node Slurm and submits the script)"),
    (r"JAXTRAIN_TEST_GPU=1", "needs a GPU (the tests skip themselves, saying so, without one)"),
    (r"^git clone|gpu_side_by_side", "fetches nanoGPT from the network, and measures on a GPU"),
    (r"^curl ", "downloads a file (the test writes its own input.txt), or asks a running server"),
    (r"^(jaxtrain-serve|python -m jaxtrain\.serve)\b", "serves until stopped; tests/test_serve.py "
     "starts the server and talks to it with the openai client, raw HTTP and a browser"),
    (r"^(llama-completion|llama-server|ollama) ", "needs llama.cpp or Ollama built and installed "
     "(tests/test_gguf.py runs GGUF files through llama.cpp's Python binding where it is installed)"),
    (r"--config\.data\.tokenizer=gpt2", "fetches GPT-2's tokenizer once from the network "
     "(tests/test_first_week.py checks how it is made, and the line where it cannot be had)"),
    (r"^wandb (login|sync)", "talks to the W&B service over the network (tests/test_wandb.py "
                             "checks offline runs)"),
    (r"^python benchmarks/track\.py", "takes 5 minutes of a quiet machine (tests/test_track.py "
     "checks its held-out text and its score)"),
    (r"--config\.distributed\.num_processes=[2-9]",
     "one process per host of a multi-host jax.distributed run (tests/test_scale_out.py runs two "
     "processes on one machine)"),
]
# Commands that fail today because of a bug another change is fixing: run, and a failure of these
# alone makes the test xfail (not strict: it passes once they are fixed).
KNOWN_BUGS: list[tuple[str, str]] = []
# Size and step overrides appended to training commands: a field the command sets itself is kept,
# except train.max_steps, which becomes 6 there (more than the 3 of a first run, so "train further"
# trains).
# A BPE vocabulary is learned small (the merges of GPT-2's 50257 took a minute of the test).
TINY = {"model.n_layers": 1, "model.d_model": 32, "model.n_heads": 2, "model.seq_len": 32,
        "train.batch_size": 4, "train.log_every": 1, "train.eval_every": 3, "train.eval_steps": 1,
        "train.checkpoint_every": 3, "optim.warmup_steps": 1, "sample.num_samples": 1,
        "sample.max_new_tokens": 8, "data.vocab_size": 512}
TINY_SAMPLE = {"max_new_tokens": 8}  # sample and chat
RERUN_PAGES = {"resume.md"}  # its "the same command again" is the point: a restart of a finished run


def _dotted(d, prefix=""):
  for k, v in d.items():
    yield from _dotted(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]


def _section(markdown: str, title: str) -> str:
  return markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_ci_runs_the_readme_test_commands():
  """.ci/run ends with the commands of the README's Tests section, as written there: every test
  (both tiers) on the oldest JAX (Python 3.11), pinned by its constraint file, then the `newest`
  ones on what pip resolves on Python 3.12 today, each leg in a fresh venv."""
  readme = (ROOT / "README.md").read_text()
  ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
  oldest, newest = bash_commands(_section(readme, "Tests"))
  # (each leg ends in `|| exit 1`: set -e does not stop at a failure inside an && list)
  assert [ci_lines[-3], ci_lines[-1]] == [f"{oldest} || exit 1", f"{newest} || exit 1"]
  assert ci_lines[-2] == "deactivate"
  assert oldest.startswith("python3 -m venv .venv && ") and "pip install -e '.[test]' -c " \
      "constraints/jax-0.10.2-py3.11.txt" in oldest and re.search(r" && python -m pytest --all( |$)", oldest)
  # No constraint file on the newest leg: a new release that breaks something is seen in CI first.
  assert newest.startswith("python3.12 -m venv .venv-newest && ") and \
      " pip install -e '.[test-core]' && python -m pytest -m newest" in newest and " -c " not in newest
  constraints = re.search(r"-c (\S+)", oldest).group(1)
  assert (ROOT / constraints).is_file(), constraints
  # pip takes only `name==version` as a constraint (an editable path stops the install).
  for path in (ROOT / "constraints").glob("*.txt"):
    pins = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    unpinned = [p for p in pins if not re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+!-]+", p)]
    assert pins and not unpinned, (path.name, unpinned)


def test_the_quick_start_installs_what_training_needs_and_trains():
  """Two commands, and neither the test extra (torch, transformers, ...) nor the tests."""
  install, train = bash_commands(_section((ROOT / "README.md").read_text(), "Quick start"))
  assert install.endswith("pip install -e .") and train.startswith("python -m jaxtrain --config=")


# What git writes around a conflict it leaves for a person to resolve, built from parts so
# that this file holds no such line itself.
CONFLICT_MARKERS = re.compile("^(" + "<" * 7 + " |" + "=" * 7 + "$|" + ">" * 7 + " )", re.M)


def _tracked_files() -> list[Path]:
  if shutil.which("git") is None or not (ROOT / ".git").exists():
    pytest.skip("not a git checkout: no list of tracked files")
  out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
  return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_no_file_holds_merge_conflict_markers():
  found = []
  for path in _tracked_files():
    if path.is_symlink() or not path.is_file():
      continue
    data = path.read_bytes()
    if b"\0" in data[:8192]:
      continue  # binary
    text = data.decode("utf-8", errors="replace")
    found += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
              for m in CONFLICT_MARKERS.finditer(text)]
  assert not found, f"unresolved merge conflicts: {found}"


def test_docs_name_every_config_field():
  text = "\n".join(p.read_text() for p in DOCS)
  # ext.*: the options of extensions a test of this process registered, not jaxtrain's fields
  missing = [f for f in _dotted(default_config().to_dict())
             if f"`{f}`" not in text and not f.startswith("ext.")]
  assert not missing, f"README.md and docs/*.md lack {missing}"


def test_relative_links_resolve():
  broken = []
  for doc in DOCS:
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
      path = target.split("#")[0]
      if path and "://" not in path and not (doc.parent / path).exists():
        broken.append(f"{doc.relative_to(ROOT)}: {target}")
  assert not broken, f"links to nothing: {broken}"


def test_paths_and_names_the_docs_give_exist():
  """jaxtrain/loop/feed.py, jaxtrain.system.runtime.MAX_IN_FLIGHT and the like, in the docs, the
  benchmarks' and notebooks' READMEs, the notebooks' text and pyproject.toml's comments: a module
  that moved is named where it is now."""
  pages = {p: p.read_text() for p in [*DOCS, ROOT / "benchmarks" / "README.md",
                                      ROOT / "notebooks" / "README.md", ROOT / "pyproject.toml"]}
  for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    cells = json.loads(notebook.read_text())["cells"]
    pages[notebook] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
  wrong = [f"{page.relative_to(ROOT)}: {name}" for page, text in pages.items()
           for name in sorted(set(missing_names(text)))]
  assert not wrong, wrong


def bash_commands(markdown: str) -> list[str]:
  """The commands of a markdown text's ```bash blocks, in order: continuation lines joined, comment
  lines and trailing comments dropped."""
  commands = []
  for block in re.findall(r"^```bash\n(.*?)^```", markdown, flags=re.S | re.M):
    for line in block.replace("\\\n", " ").splitlines():
      line = re.sub(r"\s+#\s.*$", "", line).strip()
      if line and not line.startswith("#"):
        commands.append(re.sub(r"\s+", " ", line))
  return commands


def _match(table, command):
  return next((reason for pattern, reason in table if re.search(pattern, command)), None)


def tiny(command: str) -> str:
  """The command as written, with size and step overrides appended."""
  if re.match(r"(python -m jaxtrain(\.sweep)?|jaxtrain(-sweep)?) ", command):
    extra = {f"config.{k}": v for k, v in TINY.items() if f"--config.{k}=" not in command}
    extra["config.train.max_steps"] = 6 if "--config.train.max_steps=" in command else 3
    if "examples/finetune/" in command:  # its records are longer than TINY's window
      extra["config.model.seq_len"] = 96
    if "--config.train.time_budget=" in command:
      extra["config.train.time_budget"] = "15s"
  elif command.startswith(("python -m jaxtrain.sample ", "python -m jaxtrain.chat ",
                            "jaxtrain-sample ", "jaxtrain-chat ")):
    extra = TINY_SAMPLE
  else:
    extra = {}
  return " ".join([command, *(f"--{k}={v}" for k, v in extra.items())])


def test_every_skipped_command_is_still_documented():
  commands = [c for doc in DOCS for c in bash_commands(doc.read_text())]
  for pattern, _ in NOT_HERE + KNOWN_BUGS:
    assert any(re.search(pattern, c) for c in commands), f"no documented command matches {pattern}"


def _fixtures(sandbox: Path, text: str) -> None:
  """The configs, and the data files the docs name: a text file, notes, jsonl and parquet."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  (sandbox / "configs").symlink_to(ROOT / "configs")
  for example in ("finetune", "extend"):  # as shipped
    shutil.copytree(ROOT / "examples" / example, sandbox / "examples" / example)
  bin_dir = sandbox / ".bin"
  bin_dir.mkdir()
  (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
  (bin_dir / "python").chmod(0o755)
  for script, module in (("jaxtrain", "jaxtrain"), *((f"jaxtrain-{c}", f"jaxtrain.{c}") for c in (
      "sample", "export", "chat", "eval", "compare", "sweep"))):  # the console scripts, as -m runs
    (bin_dir / script).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
    (bin_dir / script).chmod(0o755)
  lines = text.splitlines()
  (sandbox / "input.txt").write_text(text)
  (sandbox / "prompt.txt").write_text("The quick ")
  (sandbox / "notes" / "sub").mkdir(parents=True)
  (sandbox / "notes" / "a.md").write_text("\n".join(lines[:600]) + "\n")
  (sandbox / "notes" / "sub" / "b.md").write_text("\n".join(lines[600:]) + "\n")
  docs = [" ".join(lines[i:i + 5]) for i in range(0, len(lines), 5)]
  (sandbox / "docs.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
  (sandbox / "data").mkdir()
  for i in range(2):
    pq.write_table(pa.table({"text": docs[i::2]}), sandbox / "data" / f"part-{i}.parquet")
  _token_files(sandbox, text)
  (sandbox / "books").mkdir()
  for i in range(2):
    (sandbox / "books" / f"{i}.txt").write_text("\n".join(lines[i::2]) + "\n")
  (sandbox / "notes.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
  records = [{"prompt": f"{w} =", "completion": f" {w[::-1]}"} for w in " ".join(lines).split()]
  for name, part in (("routes", records[:-40]), ("prompts", records[-40:]),
                     ("held_out", records[-40:])):
    (sandbox / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
  chats = [{"messages": [{"role": "user", "content": r["prompt"]},
                         {"role": "assistant", "content": r["completion"]}]} for r in records]
  (sandbox / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))


def _token_files(sandbox: Path, text: str) -> None:
  """Token files as nanoGPT (character ids, data/shakespeare_char) and llm.c (GPT-2 shards,
  dev/data/fineweb10B) write them."""
  import numpy as np

  text += "\nROMEO: a line as Shakespeare's text has them.\n"  # for the docs' prompt
  chars = sorted(set(text))
  ids = np.array([chars.index(c) for c in text], np.uint16)
  nano = sandbox / "data" / "shakespeare_char"
  nano.mkdir(parents=True)
  ids[:len(ids) * 9 // 10].tofile(nano / "train.bin")
  ids[len(ids) * 9 // 10:].tofile(nano / "val.bin")
  (nano / "input.txt").write_text(text)
  (nano / "prepare.py").write_text("# writes train.bin, val.bin and meta.pkl\n")
  with open(nano / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                 "stoi": {c: i for i, c in enumerate(chars)}}, f)
  shards = sandbox / "dev" / "data" / "fineweb10B"
  shards.mkdir(parents=True)
  gpt2 = (ids.astype(np.int64) * 997 % 50257).astype(np.uint16)
  for i, part in enumerate(np.array_split(gpt2, 3)):
    header = np.zeros(256, np.int32)
    header[:3] = 20240520, 1, len(part)
    name = f"fineweb_{'val' if i == 0 else 'train'}_{i:06d}.bin"
    (shards / name).write_bytes(header.tobytes() + part.tobytes())


def _run(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
  """`command` in bash. A time budget too short for this machine's start-up (the test's is 15 s)
  is run again with a longer one, as its error says to: what the test checks is that the command
  runs, on a machine of any speed."""
  out = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, input="def \n",
                       capture_output=True, text=True, timeout=300)
  # "... too short: starting up and compiling took 32.9s already" (1m05s on a slow machine) or
  # "... too short for this run: ...; pass --config.train.time_budget=41s"
  short = re.search(r"time_budget: \S+ is too short.*(?:took (\S+) already|time_budget=(\d+)s)", out.stderr)
  if out.returncode == 2 and short:  # once: the rerun starts faster (its compiles are cached)
    longer = f"--config.train.time_budget={int(fmt.parse_duration(short[1] or short[2])) + 15}s"
    out = subprocess.run(["bash", "-c", re.sub(r"--config\.train\.time_budget=\S+$", longer, command)],
                         cwd=cwd, env=env, input="def \n", capture_output=True, text=True, timeout=300)
  return out


@pytest.mark.slow
def test_every_documented_command_runs(tmp_path, corpus_file):
  """Each command of README.md, then of docs/*.md, in order, in one directory as a new user's
  checkout would be: later commands read the runs earlier ones made (runs/nano, its export). A
  command repeated from an earlier page runs once, except on the page about running it again."""
  _fixtures(tmp_path, corpus_file.read_text())
  env = dict(os.environ, PATH=f"{tmp_path / '.bin'}{os.pathsep}{os.environ['PATH']}",
             PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
             PYTHONUNBUFFERED="1")
  report, failed, known, ran = [], [], [], set()
  for doc in DOCS:
    for command in bash_commands(doc.read_text()):
      where = f"{doc.relative_to(ROOT)}: {command}"
      if reason := _match(NOT_HERE, command):
        report.append(f"skipped  {where}\n         ({reason})")
        continue
      if command in ran and doc.name not in RERUN_PAGES:
        report.append(f"ran above        {where}")
        continue
      ran.add(command)
      start = time.perf_counter()
      out = _run(tiny(command), tmp_path, env)
      took = time.perf_counter() - start
      report.append(f"rc {out.returncode} {took:5.1f}s {where}")
      if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-6:])
        entry = f"{where}\n  ran: {tiny(command)}\n  exit {out.returncode}:\n{tail}"
        (known if _match(KNOWN_BUGS, command) else failed).append(entry)
  print("\n".join(report))
  assert not failed, "documented commands that fail:\n\n" + "\n\n".join(failed)
  if known:
    pytest.xfail("only known bugs fail: " + "; ".join(reason for _, reason in KNOWN_BUGS) +
                 "\n\n" + "\n\n".join(known))
