"""Shared test setup: every test gets its own toolkit home (caches, engines) in a temp dir."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def toolkit_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("toolkit-home")
    monkeypatch.setenv("TOOLKIT_HOME", str(home))
    return home
