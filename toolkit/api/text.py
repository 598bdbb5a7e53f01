"""Prompt side of the API: the repository's own tokenizer, chat template and length limits.

The API counts prompt tokens with the same `tokenizer.json` and the same `add_special_tokens`
setting as the repository's preprocessing model, so a prompt that is too long is refused here,
with the limit named, before it reaches Triton, and `usage.prompt_tokens` is exact.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import RepositoryError

PREPROCESSING_CONFIG = Path("preprocessing") / "config.pbtxt"


@dataclass(frozen=True)
class ModelLimits:
    """Token limits of the served engine, as the preprocessing model enforces them."""

    max_input_len: int
    max_output_len: int
    max_seq_len: int

    def output_limit(self, prompt_tokens: int) -> int:
        """The most tokens a request with this prompt may ask for."""
        return max(0, min(self.max_output_len, self.max_seq_len - prompt_tokens))


@dataclass(frozen=True)
class RepositoryFacts:
    """What the API needs from a model repository: tokenizer folder, limits, special-token setting."""

    tokenizer_dir: Path
    limits: ModelLimits
    add_special_tokens: bool
    end_id: int
    pad_id: int


def read_repository_facts(repo: Path) -> RepositoryFacts:
    """Read the preprocessing model's parameters (written by `toolkit build`) from `repo`."""
    from toolkit.repository.configs import parse_pbtxt

    repo = Path(repo)
    config_path = repo / PREPROCESSING_CONFIG
    if not config_path.is_file():
        raise RepositoryError(f"{repo} has no {PREPROCESSING_CONFIG}", hint="pass --repo with a repository made by `toolkit build`")
    config = parse_pbtxt(config_path.read_text())
    params = {key: value.string_value for key, value in config.parameters.items()}
    tokenizer_dir = repo / "preprocessing" / "1" / params.get("tokenizer_dir", "tokenizer")
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise RepositoryError(f"no tokenizer.json in {tokenizer_dir}", hint="rebuild the repository with `toolkit build`")
    limits = ModelLimits(
        max_input_len=int(params.get("max_input_len", "2048")),
        max_output_len=int(params.get("max_output_len", "2048")),
        max_seq_len=int(params.get("max_seq_len", "4096")),
    )
    end_id = int(params.get("end_id", "-1"))
    add_special = params.get("add_special_tokens", "false").lower() == "true"
    return RepositoryFacts(tokenizer_dir, limits, add_special, end_id, int(params.get("pad_id", str(end_id))))


def load_token_decoder(repo: Path):
    """The repository's own TextCodec (token id -> exact bytes), as its postprocessing model uses it."""
    import importlib.util

    path = Path(repo) / "postprocessing" / "1" / "textcodec.py"
    if not path.is_file():
        raise RepositoryError(f"{path} is missing", hint="rebuild the repository with `toolkit build`, or pass --model-name ensemble")
    spec = importlib.util.spec_from_file_location("_toolkit_repo_textcodec", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TextCodec(path.parent / "tokenizer")


class PromptCodec:
    """Render chat messages with the checkpoint's chat template and count tokens like preprocessing does."""

    def __init__(self, tokenizer_dir: Path, *, add_special_tokens: bool = False):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.add_special_tokens = add_special_tokens
        config = _read_json(Path(tokenizer_dir) / "tokenizer_config.json")
        self.special_tokens = {key: _token_text(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
        source = _chat_template_source(Path(tokenizer_dir), config)
        self.template = _compile_template(source) if source else None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def render_chat(self, messages: list[dict]) -> str:
        """The prompt text for `messages`, ending with the assistant's generation prompt."""
        if self.template is None:
            raise ValueError("this model's tokenizer has no chat template; use /v1/completions")
        return self.template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # older tokenizer_config.json: {"content": "<s>", ...}
        return value.get("content")
    return value


def _chat_template_source(tokenizer_dir: Path, config: dict) -> str | None:
    """transformers 4.43+ saves the template as chat_template.jinja; older versions inline it."""
    jinja = tokenizer_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {item.get("name"): item.get("template") for item in template}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _compile_template(source: str):
    """Compile in a sandbox, with the whitespace settings and helpers chat templates are written for."""
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class StopScanner:
    """Turns a stream of UTF-8 byte pieces into text, holding back what could start a stop string.

    `feed` returns the text that is safe to send now; once a stop string appears, `stopped` is
    set and nothing from the stop string on is ever returned. The held-back tail is at most
    (longest stop string - 1) characters, so a stop string split across pieces is still found.
    """

    def __init__(self, stops: list[str] | None = None):
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = [s for s in (stops or []) if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        text = self.pending + self.decoder.decode(piece)
        if not self.stops:
            self.pending = ""
            return text
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            self.pending = ""
            return text[:cut]
        keep = len(text) - self.hold if self.hold else len(text)
        keep = max(keep, 0)
        self.pending = text[keep:]
        return text[:keep]

    def flush(self) -> str:
        """The held-back text at the end of generation (no stop string completed)."""
        if self.stopped:
            return ""
        text = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return text[:cut]
        return text

    def _first_stop(self, text: str) -> int | None:
        """Where to cut: at the stop string that completes first (then starts first), as a token-by-token
        scan would find it, so the text does not depend on how tokens were grouped into pieces."""
        best = None
        for stop in self.stops:
            i = text.find(stop)
            if i >= 0 and (best is None or (i + len(stop), i) < best):
                best = (i + len(stop), i)
        return best[1] if best else None
