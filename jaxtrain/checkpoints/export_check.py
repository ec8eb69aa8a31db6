"""The check every export makes before its files are put in place: the exported model, run from
what was written, on a probe batch against jaxtrain's own logits of the same weights. A
Hugging Face directory runs in transformers where it is installed, else in numpy by
transformers' names and layouts (`hf_weights`); a GGUF file runs in numpy as llama.cpp computes it
(gguf_file.weights). A difference beyond float rounding refuses the export (forward.compare).
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxtrain.checkpoints import forward, gguf_file, hf
from jaxtrain.core import lora
from jaxtrain.core import model as model_lib


def reference(state, tokens_BT: np.ndarray, dtype: str = "float32") -> np.ndarray:
  """jaxtrain's float32 logits with the params an export writes: LoRA merged, and the matrices
  rounded to `dtype` where the export stores them so."""
  c = dataclasses.replace(state.model_cfg, dtype="float32", attention="xla", remat="none",
                          dropout=0.0)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_lib.GPT(c, nnx.Rngs(0))), nnx.Param)
  rounded = lambda x: np.asarray(  # noqa: E731
      jnp.asarray(x).astype(dtype).astype(jnp.float32)) if np.ndim(x) >= 2 else np.asarray(x)
  params = jax.tree.map(rounded, lora.merged(state.params, state.lora))
  return np.asarray(nnx.merge(graphdef, params)(jnp.asarray(tokens_BT)), np.float64)


def probe(state, tok) -> np.ndarray:
  c = state.model_cfg
  return forward.probe(min(tok.vocab_size, c.vocab_size), tok.eot_id, c.seq_len)


def check_hf(directory: Path, state, tok) -> float:
  """The largest logit difference of the Hugging Face directory from jaxtrain's (a UserError
  where it is not float rounding)."""
  tokens = probe(state, tok)
  try:
    import torch
    import transformers
  except ImportError:
    config, tensors = hf.read_dir(directory)
    theirs = forward.logits(*hf_weights(config, tensors), tokens)
  else:
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a bar for loading 20 tensors says nothing
    try:
      model = transformers.AutoModelForCausalLM.from_pretrained(str(directory),
                                                                 trust_remote_code=True)
    finally:
      if bars:
        transformers.utils.logging.enable_progress_bar()
    with torch.no_grad():
      theirs = model(torch.tensor(tokens, dtype=torch.long)).logits.double().numpy()
  return forward.compare(theirs, reference(state, tokens), "the exported model")


def check_gguf(path: Path, state, tok, dtype: str) -> float:
  """As check_hf, for a GGUF file (its matrices in `dtype`)."""
  tokens = probe(state, tok)
  theirs = forward.logits(*gguf_file.weights(*gguf_file.read(path)), tokens)
  return forward.compare(theirs, reference(state, tokens, dtype), "the GGUF file")


def hf_weights(cfg: dict, t: dict[str, np.ndarray]) -> tuple[forward.Spec, forward.Weights]:
  """What transformers computes with an export of each of the three classes, for forward.logits."""
  arch = cfg["architectures"][0]
  tied = cfg.get("tie_word_embeddings", arch == hf.GPT2)
  if arch == hf.LLAMA:
    rope = cfg.get("rope_parameters") or {}
    spec = forward.Spec(n_layers=cfg["num_hidden_layers"], n_heads=cfg["num_attention_heads"],
                        n_kv_heads=cfg["num_key_value_heads"], norm="rmsnorm",
                        norm_eps=cfg["rms_norm_eps"], pos="rope", mlp="swiglu",
                        rope_theta=rope.get("rope_theta", 10000.0))
    w = {"embed": t["model.embed_tokens.weight"], "final_norm": t["model.norm.weight"]}
    parts = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2",
             "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v",
             "self_attn.o_proj": "o", "mlp.gate_proj": "gate", "mlp.up_proj": "up",
             "mlp.down_proj": "down"}
    for name, x in t.items():
      if name.startswith("model.layers."):
        i, part = name.removeprefix("model.layers.").removesuffix(".weight").split(".", 1)
        w[f"{i}/{parts[part]}"] = x.T  # torch's Linear: [out, in]
    w["head"] = (t["model.embed_tokens.weight"] if tied else t["lm_head.weight"]).T
    return spec, w
  if arch == hf.GPT2:
    D, H = cfg["n_embd"], cfg["n_head"]
    spec = forward.Spec(n_layers=cfg["n_layer"], n_heads=H, n_kv_heads=H, norm="layernorm",
                        norm_eps=cfg["layer_norm_epsilon"], pos="learned", mlp="gelu")
    w = {"embed": t["transformer.wte.weight"], "pos": t["transformer.wpe.weight"],
         "final_norm": t["transformer.ln_f.weight"], "final_norm_b": t["transformer.ln_f.bias"]}
    parts = {"ln_1": "norm1", "ln_2": "norm2", "attn.c_proj": "o", "mlp.c_fc": "up",
             "mlp.c_proj": "down"}
    for name, x in t.items():
      if not name.startswith("transformer.h.") or name.endswith(".attn.bias"):
        continue
      i, part = name.removeprefix("transformer.h.").split(".", 1)
      part, kind = part.rsplit(".", 1)
      suffix = "_b" if kind == "bias" else ""
      if part == "attn.c_attn":  # Conv1D: [in, out], q, k and v side by side
        for n, y in zip("qkv", np.split(x, [D, 2 * D], axis=-1)):
          w[f"{i}/{n}{suffix}"] = y
      else:
        w[f"{i}/{parts[part]}{suffix}"] = x
    w["head"] = (t["transformer.wte.weight"] if tied else t["lm_head.weight"]).T
    return spec, w
  return _own_weights(cfg, t)


def _own_weights(cfg: dict, t: dict[str, np.ndarray]) -> tuple[forward.Spec, forward.Weights]:
  """JaxtrainForCausalLM (hf_modeling.py): jaxtrain's names and layouts."""
  H, G, L = cfg["n_heads"], cfg.get("n_kv_heads") or cfg["n_heads"], cfg["n_layers"]
  spec = forward.Spec(n_layers=L, n_heads=H, n_kv_heads=G, norm=cfg["norm"], norm_eps=hf.EPS,
                      pos=cfg["pos"], mlp=cfg["mlp"], rope_theta=cfg["rope_theta"],
                      qk_norm=cfg["qk_norm"], x0_mix=cfg["x0_mix"], canon=cfg["canon"])
  K, F = cfg["d_model"] // H, cfg["mlp_hidden"]
  w = {"embed": t["wte.embedding"], "final_norm": t["norm_f.scale"]}
  w["head"] = t["wte.embedding"].T if cfg["tie_embeddings"] else t["lm_head.kernel"]
  if cfg["pos"] == "learned":
    w["pos"] = t["wpe"]
  if cfg["x0_mix"]:
    w["x0_scale"] = t["x0_scale"]
  for i in range(L):
    b = f"blocks.{i}."
    q, k, v = np.split(t[b + "attn.qkv.kernel"], [H * K, (H + G) * K], axis=-1)
    up = t[b + "mlp.up.kernel"]
    w |= {f"{i}/norm1": t[b + "norm1.scale"], f"{i}/norm2": t[b + "norm2.scale"], f"{i}/q": q,
          f"{i}/k": k, f"{i}/v": v, f"{i}/o": t[b + "attn.out.kernel"],
          f"{i}/down": t[b + "mlp.down.kernel"]}
    w |= {f"{i}/gate": up[:, :F], f"{i}/up": up[:, F:]} if cfg["mlp"] == "swiglu" else {f"{i}/up": up}
    if cfg["canon"]:
      w |= {f"{i}/conv_attn": t[b + "conv_attn"], f"{i}/conv_mlp": t[b + "conv_mlp"]}
  return spec, w
