"""benchmarks/track.py, the 5-minute CPU track: its validation text is the run's own held-out
split (the same bytes for every tokenizer), and its score is the saved model's bits per byte
over that whole text."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxtrain as jt
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import track  # noqa: E402  (benchmarks/ on the path)


@pytest.mark.parametrize("name", ["byte", "char"])
def test_the_validation_text_is_the_runs_held_out_split(name, tiny, corpus_file):
  raw = corpus_file.read_bytes()
  tiny.data.tokenizer, tiny.data.val_fraction = name, track.VAL_FRACTION
  corpus = corpus_lib.prepare(tiny.data, show_progress=False, log=lambda line: None)
  held_out = corpus.tokenizer.decode(np.asarray(corpus.val)).replace(tokenizer.EOT, "")
  assert held_out.encode() == track.validation_text(raw)
  assert 0.09 < len(track.validation_text(raw)) / len(raw) <= 0.11


@pytest.mark.slow
def test_the_score_is_the_saved_models_bits_per_byte_over_the_whole_text(tiny, corpus_file,
                                                                         tmp_path):
  tiny.sample.num_samples, tiny.train.max_steps = 0, 4
  jt.run(tiny, show_progress=False)
  val = track.validation_text(corpus_file.read_bytes())
  got = track.score(Path(tiny.workdir), val, env=None)
  state, tok = jt.load_state(tiny.workdir), jt.load_tokenizer(tiny.workdir)
  batches = jt.text_batches(val.decode(), tok, state.model_cfg.seq_len)
  nats = sum(float(jt.eval_step(state, b)["loss"]) * float(b["weights"].sum()) for b in batches)
  assert got["step"] == 4 and got["val_bytes"] == len(val)
  assert got["val_bpb"] == pytest.approx(nats / (len(val) * math.log(2)), abs=1e-4)
  assert got["val_tokens"] == len(val) - 1  # bytes: each token but the first predicted once
