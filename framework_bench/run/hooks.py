"""A backend's hooks called under the host's guarantee: whatever a hook raises becomes a
`HookError` carrying the plugin's own traceback tail, which the pipeline turns into a `failed`
result naming the hook, never a host crash (framework_bench/plugins/hookspecs.py)."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from framework_bench.plugins import registry as plugins

HOOK_ERROR_FRAMES = 6  # the innermost frames of a hook's traceback kept in a failed result
_RUN = Path(__file__).resolve().parent  # the pipeline's own modules: their frames say nothing of the plugin


class HookError(Exception):
    """A backend hook raised: the run becomes a `failed` result naming the hook, never a host crash."""


def call_hook(hook: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, with any exception turned into a `HookError` carrying the traceback tail."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any plugin bug ends as a failed row
        # The plugin's frames: the host's own (the pipeline, pluggy's dispatch) say nothing.
        frames = [f for f in traceback.extract_tb(e.__traceback__)
                  if Path(f.filename).resolve().parent != _RUN and f.filename != plugins.__file__
                  and f"{os.sep}pluggy{os.sep}" not in f.filename]
        tail = "".join(traceback.format_list(frames[-HOOK_ERROR_FRAMES:]) + traceback.format_exception_only(e))
        raise HookError(f"{hook} raised {type(e).__name__}: {e}\nTraceback (most recent call last):\n{tail}".rstrip()) from e


def tail_of(e: BaseException) -> str:
    return "".join(traceback.format_exception(e)[-HOOK_ERROR_FRAMES:])
