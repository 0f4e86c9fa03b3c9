"""The character datasets' tokenizer for transformers: one token per character of chars.json (prepare.py's list)."""

import json
import os

from transformers import PreTrainedTokenizer


class CharTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "chars.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        with open(vocab_file) as f:
            self.chars = json.load(f)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.chars)

    def get_vocab(self):
        return dict(self.stoi)

    def _tokenize(self, text, **kwargs):
        return list(text)

    def _convert_token_to_id(self, token):
        return self.stoi[token]

    def _convert_id_to_token(self, index):
        return self.chars[index]

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, (filename_prefix or "") + "chars.json")
        with open(path, "w") as f:
            json.dump(self.chars, f)
        return (path,)
