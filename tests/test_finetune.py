"""Fine-tuning for a task: prompt/completion records (only completions in the loss, records kept
apart by document masks), batched completions of a prompts file, and task evaluation, on a
synthetic task a tiny model learns in seconds: three random letters and a key, then a pattern
that the key alone decides ("xsvc:" -> "C33")."""

import json
import math
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from test_sample_cli import module

import jaxtrain as jt
from jaxtrain.checkpoints import load
from jaxtrain.config import validate
from jaxtrain.core import loss, steps
from jaxtrain.data import corpus as corpus_lib
from jaxtrain.data import records, windows
from jaxtrain.evals import scoring
from jaxtrain.system.errors import ConfigError, UserError
from jaxtrain.testing import tiny_config

KEYS, NOISE = "abcdefgh", "stuvwxyz"
STEPS = 60
FIELDS = {"data.prompt_field": "prompt", "data.completion_field": "completion"}


def pattern(k: int) -> str:
  return KEYS[k].upper() + str(k + 1) * 2


def keyed(n: int, seed: int) -> list[dict]:
  """Records whose prompts are mostly noise (unpredictable) and whose completions are not."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    noise, k = "".join(NOISE[i] for i in rng.integers(0, len(NOISE), 3)), int(rng.integers(0, 8))
    rows.append({"prompt": noise + KEYS[k] + ":", "completion": pattern(k)})
  return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def task_config(path: Path, workdir: Path, **kw):
  return tiny_config(**{"workdir": str(workdir), "data.path": str(path), "headless": True,
                        "train.batch_size": 16, "optim.lr": 1e-2, "optim.warmup_steps": 10,
                        "train.eval_every": 30, "train.checkpoint_every": 1000,
                        "sample.num_samples": 0, **kw})


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  """A tiny model fine-tuned on prompt/completion records, and held-out records."""
  root = tmp_path_factory.mktemp("task")
  train = write_jsonl(root / "train.jsonl", keyed(2000, seed=0))
  held = write_jsonl(root / "held.jsonl", keyed(48, seed=1))
  cfg = task_config(train, root / "run", **FIELDS, **{"train.max_steps": STEPS})
  result = jt.run(cfg)
  return {"root": root, "train": train, "held": held, "cfg": cfg, "result": result}


def test_only_completions_and_their_end_of_text_are_in_the_loss(tmp_path):
  rows = keyed(40, seed=0)
  path = write_jsonl(tmp_path / "r.jsonl", rows)
  corpus = corpus_lib.prepare(task_config(path, tmp_path / "w", **FIELDS).data, show_progress=False)
  eot = corpus.tokenizer.eot_id
  expected_tokens, expected_mask = [], []
  for r in rows:  # byte tokens: prompt, completion, end-of-text
    expected_tokens += [*r["prompt"].encode(), *r["completion"].encode(), eot]
    expected_mask += [0] * len(r["prompt"]) + [1] * (len(r["completion"]) + 1)
  assert len(expected_tokens) == 40 * 9
  assert np.array_equal(corpus.tokens, expected_tokens)
  assert np.array_equal(corpus.mask, expected_mask) and corpus.n_docs == 40
  batch = windows.WindowBatches(corpus.train, 4, 8, 0, 0, mask=corpus.split_mask(True))[3]
  assert batch["weights"].shape == (4, 8) and batch["weights"].dtype == np.float32
  # Each target's weight is its token's mask (the windows' starts drawn as WindowBatches does).
  starts = np.random.default_rng([0, 0, 3]).integers(0, len(corpus.train) - 8, size=4)
  at = starts[:, None] + np.arange(1, 9)
  assert np.array_equal(batch["tokens"][:, 1:], corpus.tokens[at])
  assert np.array_equal(batch["weights"], np.asarray(expected_mask, np.float32)[at])
  # Plain text corpora have no mask and no weights: their batches are as before.
  text = write_jsonl(tmp_path / "t.jsonl", [{"text": r["prompt"] + r["completion"]} for r in rows])
  plain = corpus_lib.prepare(task_config(text, tmp_path / "w").data, show_progress=False)
  assert plain.mask is None and set(corpus_lib.eval_batches(plain, 2, 8, 0, 1)[0]) == {"tokens"}


@pytest.mark.slow
def test_the_weighted_loss_is_the_mean_over_weighted_targets():
  cfg = tiny_config()
  state, batch = jt.init(cfg), jt.random_batch(cfg)
  tokens = jnp.asarray(batch["tokens"])
  plain = steps.loss_fn(state.params, state.graphdef, tokens)
  ones = steps.loss_fn(state.params, state.graphdef, tokens, weights_BT=jnp.ones(tokens[:, 1:].shape))
  np.testing.assert_allclose(float(ones), float(plain), rtol=1e-6)
  w = np.zeros(tokens[:, 1:].shape, np.float32)
  w[:, -3:] = 1  # only the last three targets of each row
  logits = state.model()(tokens[:, :-1])
  by_hand = loss.mean_loss(loss.token_losses(logits[:, -3:], tokens[:, -3:]))
  got = steps.eval_step(state, {"tokens": tokens, "weights": jnp.asarray(w)})["loss"]
  np.testing.assert_allclose(float(got), float(by_hand), rtol=1e-5)


@pytest.mark.parametrize("rows, overrides, message", [
    ([{"prompt": "a=", "completion": "a"}, {"prompt": "b="}], FIELDS,
     "r.jsonl line 2 has no field 'completion'"),
    ([{"prompt": "a=", "completion": ""}] * 50, FIELDS, "holds no completion text"),
    ([{"prompt": "a=", "completion": 3}], FIELDS, "line 1: field 'completion' is int"),
])
def test_bad_records_are_one_line_naming_the_file_and_line(rows, overrides, message, tmp_path):
  path = write_jsonl(tmp_path / "r.jsonl", rows)
  with pytest.raises(UserError, match=message):
    corpus_lib.prepare(task_config(path, tmp_path / "w", **overrides).data, show_progress=False)


def test_prompt_completion_config_is_checked_up_front(tmp_path):
  with pytest.raises(ConfigError, match="data.completion_field.*is empty but data.prompt_field"):
    validate.validate(tiny_config(**{"data.prompt_field": "q"}))
  with pytest.raises(ConfigError, match="same field"):
    validate.validate(tiny_config(**{"data.prompt_field": "q", "data.completion_field": "q"}))
  text = tmp_path / "plain.txt"
  text.write_text("some text\n" * 100)
  with pytest.raises(UserError, match="plain.txt is a text file; prompt/completion records"):
    corpus_lib.prepare(task_config(text, tmp_path / "w", **FIELDS).data, show_progress=False)


@pytest.mark.slow
def test_a_fine_tuned_model_completes_held_out_prompts(task):
  state, tok = load.load(str(task["cfg"].workdir))
  assert state.model_cfg.doc_mask  # records packed into one window do not see each other
  fields = {"prompt": "prompt", "completion": "completion", "context": "context",
            "endings": "endings", "label": "label"}
  result = scoring.evaluate(state, tok, str(task["held"]), fields)
  assert result["exact_match"] >= 0.8, result
  # 3 bytes and 4 tokens (with the end of text) per completion, in bits and nats
  assert result["loss"] < 0.3 and math.isclose(result["bpb"] * math.log(2) * 3 * 48,
                                               result["loss"] * 4 * 48, rel_tol=1e-6)
  metrics = [json.loads(line) for line in open(Path(task["cfg"].workdir) / "metrics.jsonl")]
  evals = [m["val_loss"] for m in metrics if "val_loss" in m]
  assert evals[-1] < 0.6 * evals[0]


@pytest.mark.slow
def test_masking_the_prompts_is_visible_in_the_loss(task, tmp_path):
  """The same records as plain text (prompts in the loss): random prompts are unpredictable, so
  its loss stays far above the masked run's, which counts only the learnable completions."""
  text = write_jsonl(tmp_path / "text.jsonl", [{"text": r["prompt"] + r["completion"]}
                                               for r in keyed(2000, seed=0)])
  result = jt.run(task_config(text, tmp_path / "run", **{"train.max_steps": STEPS}))
  assert task["result"].val_loss < 0.5 * result.val_loss, \
      (task["result"].val_loss, result.val_loss)


