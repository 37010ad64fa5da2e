"""A scenario file read as YAML, strictly: a regular file of bounded size, UTF-8, YAML's safe
loader refusing what it would silently resolve (a key given twice, an integer too long to
convert). Every failure is one `Unreadable` line naming the file (and the line, where YAML has one)."""

from __future__ import annotations

from pathlib import Path

import yaml


class Unreadable(Exception):
    """The file cannot be read as a scenario's YAML: the message says why, naming it."""


MAX_FILE_BYTES = 1 << 20  # a scenario is a few hundred bytes: a larger file is not one (/dev/zero, a dataset)


def _read_text(path: Path) -> str:
    """A scenario file's text: a regular file of at most MAX_FILE_BYTES, never an endless device."""
    if path.exists() and not path.is_file():
        raise Unreadable(f"{path}: cannot read: not a regular file")
    with path.open("rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise Unreadable(f"{path}: cannot read: larger than {MAX_FILE_BYTES >> 20} MiB, not a scenario file")
    return data.decode("utf-8")


class _Refused(yaml.YAMLError):
    """YAML that parses but is no scenario's: said with its line, never read another way."""

    def __init__(self, mark, message: str):
        super().__init__(message)
        self.line, self.message = mark.line + 1, message


MAX_DIGITS = 100  # no count or figure of a scenario has more; Python refuses int() past 4300


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, refusing what it would silently resolve: a key given twice (the last
    won) and an integer too long to convert (a ValueError from deep inside the constructor)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key, (str, int, float, bool)):
                    continue
                if key in first:
                    raise _Refused(key_node.start_mark, f"duplicate key {key!r} (first on line {first[key]}): "
                                                        "give each key once")
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > MAX_DIGITS:
            raise _Refused(node.start_mark, f"an integer of {digits} digits: no scenario field holds one")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def load(path: Path) -> object:
    """What the YAML file at `path` holds."""
    try:
        return yaml.load(_read_text(path), Loader=_Loader)  # noqa: S506 - a SafeLoader
    except UnicodeDecodeError as e:
        raise Unreadable(f"{path}: cannot read: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise Unreadable(f"{path}: cannot read: {e.strerror or e}") from None
    except RecursionError:  # the composer recurses once per level: no scenario is nested 1,000 deep
        raise Unreadable(f"{path}: cannot read: nested too deeply to be a scenario") from None
    except _Refused as e:
        raise Unreadable(f"{path}: line {e.line}: {e.message}") from None
    except yaml.YAMLError as e:
        raise Unreadable(f"{path}: cannot read: not YAML: {' '.join(str(e).split())}") from None
