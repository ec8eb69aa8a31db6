"""Every export checks itself: a model field or value without a mapping is refused by name, a
wrong weight is caught by running what was written (transformers, or numpy without it) against
jaxtrain's logits, and nothing is left at --out. A resume refuses a model or optimizer field it
does not know to be harmless; a restore error shows orbax's whole explanation."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxtrain as jt
from jaxtrain.checkpoints import export_check, forward, gguf_file, hf, recover, store, targets
from jaxtrain.config import loading
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import export

ROOT = Path(__file__).resolve().parents[1]


def make_run(directory: Path, cfg, model_extra: dict | None = None,
             tokenizer=None) -> jt.TrainState:
  """A run's workdir as training leaves it, its params noisy so that every weight matters; its
  checkpoint's config holds `model_extra` too, as a run of a fork or an extension would save."""
  tok = tokenizer or tokenizer_lib.ByteTokenizer()
  state = jt.build(cfg, cfg.model.vocab_size or tok.vocab_size, jax.devices()[:1],
                   eot_id=tok.eot_id).init()
  rng = np.random.default_rng(0)
  state = state.replace(params=jax.tree.map(
      lambda x: np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(np.float32),
      jax.device_get(state.params)))
  directory.mkdir(parents=True)
  saved = cfg.to_dict()
  saved["model"].update(model_extra or {})
  ckpts = store.Checkpoints(str(directory))
  ckpts.save(state, meta={"config": saved}, val_loss=1.0)
  ckpts.close()
  paths.write_json(directory / paths.RUN_FILE, {})
  tokenizer_lib.save(tok, str(directory / "tokenizer.json"))
  return state


def _nothing_written(tmp_path: Path, run: str = "run") -> None:
  assert sorted(p.name for p in tmp_path.iterdir()) == [run], "the export left files behind"


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_a_model_field_without_a_mapping_is_refused_by_name(fmt, tmp_path):
  if fmt == "gguf":
    pytest.importorskip("gguf", reason="the gguf extra (pip install '.[gguf]')")
  make_run(tmp_path / "run", tiny_config(), {"window": 16})
  with pytest.raises(UserError, match=r"has no mapping for model\.window=16 \(a field it does not "
                                      r"know\).*nothing was written"):
    if fmt == "hf":
      export.export(str(tmp_path / "run"), str(tmp_path / "out"))
    else:
      export.export_gguf(str(tmp_path / "run"), str(tmp_path / "out.gguf"))
  _nothing_written(tmp_path)


def test_a_value_without_a_mapping_is_refused_by_name():
  fields = tiny_config().model.to_dict()
  for target in ("hf", "gguf"):
    with pytest.raises(UserError, match=r"no (llama\.cpp )?architecture computes model\.pos=alibi"):
      targets.choose(target, {**fields, "pos": "alibi"})
    # An extension's attention, block or whole model (examples/extend/window.py's "window")
    for field in ("attention_variant", "block", "arch"):
      with pytest.raises(UserError, match=rf"architecture computes model\.{field}=window"):
        targets.choose(target, {**fields, field: "window"})
  with pytest.raises(UserError, match=r"model\.canon=4, model\.mlp=relu2, model\.x0_mix=True "
                                      r"\(the nearest, qwen3, lacks them\)"):
    targets.choose("gguf", {**fields, "canon": 4, "x0_mix": True, "mlp": "relu2", "qk_norm": True})
  assert targets.choose("hf", {**fields, "canon": 4}) == hf.CUSTOM
  # Every field of today's defaults is in the table: a new one must be mapped (or refused).
  assert not targets.unknown("hf", fields) and not targets.unknown("gguf", fields)


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["transformers", "numpy"])
def test_a_wrong_weight_is_caught_and_nothing_is_written(runner, tmp_path, monkeypatch):
  if runner == "transformers":
    pytest.importorskip("transformers", reason="the test extra installs transformers")
  else:  # as where transformers is not installed
    monkeypatch.setitem(sys.modules, "transformers", None)
  make_run(tmp_path / "run", tiny_config(**{"model.n_kv_heads": 2}))
  right = export.export(str(tmp_path / "run"), str(tmp_path / "right"))
  assert (right / "model.safetensors").is_file()
  to_hf = hf.to_hf

  def one_wrong(flat, c):  # one key projection's rows of two heads swapped
    out = to_hf(flat, c)
    k = out["model.layers.1.self_attn.k_proj.weight"]
    out["model.layers.1.self_attn.k_proj.weight"] = np.concatenate([k[8:], k[:8]])
    return out
  monkeypatch.setattr(hf, "to_hf", one_wrong)
  with pytest.raises(UserError, match=r"^the exported model does not compute the trained model: "
                                      r"its logits differ from jaxtrain's by up to [0-9.]+ \(row"):
    export.export(str(tmp_path / "run"), str(tmp_path / "wrong"))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["right", "run"]