@pytest.mark.slow
def test_init_from_a_run_fine_tunes_on_records(task, tmp_path):
  cfg = task_config(task["train"], tmp_path / "ft", **FIELDS,
                    **{"train.max_steps": 10, "init_from": str(task["cfg"].workdir),
                       "train.eval_every": 10, "optim.lr": 1e-4})
  result = jt.run(cfg)
  assert result.val_loss < 1.0  # starts where the source ended, not from scratch (~5.5)


@pytest.mark.slow
def test_sample_and_eval_commands_on_a_prompts_file(task, tmp_path):
  held = shutil.copy(task["held"], tmp_path / "held.jsonl")
  workdir = f"--workdir={task['cfg'].workdir}"
  proc = module("jaxtrain.sample", workdir, f"--prompts={held}", "--temperature=0")
  assert proc.returncode == 0, proc.stderr
  out = [json.loads(line) for line in open(tmp_path / "held.completions.jsonl")]
  refs = [json.loads(line) for line in open(held)]
  assert [o["prompt"] for o in out] == [r["prompt"] for r in refs]
  assert all("<|endoftext|>" not in o["completion"] for o in out)  # each stops at end of text
  right = np.mean([o["completion"] == r["completion"] for o, r in zip(out, refs)])
  assert right >= 0.8
  mc = write_jsonl(tmp_path / "mc.jsonl", [{"context": r["prompt"], "endings": [
      pattern((KEYS.index(r["prompt"][3]) + 1) % 8), r["completion"], pattern(0)[:2]],
      "label": 1} for r in refs[:16]])
  proc = module("jaxtrain.eval", workdir, f"--data={mc}", f"--out={tmp_path / 'r.json'}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads((tmp_path / "r.json").read_text())
  assert {"loss", "bpb", "exact_match", "mc_accuracy"} <= result.keys()
  assert result["mc_accuracy"] >= 0.75 and result["exact_match"] is None
  assert "mc_accuracy" in proc.stdout and "exact_match" in proc.stdout
  with pytest.raises(UserError, match="mc.jsonl line 1 has no field 'prompt'.*--prompt_field"):
    records.prompts(str(mc), "prompt")  # what `sample --prompts` says, as one line


@pytest.mark.slow
def test_resume_is_bit_for_bit_on_prompt_completion_records(tiny, tmp_path):
  from test_resume import _check_resume

  tiny.data.path = str(write_jsonl(tmp_path / "r.jsonl", keyed(600, seed=0)))
  tiny.data.prompt_field, tiny.data.completion_field = "prompt", "completion"
  _check_resume(tiny, tmp_path, n=3)
