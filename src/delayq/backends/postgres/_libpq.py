"""One statement through libpq's own calls, without a psycopg cursor: the exchange
as a generator that does no I/O of its own (driven by :mod:`._async.drive` and its
generated sync twin, each face waiting with its own primitive), and the error a failed
result stands for.

Only :mod:`psycopg.pq` (psycopg's documented libpq wrapper, ``Connection.pgconn``)
and :func:`psycopg.errors.lookup` are used. The put of one message goes this way
(:class:`~.statements.Prepared`): psycopg's cursor, parameter adaptation and
prepared-statement bookkeeping were about a sixth of that put's time.
"""

from __future__ import annotations

from collections.abc import Generator

import psycopg
from psycopg import pq

__all__ = ["READ", "WRITE", "Exchange", "checked", "exchange"]

#: What :func:`exchange` waits for on the socket, and what its driver says is ready.
READ = 1
WRITE = 2

#: Yields (socket, READ/WRITE wanted), is sent what became ready, returns the results.
Exchange = Generator[tuple[int, int], int, list[pq.abc.PGresult]]

_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)


def exchange(pgconn: pq.abc.PGconn) -> Exchange:
    """After a ``send_*`` call on ``pgconn`` (in nonblocking mode, as psycopg keeps
    it): finish sending, then read every result of the command."""
    fd = pgconn.socket
    while pgconn.flush():  # 1: part of the command is still to be sent
        ready = yield fd, READ | WRITE
        if ready & READ:  # the server may answer (or fail) before taking it all
            pgconn.consume_input()
    results: list[pq.abc.PGresult] = []
    while True:
        while pgconn.is_busy():
            yield fd, READ
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            return results
        results.append(result)


def checked(results: list[pq.abc.PGresult], encoding: str) -> pq.abc.PGresult:
    """The last of a command's ``results``, or the error it reports raised: the class
    psycopg has for its SQLSTATE (``UniqueViolation``...), or ``OperationalError``
    when there is none (the connection broke)."""
    if not results:
        raise psycopg.OperationalError("the server sent no result")
    result = results[-1]
    if result.status in _OK:
        return result
    message = (result.error_message or b"").decode(encoding, "replace").strip()
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    if state is None:
        raise psycopg.OperationalError(message or "the connection to the server broke")
    try:
        error = psycopg.errors.lookup(state.decode("ascii"))
    except KeyError:
        error = psycopg.DatabaseError
    raise error(message)
