"""A reference run's folder held out of the round's reach: a reference that does not run last in
its round (`design.trial_orders` rotates it) would leave its loss records and update projection
on disk for the runs after it to copy. Its folder is read into the host's memory and removed
until the round's runs have ended, then written back as it was.

In memory because anything the host could find again on disk, a worker of the same user could
find too. The price: a host killed with -9 in between loses that reference's run (the round's
others are recovered unjudged, as when a round is killed before its reference ran), and a disk
full by the round's end loses its folder (its row is kept, the round's others stay unjudged).
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

    def restore(self) -> str | None:
        """None once the folder is back; else (a full disk) why not, the part written removed: no
        half folder is left for anything to read as the run's."""
        try:
            with tarfile.open(fileobj=io.BytesIO(self.archive)) as tar:
                tar.extractall(self.run_dir.parent, filter="fully_trusted")  # the host's own archive of its own folder
        except OSError as e:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            return (f"the reference's run folder {self.run_dir} could not be written back after its round "
                    f"({e.strerror or e}): its files are lost")
        return None


def seal(run_dir: Path) -> Sealed:
    """Read `run_dir` whole into memory and remove it from the disk."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(run_dir, arcname=run_dir.name)
    shutil.rmtree(run_dir)
    return Sealed(run_dir, buffer.getvalue())
