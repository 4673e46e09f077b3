"""Storage: ORM models, the engine and session factory, crud (the only module that commits), reads,
and the Alembic migrations that own the schema. No torch here."""
