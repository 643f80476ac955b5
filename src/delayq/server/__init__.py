"""``delayq serve``: the delay queue as an HTTP service (FastAPI on uvicorn).

:func:`create_app` builds the application for a :class:`ServeConfig`: the ``/v1``
JSON API (put, get, cancel, reschedule, reserve with long-poll, ack/nack/extend,
stats, dead letters), ``/healthz``, ``/metrics``, the callback dispatcher and the
dashboard. Needs the ``serve`` extra (``pip install 'delayq[serve]'``).
:func:`verify` checks a callback request's ``X-Delayq-Signature`` (for a Python
receiver: v3, over the method, URL, message id, queue, attempt, content type and
body, when given all of them; v2, without the queue, attempt and content type; else
v1, over the body); :func:`sign` makes
one; :func:`message_id_from_header` and :func:`queue_from_header` turn an
``X-Delayq-Message-Id`` or ``X-Delayq-Queue`` header back into the message id or
queue name (one a header cannot carry as it is arrives encoded).
"""

from ._app import create_app, request_stop
from ._callbacks import message_id_from_header, queue_from_header, sign, verify
from ._config import ServeConfig

__all__ = [
    "ServeConfig",
    "create_app",
    "message_id_from_header",
    "queue_from_header",
    "request_stop",
    "sign",
    "verify",
]