@pytest.mark.slow
def test_the_numpy_forward_computes_each_classes_logits(tmp_path, monkeypatch):
  """transformers' three classes as numpy reads them, on exports transformers checked: the
  fallback's own differences stay at float rounding."""
  monkeypatch.setitem(sys.modules, "transformers", None)
  for name, over in [("llama", {"model.tie_embeddings": False}),
                     ("gpt2", {"model.pos": "learned", "model.norm": "layernorm",
                               "model.mlp": "gelu"}),
                     ("own", {"model.canon": 3, "model.x0_mix": True, "model.mlp": "relu2",
                              "model.qk_norm": True, "model.n_kv_heads": 1})]:
    state = make_run(tmp_path / name, tiny_config(**over))
    out = export.export(str(tmp_path / name), str(tmp_path / f"{name}-hf"))
    tokens = forward.probe(255, 255, 32)
    theirs = forward.logits(*export_check.hf_weights(*hf.read_dir(out)), tokens)
    assert forward.compare(theirs, export_check.reference(state, tokens), name) < 1e-4


def test_a_wrong_gguf_weight_is_caught(tmp_path, monkeypatch):
  pytest.importorskip("gguf", reason="the gguf extra (pip install '.[gguf]')")
  make_run(tmp_path / "run", tiny_config())
  monkeypatch.setattr(gguf_file, "_permute", lambda w, heads: w)  # RoPE's halves left as pairs
  with pytest.raises(UserError, match=r"^the GGUF file does not compute the trained model"):
    export.export_gguf(str(tmp_path / "run"), str(tmp_path / "model.gguf"))
  _nothing_written(tmp_path)


def test_a_resume_refuses_a_model_or_optimizer_field_it_does_not_know():
  cfg = tiny_config().to_dict()
  newer = {**cfg, "model": {**cfg["model"], "window": 16}}
  breaking, _ = loading.config_changes(cfg, newer)  # a field this jaxtrain saved without
  assert breaking == ["model.window: <absent> -> 16"]
  breaking, _ = loading.config_changes(newer, cfg)  # saved by a jaxtrain that had it
  assert breaking == ["model.window: 16 -> <absent>"]
  changed = {**newer, "model": {**newer["model"], "window": 32}}
  assert loading.config_changes(newer, changed)[0] == ["model.window: 16 -> 32"]
  lion = {**cfg, "optim": {**cfg["optim"], "lion_beta": 0.99}}
  assert loading.config_changes(cfg, lion)[0] == ["optim.lion_beta: <absent> -> 0.99"]
  # The fields known to be harmless stay harmless; every other model/optim field breaks.
  harmless = {**cfg, "model": {**cfg["model"], "dropout": 0.1, "remat": "full"},
              "optim": {**cfg["optim"], "lr": 0.5, "z_loss": 1e-4}}
  breaking, fine = loading.config_changes(cfg, harmless)
  assert breaking == [] and len(fine) == 4
  for section in ("model", "optim"):
    for field in cfg[section]:
      name = f"{section}.{field}"
      assert (name in loading.HARMLESS) != (name in loading.STATE_FIELDS), name


def test_a_restore_error_shows_orbaxs_whole_explanation(tmp_path):
  state = jt.build(tiny_config(), 256, jax.devices()[:1]).init()
  ckpts = store.Checkpoints(str(tmp_path))
  ckpts.save(state, meta={"config": {}})
  ckpts.close()
  muon = jt.build(tiny_config(**{"optim.name": "muon"}), 256, jax.devices()[:1])
  ckpts = store.Checkpoints(str(tmp_path), read_only=True)
  with pytest.raises(UserError) as e:
    recover.read_one(ckpts, 0, lambda s: (*ckpts.read(s, muon.abstract, muon.shardings), None))
  ckpts.close()
  line = str(e.value)
  assert "\n" not in line
  # orbax's headline, and after it each differing path with what each side holds
  assert "tree structures do not match: opt_state[" in line and "- Source: " in line, line
  assert "- Target: " in line and "nothing was moved" in line, line
