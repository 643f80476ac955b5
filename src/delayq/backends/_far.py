"""Scheduled messages due far ahead, kept out of process memory: the replicated
scheduler's records (``delayq.backends._replicated``) beyond the earliest few tens of
thousands waiting, in a private SQLite database of the process (issue 41, point 1).

:class:`~delayq.backends._records.Records` holds in memory every message due before
its ``far_from`` and hands those due at or after it to a :class:`Far`, which keeps each
as one row: the id, the due time and sequence (the order claims take), the record's
encoded image. Nothing here is durable, nor needs to be: the log is the truth, and a
scheduler that restarts folds it again. Its pages stay in a bounded cache.

The database is a named file in a directory of the user's own in the temporary
directory (:func:`far_directory`), held under an exclusive ``flock`` while it is open,
and removed by :meth:`Far.close`. It is not SQLite's anonymous database (a file
unlinked as it is opened) because of what a ``kill -9`` costs then: the kernel frees an
unlinked file's blocks as the dead process's files are closed, before its sockets are
(gigabytes at ten million records: 0.8 s), and the broker hands the scheduler's lead
over only once its connection closed. A named file costs its death nothing; the next
:class:`Far` to open on the host removes the files no living process holds (their lock
came free with their owner), on a thread of its own. Where the directory cannot be
made its own (another user's, or none), the anonymous database is used.

Writes wait in a dict (``pending``, by id: the record, or None for a row to delete)
and go to the table a batch at a time; a read by id looks there first, a read in order
writes them first.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from ..durable.message import Record

if sys.platform != "win32":
    import fcntl

__all__ = ["Far", "far_directory", "remove_left_behind"]

#: Pending writes that go to the table in one batch.
_FLUSH_AT: Final = 2048
#: The ids of one look-up (SQLite takes at most 32,766 parameters).
_IN_AT_ONCE: Final = 500
#: The page cache of the database (KiB): what it holds in memory at most.
_CACHE_KIB: Final = 8192

_SCHEMA = """
CREATE TABLE far (
    id TEXT PRIMARY KEY,
    due_at INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    image BLOB NOT NULL
) WITHOUT ROWID;
CREATE INDEX far_due ON far (due_at, seq);
"""


#: The name of a far database's file: ``far-<pid>-<random>.db``.
_PREFIX: Final = "far-"
_SUFFIX: Final = ".db"
#: A file younger than this (seconds) is left to its maker: between its creation and
#: its lock, another process could take it for one left behind.
_YOUNG: Final = 10.0


#: The named files of the open far databases, each with the process that made it:
#: removed at that process's exit if still there (an exit that did not close them), as
#: an anonymous database would go; a forked child's exit leaves its parent's alone.
_OPEN: dict[Path, int] = {}


@atexit.register
def _remove_open() -> None:
    me = os.getpid()
    for path, pid in list(_OPEN.items()):
        if pid == me:
            with contextlib.suppress(OSError):
                path.unlink()
            del _OPEN[path]


def far_directory() -> Path | None:
    """The directory of this user's far databases (made if missing, mode 0700), or None
    when it exists and is not this user's own, or cannot be made (or on Windows)."""
    if sys.platform == "win32":
        return None
    path = Path(tempfile.gettempdir()) / f"delayq-far-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        status = path.lstat()
    except OSError:
        return None
    if not path.is_dir() or path.is_symlink() or status.st_uid != os.getuid():
        return None
    if status.st_mode & 0o077:
        return None
    return path


def remove_left_behind(directory: Path, *, keep: Path | None = None) -> tuple[list[Path], int]:
    """Remove the far databases in ``directory`` that no process holds (their owner
    died, a ``kill -9``), but ``keep`` and those younger than :data:`_YOUNG`: the paths
    removed, and how many young ones were left. Freeing their blocks happens here (the
    GIL let go meanwhile)."""
    removed, young = [], 0
    if sys.platform == "win32":
        return removed, young
    now = time.time()
    for path in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        if path == keep:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its process lives
                continue
            if now - os.fstat(fd).st_mtime < _YOUNG:
                young += 1
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
        finally:
            os.close(fd)  # the last reference: its blocks are freed here
    return removed, young


