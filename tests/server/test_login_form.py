"""The login form's bad input: a 4xx login page, never a 500, and a form that
presents a token counts against the throttle like a wrong token (issue 33, point 7)."""

from __future__ import annotations

import logging

import pytest

from ._helpers import TOKEN, error_of
from .conftest import MakeClient

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def many_fields(count: int, *, token: str | None) -> bytes:
    """A urlencoded form of ``count`` fields, the first the token when given."""
    fields = [] if token is None else [f"token={token}"]
    fields += [f"f{n}=x" for n in range(count - len(fields))]
    return "&".join(fields).encode()


def test_a_form_of_too_many_fields_is_a_400_page_not_a_500(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    locked = make_client(token=TOKEN)
    caplog.set_level(logging.INFO, logger="delayq")
    for token in (TOKEN, None):
        answer = locked.post("/login", content=many_fields(9, token=token), headers=FORM)
        assert answer.status_code == 400, answer.text
        assert answer.headers["content-type"].startswith("text/html")
        assert "too many fields" in answer.text
        assert 'name="token"' in answer.text  # the form again, to try once more
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    # Even with the right token among them: the form is refused, no session starts.
    assert locked.get("/v1/queues").status_code == 401
    # Eight fields are still a form.
    fine = locked.post(
        "/login", content=many_fields(8, token=TOKEN), headers=FORM, follow_redirects=False
    )
    assert fine.status_code < 400, fine.text  # signed in


def test_a_form_of_too_many_fields_with_a_token_is_a_counted_attempt(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    locked = make_client(token=TOKEN)
    caplog.set_level(logging.WARNING, logger="delayq")
    # Without a token field it is no attempt: nothing counted.
    for _ in range(25):
        assert (
            locked.post("/login", content=many_fields(9, token=None), headers=FORM).status_code
            == 400
        )
    assert not [r for r in caplog.records if r.getMessage().startswith("auth.failed")]
    for _ in range(20):
        answer = locked.post("/login", content=many_fields(9, token="guess"), headers=FORM)
        assert answer.status_code == 400
    failed = [r for r in caplog.records if r.getMessage().startswith("auth.failed")]
    assert len(failed) == 20
    assert "via=login" in failed[0].getMessage()
    # Past the burst the address is throttled, whatever the form holds.
    throttled = locked.post("/login", content=many_fields(9, token="guess"), headers=FORM)
    assert throttled.status_code == 429
    assert int(throttled.headers["retry-after"]) >= 1
    bearer = locked.get("/v1/queues", headers={"Authorization": f"Bearer {TOKEN}"})
    assert error_of(bearer, 429) == "too_many_attempts"
