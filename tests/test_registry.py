"""toolkit.registry.by_name: the tables of named records (GPU profiles, embedded models)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from toolkit.model.embedded import EMBEDDED_MODELS
from toolkit.plan.gpus import GPU_PROFILES
from toolkit.registry import by_name


@dataclass(frozen=True)
class Record:
    name: str
    value: int


def test_records_are_keyed_by_name_in_the_order_given():
    table = by_name(Record("b", 1), Record("a", 2))
    assert list(table) == ["b", "a"] and table["a"] == Record("a", 2)


def test_a_name_given_twice_is_refused_instead_of_one_record_silently_lost():
    with pytest.raises(ValueError, match="'a'"):
        by_name(Record("a", 1), Record("a", 2))


def test_the_toolkit_tables_key_each_record_by_its_own_name():
    for table in (GPU_PROFILES, EMBEDDED_MODELS):
        assert table and all(key == record.name for key, record in table.items())
