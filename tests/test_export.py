"""Export to Hugging Face transformers and `init_from` back: logits equal within 1e-4 in torch,
tokenizers with the same ids, round trips, and one-line refusals."""

import io
import logging
import os
import stat
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
import tokenizers

import jaxtrain as jt
from jaxtrain.checkpoints import hf, init_from, store
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system import paths
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import export

ROOT = Path(__file__).resolve().parents[1]
torch = pytest.importorskip("torch", reason="the test extra installs torch (CPU)")
transformers = pytest.importorskip("transformers")

LAYOUTS = {
    "llama": {},
    "llama-untied": {"model.tie_embeddings": False},
    "llama-gqa": {"model.n_kv_heads": 2, "model.mlp": "swiglu", "model.zero_init_out": True},
    "gpt2": {"model.pos": "learned", "model.norm": "layernorm", "model.mlp": "gelu"},
}


def make_run(directory: Path, cfg, tok=None, noise: float = 0.3) -> jt.TrainState:
  """A run's workdir as training leaves it (run.json, tokenizer.json, a checkpoint with its
  config), holding a fresh state with noise on its params so that every weight matters."""
  tok = tok or tokenizer_lib.ByteTokenizer()
  state = jt.build(cfg, cfg.model.vocab_size or tok.vocab_size, jax.devices()[:1],
                   eot_id=tok.eot_id).init()
  rng = np.random.default_rng(0)
  state = state.replace(params=jax.tree.map(
      lambda x: np.asarray(x) + rng.normal(0, noise, x.shape).astype(np.float32),
      jax.device_get(state.params)))
  directory.mkdir(parents=True)
  ckpts = store.Checkpoints(str(directory))
  ckpts.save(state, meta={"config": cfg.to_dict()}, val_loss=1.0)
  ckpts.close()
  paths.write_json(directory / paths.RUN_FILE, {})
  tokenizer_lib.save(tok, str(directory / "tokenizer.json"))
  return state


def torch_logits(directory: Path, tokens: np.ndarray) -> np.ndarray:
  model = transformers.AutoModelForCausalLM.from_pretrained(str(directory))
  with torch.no_grad():
    return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_exported_model_gives_jaxtrains_logits_in_transformers(layout, tmp_path):
  cfg = tiny_config(**LAYOUTS[layout])
  state = make_run(tmp_path / "run", cfg)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
  tokens = np.random.default_rng(1).integers(0, 256, (2, cfg.model.seq_len))
  theirs = torch_logits(out, tokens)
  ours = np.asarray(state.model()(tokens))
  assert np.abs(ours).max() > 1.0  # logits of a size where a wrong mapping shows
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
  arch = transformers.AutoConfig.from_pretrained(str(out)).architectures[0]
  assert arch == (hf.GPT2 if layout == "gpt2" else hf.LLAMA)
  # And back: init_from reads the export as the params it came from.
  flat, _ = init_from.load_flat(str(out), state.model_cfg, tokenizer_lib.ByteTokenizer())
  jt.assert_trees_equal(hf.fill(state.params, flat, "x"), jax.device_get(state.params))
  with pytest.raises(UserError, match="another tokenizer"):  # the export records its tokenizer
    init_from.load_flat(str(out), state.model_cfg, tokenizer_lib.CharTokenizer("abc"))


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_exported_files_get_the_mode_the_umask_gives(umask, tmp_path):
  make_run(tmp_path / "run", tiny_config())
  before = os.umask(umask)
  try:
    out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  finally:
    os.umask(before)
  modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
  assert set(modes) == set(export.WRITTEN)
  assert modes == dict.fromkeys(export.WRITTEN, 0o666 & ~umask), modes


@pytest.mark.slow
@pytest.mark.parametrize("model", [{}, {"model.qk_norm": True}])  # a Llama; one with its own code
def test_an_export_holds_no_local_path(model, tmp_path):
  """An export is shared: none of its files names where the run or the export were on this
  machine (config.json says the run's folder name and its step)."""
  chat = chat_format.with_chat(tokenizer_lib.ByteTokenizer())
  make_run(tmp_path / "deep" / "nano", tiny_config(**model), tok=chat)
  out = export.export(str(tmp_path / "deep" / "nano"), str(tmp_path / "hf"))
  local = {str(tmp_path), str(tmp_path.resolve()), str(Path.home()), os.getcwd()} - {"/"}
  for path in out.iterdir():
    text = path.read_bytes().decode("utf-8", errors="replace")
    assert not [where for where in local if where in text], (path.name, local)
  assert paths.read_json(out / "config.json")["jaxtrain"] == {"run": "nano", "step": 0}


