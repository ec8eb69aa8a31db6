# A sliding window on levanter's Llama, as a user's own file (levanter 9263f81e; written to its API,
# not run here). levanter's Mistral config has a sliding_window field of its own; a new attention
# variant for Llama is a config subclass registered by name and a model subclass that applies it.
import dataclasses

from levanter.layers.attention import AttentionMask
from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
from levanter.models.lm_model import LmConfig


@LmConfig.register_subclass("llama_window")
@dataclasses.dataclass(frozen=True)
class LlamaWindowConfig(LlamaConfig):
    window: int = 64

    @property
    def model_type(self) -> type["LlamaWindowLMHeadModel"]:
        return LlamaWindowLMHeadModel


class LlamaWindowLMHeadModel(LlamaLMHeadModel):
    @classmethod
    def init(cls, Vocab, config, *, key):
        model = LlamaLMHeadModel.init(Vocab, config, key=key)  # it builds a LlamaLMHeadModel
        return cls(model.transformer, model.embeddings, model.lm_head)

    def activations(self, input_ids, attn_mask=None, *, key=None, pos_ids=None):
        if isinstance(attn_mask, AttentionMask):
            attn_mask = attn_mask.with_sliding_window(self.config.window)
        return super().activations(input_ids, attn_mask, key=key, pos_ids=pos_ids)
