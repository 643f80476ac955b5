"""The far database's file (``delayq.backends._far``, issue 41 point 2): a named file in
a directory of the user's own, locked while its process lives, so that a ``kill -9``
of a scheduler with millions of far records does not make the kernel free gigabytes
before the broker sees its connection close; the next far database opened on the host
removes the files left behind, and never one a living process holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from delayq.backends import _far

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock")

#: A child that opens a far database, says its file, and waits to be killed.
HOLDER = """
import sys, time
from delayq.backends import _far
far = _far.Far(lambda record: b"", lambda images: [])
far._connection().execute("INSERT INTO far VALUES ('a', 1, 1, x'00')")
print(far._path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def tmpdir_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's and its children's temporary directory: ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _holder() -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def _wait_gone(path: Path, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not path.exists()


@pytest.mark.usefixtures("tmpdir_own")
def test_a_far_database_is_a_named_file_of_its_own_removed_by_its_close() -> None:
    far = _far.Far(lambda record: b"", lambda images: [])
    far._connection()
    path = far._path
    assert path is not None
    assert path.exists()
    assert path.parent == _far.far_directory()
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert _far.remove_left_behind(path.parent) == ([], 0)  # held: never removed
    assert path.exists()
    far.close()
    assert not path.exists()


def test_the_files_of_a_killed_process_are_removed_by_the_next_open_and_a_living_ones_kept(
    tmpdir_own: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_far, "_YOUNG", 0.0)  # the killed one's file is removable at once
    killed, left = _holder()
    living, held = _holder()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert left.exists()  # a kill -9 frees nothing of it: the point
        far = _far.Far(lambda record: b"", lambda images: [])
        far._connection()  # opening one sweeps the directory on a thread of its own
        try:
            assert _wait_gone(left), "the killed process's file was left"
            assert held.exists()  # its process lives: its lock is held
            assert far._path is not None
            assert far._path.exists()
        finally:
            far.close()
    finally:
        living.kill()
        living.wait(10)
    assert _far.remove_left_behind(tmpdir_own / f"delayq-far-{os.getuid()}") == ([held], 0)


def test_a_file_left_a_moment_ago_is_removed_once_old_enough(
    tmpdir_own: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file not held but younger than _YOUNG may be one just made and not locked
    yet: the sweep leaves it, and looks again once it is old enough."""
    monkeypatch.setattr(_far, "_YOUNG", 0.5)
    killed, left = _holder()
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    far = _far.Far(lambda record: b"", lambda images: [])
    far._connection()
    try:
        assert left.exists()
        assert _wait_gone(left, 5.0), "a young file left behind was never removed"
    finally:
        far.close()


def test_a_directory_not_this_users_own_falls_back_to_the_anonymous_database(
    tmpdir_own: Path,
) -> None:
    directory = tmpdir_own / f"delayq-far-{os.getuid()}"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)  # open to others: not used
    assert _far.far_directory() is None
    far = _far.Far(lambda record: b"", lambda images: [])
    far._connection().execute("INSERT INTO far VALUES ('a', 1, 1, x'00')")
    assert far._path is None
    assert list(directory.iterdir()) == []
    far.close()


@pytest.mark.usefixtures("tmpdir_own")
def test_a_process_that_exits_without_closing_its_far_database_leaves_no_file() -> None:
    """An exit (not a kill) with the database open, as the anonymous one left nothing."""
    ended = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(600)", "")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    path = Path(ended.stdout.strip())
    assert path.parent == _far.far_directory()
    assert not path.exists()


@pytest.mark.usefixtures("tmpdir_own")
def test_a_forked_child_that_exits_leaves_its_parents_far_file() -> None:
    script = HOLDER.replace("time.sleep(600)", "") + (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # a normal exit: atexit runs in the child\n"
        "os.waitpid(pid, 0)\n"
        "print(far._path.exists(), flush=True)\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    path, kept = ended.stdout.split()
    assert kept == "True", "the child's exit removed its parent's far file"
    assert not Path(path).exists()  # the parent's own exit did
