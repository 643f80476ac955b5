"""``python -m delayq.cli``: the ``delayq`` command."""

from ._main import main

main(prog_name="delayq")
