"""The two query languages the rendered rules are written in, read here by their grammars: KEDA's
Prometheus queries (selectors, and the values they give over a set of series) and the endpoint
picker's metric specs NAME{k=v,...}.
"""

from __future__ import annotations

import re

METRIC_SPEC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^{}]*)\})?$")
PROMQL_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")


def promql_selectors(query: str) -> list[tuple[str, dict]]:
    """(metric, {label: value}) of every selector in a query; only `label="value"` matchers are allowed."""
    found = []
    for name, body in PROMQL_SELECTOR.findall(query):
        labels = {}
        for matcher in filter(None, (m.strip() for m in body.split(","))):
            match = re.fullmatch(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', matcher)
            assert match, f"{matcher!r} in {query!r} is not an equality matcher"
            labels[match.group(1)] = match.group(2)
        found.append((name, labels))
    return found


PROMQL_TOKEN = re.compile(
    r"\s*(?:(?P<number>[0-9]+(?:\.[0-9]+)?)|(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<matchers>\{[^{}]*\})?"
    r"|(?P<punct>[-+(),*]))"
)


def promql_value(query: str, series: list[tuple[str, dict, float]]) -> float | None:
    """The value KEDA reads from `query` over `series` (metric, labels, value): the PromQL the
    ScaledObject uses (selectors with = matchers, sum, sum by, clamp_min, + and - matching on
    identical label sets, a number times an expression). None when the result is empty (KEDA: no
    value, its fallback)."""
    tokens = [m for m in PROMQL_TOKEN.finditer(query)]
    assert "".join(m.group(0) for m in tokens).strip() == query.strip(), query
    position = 0

    def take(text: str | None = None):
        nonlocal position
        token = tokens[position]
        assert text is None or token.group(0).strip() == text, (query, position, text)
        position += 1
        return token

    def peek() -> str:
        return tokens[position].group(0).strip() if position < len(tokens) else ""

    def term() -> dict:
        token = take()
        if token.group("number"):
            take("*")
            return {k: float(token.group("number")) * v for k, v in term().items()}
        name = token.group("name")
        if name == "clamp_min":
            take("(")
            inner = expression()
            take(",")
            low = float(take().group("number"))
            take(")")
            return {k: max(v, low) for k, v in inner.items()}
        if name == "sum":
            by: tuple[str, ...] = ()
            if peek() == "by":
                take("by")
                take("(")
                by = (take().group("name"),)
                take(")")
            take("(")
            inner = expression()
            take(")")
            out: dict = {}
            for key, value in inner.items():
                group = tuple((k, v) for k, v in key if k in by)
                out[group] = out.get(group, 0.0) + value
            return out
        if token.group(0).strip() == "(":
            inner = expression()
            take(")")
            return inner
        wanted = (
            dict(promql_selectors(token.group(0).strip())[0][1]) if token.group("matchers") else {}
        )
        return {
            tuple(sorted(labels.items())): float(value)
            for metric, labels, value in series
            if metric == name and all(labels.get(k) == v for k, v in wanted.items())
        }

    def expression() -> dict:
        left = term()
        while peek() in ("+", "-"):
            sign = 1 if take().group(0).strip() == "+" else -1
            right = term()
            left = {k: v + sign * right[k] for k, v in left.items() if k in right}
        return left

    result = expression()
    assert position == len(tokens), query
    assert len(result) <= 1, f"{query} returns {len(result)} series: KEDA needs one"
    return next(iter(result.values()), None)


def spec_selector(spec: str) -> tuple[str, dict]:
    """An EPP metric spec NAME{k=v,...} as (metric, labels), by its grammar (metrics_spec.go)."""
    match = METRIC_SPEC.match(spec)
    assert match, spec
    pairs = [p.split("=") for p in (match.group(3) or "").split(",") if p.strip()]
    return match.group(1), {k.strip(): v.strip() for k, v in pairs}
