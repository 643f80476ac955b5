"""SQLite's ack_many and put outcomes: statements that look each id up by primary key."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from delayq.backends.sqlite import statements as sql
from delayq.durable import Queue


def test_ack_many_looks_up_each_pair_by_primary_key(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    with Queue(f"sqlite:///{path}", name="jobs") as queue:
        queue.put_many([{"payload": n} for n in range(50)])
        queue.reserve(max=50, wait=0)  # many active rows: a lease scan would visit them all
        conn = sqlite3.connect(path)
        try:
            conn.execute("ANALYZE")
            params = {"queue": "jobs", "items": json.dumps([["a", "t"]]), "now": 0}
            plan = [
                str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql.ACK_MANY, params)
            ]
        finally:
            conn.close()
        queue.purge()
    text = " ".join(plan)
    # json_each drives the loop; each pair is one seek of the primary key (queue, id)
    assert "SCAN item VIRTUAL TABLE" in text
    assert "USING INDEX sqlite_autoindex_delayq_messages_1 (queue=? AND id=?)" in text
    assert "delayq_messages_lease" not in text
    assert text.index("SCAN item") < text.index("sqlite_autoindex")


def test_kept_puts_are_found_by_primary_key(tmp_path: Path) -> None:
    # INSERT_IGNORE_KEPT runs only when a run of "ignore" rows inserted fewer rows than
    # it had; then it looks each id of the run up once, by primary key.
    path = tmp_path / "q.db"
    with Queue(f"sqlite:///{path}", name="jobs") as queue:
        queue.put_many([{"payload": n, "id": f"m{n}"} for n in range(50)])
        results = queue.put_many_outcomes([{"payload": 0, "id": id} for id in ("m1", "x", "x")])
        assert [result.created for result in results] == [False, True, False]
        conn = sqlite3.connect(path)
        try:
            conn.execute("ANALYZE")
            params = {"queue": "jobs", "ids": json.dumps(["m1", "x", "x"])}
            plan = " ".join(
                str(row[-1])
                for row in conn.execute("EXPLAIN QUERY PLAN " + sql.INSERT_IGNORE_KEPT, params)
            )
        finally:
            conn.close()
        queue.purge()
    assert "USING INDEX sqlite_autoindex_delayq_messages_1 (queue=? AND id=?)" in plan
    assert "SCAN held" not in plan
