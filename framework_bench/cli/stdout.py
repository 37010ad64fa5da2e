"""The command line's standard output, guarded: a closed one (`fbench scenarios >&-`) or one
that cannot take what is written (`> /dev/full`) ends the command with one line on stderr and
exit 1, never a traceback. A closed stdout is refused before anything runs: its descriptor
would go to the next file opened, and the tables with it."""

from __future__ import annotations

import errno
import os
import sys

from framework_bench.cli.common import Typer


class OutputFailed(Exception):
    """Standard output refused a write (a full disk, an I/O error): not an OSError, so that no
    handler of the command's own OSErrors takes it for one of them."""


class _Guarded:
    """sys.stdout while a command runs: its failures raised as `OutputFailed`. A closed pipe
    (`fbench ... | head`) stays the EPIPE that click and rich end quietly."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise _failed(e) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise _failed(e) from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _failed(e: OSError) -> OSError | OutputFailed:
    return e if e.errno == errno.EPIPE else OutputFailed(e.strerror or str(e))


def _say(message: str) -> None:
    if sys.stderr is not None:
        sys.stderr.write(f"error: {message}\n")


class App(Typer):
    """The typer app, run as the `fbench` script, its standard output guarded (typer's test
    runner calls the command itself, with its own streams)."""

    def __call__(self, *args, **kwargs):
        if sys.stdout is None:
            _say("standard output is closed: fbench writes its tables and JSON there (redirect it to a file, "
                 "or to /dev/null)")
            raise SystemExit(1)
        stream = sys.stdout
        sys.stdout = _Guarded(stream)
        try:
            try:
                return super().__call__(*args, **kwargs)
            finally:  # what print() left buffered, written while its failure can still be said
                sys.stdout.flush()
        except OutputFailed as e:
            # the unwritten rest goes to /dev/null, so that the interpreter's last flush cannot fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            _say(f"cannot write to standard output: {e}")
            raise SystemExit(1) from None
        finally:
            sys.stdout = stream
