"""HRM-LM, the Transformer and UniTF as a transformers model: the repository's model.py, copied beside this file
unchanged, with transformers' inputs and outputs. generate() recomputes the whole context for every token: HRM's KV
cache keeps one slot per block application, which transformers' caches do not model (sample.py decodes with it)."""

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .model import ModelConfig, build_model, rope_table


class HRMLMConfig(PretrainedConfig):
    """hrmlm: model.py's ModelConfig fields, as the training checkpoint keeps them."""
    model_type = "hrmlm"

    def __init__(self, hrmlm=None, **kwargs):
        self.hrmlm = dict(hrmlm or {})
        kwargs.setdefault("vocab_size", self.hrmlm.get("vocab_size"))
        kwargs.setdefault("tie_word_embeddings", False)   # model.py ties its logits to wte itself
        super().__init__(**kwargs)


class HRMLMForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = HRMLMConfig
    base_model_prefix = "model"
    _supports_cache_class = False

    @classmethod
    def _supports_default_dynamic_cache(cls):   # generate() makes no transformers cache: the context is recomputed
        return False

    def __init__(self, config):
        super().__init__(config)
        self.model = build_model(ModelConfig(**config.hrmlm))
        self.post_init()

    def _init_weights(self, module):
        """No weight is drawn (model.safetensors has them); RoPE's tables, never saved, are rebuilt off meta."""
        if hasattr(module, "rope_cos"):
            c = module.trained_config
            cos, sin_rot = rope_table(c.block_size, c.n_embd // c.n_head)
            device = module.wte.weight.device
            module.rope_cos, module.rope_sin_rot = cos.to(device), sin_rot.to(device)

    def get_input_embeddings(self):
        return self.model.wte

    def forward(self, input_ids, attention_mask=None, labels=None, past_key_values=None, use_cache=None,
                return_dict=None, **kwargs):
        """Logits of every position; with labels, transformers' loss (labels shifted inside, -100 ignored)."""
        if input_ids.size(1) > self.model.config.block_size:   # RoPE tables end there, as in model.py
            raise ValueError(f"{input_ids.size(1)} tokens is more than block_size={self.model.config.block_size}")
        logits, _ = self.model(input_ids)
        loss = None if labels is None else torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids[:, -self.model.config.block_size:]}   # the whole context, every token
