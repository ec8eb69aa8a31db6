"""`--help` on every tool: exit status 0 and the command's own flags, one line each; a bad flag
is one line that points to --help."""

import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too

OWN_FLAGS = {
    "jaxtrain.sample": ["--workdir", "--prompt", "--num_samples=1", "--max_new_tokens=256",
                        "--temperature=0.8", "--top_k=0", "--top_p=1.0", "--seed=0",
                        "--step=latest", "--prompts", "--prompt_field", "--out",
                        "--[no]interactive", "--jax_platforms"],
    "jaxtrain.eval": ["--workdir", "--data", "--out", "--step=latest", "--prompt_field",
                      "--completion_field", "--context_field", "--endings_field", "--label_field",
                      "--normalize", "--max_new_tokens", "--jax_platforms"],
    "jaxtrain.export": ["--workdir", "--out", "--step=latest", "--format=hf", "--dtype=float32",
                        "--jax_platforms"],
    "jaxtrain.chat": ["--workdir", "--system", "--max_new_tokens=256", "--temperature=0.7",
                      "--top_k=0", "--top_p=1.0", "--seed=0", "--step=latest", "--jax_platforms"],
    "jaxtrain.serve": ["--workdir", "--step=latest", "--host=127.0.0.1", "--port=8000", "--name",
                       "--batch_size=8", "--queue=64", "--max_tokens=1024", "--drain_s=30.0",
                       "--api_key", "--jax_platforms"],
    "jaxtrain.compare": ["RUN", "--out=DIR", "--by=METRIC", "--baseline=RUN"],
    "jaxtrain.sweep": ["--config=FILE", "--sweep=FIELD=V1,V2", "--root=DIR", "--parallel=1",
                       "--progress_every_s=30", "--seeds=1", "--baseline=RUN", "--[no]compile_ahead",
                       "--config.FIELD=V", "--jax_*"],
}


def module(name: str, *args: str):
  return subprocess.run([sys.executable, "-m", name, *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OWN_FLAGS))
def test_help_lists_the_commands_own_flags_and_exits_0(name):
  proc = module(name, "--help")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0].startswith(f"usage: python -m {name} "), lines[0]
  listed = [line.split()[0] for line in lines[lines.index("flags:") + 1:]]
  own = [f for f in listed if f != "--helpfull"]  # no library flags (absl, grain, orbax)
  assert len(own) == len(OWN_FLAGS[name]), listed
  assert all(f.startswith(want) for f, want in zip(own, OWN_FLAGS[name])), listed
  flag_lines = lines[lines.index("flags:") + 1:]
  assert all(len(line.split(None, 1)) == 2 for line in flag_lines), flag_lines  # name and text
  assert "Try --helpfull" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OWN_FLAGS))
def test_an_unknown_flag_is_one_line_pointing_to_help(name):
  proc = module(name, "--no_such_flag=1")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], lines


@pytest.mark.slow
def test_output_into_a_closed_pipe_ends_with_141_and_no_traceback():
  code = ("from jaxtrain.system import exiting; exiting.quiet_broken_pipe()\n"
          "while True:\n  print('x' * 1000, flush=True)")
  proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  proc.stdout.readline()
  proc.stdout.close()  # `| head -1`
  assert proc.wait(60) == 141
  assert proc.stderr.read() == ""
