"""The HTTP API (FastAPI). No torch here: a test imports it and checks.

`create_app(settings)` builds the app; `harness serve` runs it with uvicorn.
"""

from harness.api.app import create_app

__all__ = ["create_app"]
