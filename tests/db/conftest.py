from __future__ import annotations

import pytest

from harness.config import Settings
from harness.db.session import Database


@pytest.fixture
def db_settings(tmp_path, database_url) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=database_url, lease_s=30, max_attempts=3)


@pytest.fixture
def db(db_settings):
    database = Database(db_settings)
    yield database
    database.dispose()
