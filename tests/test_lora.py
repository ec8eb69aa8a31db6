"""LoRA (`finetune.lora_*`): only the adapters train and have optimizer state, the base params
stay bit for bit the source's, the run learns, resumes exactly, and exports as an ordinary
transformers model with the fine-tuned logits.

The task is test_finetune's (three noise letters and a key -> a pattern the key decides); the
source model learned it with every key's pattern shifted to the next key's, so a LoRA run has
to re-map what a trained model does: what adapters are for."""

import json
import shutil
import signal
import time
from pathlib import Path

import jax
import killharness as kh
import numpy as np
import pytest
from conftest import run_cli
from test_finetune import FIELDS, keyed, pattern, task_config, write_jsonl
from test_sample_cli import module

import jaxtrain as jt
from jaxtrain.checkpoints import hf, init_from, load
from jaxtrain.config import validate
from jaxtrain.core import lora
from jaxtrain.evals import scoring
from jaxtrain.measure import estimate
from jaxtrain.system.errors import ConfigError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import export

EVAL_FIELDS = {"prompt": "prompt", "completion": "completion", "context": "context",
               "endings": "endings", "label": "label"}
LORA = {"finetune.lora_rank": 8, "finetune.lora_targets": "qkv,out"}


def shifted(rows: list[dict]) -> list[dict]:
  """The records with each key's pattern replaced by the next key's."""
  return [{**r, "completion": pattern(int(r["completion"][1]) % 8)} for r in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A source run (untied head, as nano has) trained on the shifted task, its export, and a LoRA
  run from that export (a Hugging Face directory) on the real task."""
  root = tmp_path_factory.mktemp("lora")
  src = write_jsonl(root / "src.jsonl", shifted(keyed(2000, seed=2)))
  jt.run(task_config(src, root / "source", **FIELDS, **{"train.max_steps": 60,
                                                         "model.tie_embeddings": False}),
         show_progress=False)
  export.export(str(root / "source"), str(root / "hf"))
  train = write_jsonl(root / "train.jsonl", keyed(2000, seed=0))
  held = write_jsonl(root / "held.jsonl", keyed(48, seed=1))
  # No model field set but tiny_config's sizes: the untied head comes from the HF config.json.
  cfg = task_config(train, root / "lora", **FIELDS, **LORA,
                    **{"train.max_steps": 60, "init_from": str(root / "hf")})
  result = jt.run(cfg, show_progress=False)
  return {"root": root, "source": root / "source", "hf": root / "hf", "lora": root / "lora",
          "held": held, "cfg": cfg, "result": result}


@pytest.mark.slow
def test_only_the_adapters_train_and_the_base_stays_bit_for_bit(runs):
  source = jax.device_get(load.load_state(str(runs["source"])).params)
  state, tok = load.load(str(runs["lora"]))
  params = jax.device_get(state.params)
  jt.assert_trees_equal(lora.base(params), source)  # through export and init_from, untouched
  assert state.lora == lora.Lora(8, 16.0, ("qkv", "out"))
  assert json.loads((runs["lora"] / "config.json").read_text())["model"]["tie_embeddings"] is False
  adapters = lora.trainable(params, state.lora)
  names = set(hf.flatten(adapters))
  assert len(names) == 2 * 2 * 2  # 2 layers x (qkv, out) x (A, B)
  assert all(np.any(x != 0) for x in jax.tree.leaves(adapters))  # B started at zero: it trained
  # AdamW's two moments, for the adapters alone (the rest of the state: step counts)
  moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
  assert sum(x.size for x in moments) == 2 * lora.count(adapters)
  assert {x.shape for x in moments} == {x.shape for x in jax.tree.leaves(adapters)}


@pytest.mark.slow
def test_the_lora_run_learns_the_task(runs):
  state, tok = load.load(str(runs["lora"]))
  before = scoring.evaluate(load.load_state(str(runs["source"])), tok, str(runs["held"]),
                             EVAL_FIELDS)
  after = scoring.evaluate(state, tok, str(runs["held"]), EVAL_FIELDS)
  assert before["exact_match"] == 0.0 and after["exact_match"] >= 0.8, (before, after)
  assert after["loss"] < 0.1 * before["loss"], (before, after)


@pytest.mark.slow
def test_memory_estimate_counts_gradients_and_optimizer_for_the_adapters_only():
  cfg = tiny_config(**LORA, **{"init_from": "runs/x"})
  full, adapted = (jt.build(c, 256, jax.devices()[:1]) for c in (tiny_config(), cfg))
  n, n_trained = lora.count(adapted.abstract.params), lora.count(adapted.abstract.trainable())
  assert n == lora.count(full.abstract.params) + n_trained and n_trained == 2 * (
      32 * 8 + 8 * 96 + 32 * 8 + 8 * 32)
  moments = sum(x.size for x in jax.tree.leaves(adapted.abstract.opt_state) if x.ndim > 0)
  m = estimate.memory_estimate(adapted.model_cfg, 8, 1, n_params=n, n_trained=n_trained)
  assert m.params == 4 * n and m.grads == 4 * n_trained and m.optimizer == 4 * moments
  everything = estimate.memory_estimate(full.model_cfg, 8, 1)
  assert m.optimizer < everything.optimizer / 10
  line, _ = estimate.memory_report(adapted.model_cfg, 8, 1, jax.devices()[:1], 1, n, n_trained)
  assert f"grads {jt_nbytes(4 * n_trained)} + optimizer {jt_nbytes(8 * n_trained)}" in line
  # Fresh adapters change nothing: B is zero.
  batch = jt.random_batch(cfg)["tokens"][:, :-1]
  state, base_state = adapted.init(), full.init()
  np.testing.assert_array_equal(state.model()(batch), base_state.model()(batch))


def jt_nbytes(n: int) -> str:
  from jaxtrain.system import fmt

  return fmt.nbytes(n)


@pytest.mark.parametrize("overrides, message", [
    ({"finetune.lora_targets": "qkv,q_proj"}, "config.finetune.lora_targets: 'q_proj' is not a "
     r"linear layer of the model's blocks \(those are qkv, out, up, down\)"),
    ({"finetune.lora_targets": "qkv,qkv"}, "names qkv twice"),
    ({"finetune.lora_targets": ""}, "is empty, so LoRA"),
    ({"finetune.lora_rank": -1}, "lora_rank: must be an integer >= 0"),
    ({"finetune.lora_alpha": 0.0}, "lora_alpha: must be > 0"),
    ({"init_from": ""}, "lora_rank: is 8 \\(LoRA\\) but init_from is empty"),
])
def test_bad_lora_settings_are_refused_up_front(overrides, message):
  with pytest.raises(ConfigError, match=message):
    validate.validate(tiny_config(**{**LORA, "init_from": "runs/x", **overrides}))


@pytest.mark.slow
def test_a_bad_target_is_one_line_from_the_command_line(tmp_path):
  proc = run_cli("--config=configs/finetune_lora.py", f"--config.workdir={tmp_path / 'w'}",
                 "--config.finetune.lora_targets=q,v")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert lines[0].startswith("error: config.finetune.lora_targets: 'q' is not a linear layer")
  assert "qkv, out, up, down" in lines[0] and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_export_merges_the_adapters_into_an_ordinary_model(runs, tmp_path):
  torch = pytest.importorskip("torch", reason="the test extra installs torch (CPU)")
  transformers = pytest.importorskip("transformers")
  state, tok = load.load(str(runs["lora"]))
  out = export.export(str(runs["lora"]), str(tmp_path / "hf"))
  names = set(hf.read_dir(out)[1])
  assert not any("lora" in name for name in names)
  assert names == set(hf.read_dir(runs["hf"])[1])  # the source's layout, tensor for tensor
  tokens = np.random.default_rng(3).integers(0, 256, (2, runs["cfg"].model.seq_len))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
  with torch.no_grad():
    theirs = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(state.model()(tokens))
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
  source = np.asarray(load.load_state(str(runs["source"])).model()(tokens))
  assert np.abs(ours - source).max() > 0.1  # the adapters are in what the export computes
  # init_from reads the export (or the run itself) as the merged params.
  merged = lora.merged(state.params, state.lora)
  for path in (out, runs["lora"]):
    flat, _ = init_from.load_flat(str(path), state.model_cfg, tok)
    jt.assert_trees_equal({k: flat[k] for k in hf.flatten(merged)}, hf.flatten(merged))


@pytest.mark.slow
def test_sample_and_eval_commands_on_a_lora_run(runs, tmp_path):
  held = shutil.copy(runs["held"], tmp_path / "held.jsonl")
  workdir = f"--workdir={runs['lora']}"
  proc = module("jaxtrain.sample", workdir, f"--prompts={held}", "--temperature=0")
  assert proc.returncode == 0, proc.stderr
  out = [json.loads(line) for line in open(tmp_path / "held.completions.jsonl")]
  refs = [json.loads(line) for line in open(held)]
  assert np.mean([o["completion"] == r["completion"] for o, r in zip(out, refs)]) >= 0.8
  proc = module("jaxtrain.eval", workdir, f"--data={held}", f"--out={tmp_path / 'r.json'}")
  assert proc.returncode == 0, proc.stderr
  assert json.loads((tmp_path / "r.json").read_text())["exact_match"] >= 0.8


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_for_bit(runs, tmp_path, corpus_file):
  """A LoRA run (Muon on the adapters, dropout, grad_accum 3) from a run's workdir, killed once
  mid-run and completed, ends where an uninterrupted one does: params, optimizer, data, losses."""
  def args(workdir: Path) -> list[str]:
    return [*kh.cli_args(workdir, corpus_file, 12), f"--config.init_from={runs['source']}",
            "--config.finetune.lora_rank=4", "--config.finetune.lora_targets=qkv,up,down"]

  kh.complete(args(tmp_path / "whole"))
  ckpts = tmp_path / "killed" / "checkpoints"
  run = kh.Run(args(tmp_path / "killed"))
  deadline = time.time() + 120
  while run.proc.poll() is None and time.time() < deadline and not (
      ckpts.is_dir() and any(p.name.isdigit() for p in ckpts.iterdir())):
    time.sleep(0.01)
  assert run.proc.poll() is None, run.text()  # still training, a checkpoint saved: kill it
  run.proc.send_signal(signal.SIGKILL)
  run.wait(30)
  assert "resumed from checkpoint" in kh.complete(args(tmp_path / "killed")).text()
  (a, a_pos), (b, b_pos) = (final_state(tmp_path / w) for w in ("whole", "killed"))
  jt.assert_trees_equal(a, b)
  assert a_pos == b_pos
  assert kh.losses(tmp_path / "whole") == kh.losses(tmp_path / "killed")
  source = jax.device_get(load.load_state(str(runs["source"])).params)
  jt.assert_trees_equal(lora.base(b["params"]), source)


def final_state(workdir: Path) -> tuple[dict, dict]:
  """The arrays of a run's newest checkpoint, and its data position."""
  arrays = jax.device_get(load.load_state(str(workdir)).arrays())
  last = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  data = next((workdir / "checkpoints" / str(last) / "data").glob("*.json"))
  return arrays, json.loads(data.read_text())


def test_init_from_a_hugging_face_directory_fills_the_unset_model_fields(tmp_path):
  """As from a run: the fields its config.json fixes, where the config leaves them at default."""
  source = jt.tiny_config(**{"model.tie_embeddings": False, "model.n_kv_heads": 2,
                             "model.mlp_ratio": 3.0, "model.rope_theta": 500.0})
  c = jt.model_config(source)
  (tmp_path / "model.safetensors").write_bytes(b"")
  config_json = tmp_path / "config.json"
  config_json.write_text(json.dumps(hf.hf_config(c, eos_id=256)))
  cfg = jt.default_config()
  cfg.init_from, cfg.model.n_heads = str(tmp_path), 4  # set: kept, and the same as the source's
  resolved, taken = init_from.resolve(cfg)
  model = resolved.model
  assert (model.n_layers, model.d_model, model.n_heads, model.n_kv_heads) == (2, 32, 4, 2)
  assert not model.tie_embeddings and model.rope_theta == 500.0 and model.vocab_size == 256
  assert jt.model_config(resolved).mlp_hidden == c.mlp_hidden  # the width, whatever the ratio
  assert "model.n_layers=2" in taken and "model.n_heads=4" not in " ".join(taken)
  # A value of the wrong kind is left to load_flat to name; no traceback here.
  config_json.write_text(json.dumps({**hf.hf_config(c, eos_id=256), "num_hidden_layers": "2"}))
  model = init_from.resolve(cfg)[0].model
  assert model.n_layers == 4 and model.d_model == 32
  config_json.write_text(json.dumps({**hf.hf_config(c, eos_id=256), "hidden_size": 0}))
  assert init_from.resolve(cfg)[0].model.d_model == 128  # nothing taken
