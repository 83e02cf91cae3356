"""Output directories we write as a whole (sliced checkpoints, HF exports, strategy folders): we replace only
what we own.

A directory we wrote carries a marker (`.mindrlhf_output.json`) naming the tool and the entries it owns (names
or glob patterns, e.g. `rank_*`). Writing into an existing directory is allowed when it is empty or holds only
the entries its marker claims for the same tool; anything else (a user's notes, a checkpoint of another
program, an export of another of our tools) is refused naming the first foreign entry, unless `overwrite`.
A symlinked destination stays a symlink: its target is what gets written.
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
from typing import Iterable, List, Optional

from mindrlhf.errors import ConfigError
from mindrlhf.utils.atomic import atomic_dir, write_json

MARKER = ".mindrlhf_output.json"


def _marker(path: str) -> Optional[dict]:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def foreign_entries(path: str, tool: str) -> List[str]:
    """The entries of `path` that are not ours to replace (sorted); [] for a missing or empty directory."""
    if not os.path.exists(path):
        return []
    if not os.path.isdir(path):
        return [os.path.basename(path.rstrip("/"))]
    names = sorted(os.listdir(path))
    marker = _marker(path)
    if marker is None or marker.get("tool") != tool:
        return names
    owned = [str(p) for p in marker.get("entries", [])]
    return [n for n in names if n != MARKER and not any(fnmatch.fnmatchcase(n, p) for p in owned)]


def check_output_dir(path: str, tool: str, flag: str, overwrite: bool = False) -> str:
    """The real directory to write (a symlink resolved); a ConfigError naming `flag` and the first foreign
    entry when `path` holds something that is not this tool's output (unless `overwrite`)."""
    real = os.path.realpath(path)
    if overwrite:
        if os.path.exists(real) and not os.path.isdir(real):
            raise ConfigError(f"{flag} {path}: is a file, not a directory")
        return real
    foreign = foreign_entries(real, tool)
    if foreign:
        what = ("is a file, not a directory" if not os.path.isdir(real) else
                f"holds {foreign[0]!r}" + (f" and {len(foreign) - 1} more entr{'y' if len(foreign) == 2 else 'ies'}"
                                           if len(foreign) > 1 else "") + f", which {tool} did not write")
        raise ConfigError(f"{flag} {path}: {what}. Choose an empty or new directory, or pass --overwrite "
                          f"(what is there may then be replaced)")
    return real


def write_marker(directory: str, tool: str, entries: Iterable[str]):
    write_json(os.path.join(directory, MARKER), {"tool": tool, "entries": sorted(set(entries))})


@contextlib.contextmanager
def owned_output_dir(path: str, tool: str, flag: str, overwrite: bool = False):
    """Yield a temp directory; on success it replaces `path` as a whole, marked as `tool`'s with the entries
    written. Checked first (check_output_dir), so only our own earlier output is ever replaced."""
    real = check_output_dir(path, tool, flag, overwrite)
    with atomic_dir(real) as tmp:
        yield tmp
        write_marker(tmp, tool, os.listdir(tmp))
