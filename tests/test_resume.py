"""A run stopped at step N and resumed to 2N ends bit-for-bit where an uninterrupted run ends."""

import json

import jax
import pytest
import tokenizers

from jaxtrain import testing, train
from jaxtrain.checkpoints import store
from jaxtrain.core import programs
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.loop import preview
from jaxtrain.system.errors import UserError
from jaxtrain.testing import assert_trees_equal

pytestmark = pytest.mark.newest  # CI runs it on the newest JAX too


def _final_arrays(cfg):
  corpus = corpus_lib.prepare(cfg.data, show_progress=False)
  p = programs.build(cfg, corpus.tokenizer.vocab_size, eot_id=corpus.tokenizer.eot_id)
  ckpts = store.Checkpoints(cfg.workdir, cfg.train.keep_checkpoints)
  it = corpus_lib.train_iterator(corpus, cfg.train.batch_size, cfg.model.seq_len, cfg.seed)
  state = testing.restore(ckpts, ckpts.latest_step(), p.abstract, p.shardings, it)
  ckpts.close()
  return jax.device_get(state.arrays()), it.get_state()


def _logged(cfg, key):
  lines = [json.loads(line) for line in open(f"{cfg.workdir}/metrics.jsonl")]
  return {r["step"]: r[key] for r in lines if key in r}


def test_resume_is_bit_for_bit(tiny, tmp_path):
  _check_resume(tiny, tmp_path, n=6)


@pytest.mark.slow
def test_resume_is_bit_for_bit_with_bpe_on_jsonl_documents(tiny, tmp_path):
  lines = open(tiny.data.path, encoding="utf-8").read().splitlines()
  docs = tmp_path / "docs.jsonl"  # every sentence a document
  docs.write_text("".join(json.dumps({"body": line}) + "\n" for line in lines))
  tiny.data.path, tiny.data.text_field = str(docs), "body"
  tiny.data.tokenizer, tiny.data.vocab_size = "bpe", 320
  tiny.model.doc_mask = True
  tiny.model.fused_loss = True  # the fused cross-entropy resumes bit for bit too
  _check_resume(tiny, tmp_path, n=3)
  hf = tokenizers.Tokenizer.from_file(str(tmp_path / "whole" / "tokenizer.json"))
  assert hf.get_vocab_size() == 320 and hf.decode(hf.encode("Seven wise kings").ids) == \
      "Seven wise kings"
  evals = [r for r in map(json.loads, open(tmp_path / "whole" / "metrics.jsonl")) if "val_loss" in r]
  assert evals and all(0 < r["val_bpb"] < r["val_loss"] for r in evals)  # > 1 byte a token
  # The same workdir with another tokenizer: refused in one line.
  tiny.workdir, tiny.data.tokenizer = str(tmp_path / "whole"), "byte"
  with pytest.raises(UserError, match=r"^cannot resume .* data.tokenizer: 'bpe' -> 'byte'\. "
                     "Change these back"):
    train.run(tiny, show_progress=False)


@pytest.mark.slow
def test_a_resume_the_config_forbids_is_refused_before_any_data_work(tiny, tmp_path, capsys):
  tiny.train.max_steps, tiny.train.checkpoint_every, tiny.sample.num_samples = 2, 2, 0
  train.run(tiny, show_progress=False)
  other = tmp_path / "other.txt"  # text no run read yet: a run would tokenize it first
  other.write_text(open(tiny.data.path, encoding="utf-8").read() + "More text.\n")
  tiny.model.d_model, tiny.data.path = 64, str(other)
  tiny.data.cache_dir = str(tmp_path / "cache")
  refusal = r"^cannot resume .*run with this config: model.d_model: 32 -> 64\. Change these back"
  with pytest.raises(UserError, match=refusal):
    train.run(tiny)
  with pytest.raises(UserError, match=refusal):  # --dry_run refuses it alike
    preview.dry_run(tiny)
  lines = capsys.readouterr().out.splitlines()  # the dry run's config lines are indented
  assert not any(x.startswith("data:") for x in lines) and not (tmp_path / "cache").exists()


def _check_resume(tiny, tmp_path, n: int):
  tiny.train.grad_accum = 2
  tiny.model.dropout = 0.1
  tiny.optim.decay_steps = 2 * n  # the schedule must not depend on where the first leg stops
  tiny.train.log_every = 1
  tiny.train.eval_every = 3
  tiny.train.checkpoint_every = 4  # the first leg ends between checkpoint cadences
  tiny.sample.num_samples = 0

  whole = tiny.copy_and_resolve_references()
  whole.workdir = str(tmp_path / "whole")
  whole.train.max_steps = 2 * n
  r_whole = train.run(whole, show_progress=False)

  legs = tiny.copy_and_resolve_references()
  legs.workdir = str(tmp_path / "legs")
  legs.train.max_steps = n
  r_first = train.run(legs, show_progress=False)
  assert r_first.step == n
  legs.train.max_steps = 2 * n
  r_second = train.run(legs, show_progress=False)
  assert r_second.step == r_whole.step == 2 * n

  a, a_data = _final_arrays(whole)
  b, b_data = _final_arrays(legs)
  assert_trees_equal(a, b)
  assert a_data == b_data == {"next_index": 2 * n * 2}
  assert _logged(whole, "loss") == _logged(legs, "loss")  # every logged loss, both legs
  assert _logged(whole, "val_loss") == _logged(legs, "val_loss")
  assert r_whole.val_loss == r_second.val_loss
