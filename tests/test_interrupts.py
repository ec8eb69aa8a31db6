"""A signal at any moment is honoured within seconds, keeping what is done: while a BPE vocabulary
trains (native code that once held Ctrl-C for its whole length), while token files' ids are
checked, and in any evaluation, the periodic ones and the run's last (which then ends as an
interrupted run, and a restart makes that evaluation and the samples). Long preparation prints
progress lines with output to a file. Real `python -m jaxtrain` processes, as a user stops them."""

import json
import os
import signal
import time
from pathlib import Path

import killharness as kh
import numpy as np
import pytest

from jaxtrain.system import signals
from jaxtrain.system.console import Ticker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def words_file(tmp_path_factory) -> Path:
  """~30 MB of random words, ~1.7M of them distinct: a 4096-token BPE vocabulary takes ~20 s to
  learn from it on a quiet 2-core Zen 4 (the progress lines start after Ticker.FIRST_S)."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 12, 2_000_000)
  letters = rng.integers(97, 123, lengths.sum()).astype(np.uint8).tobytes().decode()
  ends = np.cumsum(lengths)
  words = [letters[e - n:e] for e, n in zip(ends.tolist(), lengths.tolist())]
  path = tmp_path_factory.mktemp("words") / "words.txt"
  with open(path, "w") as f:
    for _ in range(80):
      f.write(" ".join(words[j] for j in rng.integers(0, len(words), 50_000)) + "\n")
  return path


def _stop(proc: kh.Proc, sig=signal.SIGINT) -> float:
  """Sends `sig`; the seconds until the process has exited."""
  t0 = time.monotonic()
  proc.proc.send_signal(sig)
  proc.finish(120)
  return time.monotonic() - t0


def test_ctrl_c_while_a_bpe_vocabulary_trains_stops_at_once_and_progress_shows(words_file,
                                                                               tmp_path):
  run = kh.Proc(["--config=nano", "--jax_platforms=cpu", f"--config.workdir={tmp_path / 'run'}",
                 f"--config.data.path={words_file}", "--config.data.tokenizer=bpe",
                 "--config.data.vocab_size=4096", f"--config.data.cache_dir={tmp_path / 'cache'}",
                 "--config.headless=True"])
  # Output into a pipe, not a terminal: the BPE's work shows as progress lines.
  run.wait_for(lambda: any(x.startswith("data: BPE: ") for x in run.out), timeout=600)
  seconds = _stop(run)
  assert run.proc.returncode == 130
  # ~15 s of the merges are left when the signal comes (more on any machine slower than a quiet
  # 2-core Zen 4): a stop that waited for them would take longer than this, however slow the machine
  assert seconds < 10, f"the signal waited {seconds:.1f}s for the BPE"
  assert run.err == ["SIGINT while preparing the run: stopped; nothing was saved; a restart begins "
                     "afresh"]
  assert not (tmp_path / "run").exists()
  tokens = tmp_path / "cache" / "tokens"
  assert not tokens.is_dir() or not [p for p in tokens.iterdir() if p.suffix == ".json"]


def test_ctrl_c_while_token_ids_are_checked_is_one_line_and_caches_no_check(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  with open(data / "train.bin", "wb") as f:  # 512 MiB of id 0, sparse on disk
    f.truncate(512 << 20)
  (data / "val.bin").write_bytes(np.arange(4096, dtype="<u2").tobytes())
  run = kh.Proc([*kh.cli_args(tmp_path / "run", data, 2), "--config.model.vocab_size=4096",
                 f"--config.data.cache_dir={tmp_path / 'cache'}"])
  run.wait_for(lambda: any(x.startswith("data: checking the ids of 2 token file(s)")
                           for x in run.out))
  run.proc.send_signal(signal.SIGSTOP)  # held mid-check, however busy the machine is
  try:
    run.proc.send_signal(signal.SIGINT)
  finally:
    run.proc.send_signal(signal.SIGCONT)
  assert run.finish(60) == 130
  assert run.err == ["SIGINT while preparing the run: stopped; nothing was saved; a restart begins "
                     "afresh"]
  checks = tmp_path / "cache" / "tokenfiles"
  assert len(list(checks.glob("*.json")) if checks.is_dir() else []) < 2  # train.bin's is not


def _eval_args(workdir: Path, corpus: Path, max_steps: int, eval_every: int) -> list[str]:
  # 4096 evaluation batches of 32 x 64 tokens: an evaluation of ~20 s, the kind that held a
  # Ctrl-C to its end.
  return [*kh.cli_args(workdir, corpus, max_steps), f"--config.train.eval_every={eval_every}",
          "--config.train.eval_steps=4096", "--config.train.batch_size=32",
          "--config.model.seq_len=64", "--config.train.checkpoint_every=1000"]


def _in_evaluation(run: kh.Proc, step: int, total: int):
  # The step an evaluation follows is logged just before it.
  return lambda: any(x.startswith(f"step {step:>6}/{total} ") for x in run.out)


def test_ctrl_c_in_a_periodic_evaluation_stops_within_seconds_with_a_checkpoint(corpus_file,
                                                                                tmp_path):
  args = _eval_args(tmp_path / "run", corpus_file, 50, 2)
  run = kh.Proc(args)
  run.wait_for(_in_evaluation(run, 2, 50), timeout=600)
  time.sleep(1.0)
  _stop(run)  # the evaluation, ~20 s (longer on a slower machine), given up: no record of it
  assert run.proc.returncode == 130, (run.out[-3:], run.err)
  assert "SIGINT: stopping the evaluation, then saving a checkpoint and stopping" in run.err
  assert not any(x.startswith("eval step 2:") for x in run.out)  # given up: no record
  assert run.out[-4].startswith("SIGINT: stopped at step 2; checkpoint saved in ")
  assert run.out[-4].endswith("Run the same command again to resume.")
  assert run.out[-1].startswith("to resume: python -m jaxtrain --config=configs/nano.py")
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["state"] == "stopped" and status["step"] == 2


def test_ctrl_c_in_the_last_evaluation_ends_as_interrupted_and_a_restart_ends_the_run(
    corpus_file, tmp_path):
  args = _eval_args(tmp_path / "run", corpus_file, 2, 100)
  run = kh.Proc(args)
  run.wait_for(_in_evaluation(run, 2, 2), timeout=600)
  time.sleep(1.0)
  _stop(run)
  assert run.proc.returncode == 130, (run.out[-3:], run.err)
  assert not any(x.startswith("eval step 2:") for x in run.out)  # given up: no record
  assert run.out[-4] == (f"SIGINT: stopped at step 2; checkpoint saved in "
                         f"{tmp_path / 'run' / 'checkpoints' / '2'}. Run the same command again "
                         "for the last evaluation and the samples.")
  assert run.out[-1].startswith("to resume: python -m jaxtrain ")
  assert not any(x.startswith(("done:", "eval step")) for x in run.out)
  status = json.loads((tmp_path / "run" / "status.json").read_text())
  assert status["state"] == "stopped" and status["step"] == 2 and status["end_left"]
  again = kh.complete([*args, "--config.train.eval_steps=2"])
  text = again.text()
  assert "step 2 is the run's last; making its evaluation, then the samples" in text
  assert "eval step 2: val loss" in text and "done: step 2" in text
  assert "to resume" not in text
  assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"
  third = kh.complete(args)  # finished now: nothing to do
  assert "this run already reached step 2" in third.text()


def test_a_blocking_call_in_native_code_does_not_hold_a_signal(tmp_path):
  # The mechanism itself: the main thread waits, ready for the handler, while the call runs.
  if os.name != "posix":
    pytest.skip("signals")
  seen = []
  t0 = time.monotonic()
  signals.raise_on_signals()
  try:
    with pytest.raises(KeyboardInterrupt):
      signal_at = time.monotonic() + 0.3
      signals.interruptible(lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGINT),
                                     time.sleep(30)), waiting=seen.append, every_s=0.1)
  finally:
    signals.handled()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  # well before the call's 30 s end, however busy the machine
  assert time.monotonic() - signal_at < 10 and time.monotonic() - t0 < 15
  assert seen  # the waiting callback ran while it waited
  assert signals.interruptible(lambda a, b: a + b, 2, 3) == 5
  with pytest.raises(ZeroDivisionError):
    signals.interruptible(lambda: 1 / 0)


def test_progress_lines_come_after_a_few_seconds_then_at_intervals(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(time, "monotonic", lambda: now[0])
  lines = []
  ticker = Ticker(lines.append, "data: tokenizing", 100 << 20)
  for t in range(0, 40):
    now[0] = float(t)
    ticker.update(1 << 20)
  assert lines == ["data: tokenizing: 6.00 MiB of 100.00 MiB (6%), 5.0s",
                   "data: tokenizing: 21.00 MiB of 100.00 MiB (21%), 20.0s",
                   "data: tokenizing: 36.00 MiB of 100.00 MiB (36%), 35.0s"]