def test_exported_tokenizers_give_jaxtrains_ids(tmp_path):
  text = "def f(x):\n  return x  # héllo"
  for tok in (tokenizer_lib.ByteTokenizer(), tokenizer_lib.CharTokenizer(text + "ab")):
    export.write_tokenizer(tok, tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ids = hf_tok(text)["input_ids"]
    assert ids == tok.encode(text).tolist()
    assert hf_tok.decode(ids) == text


def _check_own_class(out: Path, state, tokens: np.ndarray) -> None:
  """`out` is JaxtrainForCausalLM with its code beside it; transformers (trust_remote_code, no
  network) gives jaxtrain's logits, generates, and init_from reads the export back exactly."""
  config = paths.read_json(out / "config.json")
  assert config["architectures"] == [hf.CUSTOM] and (out / hf.MODELING_FILE).is_file()
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
  assert type(model).__name__ == hf.CUSTOM
  with torch.no_grad():
    theirs = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(state.model()(tokens))
  assert np.abs(ours).max() > 1.0
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
  ids = model.generate(torch.tensor(tokens[:1, :3]), max_new_tokens=4, do_sample=False)
  assert ids.shape == (1, 7)
  flat, _ = init_from.load_flat(str(out), state.model_cfg, None)
  jt.assert_trees_equal(hf.fill(state.params, flat, "x"), jax.device_get(state.params))


@pytest.mark.slow
@pytest.mark.parametrize("switch,value", [("norm", "layernorm"), ("qk_norm", True),
                                          ("mlp", "relu2"), ("x0_mix", True), ("canon", 4)])
def test_a_layout_without_a_transformers_class_exports_with_its_own_code(switch, value, tmp_path):
  cfg = tiny_config(**{f"model.{switch}": value})
  state = make_run(tmp_path / "run", cfg)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  _check_own_class(out, state, np.random.default_rng(1).integers(0, 256, (2, cfg.model.seq_len)))
  assert set(p.name for p in out.iterdir()) == {*export.WRITTEN, hf.MODELING_FILE}
  line = export.written_line(out, "hf")
  assert line.startswith(f"wrote {hf.CUSTOM} (") and f"model.{switch}={value}" in line
  assert line.endswith("from_pretrained('hf', trust_remote_code=True)")


@pytest.mark.slow
def test_document_masks_and_a_learned_position_model_of_its_own_class(tmp_path):
  cfg = tiny_config(**{"model.doc_mask": True, "model.canon": 3, "model.pos": "learned",
                       "model.n_kv_heads": 1})
  tok = tokenizer_lib.ByteTokenizer()
  state = make_run(tmp_path / "run", cfg, tok)
  rng = np.random.default_rng(0)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  tokens = rng.integers(0, 255, (2, cfg.model.seq_len))
  tokens[:, [3, 9]] = tok.eot_id  # three documents in each row
  _check_own_class(out, state, tokens)


@pytest.mark.slow
@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_a_padded_batch_in_the_own_class_gives_each_prompts_logits_alone(pos, tmp_path):
  """Prompts of several lengths batched with padding (attention_mask, as generate and pipelines
  pass it): each row's logits are its prompt's alone, whichever side is padded."""
  cfg = tiny_config(**{"model.pos": pos, "model.canon": 3, "model.x0_mix": True})
  make_run(tmp_path / "run", cfg)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True)
  short, long = [5, 6, 7], [8, 9, 10, 11, 12, 13]
  with torch.no_grad():
    alone = model(torch.tensor([short])).logits[0]
    for row, mask in (([0, 0, 0, *short], [0, 0, 0, 1, 1, 1]), ([*short, 0, 0, 0], [1, 1, 1, 0, 0, 0])):
      batch = model(torch.tensor([long, row]), attention_mask=torch.tensor([[1] * 6, mask])).logits
      np.testing.assert_allclose(batch[1][torch.tensor(mask, dtype=torch.bool)], alone, atol=1e-5)


@pytest.mark.slow
def test_the_own_class_loads_in_16_bits_as_transformers_converts_it(tmp_path):
  """from_pretrained(..., dtype=torch.bfloat16) (the export writes float32; transformers converts
  on load) computes in bfloat16: near the float32 logits, no dtype error."""
  cfg = tiny_config(**{"model.qk_norm": True})
  make_run(tmp_path / "run", cfg)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  tokens = torch.tensor(np.random.default_rng(1).integers(0, 256, (2, 16)))
  logits = {}
  for dtype in (torch.float32, torch.bfloat16):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), trust_remote_code=True,
                                                              dtype=dtype)
    with torch.no_grad():
      logits[dtype] = model(tokens).logits
  assert logits[torch.bfloat16].dtype == torch.bfloat16
  np.testing.assert_allclose(logits[torch.bfloat16].float(), logits[torch.float32], atol=0.25)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(p.stem for p in (ROOT / "configs").glob("*.py")))
