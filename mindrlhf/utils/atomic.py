"""Write-then-rename helpers: a crash never leaves a half-written file or directory in place."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile


def fsync_path(path: str):
    """Flush a file's (or a directory's entries') data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str):
    """fsync every file below `path`, then the directories bottom-up."""
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(os.path.join(root, name))
        fsync_path(root)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temp path beside `path`; on success it is fsynced and renamed onto `path` (and the
    directory fsynced, so the rename survives a power loss), on error removed."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{path}: the directory {directory} does not exist")
    # keep the extension: some writers (MindSpore's save_checkpoint) append one when it is missing
    fd, tmp = tempfile.mkstemp(prefix=".tmp_" + os.path.basename(path) + ".", dir=directory,
                               suffix=os.path.splitext(path)[1])
    os.close(fd)
    try:
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        fsync_path(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str):
    """Yield a temp directory beside `path`; on success it replaces `path` as a whole."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp_" + os.path.basename(os.path.abspath(path)) + ".", dir=parent)
    try:
        yield tmp
        fsync_tree(tmp)
        if os.path.isdir(path):
            old = tmp + ".old"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        fsync_path(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json(path: str, obj, indent: int = 1):
    """Write `obj` as JSON at `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=indent)


def write_text(path: str, text: str):
    """Write `text` at `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
