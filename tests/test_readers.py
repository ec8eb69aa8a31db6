"""The commands that only read a run (sample, export, eval, chat, compare) change none of its files,
a damaged checkpoint included: they skip it with one line and load the one before. Only training
sets a damaged checkpoint aside."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_damaged_checkpoints import DAMAGE
from test_export import make_run

from jaxtrain.checkpoints import load, store
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.testing import tiny_config

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def snapshot(root: Path) -> dict:
  """Every file and directory under `root`: its mode, and a file's bytes."""
  return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
          for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def damaged_run(tmp_path_factory):
  """A chat-capable run with checkpoints at steps 0 and 2, step 2 damaged."""
  root = tmp_path_factory.mktemp("readers")
  workdir = root / "run"
  cfg = tiny_config(**{"data.messages_field": "messages"})
  tok = chat_format.with_chat(tokenizer_lib.ByteTokenizer())
  state = make_run(workdir, cfg, tok)
  ckpts = store.Checkpoints(str(workdir), keep=2)
  ckpts.save(state.replace(step=state.step + 2), meta={"config": cfg.to_dict()}, val_loss=1.0)
  ckpts.close()
  DAMAGE["bytes flipped inside array data"](workdir / "checkpoints" / "2")
  (root / "held.jsonl").write_text(json.dumps({"prompt": "ab", "completion": "c"}) + "\n")
  return workdir


COMMANDS = {
    "sample": lambda run: ("jaxtrain.sample", f"--workdir={run}", "--prompt=ab",
                           "--max_new_tokens=4"),
    "export": lambda run: ("jaxtrain.export", f"--workdir={run}", f"--out={run.parent / 'hf'}"),
    "eval": lambda run: ("jaxtrain.eval", f"--workdir={run}", f"--data={run.parent / 'held.jsonl'}"),
    "chat": lambda run: ("jaxtrain.chat", f"--workdir={run}", "--max_new_tokens=4"),
    "compare": lambda run: ("jaxtrain.compare", str(run)),
}


def run(name: str, *args: str):
  """`python -m NAME ARGS` on the CPU (JAX_PLATFORMS: compare takes no JAX flags), "hi" on stdin."""
  env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", name, *args], cwd=ROOT, env=env, input="hi\n",
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_that_reads_a_run_changes_none_of_its_files(damaged_run, command):
  before = snapshot(damaged_run)
  proc = run(*COMMANDS[command](damaged_run))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert snapshot(damaged_run) == before, sorted(set(snapshot(damaged_run)) ^ set(before))
  if command != "compare":  # compare reads no checkpoint
    warning = next(x for x in proc.stderr.splitlines() if x.startswith("warning:"))
    step_dir = damaged_run / "checkpoints" / "2"
    assert warning.startswith(f"warning: checkpoint {step_dir} is damaged (array data differs")
    assert warning.endswith("); left in place (reading a run changes none of its files; resuming "
                            "its training sets it aside); loading step 0")


@pytest.mark.slow
def test_load_state_skips_a_damaged_checkpoint_and_leaves_it(damaged_run, capsys):
  before = snapshot(damaged_run)
  assert int(load.load_state(str(damaged_run)).step) == 0
  assert snapshot(damaged_run) == before
  assert "left in place" in capsys.readouterr().err
