"""A run's model as one GGUF file, llama.cpp's (and Ollama's) format, written with the `gguf`
package that llama.cpp maintains (`pip install 'jaxtrain[gguf]'`), and read back (`read`).

Three of llama.cpp's architectures compute what a jaxtrain model does (targets.py has the table):
`llama` (RoPE, RMSNorm, SwiGLU, grouped-query attention, tied or untied head), `qwen3` (the same
with each head's queries and keys RMS-normed before RoPE) and `gpt2` (learned positions, LayerNorm,
GELU; its biases written as zeros). llama.cpp's `llama` applies RoPE to consecutive pairs of a
head's values, jaxtrain (and `qwen3`) to its two halves: the query and key rows are permuted so
that the same pairs rotate. Matrices are written in `--dtype`, vectors (norms) in float32.

The tokenizer goes into the metadata as llama.cpp's byte-level BPE ("gpt2"), which gives
jaxtrain's ids: bytes (each byte its own token; no merges), characters (a character of several
UTF-8 bytes is merged from its bytes, and never across characters) and byte-level BPE with
GPT-2's pre-tokenizer (jaxtrain's own `bpe`, GPT-2's). Anything else is refused by name.
"""

from pathlib import Path

import numpy as np

from jaxtrain.checkpoints import forward
from jaxtrain.data import chat_format
from jaxtrain.data.bpe_tiktoken import byte_chars
from jaxtrain.system.errors import UserError

DTYPES = ("float32", "float16", "bfloat16")
INSTALL = "pip install 'jaxtrain[gguf]' (the gguf package)"
RMS_EPS = 1e-5  # jaxtrain's norms' epsilon (its QK-norm's is 1e-6: qwen3 has one for both)
_NEVER = "ÿ ÿ"  # bytes 0xFF 0xFF, which UTF-8 never holds: llama.cpp's BPE needs one merge


def gguf_module():
  try:
    import gguf
  except ImportError:
    raise UserError(f"--format=gguf needs the gguf package: {INSTALL}") from None
  return gguf


def _tokens_of(tok) -> tuple[dict[int, str], list[str], set[int], str]:
  """({id: llama.cpp's text of the token}, merges, the special ids, what it is) of a tokenizer
  llama.cpp's byte-level BPE reproduces; else a UserError naming what it lacks."""
  import json

  d = json.loads(tok.hf_json())
  model, pre = d.get("model") or {}, d.get("pre_tokenizer") or {}
  kind = model.get("type")
  added = {a["id"]: a for a in d.get("added_tokens") or []}
  if d.get("normalizer"):
    raise UserError(f"--format=gguf: the run's tokenizer normalizes text "
                    f"({d['normalizer'].get('type')}), which llama.cpp's byte-level BPE does not")
  if kind == "BPE":
    if pre.get("type") != "ByteLevel" or pre.get("add_prefix_space") or any(
        model.get(k) for k in ("continuing_subword_prefix", "end_of_word_suffix", "byte_fallback",
                               "ignore_merges", "dropout")):
      raise UserError("--format=gguf: the run's tokenizer.json is a BPE without GPT-2's byte-level "
                      f"pre-tokenizer (it has {pre.get('type') or 'none'}); llama.cpp's byte-level "
                      "BPE would split its text otherwise")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    if merges and not pre.get("use_regex", True):
      raise UserError("--format=gguf: the run's BPE merges across GPT-2's word boundaries "
                      "(use_regex off), which llama.cpp's byte-level BPE does not")
    texts = {i: piece for piece, i in model["vocab"].items()}
    what = "byte-level BPE" if merges else "bytes"
  elif kind == "WordLevel" and pre.get("type") == "Split":  # characters
    chars = byte_chars()
    texts, merges = {}, []
    for ch, i in model["vocab"].items():
      encoded = [chars[b] for b in ch.encode("utf-8")]
      texts[i] = "".join(encoded)
      merges += [f"{''.join(encoded[:n])} {encoded[n]}" for n in range(1, len(encoded))]
    merges, what = list(dict.fromkeys(merges)), "characters"
  else:
    raise UserError("--format=gguf: the run's tokenizer "
                    f"({'token ids without text' if kind == 'WordLevel' else kind}) has no form "
                    "in llama.cpp's tokenizers; export to Hugging Face instead (without --format)")
  texts.update({i: a["content"] for i, a in added.items()})
  return texts, merges or [_NEVER], {i for i, a in added.items() if a.get("special")}, what


