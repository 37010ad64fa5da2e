"""The host's own clock (issue 20, item 1): each lie about time, told by a third-party
backend that is the torch reference worker with a few lines changed, ends `invalid` naming
the check that caught it; the honest copy ends `ok`; with the checks switched off each lie
would have passed."""

from __future__ import annotations

import pytest

from conftest import LIARS


def test_each_lie_is_the_torch_worker_with_at_most_10_changed_lines(monkeypatch):
    monkeypatch.syspath_prepend(str(LIARS))
    import fbench_lying_worker as kit

    assert kit.changed_lines("honest") == 0
    for lie in kit.LIES:
        assert kit.changed_lines(lie) <= kit.MAX_CHANGED_LINES, lie
        assert kit.lied_source(lie) != kit.worker_path().read_text() or lie == "honest"
