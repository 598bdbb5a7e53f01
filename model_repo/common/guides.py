"""Guided decoding's guides as grammars (llguidance), by the tensorrtllm backend's guide types.

The backend takes a guide type (`json`, `json_schema`, `regex`, `ebnf_grammar`: its utils.cc map) and
a guide string; its xgrammar compiles them on the GPU. The repository's CPU engine compiles the same
guides with llguidance, and the OpenAI API checks every guide here before any engine sees it, so a
schema or grammar that does not compile is the client's error with the compiler's words, on every
target. llguidance rather than xgrammar or outlines-core (measured, /work/notes/cpu_features.md):
7.6 MB with no dependencies (xgrammar pulls 1 GB of triton), ~1 ms to compile a schema
(outlines-core 400-640 ms), every kind the backend has (outlines-core: no EBNF), and valid JSON from
a random model (xgrammar let raw control bytes into strings).

- `json`: any JSON object (what OpenAI's json_object asks; the backend's type takes no guide).
- `json_schema`: the guide is a JSON schema; output is compact JSON (no free whitespace, where small
  models loop).
- `regex`: the guide is a regular expression the whole output matches.
- `ebnf_grammar`: the guide is an EBNF grammar in xgrammar's (GBNF) notation, `root ::= ...`, or Lark.
"""

from __future__ import annotations

import json

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
ANY_JSON_OBJECT = '{"type": "object"}'
JSON_OPTIONS = {"whitespace_flexible": False}


class GuideError(ValueError):
    """A guide that cannot be compiled: the client's error; the message names what is wrong."""


def grammar_for(guide_type: str, guide: str | None) -> str:
    """The llguidance grammar of a guide (not yet checked: see check_guide)."""
    from llguidance import LLMatcher

    if guide_type not in GUIDE_TYPES:
        raise GuideError(
            f"guided_decoding_guide_type {guide_type!r} is not one of {', '.join(GUIDE_TYPES)}"
        )
    if guide_type != "json" and not guide:
        raise GuideError(f"a {guide_type} guide needs its text in guided_decoding_guide")
    try:
        if guide_type == "json":
            return LLMatcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=JSON_OPTIONS)
        if guide_type == "json_schema":
            json.loads(guide)  # llguidance's own message for bad JSON names no position
            return LLMatcher.grammar_from_json_schema(guide, defaults=JSON_OPTIONS)
        if guide_type == "regex":
            return LLMatcher.grammar_from_regex(guide)
        return LLMatcher.grammar_from_lark(_lark(guide))
    except GuideError:
        raise
    except ValueError as exc:  # json's and llguidance's errors
        raise GuideError(f"the {guide_type} guide does not compile: {exc}") from None


def _lark(grammar: str) -> str:
    """An EBNF (GBNF) grammar in Lark notation, which llguidance compiles; Lark stays as it is."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        return any_to_lark(grammar)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare Exception for an unknown rule
        raise GuideError(f"the ebnf_grammar guide does not compile: {exc}") from None


def check_guide(guide_type: str, guide: str | None) -> str:
    """The guide's grammar, compiled once to check it; GuideError with the compiler's message if it fails."""
    from llguidance import LLMatcher

    grammar = grammar_for(guide_type, guide)
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise GuideError(f"the {guide_type} guide does not compile: {error}")
    return grammar