def test_every_recipes_model_exports_to_transformers_with_equal_logits(recipe, tmp_path):
  from jaxtrain.config import loading

  model = loading.load_config(str(ROOT / "configs" / f"{recipe}.py")).model
  # The recipe's switches, at a size a test holds.
  cfg = tiny_config(**{f"model.{k}": v for k, v in model.items()
                       if k not in ("n_layers", "n_heads", "d_model", "seq_len", "vocab_size",
                                    "dtype", "attention", "remat", "n_kv_heads")})
  state = make_run(tmp_path / "run", cfg)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  tokens = np.random.default_rng(1).integers(0, 256, (2, cfg.model.seq_len))
  if hf.blockers(state.model_cfg):
    _check_own_class(out, state, tokens)
  else:
    np.testing.assert_allclose(torch_logits(out, tokens), np.asarray(state.model()(tokens)),
                               atol=1e-4, rtol=0)


@pytest.mark.slow
def test_an_export_never_overwrites_and_leaves_nothing_half_written(tmp_path):
  make_run(tmp_path / "run", tiny_config())
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  with pytest.raises(UserError) as e:
    export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  assert str(e.value) == (f"--out={tmp_path / 'hf'} holds an earlier export; pass --out=<a new "
                          f"or empty directory>, or remove {tmp_path / 'hf'} first: nothing is "
                          "overwritten")
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before
  (tmp_path / "empty").mkdir()
  assert export.export(str(tmp_path / "run"), str(tmp_path / "empty")).is_dir()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "hf", "run"]  # no temporary left


@pytest.mark.slow
def test_the_export_carries_end_of_text_in_every_file(tmp_path):
  tok = tokenizer_lib.CharTokenizer("abcdef \n")
  make_run(tmp_path / "run", tiny_config(), tok)
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  eot = tok.eot_id
  assert transformers.AutoConfig.from_pretrained(str(out)).eos_token_id == eot
  gen = transformers.GenerationConfig.from_pretrained(str(out))
  assert gen.eos_token_id == eot and gen.pad_token_id == eot and gen.max_new_tokens == 16
  assert "max_length" not in paths.read_json(out / "generation_config.json")
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert hf_tok.eos_token == tokenizer_lib.EOT and hf_tok.eos_token_id == eot
  assert hf_tok.bos_token_id is None  # jaxtrain's own tokenizers have no beginning token
  assert hf_tok("abc")["input_ids"] == tok.encode("abc").tolist()  # nothing added around text


def test_a_tokenizer_json_with_a_beginning_token_exports_it_as_bos():
  t = tokenizers
  base = t.Tokenizer(t.models.WordLevel(vocab={"a": 0, "b": 1}, unk_token=None))
  base.add_special_tokens([t.AddedToken("<s>", special=True)])
  tok = tokenizer_lib.HFTokenizer(base.to_str())
  assert tokenizer_lib.bos_id(tok) == 2 and tok.eot_id == 3
  assert tokenizer_lib.bos_id(tokenizer_lib.ByteTokenizer()) is None
  assert hf.hf_config(jt.ModelConfig.from_config(tiny_config().model, 4), tok.eot_id,
                      tokenizer_lib.bos_id(tok))["bos_token_id"] == 2


@pytest.mark.slow
def test_generate_stops_at_end_of_text_and_a_pipeline_warns_nothing(tmp_path, caplog):
  make_run(tmp_path / "run", tiny_config(**LAYOUTS["gpt2"]))
  caplog.set_level(logging.WARNING)
  jt.load_state(str(tmp_path / "run"))
  assert not [r for r in caplog.records if "read only" in r.getMessage()
              or "read_only" in r.getMessage()], caplog.text
  out = export.export(str(tmp_path / "run"), str(tmp_path / "hf"))
  eot = tokenizer_lib.ByteTokenizer.eot_id
  model = transformers.AutoModelForCausalLM.from_pretrained(str(out))
  with torch.no_grad():  # every position's likeliest next token becomes end-of-text
    model.transformer.ln_f.weight.zero_()
    model.transformer.ln_f.bias.fill_(1.0)
    model.transformer.wte.weight[eot] = 10.0
  prompt = torch.tensor([[72, 105]])
  ids = model.generate(prompt, max_new_tokens=8, do_sample=False)
  assert ids[0].tolist() == [72, 105, eot]  # stopped at end of text, not after 8 tokens

  seen = io.StringIO()
  handler = logging.StreamHandler(seen)
  transformers.logging.get_logger().addHandler(handler)
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      pipe = transformers.pipeline("text-generation", model=str(out))
      for kw in ({}, {"max_new_tokens": 5}) * 3:  # sampled: some stop at end of text, some not
        assert pipe("Hi", **kw)[0]["generated_text"].startswith("Hi")
  finally:
    transformers.logging.get_logger().removeHandler(handler)
  assert [str(w.message) for w in caught] == [] and seen.getvalue() == ""


