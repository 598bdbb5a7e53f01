"""The toolkit's tables of named records (GPU profiles, embedded models, ...): one dict keyed by name."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


R = TypeVar("R", bound=Named)


def by_name(*records: R) -> dict[str, R]:
    """{record.name: record} in the order given; a name given twice is a mistake in the table."""
    table: dict[str, R] = {}
    for record in records:
        if record.name in table:
            raise ValueError(f"two records are named {record.name!r}")
        table[record.name] = record
    return table
