"""What each export target computes, as an explicit table of the run's `model.*` fields and the
values each of the target's architectures maps; the export writes the first architecture that
takes every field's value, and refuses by name a field or a value that none takes.

A field missing from the table (a new one in default_config, or one a user's own code adds) and
a value missing from it (a component registered under a new name, e.g. `model.pos=alibi`) are
refused automatically: an export never writes a model that silently drops what it does not know.
A new switch exports once its mapping is written (checkpoints/hf.py, checkpoints/gguf_file.py)
and its values are added here.
"""

from jaxtrain.system.errors import UserError

# Fields that change nothing a trained model computes at inference (the speed, memory,
# regularisation or initialisation of training, or derived by the tokenizer): every target
# takes any value. An export's weights and compute are float32 (or the GGUF's --dtype), whatever
# model.dtype trained in.
TRAINING_ONLY = ("size", "dropout", "dtype", "attention", "remat", "zero_init_out", "loss_chunk",
                 "fused_loss", "scatter_free", "eot_id")
# Numbers every target writes as they are (the model's shape).
NUMBERS = ("n_layers", "n_heads", "d_model", "seq_len", "vocab_size", "mlp_ratio", "rope_theta")
MHA = "n_kv_heads=0 or n_heads"  # n_kv_heads' values for an architecture without grouped queries
ANY_GROUPS = "any n_kv_heads"
BOTH = (False, True)

# The built-in components' names (core/registry.py): an extension's attention, block or whole
# model is a value no target takes.
_BUILT_IN = {"attention_variant": ("causal",), "block": ("prenorm",), "arch": ("gpt",)}
# doc_mask: the exported model sees one document per prompt, as jaxtrain's generation does (a
# prompt holding an end-of-text token mid-way is masked by jaxtrain's own class only).
_LLAMA = {**_BUILT_IN, "norm": ("rmsnorm",), "pos": ("rope",), "mlp": ("swiglu",), "tie_embeddings": BOTH,
          "n_kv_heads": ANY_GROUPS, "qk_norm": (False,), "doc_mask": BOTH, "x0_mix": (False,),
          "canon": (0,)}
_GPT2 = {**_BUILT_IN, "norm": ("layernorm",), "pos": ("learned",), "mlp": ("gelu",), "tie_embeddings": BOTH,
         "n_kv_heads": MHA, "qk_norm": (False,), "doc_mask": BOTH, "x0_mix": (False,),
         "canon": (0,)}
ARCHITECTURES = {
    "hf": {
        "LlamaForCausalLM": _LLAMA,
        "GPT2LMHeadModel": _GPT2,
        # hf_modeling.py: every built-in switch, computed as jaxtrain computes it
        "JaxtrainForCausalLM": {**_BUILT_IN, "norm": ("rmsnorm", "layernorm"), "pos": ("rope", "learned"),
                                "mlp": ("swiglu", "gelu", "relu2"), "tie_embeddings": BOTH,
                                "n_kv_heads": ANY_GROUPS, "qk_norm": BOTH, "doc_mask": BOTH,
                                "x0_mix": BOTH, "canon": "any canon"},
    },
    "gguf": {  # llama.cpp's architectures (gguf_file.py)
        "llama": _LLAMA,
        # qwen3: llama's layout with a learned RMSNorm of each head's queries and keys (written
        # as ones) before RoPE, which is rotate-half there, as jaxtrain's
        "qwen3": {**_LLAMA, "qk_norm": (True,)},
        "gpt2": _GPT2,
    },
}


def _admits(allowed, value, fields: dict) -> bool:
  if allowed == MHA:
    return value in (0, fields.get("n_heads"))
  if isinstance(allowed, str):  # "any ...": every value of the field's type
    return True
  return any(value == a and type(value) is type(a) for a in allowed)


def _shown(field: str, value) -> str:
  return f"model.{field}={value}"


def unknown(target: str, fields: dict) -> list[str]:
  """The fields of `fields` (a run's model.* section) that no architecture of `target` has in
  its table, as `model.<field>=<value>`."""
  known = set(TRAINING_ONLY) | set(NUMBERS) | {f for a in ARCHITECTURES[target].values() for f in a}
  return [_shown(f, fields[f]) for f in sorted(fields) if f not in known]


def mismatches(target: str, arch: str, fields: dict) -> list[str]:
  """The switches of `fields` that architecture `arch` of `target` does not compute."""
  table = ARCHITECTURES[target][arch]
  return [_shown(f, fields[f]) for f in sorted(table)
          if f in fields and not _admits(table[f], fields[f], fields)]


def choose(target: str, fields: dict) -> str:
  """The first architecture of `target` that computes what `fields` (a run's model.* section)
  describe; else a UserError naming the fields or the switches it has no mapping for."""
  what = "--format=gguf" if target == "gguf" else "the Hugging Face export"
  missing = unknown(target, fields)
  if missing:
    raise UserError(f"{what} has no mapping for {', '.join(missing)} (a field it does not know): "
                    "it would write a model that computes something else, so nothing was "
                    "written; export a run without it, or add its mapping "
                    "(jaxtrain/checkpoints/targets.py)")
  for arch in ARCHITECTURES[target]:
    if not mismatches(target, arch, fields):
      return arch
  near = {arch: mismatches(target, arch, fields) for arch in ARCHITECTURES[target]}
  best = min(near, key=lambda a: len(near[a]))
  where = "no llama.cpp architecture" if target == "gguf" else "no architecture"
  raise UserError(f"{what}: {where} computes {', '.join(near[best])} (the nearest, {best}, lacks "
                  f"{'them' if len(near[best]) > 1 else 'it'}); nothing was written. Train without "
                  f"{'them' if len(near[best]) > 1 else 'it'} to export, "
                  + ("or export to Hugging Face (python -m jaxtrain.export without --format)"
                     if target == "gguf" else "or add its mapping (jaxtrain/checkpoints/targets.py)"))