def test_every_switch_without_a_transformers_class_is_named():
  cfg = tiny_config(**{"model.qk_norm": True, "model.x0_mix": True, "model.mlp": "relu2"})
  assert hf.blockers(jt.ModelConfig.from_config(cfg.model, 256)) == [
      "model.qk_norm=True", "model.x0_mix=True",
      "model.mlp=relu2 with model.pos=rope (Llama has model.mlp=swiglu)"]


@pytest.mark.parametrize("arch", [hf.LLAMA, hf.GPT2])
def test_init_from_a_transformers_model_made_with_save_pretrained(arch, tmp_path):
  torch.manual_seed(0)
  if arch == hf.LLAMA:
    over = {"model.rope_theta": 500.0}
    hf_cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=True, initializer_range=0.3)
    model = transformers.LlamaForCausalLM(hf_cfg)
  else:
    over = {"model.pos": "learned", "model.norm": "layernorm", "model.mlp": "gelu"}
    hf_cfg = transformers.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                     n_inner=128, activation_function="gelu_new",
                                     layer_norm_epsilon=1e-5, initializer_range=0.3)
    model = transformers.GPT2LMHeadModel(hf_cfg)
    with torch.no_grad():  # jaxtrain's layers have no biases: only a model without them maps
      for name, p in model.named_parameters():
        if name.endswith(".bias"):
          p.zero_()
  model.eval()  # no dropout
  model.save_pretrained(str(tmp_path / "hf"))
  cfg = tiny_config(**over)
  programs = jt.build(cfg, 256, jax.devices()[:1])
  flat, what = init_from.load_flat(str(tmp_path / "hf"), programs.model_cfg,
                                   tokenizer_lib.ByteTokenizer())
  assert arch in what
  state = programs.abstract.replace(params=hf.fill(programs.abstract.params, flat, "x"))
  tokens = np.random.default_rng(2).integers(0, 256, (2, 32))
  ours = np.asarray(state.model()(tokens))
  with torch.no_grad():
    theirs = model(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
  # A config that does not fit: one line naming the field, or the tensor.
  with pytest.raises(UserError, match=r"model\.n_heads=4"):
    init_from.load_flat(str(tmp_path / "hf"), jt.build(tiny_config(**over, **{"model.n_heads": 2}),
                                                       256, jax.devices()[:1]).model_cfg, None)
  wide = jt.build(tiny_config(**over, **{"model.mlp_ratio": 2.0}), 256, jax.devices()[:1])
  flat, _ = init_from.load_flat(str(tmp_path / "hf"), wide.model_cfg, None)
  with pytest.raises(UserError, match=r"tensor blocks/0/mlp/(up|down)/kernel of .* has shape"):
    hf.fill(wide.abstract.params, flat, str(tmp_path / "hf"))


@pytest.mark.slow
def test_init_from_a_run_checks_tokenizer_and_switches(tmp_path):
  cfg = tiny_config()
  state = make_run(tmp_path / "run", cfg)
  c = state.model_cfg
  flat, what = init_from.load_flat(str(tmp_path / "run"), c, tokenizer_lib.ByteTokenizer())
  assert what.startswith("step 0 of")
  jt.assert_trees_equal(hf.fill(state.params, flat, "x"), jax.device_get(state.params))
  with pytest.raises(UserError, match="another tokenizer"):
    init_from.load_flat(str(tmp_path / "run"), c, tokenizer_lib.CharTokenizer("abc"))
  other = jt.build(tiny_config(**{"model.mlp": "gelu"}), 256, jax.devices()[:1]).model_cfg
  with pytest.raises(UserError, match=r"model\.mlp=swiglu"):
    init_from.load_flat(str(tmp_path / "run"), other, tokenizer_lib.ByteTokenizer())
  with pytest.raises(UserError, match="neither a jaxtrain run"):
    init_from.load_flat(str(tmp_path), c, tokenizer_lib.ByteTokenizer())
