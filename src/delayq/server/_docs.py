"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) without the internet.

FastAPI's own pages load Swagger UI and ReDoc from a CDN, so they are blank on a
machine without the internet. Here the same pages (FastAPI's ``get_swagger_ui_html``
and ``get_redoc_html``, without Google's fonts) load the files the ``fastapi-offline``
package ships (a dependency of the ``serve`` extra, never files copied into this
repository), served at :data:`ASSETS_PATH`. ReDoc's bundle still names one image on
its own CDN (the small logo of its "API docs by Redocly" link): the policy below
keeps the browser from fetching it, and ReDoc then leaves the image out. ReDoc runs
its search in a worker it makes from a ``blob:`` of its own script.

Swagger UI starts from an inline script and styles itself inline, which the
dashboard's policy forbids: the page has a policy of its own that allows that one
script (by its hash) and inline styles, and nothing from another origin.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_PATH", "install_docs"]

#: Where the Swagger UI files are served.
ASSETS_PATH = "/docs/assets"
_ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
# A <script> element without attributes: the page's own inline script.
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)
_POLICY = (
    "default-src 'self'; script-src 'self'{scripts}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; "
    "base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a Content-Security-Policy admitting its inline scripts by hash."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(bytes(page.body))
    )
    page.headers["Content-Security-Policy"] = _POLICY.format(scripts=hashes)
    page.headers["X-Content-Type-Options"] = "nosniff"
    page.headers["Referrer-Policy"] = "same-origin"
    page.headers["X-Frame-Options"] = "DENY"
    return page


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and ``/redoc`` of ``app`` (made with ``docs_url=None`` and
    ``redoc_url=None``) from local files."""
    for name in ("swagger-ui-bundle.js", "redoc.standalone.js"):
        if not (_ASSETS_DIR / name).is_file():  # pragma: no cover
            raise RuntimeError(f"fastapi-offline ships no {name} in {_ASSETS_DIR}")
    app.mount(ASSETS_PATH, StaticFiles(directory=_ASSETS_DIR), name="api-docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        assets = root + ASSETS_PATH
        page = get_swagger_ui_html(
            openapi_url=root + str(app.openapi_url),
            title=f"{app.title} API",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=root + "/static/favicon.svg",
            # No badge from the online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )
        return _with_policy(page)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", "")).rstrip("/")
        page = get_redoc_html(
            openapi_url=root + str(app.openapi_url),
            title=f"{app.title} API",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=root + "/static/favicon.svg",
            with_google_fonts=False,
        )
        return _with_policy(page)
