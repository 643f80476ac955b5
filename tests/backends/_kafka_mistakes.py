"""The ways a first connection to Kafka fails, against a private Tansu broker or a
closed port: each case's URL and the one line delayq says (its password hidden)."""

from __future__ import annotations

from ._postgres_mistakes import closed_port

__all__ = ["NAMES", "mistakes"]

#: The mistakes, in the order of :func:`mistakes`.
NAMES = ("down", "tls file", "no idempotent producer")


def mistakes(bootstrap: str) -> dict[str, tuple[str, type[Exception], str]]:
    """mistake -> (its URL, whose password is never shown; the error every face
    raises; what it says). ``bootstrap``: a running Tansu broker."""
    port = closed_port()
    down = f"kafka://svc:hunter2@127.0.0.1:{port}?security_protocol=SASL_SSL&request_timeout=5"
    return {
        "down": (
            down,
            ConnectionError,
            f"cannot use the queue at {down.replace('hunter2', '***')}: "
            f"no Kafka broker answers at 127.0.0.1:{port}",
        ),
        "tls file": (
            f"kafka://{bootstrap}?security_protocol=SSL&ssl_cafile=/nonexistent/ca.pem",
            ValueError,
            "cannot use the TLS files (ssl_cafile=/nonexistent/ca.pem): ",
        ),
        # Tansu has no InitProducerId (docs/kafka.md); Kafka grants it
        "no idempotent producer": (
            f"kafka://{bootstrap}?prefix=delayq-mistakes&request_timeout=5",
            ValueError,
            "the Kafka broker refused an idempotent producer (",
        ),
    }