def tokenizer(tok, vocab_size: int, doc_mask: bool) -> dict:
  """The tokenizer's metadata: tokens (padded to the model's vocabulary), their types, merges,
  end-of-text (which a prompt also starts with, as jaxtrain's completions do, unless documents
  are masked), the chat template and <|end|> where the run has chat tokens."""
  gguf = gguf_module()
  texts, merges, special, what = _tokens_of(tok)
  T = gguf.TokenType
  tokens = [texts.get(i, f"[PAD{i}]") for i in range(vocab_size)]
  types = [T.CONTROL if i in special else T.NORMAL if i in texts else T.UNUSED
           for i in range(vocab_size)]
  chat = chat_format.special_ids(tok)
  eot = tok.eot_id if tok.eot_id >= 0 else None
  return {"tokens": tokens, "types": types, "merges": merges, "eos": eot, "what": what,
          "bos": eot if eot is not None and not doc_mask else None,
          "chat_template": chat_format.TEMPLATE if chat else None,
          "end": chat[chat_format.END] if chat else None}


def _permute(w_OI: np.ndarray, heads: int) -> np.ndarray:
  """Rows of each head from rotate-half order (x0..x_{K/2-1}, then their partners) to pairs."""
  return w_OI.reshape(heads, 2, w_OI.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w_OI.shape)


def tensors(flat: dict[str, np.ndarray], c, arch: str) -> dict[str, np.ndarray]:
  """llama.cpp's tensors of jaxtrain's flat params (numpy [out, in], as llama.cpp reads them)."""
  D, H, G, K, F = c.d_model, c.n_heads, c.kv_heads, c.head_dim, c.mlp_hidden
  f = {k: np.asarray(v, np.float32) for k, v in flat.items()}
  out = {"token_embd.weight": f["wte/embedding"], "output_norm.weight": f["norm_f/scale"]}
  if not c.tie_embeddings:
    out["output.weight"] = f["lm_head/kernel"].T
  if arch == "gpt2":
    out["position_embd.weight"] = f["wpe"]
    out["output_norm.bias"] = np.zeros(D, np.float32)
  for i in range(c.n_layers):
    b, j = f"blk.{i}.", f"blocks/{i}/"
    qkv, up = f[j + "attn/qkv/kernel"].T, f[j + "mlp/up/kernel"].T  # [out, in]
    out |= {b + "attn_norm.weight": f[j + "norm1/scale"], b + "ffn_norm.weight": f[j + "norm2/scale"],
            b + "attn_output.weight": f[j + "attn/out/kernel"].T,
            b + "ffn_down.weight": f[j + "mlp/down/kernel"].T}
    if arch == "gpt2":
      zeros = lambda n: np.zeros(n, np.float32)  # noqa: E731
      out |= {b + "attn_qkv.weight": qkv, b + "attn_qkv.bias": zeros(qkv.shape[0]),
              b + "ffn_up.weight": up, b + "ffn_up.bias": zeros(F), b + "ffn_down.bias": zeros(D),
              b + "attn_output.bias": zeros(D), b + "attn_norm.bias": zeros(D),
              b + "ffn_norm.bias": zeros(D)}
      continue
    q, k, v = np.split(qkv, [H * K, (H + G) * K])
    if arch == "llama":
      q, k = _permute(q, H), _permute(k, G)
    else:  # qwen3: its learned per-head norms, as ones
      out |= {b + "attn_q_norm.weight": np.ones(K, np.float32),
              b + "attn_k_norm.weight": np.ones(K, np.float32)}
    out |= {b + "attn_q.weight": q, b + "attn_k.weight": k, b + "attn_v.weight": v,
            b + "ffn_gate.weight": up[:F], b + "ffn_up.weight": up[F:]}
  return out