def _sweep(directory: Path, keep: Path) -> None:
    """:func:`remove_left_behind`, again after :data:`_YOUNG` while it left young ones
    (a scheduler killed just before this one opened its database)."""
    while remove_left_behind(directory, keep=keep)[1]:
        time.sleep(_YOUNG)


class Far:
    """Scheduled records kept in a private SQLite database: by id, and in ``(due_at,
    seq)`` order. The caller holds each id in one place at a time: :meth:`add` is
    given a record whose id is not here (it took the old one with :meth:`pop`)."""

    def __init__(
        self,
        encode: Callable[[Record], bytes],
        decode: Callable[[list[bytes]], list[Record]],
    ) -> None:
        self._encode = encode
        self._decode = decode
        self._db: sqlite3.Connection | None = None
        self._path: Path | None = None  # its named file, if any
        self._lock_fd = -1  # holds the flock on it
        self.pending: dict[str, Record | None] = {}
        #: How many records are here.
        self.count = 0

    def _connection(self) -> sqlite3.Connection:
        db = self._db
        if db is None:
            # Opened at the first record: a scheduler that never holds many pays nothing.
            db = sqlite3.connect(self._named(), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            db.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
            db.executescript(_SCHEMA)
            self._db = db
        return db

    def _named(self) -> str:
        """A new named file of its own, locked, and a sweep of those left behind started;
        "" (SQLite's anonymous database) when there is no directory for it."""
        directory = far_directory()
        if directory is None:
            return ""
        path = directory / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}{_SUFFIX}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            return ""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a sweep took it for one left behind: it removes it later
            os.close(fd)
            return ""
        self._path, self._lock_fd = path, fd
        _OPEN[path] = os.getpid()
        sweep = threading.Thread(
            target=_sweep, args=(directory, path), name="delayq-far-sweep", daemon=True
        )
        sweep.start()
        return str(path)

    def close(self) -> None:
        """Drop every record and the database (its file goes with it)."""
        db, self._db = self._db, None
        path, self._path = self._path, None
        fd, self._lock_fd = self._lock_fd, -1
        self.pending.clear()
        self.count = 0
        if db is not None:
            db.close()
        if path is not None:
            _OPEN.pop(path, None)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if fd >= 0:
            os.close(fd)

    def add(self, record: Record) -> None:
        self.pending[record.id] = record
        self.count += 1
        if len(self.pending) >= _FLUSH_AT:
            self.flush()

    def get(self, id: str) -> Record | None:
        pending = self.pending
        if id in pending:
            return pending[id]
        if not self.count:
            return None
        row = self._connection().execute("SELECT image FROM far WHERE id = ?", (id,)).fetchone()
        return None if row is None else self._decode([row[0]])[0]

    def get_many(self, ids: list[str]) -> dict[str, Record]:
        """The records here of ``ids``, by id (one look-up a few hundred at a time)."""
        found: dict[str, Record] = {}
        if not self.count or not ids:
            return found
        pending = self.pending
        asked: list[str] = []
        for id in ids:
            if id in pending:
                record = pending[id]
                if record is not None:
                    found[id] = record
            else:
                asked.append(id)
        db = self._connection()
        for at in range(0, len(asked), _IN_AT_ONCE):
            part = asked[at : at + _IN_AT_ONCE]
            marks = ",".join("?" * len(part))
            images = [
                image
                for (image,) in db.execute(f"SELECT image FROM far WHERE id IN ({marks})", part)
            ]
            for record in self._decode(images):
                found[record.id] = record
        return found

    def discard(self, id: str) -> None:
        """Take the record of ``id`` out unread: the caller read it (it is here)."""
        self.pending[id] = None
        self.count -= 1
        if len(self.pending) >= _FLUSH_AT:
            self.flush()

    def pop(self, id: str) -> Record | None:
        """Take the record of ``id`` out (None: not here)."""
        record = self.get(id)
        if record is not None:
            self.discard(id)
        return record

    def flush(self) -> None:
        pending = self.pending
        if not pending:
            return
        encode = self._encode
        rows = [(r.id, r.due_at, r.seq, encode(r)) for r in pending.values() if r is not None]
        gone = [(id,) for id, r in pending.items() if r is None]
        pending.clear()
        db = self._connection()
        db.execute("BEGIN")
        try:
            if gone:
                db.executemany("DELETE FROM far WHERE id = ?", gone)
            if rows:
                db.executemany("INSERT OR REPLACE INTO far VALUES (?, ?, ?, ?)", rows)
        finally:
            db.execute("COMMIT")

    def take(self, limit: int) -> tuple[list[Record], tuple[int, int] | None]:
        """Take out the first ``limit`` records in ``(due_at, seq)`` order; and the
        ``(due_at, seq)`` of the first one left (None: none left)."""
        if not self.count:
            return [], None
        self.flush()
        db = self._connection()
        rows = db.execute(
            "SELECT due_at, seq, image FROM far ORDER BY due_at, seq LIMIT ?", (limit,)
        ).fetchall()
        if rows:
            db.execute("DELETE FROM far WHERE (due_at, seq) <= (?, ?)", rows[-1][:2])
            self.count -= len(rows)
        left = db.execute("SELECT due_at, seq FROM far ORDER BY due_at, seq LIMIT 1").fetchone()
        return self._decode([row[2] for row in rows]), None if left is None else (left[0], left[1])

    def after(self, position: tuple[int, ...] | None, limit: int) -> list[Record]:
        """Up to ``limit`` records after ``position`` (``(due_at, seq)``), in that order."""
        if not self.count or limit <= 0:
            return []
        self.flush()
        due_at, seq = (-(1 << 62), 0) if position is None else position[:2]
        cursor = self._connection().execute(
            "SELECT image FROM far WHERE (due_at, seq) > (?, ?) ORDER BY due_at, seq LIMIT ?",
            (due_at, seq, limit),
        )
        return self._decode([image for (image,) in cursor])

    def due_counts(self, now_ms: int, width: int, buckets: int) -> list[tuple[int, int]]:
        """``(i, n)``: ``n`` records due after ``now_ms`` whose ``(due_at - now_ms) //
        width`` is ``i``, for each ``i`` below ``buckets`` that has any (the buckets of
        :func:`~delayq.durable.inspection.count_due`): a range of the due index,
        grouped by SQLite, nothing decoded."""
        if not self.count:
            return []
        self.flush()
        cursor = self._connection().execute(
            "SELECT (due_at - :now) / :width, COUNT(*) FROM far"
            " WHERE due_at > :now AND due_at < :now + :width * :buckets"
            " GROUP BY (due_at - :now) / :width",
            {"now": now_ms, "width": width, "buckets": buckets},
        )
        return cursor.fetchall()

    def raw_by_id(self, after: str, limit: int) -> list[tuple[str, bytes]]:
        """:meth:`by_id`'s ids and images, not decoded."""
        if not self.count:
            return []
        self.flush()
        cursor = self._connection().execute(
            "SELECT id, image FROM far WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
        )
        return cursor.fetchall()

    def by_id(self, after: str, limit: int) -> list[Record]:
        """Up to ``limit`` records whose id comes after ``after``, in the ids' order (a
        walk of every record that records added or taken meanwhile do not upset)."""
        return self._decode([image for _, image in self.raw_by_id(after, limit)])

    def ids_after(self, after: str, limit: int) -> list[str]:
        """Up to ``limit`` ids after ``after``, in order, read, not taken out (a purged
        set's, logged a page at a time)."""
        if not self.count:
            return []
        self.flush()
        cursor = self._connection().execute(
            "SELECT id FROM far WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
        )
        return [id for (id,) in cursor]

    def forget(self, id: str) -> None:
        """Take the record of ``id`` out unread, if it is here."""
        pending = self.pending
        if id in pending:
            if pending[id] is not None:
                self.discard(id)
        elif (
            self.count
            and self._connection().execute("SELECT 1 FROM far WHERE id = ?", (id,)).fetchone()
        ):
            self.discard(id)

    def take_newer(self, seq: int) -> list[Record]:
        """Take out every record of a sequence number after ``seq`` (a whole walk: the
        rare resumed purge's, _records.py)."""
        if not self.count:
            return []
        self.flush()
        db = self._connection()
        images = [image for (image,) in db.execute("SELECT image FROM far WHERE seq > ?", (seq,))]
        if images:
            db.execute("DELETE FROM far WHERE seq > ?", (seq,))
            self.count -= len(images)
        return self._decode(images)

    def __iter__(self) -> Iterator[Record]:
        """Every record, a page at a time."""
        after = ""
        while page := self.by_id(after, 1000):
            yield from page
            after = page[-1].id
