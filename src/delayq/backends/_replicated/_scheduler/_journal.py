"""One queue's records as the scheduler holds them: a :class:`Records` that notes each
change for the log, and what the live images weigh."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ....durable.message import Now, PutRequest, Record, State
from ..._far import Far
from ..._records import Records
from .._codec import decode_records, encode_record, packer, unpack_each
from .._constants import IMAGE_OVERHEAD

__all__ = ["Journal", "image_bytes", "unclaim_each"]


def image_bytes(id: str, payload: bytes, headers: Any, last_error: str | None) -> int:
    """About what a record's image takes in the log (the live bytes are their sum)."""
    size = len(id) + len(payload) + IMAGE_OVERHEAD + len(last_error or "")
    if headers:
        for key, value in headers.items():
            size += len(key) + len(str(value)) + 2
    return size


def _record_bytes(record: Record) -> int:
    return image_bytes(record.id, record.payload, record.headers, record.last_error)


def _decode(images: list[bytes]) -> list[Record]:
    return decode_records(unpack_each(images))


def unclaim_each(store: Records, records: list[Record]) -> None:
    """Give back each of ``records``, claimed for a caller that did not receive them,
    as if never claimed, even if its lease has run out since (:meth:`Records.unclaim`;
    one settled since is left as it is)."""
    for record in records:
        store.unclaim(record.id, record.lease or "")


class Journal(Records):
    """One queue's records that note every change, for the log, and the bytes their
    images take."""

    def __init__(self) -> None:
        self._pack = packer()  # this journal's own: its scheduler's thread only
        super().__init__(self._new_far())
        self.changed: dict[str, Record | None] = {}
        self.size = 0
        #: The far records purges took, whose deletions are not all logged yet: each
        #: purge's set, logged a page at a time by the scheduler (_requests.py), which
        #: takes the newest as its purge's (``aside[-1]``) and drops it once logged.
        self.aside: list[Far] = []

    def _put(self, record: Record, fresh: bool = False) -> Record | None:
        old = Records.write(self, record, fresh)
        if old is not None:
            self.size -= _record_bytes(old)
        self.size += _record_bytes(record)
        return old

    def _new_far(self) -> Far:
        pack = self._pack
        return Far(lambda record: pack(encode_record(record)), _decode)

    def write(self, record: Record, fresh: bool = False) -> Record | None:
        old = self._put(record, fresh)
        self.changed[record.id] = record
        return old

    def put(self, requests: Sequence[PutRequest], now: Now) -> list[int]:
        kept = super().put(requests, now)
        # A put is the one change that brings an id back. One purged whose deletion
        # is not logged yet is taken out of the purge's set, since a replay would
        # delete the new record after its image. (A put that kept a stored message
        # found its id live: in no set.)
        for purged in self.aside:
            for request in requests:
                if not request.generated_id:
                    purged.forget(request.id)
        return kept

    def _set_aside(self, far: Far) -> None:
        self.far = self._new_far()
        self.aside.append(far)

    def purge(self, state: State | None, now: Now, through: int | None = None) -> int:
        aside = len(self.aside)
        purged = super().purge(state, now, through)
        if len(self.aside) > aside:
            # Far's records went unread: what is left is in memory, or far again since
            # (those a resumed purge kept: few).
            left = itertools.chain(self.records.values(), self.far or ())
            self.size = sum(_record_bytes(record) for record in left)
        return purged

    def delete(self, id: str) -> Record:
        old = super().delete(id)
        self.size -= _record_bytes(old)
        self.changed[id] = None
        return old

    def far_images(self, after: str, limit: int) -> tuple[list[Any], str]:
        """The images of up to ``limit`` far records whose id comes after ``after``, as
        the log encodes them (read, not decoded into records), and the last id."""
        rows = [] if self.far is None else self.far.raw_by_id(after, limit)
        return unpack_each([image for _, image in rows]), rows[-1][0] if rows else after

    def close(self) -> None:
        """Let go of the records held out of memory (the scheduler stopped)."""
        assert self.far is not None
        self.far.close()
        for purged in self.aside:
            purged.close()
        self.aside.clear()

    def restore(self, images: list[Any], deletes: list[str], last_seq: int) -> None:
        """Apply a logged operation (replay: nothing is noted)."""
        decoded = decode_records(images)
        if self.far is not None and self.far.count:  # looked up at once
            records = self.records
            far = self.far.get_many([r.id for r in decoded if r.id not in records])
            for id, replaced in far.items():  # read once: taken out unread
                self.far.discard(id)
                self.size -= _record_bytes(replaced)
        for record in decoded:
            self._put(record, True)
        for id in deletes:
            old = self.drop(id)
            if old is not None:
                self.size -= _record_bytes(old)
        self.compact()
        self.last_seq = max(self.last_seq, last_seq)

    def take_changes(self) -> tuple[list[Any], list[str]]:
        images = [encode_record(r) for r in self.changed.values() if r is not None]
        deletes = [id for id, r in self.changed.items() if r is None]
        self.changed.clear()
        return images, deletes
