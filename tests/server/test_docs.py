"""``/docs``: Swagger UI from the files of an installed package, no CDN; its own
Content-Security-Policy, while the dashboard's stays strict. (The browser test with
the network blocked is in ``tests/e2e/test_dashboard_browser.py``.)"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi.testclient import TestClient

from delayq.server._docs import ASSETS_PATH


def test_docs_load_only_local_files(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources
    assert all(source.startswith("/") and not source.startswith("//") for source in sources)
    assert "url: '/openapi.json'" in page.text
    for source in sources:
        assert client.get(source).status_code == 200, source
    assert (
        client.get(f"{ASSETS_PATH}/swagger-ui-bundle.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )


def test_docs_have_a_policy_that_admits_their_one_inline_script(client: TestClient) -> None:
    page = client.get("/docs")
    policy = page.headers["content-security-policy"]
    (script,) = re.findall(r"<script>(.*?)</script>", page.text, re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"script-src 'self' 'sha256-{digest}';" in policy
    assert "http" not in policy
    assert "frame-ancestors 'none'" in policy
    # The dashboard's own policy is unchanged: no inline script at all.
    dashboard = client.get("/").headers["content-security-policy"]
    assert "script-src 'self';" in dashboard
    assert "unsafe-inline" not in dashboard


def test_redoc_loads_only_local_files(client: TestClient) -> None:
    page = client.get("/redoc")
    assert page.status_code == 200
    assert "http://" not in page.text
    assert "https://" not in page.text
    sources = re.findall(r'(?:src|href|spec-url)="([^"]+)"', page.text)
    assert f"{ASSETS_PATH}/redoc.standalone.js" in sources
    for source in sources:
        assert client.get(source).status_code == 200, source
    policy = page.headers["content-security-policy"]
    assert "http" not in policy
    assert "img-src 'self' data:;" in policy  # ReDoc's logo from its CDN is not fetched
