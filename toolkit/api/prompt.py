"""Prompt side of the API: the repository's own tokenizer, chat template and length limits.

The API encodes prompts with the repository's TextCodec (the same code, tokenizer.json and BOS rule
as its preprocessing model), so a prompt that is too long is refused here, with the limit named,
before it reaches Triton, and `usage.prompt_tokens` is exact.
"""

from __future__ import annotations

from toolkit.errors import RepositoryError
from toolkit.model.chat_template import ChatTemplate
from toolkit.repository.reader import Repository
from toolkit.repository.sources import common_module


class PromptCodec:
    """Render chat messages with the checkpoint's chat template; text <-> token ids as the repository does."""

    def __init__(self, repository: Repository):
        tokenizer_dir = repository.tokenizer_json.parent
        self.tokens = repository.tokens
        self.text = common_module("textcodec").TextCodec(tokenizer_dir)
        self.template = ChatTemplate.from_tokenizer_dir(tokenizer_dir)

    def encode(self, text: str) -> list[int]:
        return self.text.encode_prompt(text, self.tokens.add_special_tokens, self.tokens.bos_id)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_generated(self, data: bytes) -> int:
        """Tokens of generated text (no special tokens added): the usage count of the text models' answers."""
        return len(self.text.encode(data.decode("utf-8", errors="replace"), False))

    def decode_bytes(self, ids) -> bytes:
        return self.text.decode_bytes(ids)

    def render_chat(self, messages: list[dict]) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        if self.template is None:
            raise RepositoryError(
                "this model's tokenizer has no chat template", hint="use /v1/completions"
            )
        return self.template.render(messages)
