"""GGUF export (--format=gguf): the file read back with the gguf package's reader holds the
tensors and metadata written; each recipe exports or is refused as docs/after-training.md says;
where llama.cpp's Python binding is installed, llama.cpp gives jaxtrain's ids, logits and greedy
tokens."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxtrain as jt
from jaxtrain.checkpoints import gguf_file, hf, targets
from jaxtrain.config import loading
from jaxtrain.core import lora
from jaxtrain.data import chat_format
from jaxtrain.data import tokenizer as tokenizer_lib
from jaxtrain.system.errors import UserError
from jaxtrain.testing import tiny_config
from jaxtrain.tools import export

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_export_check import make_run  # noqa: E402

gguf = pytest.importorskip("gguf", reason="the gguf extra (pip install '.[gguf]')")

LAYOUTS = {
    "llama": ("llama", {"model.tie_embeddings": False, "model.n_kv_heads": 2}),
    "qwen3": ("qwen3", {"model.qk_norm": True}),
    "gpt2": ("gpt2", {"model.pos": "learned", "model.norm": "layernorm", "model.mlp": "gelu"}),
}
# What each recipe's model exports as (docs/after-training.md says the same); None: refused.
RECIPES = {"nano": "llama", "small": "llama", "gpt2_124m": "gpt2",
           "shakespeare_char_nanogpt": "gpt2", "shakespeare_char": None,
           "shakespeare_char_gpu": None, "finetune_chat": "llama", "finetune_lora": "llama",
           "finetune_shakespeare": "llama", "finetune_task": "llama"}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", gguf_file.DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_file_reads_back_with_the_tensors_and_metadata_written(layout, dtype, tmp_path):
  arch, over = LAYOUTS[layout]
  state = make_run(tmp_path / "run", tiny_config(**over))
  out = export.export_gguf(str(tmp_path / "run"), str(tmp_path / "m.gguf"), dtype=dtype)
  meta, tensors = gguf_file.read(out)
  c = state.model_cfg
  assert meta["general.architecture"] == arch and meta["general.name"] == "run"
  assert (meta[f"{arch}.block_count"], meta[f"{arch}.context_length"],
          meta[f"{arch}.embedding_length"], meta[f"{arch}.attention.head_count"],
          meta[f"{arch}.attention.head_count_kv"], meta[f"{arch}.feed_forward_length"]) == (
              c.n_layers, c.seq_len, c.d_model, c.n_heads, c.kv_heads, c.mlp_hidden)
  assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.eos_token_id"] == 255
  assert meta["tokenizer.ggml.tokens"][:256] == [*tokenizer_lib.byte_chars()[:255], tokenizer_lib.EOT]
  assert meta["tokenizer.ggml.bos_token_id"] == 255 and meta["tokenizer.ggml.add_bos_token"]
  written = gguf_file.tensors(hf.flatten(lora.merged(state.params, None)), c, arch)
  assert set(tensors) == set(written)
  for name, x in written.items():  # matrices in dtype, vectors in float32
    want = np.asarray(jax.numpy.asarray(x).astype(dtype if x.ndim == 2 else "float32"), np.float32)
    np.testing.assert_array_equal(tensors[name], want, err_msg=name)
  assert str(tmp_path) not in str(meta)  # the run's name, never its local path


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_exports_or_is_refused_naming_its_switches(recipe):
  fields = loading.load_config(str(ROOT / "configs" / f"{recipe}.py")).model.to_dict()
  if RECIPES[recipe] is None:
    with pytest.raises(UserError, match=r"model\.canon=4, model\.mlp=relu2, model\.x0_mix=True"):
      targets.choose("gguf", fields)
  else:
    assert targets.choose("gguf", fields) == RECIPES[recipe]


def test_tokenizers_in_the_metadata():
  chars = tokenizer_lib.CharTokenizer("ab é—\n")
  meta = gguf_file.tokenizer(chars, chars.vocab_size + 2, doc_mask=True)
  b = tokenizer_lib.byte_chars()
  assert meta["tokens"][chars.encode("é")[0]] == b[0xC3] + b[0xA9]
  assert f"{b[0xE2]} {b[0x80]}" in meta["merges"] and f"{b[0xE2]}{b[0x80]} {b[0x94]}" in meta["merges"]
  assert meta["tokens"][-2:] == [f"[PAD{chars.vocab_size}]", f"[PAD{chars.vocab_size + 1}]"]
  assert meta["bos"] is None and meta["eos"] == chars.eot_id  # documents masked: no leading token
  chat = chat_format.with_chat(tokenizer_lib.ByteTokenizer())
  meta = gguf_file.tokenizer(chat, chat.vocab_size, doc_mask=True)
  assert meta["chat_template"] == chat_format.TEMPLATE and meta["tokens"][meta["end"]] == "<|end|>"
  with pytest.raises(UserError, match="token ids without text"):
    gguf_file.tokenizer(tokenizer_lib.IdsTokenizer(100, 99), 100, doc_mask=False)


def test_without_the_gguf_package_one_line_says_how_to_install(tmp_path, monkeypatch):
  make_run(tmp_path / "run", tiny_config())
  monkeypatch.setitem(sys.modules, "gguf", None)
  with pytest.raises(UserError, match=r"^--format=gguf needs the gguf package: pip install "
                                      r"'jaxtrain\[gguf\]'"):
    export.export_gguf(str(tmp_path / "run"), str(tmp_path / "m.gguf"))


def _bpe():
  text = "def main(x):\n    return x + 1  # héllo — wörld 🙂\n" * 20
  return tokenizer_lib.train_bpe([text], 300), text


@pytest.mark.parametrize("layout", LAYOUTS)
def test_llama_cpp_gives_jaxtrains_logits_and_greedy_tokens(layout, tmp_path):
  llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding "
                                  "(pip install llama-cpp-python builds it from source)")
  arch, over = LAYOUTS[layout]
  state = make_run(tmp_path / "run", tiny_config(**over))
  out = export.export_gguf(str(tmp_path / "run"), str(tmp_path / "m.gguf"))
  # A float32 key-value cache (llama.cpp's default is float16, which rounds keys and values).
  llm = llama_cpp.Llama(str(out), n_ctx=32, logits_all=True, verbose=False, n_threads=2,
                        type_k=0, type_v=0)
  prompt = [72, 105, 33, 10]
  llm.eval(prompt)
  ours = np.asarray(state.model()(np.array([prompt])))[0]
  # ggml's GELU reads a float16 table: gpt2's logits are close, the others' equal to float rounding.
  atol = 1e-2 if arch == "gpt2" else 1e-4
  np.testing.assert_allclose(np.asarray(llm.scores[:len(prompt)]), ours, atol=atol, rtol=0)
  made = list(prompt)
  for _ in range(16):
    made.append(int(np.argmax(llm.scores[len(made) - 1])))
    llm.eval([made[-1]])
  greedy = jt.generate(state, np.array(prompt), 16, temperature=0.0)
  assert made == greedy.tolist()


def test_llama_cpp_tokenizes_as_jaxtrain(tmp_path):
  llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding "
                                  "(pip install llama-cpp-python builds it from source)")
  bpe, text = _bpe()
  for name, tok in [("byte", tokenizer_lib.ByteTokenizer()), ("char", tokenizer_lib.CharTokenizer(text)),
                    ("bpe", bpe)]:
    cfg = tiny_config(**{"model.vocab_size": tok.vocab_size})
    make_run(tmp_path / name, cfg, tokenizer=tok)
    out = export.export_gguf(str(tmp_path / name), str(tmp_path / f"{name}.gguf"))
    llm = llama_cpp.Llama(str(out), n_ctx=32, vocab_only=True, verbose=False)
    for sample in (text, "  x\n\n  (d)", text[:37]):
      ids = llm.tokenize(sample.encode(), add_bos=False, special=False)
      assert ids == tok.encode(sample).tolist(), (name, sample)
      assert llm.detokenize(ids).decode() == sample
