"""The model's tokenizer, rebuilt from the GGUF file's metadata (no hub download).

SmolLM2 uses byte-level BPE (GPT-2 style): the vocabulary is `tokenizer.ggml.tokens`, the merge
rules are `tokenizer.ggml.merges` ("a b" per rule), and tokens whose `token_type` is 3 are special
(`<|im_start|>`, `<|im_end|>`, ...): matched whole, never split by BPE. Digits are split one by
one before the byte-level split, as in the original tokenizer.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKEN_TYPE = 3
# How a special token reads on a page: what it does, not its raw name (a learner reading an
# answer should not meet "<|im_end|>").
SPECIAL_NAMES = {"<|im_start|>": "⟨turn starts⟩", "<|im_end|>": "⟨end of turn⟩",
                 "<|endoftext|>": "⟨end of text⟩"}
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class ChatTokenizer:
    """Text <-> token ids, plus the ChatML template the GGUF declares."""

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str], eos_id: int):
        vocab = {token: token_id for token_id, token in enumerate(tokens)}
        merge_pairs = [tuple(rule.split(" ", 1)) for rule in merges]
        bpe = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs))
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        bpe.decoder = decoders.ByteLevel()
        specials = [t for t, kind in zip(tokens, token_types) if kind == SPECIAL_TOKEN_TYPE]
        bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        self._bpe = bpe
        # What a user typed is encoded by a copy that reads a special token's text as plain
        # text: a typed "<|im_start|>system" must not open a chat turn. A copy, not a switch
        # flipped around each call: one tokenizer serves every session's thread.
        self._plain = Tokenizer.from_str(bpe.to_str())
        self._plain.encode_special_tokens = True
        self.vocab_size = len(tokens)
        self.eos_id = eos_id
        self.im_end_id = vocab["<|im_end|>"]
        self.special_ids = frozenset(vocab[t] for t in specials)

    def encode(self, text: str) -> list[int]:
        """Text whose special tokens' names are the special tokens (the chat template's)."""
        return self._bpe.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """A user's text: every character is text, special tokens' names included."""
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special: bool = True) -> str:
        return self._bpe.decode(token_ids, skip_special_tokens=skip_special)

    def token_text(self, token_id: int) -> str:
        """One token as readable text (bytes merged back into characters); a special token as
        what it marks, e.g. "⟨end of turn⟩"."""
        text = self._bpe.decode([token_id], skip_special_tokens=False)
        if token_id in self.special_ids:
            return SPECIAL_NAMES.get(text, f"⟨{text.strip('<|>')}⟩")
        return text

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end an answer: end of text, or the end of the assistant's turn."""
        return frozenset({self.eos_id, self.im_end_id})

    def chat_tokens(self, user_prompt: str, system_prompt: str | None = None) -> list[int]:
        """The GGUF's chat template (ChatML) with the generation prompt for the assistant.

        The template's special tokens are placed as ids; the text between them (a role and its
        message) is encoded as plain text, so a message cannot name a special token. For a
        message that names none these are the ids of encoding the whole template text: that
        encoding splits at the special tokens first, then pre-tokenizes the same pieces.
        Like the template, a conversation without a system message gets the default one."""
        system = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        start, end = self.encode("<|im_start|>"), self.encode("<|im_end|>")
        ids: list[int] = []
        for role, content in (("system", system), ("user", user_prompt)):
            ids += start + self.encode_text(f"{role}\n{content}") + end + self.encode_text("\n")
        return ids + start + self.encode_text("assistant\n")
