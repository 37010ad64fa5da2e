"""A reference run's folder held out of the round's reach: a reference that does not run last in
its round (`design.trial_orders` rotates it) would leave its loss records and update projection
on disk for the runs after it to copy. Its folder is read into the host's memory and removed
until the round's runs have ended, then written back as it was.

In memory because anything the host could find again on disk, a worker of the same user could
find too. The price: a host killed with -9 in between loses that reference's run (the round's
others are recovered unjudged, as when a round is killed before its reference ran).
"""

from __future__ import annotations

import io
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sealed:
    """A run folder taken off the disk: `restore` puts it back where it was."""

    run_dir: Path
    archive: bytes

    def restore(self) -> None:
        with tarfile.open(fileobj=io.BytesIO(self.archive)) as tar:
            tar.extractall(self.run_dir.parent, filter="fully_trusted")  # the host's own archive of its own folder


def seal(run_dir: Path) -> Sealed:
    """Read `run_dir` whole into memory and remove it from the disk."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(run_dir, arcname=run_dir.name)
    shutil.rmtree(run_dir)
    return Sealed(run_dir, buffer.getvalue())
