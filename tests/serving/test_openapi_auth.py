"""The OpenAPI schema sits behind the API key: without one configured it is open, with one it
answers 401 to a missing or wrong bearer token; the interactive docs are not served."""

from __future__ import annotations

import httpx

from conductor_pipeline.serving.server import BackgroundServer
from tests.serving.test_app import KEY, make_service


def test_schema_needs_the_key_when_one_is_configured():
    with BackgroundServer(make_service(api_key=KEY)) as server:
        server.wait_ready()
        missing = httpx.get(f"{server.url}/openapi.json")
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_api_key"
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": "Bearer sk-no"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        given = httpx.get(f"{server.url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
        assert given.status_code == 200
        assert "/v1/chat/completions" in given.json()["paths"]
        for page in ("/docs", "/redoc"):
            assert httpx.get(f"{server.url}{page}").status_code == 404


def test_schema_is_open_when_no_key_is_configured():
    with BackgroundServer(make_service(api_key=None)) as server:
        server.wait_ready()
        schema = httpx.get(f"{server.url}/openapi.json")
        assert schema.status_code == 200
        assert "/openapi.json" not in schema.json()["paths"]
