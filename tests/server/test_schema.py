"""Schemathesis against /openapi.json: whatever a client sends (valid or not), the
server never answers 5xx, and every answer matches the documented schema, status
and content type. About 200 examples in all, derandomized so runs repeat."""

from __future__ import annotations

import uuid
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from delayq.server import ServeConfig, create_app

# Every example writes to this store; a fresh one per test session.
APP = create_app(
    ServeConfig(
        url=f"memory://schema-{uuid.uuid4().hex}",
        dispatch=False,
        # The name schemathesis reaches an ASGI app by.
        allowed_hosts=("testserver",),
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@schema.parametrize()
@settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)