def write(path: Path, c, arch: str, flat: dict, tok, dtype: str, name: str) -> None:
  """The GGUF file of a model of config `c` as `arch`, its matrices in `dtype`."""
  gguf = gguf_module()
  qtype = {"float32": gguf.GGMLQuantizationType.F32, "float16": gguf.GGMLQuantizationType.F16,
           "bfloat16": gguf.GGMLQuantizationType.BF16}[dtype]
  vocab = tokenizer(tok, c.vocab_size, c.doc_mask)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_name(name)
  w.add_file_type({"float32": gguf.LlamaFileType.ALL_F32, "float16": gguf.LlamaFileType.MOSTLY_F16,
                   "bfloat16": gguf.LlamaFileType.MOSTLY_BF16}[dtype])
  w.add_context_length(c.seq_len)
  w.add_embedding_length(c.d_model)
  w.add_block_count(c.n_layers)
  w.add_feed_forward_length(c.mlp_hidden)
  w.add_head_count(c.n_heads)
  w.add_head_count_kv(c.kv_heads)
  if arch == "gpt2":
    w.add_layer_norm_eps(RMS_EPS)
  else:
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_freq_base(c.rope_theta)
    w.add_rope_dimension_count(c.head_dim)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("gpt-2")  # llama.cpp's name for GPT-2's pre-tokenizer regex
  w.add_token_list(vocab["tokens"])
  w.add_token_types(vocab["types"])
  w.add_token_merges(vocab["merges"])
  if vocab["eos"] is not None:
    w.add_eos_token_id(vocab["eos"])
  w.add_add_bos_token(vocab["bos"] is not None)
  if vocab["bos"] is not None:
    w.add_bos_token_id(vocab["bos"])
  w.add_add_eos_token(False)
  if vocab["chat_template"]:
    w.add_chat_template(vocab["chat_template"])
    w.add_eot_token_id(vocab["end"])
  for tensor_name, x in tensors(flat, c, arch).items():
    if x.ndim >= 2 and dtype != "float32":
      w.add_tensor(tensor_name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    else:
      w.add_tensor(tensor_name, x)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def read(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
  """(metadata {key: value}, tensors {name: float32 array}) of a GGUF file, by gguf's reader."""
  gguf = gguf_module()
  r = gguf.GGUFReader(str(path))
  meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
  arrays = {}
  for t in r.tensors:
    x = gguf.quants.dequantize(t.data, t.tensor_type)
    arrays[t.name] = np.asarray(x, np.float32).reshape([int(n) for n in reversed(t.shape)])
  return meta, arrays


def weights(meta: dict, t: dict[str, np.ndarray]) -> tuple[forward.Spec, forward.Weights]:
  """What llama.cpp computes with a GGUF file of these three architectures, for forward.logits."""
  arch = meta["general.architecture"]
  L, H = meta[f"{arch}.block_count"], meta[f"{arch}.attention.head_count"]
  G = meta.get(f"{arch}.attention.head_count_kv", H)
  eps = meta.get(f"{arch}.attention.layer_norm_rms_epsilon", meta.get(
      f"{arch}.attention.layer_norm_epsilon"))
  spec = forward.Spec(n_layers=L, n_heads=H, n_kv_heads=G,
                      norm="layernorm" if arch == "gpt2" else "rmsnorm", norm_eps=eps,
                      pos="learned" if arch == "gpt2" else "rope",
                      mlp="gelu" if arch == "gpt2" else "swiglu",
                      rope_theta=meta.get(f"{arch}.rope.freq_base", 10000.0),
                      rope_pairs=arch == "llama", qk_norm=arch == "qwen3", qk_eps=eps)
  w = {"embed": t["token_embd.weight"], "final_norm": t["output_norm.weight"],
       "head": t.get("output.weight", t["token_embd.weight"]).T}
  if arch == "gpt2":
    w |= {"pos": t["position_embd.weight"], "final_norm_b": t["output_norm.bias"]}
  names = {"attn_norm": "norm1", "ffn_norm": "norm2", "attn_q": "q", "attn_k": "k", "attn_v": "v",
           "attn_output": "o", "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down",
           "attn_q_norm": "q_norm", "attn_k_norm": "k_norm"}
  for name, x in t.items():
    if not name.startswith("blk."):
      continue
    _, i, part, kind = name.split(".")
    if part == "attn_qkv":
      D = t["token_embd.weight"].shape[1]
      q, k, v = np.split(x, [D, D + (x.shape[0] - D) // 2])
      w |= {f"{i}/{n}{'_b' if kind == 'bias' else ''}": y.T for n, y in zip("qkv", (q, k, v))}
      continue
    key = f"{i}/{names[part]}" + ("_b" if kind == "bias" else "")
    w[key] = x.T if x.ndim == 2 else x
  return spec, w
