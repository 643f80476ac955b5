"""Small helpers of the HTTP API tests."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from delayq.server._auth import SESSION_HEADER

#: A token long enough for ServeConfig.
TOKEN = "s3cret-token-for-tests"


def put(client: TestClient, queue: str = "q", **body: Any) -> str:
    """Put one message (payload 1 unless given); return its id. The answer must be
    201 with ``created`` true, or 200 with ``created`` false (an existing id kept)."""
    if "payload_base64" not in body:
        body.setdefault("payload", 1)
    response = client.post(f"/v1/queues/{queue}/messages", json=body)
    assert response.status_code in {200, 201}, response.text
    assert response.json()["created"] is (response.status_code == 201), response.text
    return str(response.json()["id"])


def stats(client: TestClient, queue: str = "q") -> dict[str, Any]:
    """The queue's stats as the API shows them."""
    response = client.get(f"/v1/queues/{queue}/stats")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def error_of(response: Any, status: int) -> str:
    """Assert ``response`` is the JSON error ``status``; return its code."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert isinstance(body["error"]["message"], str)
    return str(body["error"]["code"])


def session_of(page: str) -> str:
    """The session value the login's answer hands to the dashboard's script."""
    found = re.search(r'data-session="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


def signed_in(client: TestClient, token: str = TOKEN) -> dict[str, str]:
    """Log in through the dashboard's form; the header of the session, as the
    dashboard's script sends it."""
    response = client.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert response.status_code == 200, response.text
    assert "set-cookie" not in response.headers
    return {SESSION_HEADER: session_of(response.text)}


#: The header of a POST without a body (the API takes only JSON requests).
JSON_TYPE = {"content-type": "application/json"}
