"""The files and folders a command writes: checked before it runs, written without following
a link planted at their name.

A report written after a long run must not be lost to a path that could never be written
(`/dev/full`, a folder under `/proc`, a dangling link, a directory at the file's name), so
every output option is tried when the command line is read: `output_file` and
`output_directory` are argparse types that make and remove a scratch file where the
output will go (leaving nothing behind) and return the absolute path, so that an
implementation that changes its process's directory cannot move where kvspec writes.
`write_text` then writes beside the target and renames it over: a link at the name is
replaced, never followed, and a reader never sees half a file.
"""

import argparse
import os
import stat
import tempfile
from pathlib import Path


def existing_ancestor(path: Path) -> Path:
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def try_writing_in(directory: Path) -> None:
    """Make `directory` (and its missing parents), write and remove a scratch file in it,
    and remove what was made: OSError if a file cannot be written there."""
    made = []
    missing = directory
    while not os.path.lexists(missing) and missing != missing.parent:
        made.append(missing)
        missing = missing.parent
    try:
        for folder in reversed(made):
            os.mkdir(folder)
        descriptor, scratch = tempfile.mkstemp(dir=directory, prefix=".kvspec-write-check-")
        os.close(descriptor)
        os.remove(scratch)
    finally:
        for folder in made:
            try:
                os.rmdir(folder)
            except OSError:
                pass


def problem(text: str, error: OSError) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text}: cannot be written ({error.strerror or error}); name a path in a "
                                      f"folder you can write")


def output_file(text: str) -> str:
    """An option's file to write (argparse type): a regular file or none yet, in a folder
    that is or can be made and written; its absolute path."""
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty path; name a file to write")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; name a file to write, e.g. {path / 'report'}")
    if os.path.islink(path) and not path.exists():
        raise argparse.ArgumentTypeError(f"{text} is a link to a file that does not exist; name the file itself")
    if path.exists() and not stat.S_ISREG(os.stat(path).st_mode):
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a device, a FIFO or a socket); name a "
                                         f"file to write")
    if not existing_ancestor(path.parent).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing_ancestor(path.parent)} is not a directory, so the file "
                                         f"cannot be written there; name a file in a directory")
    try:
        try_writing_in(path.parent)
        if path.exists():
            with open(path, "a"):  # may it be replaced? (appending nothing changes nothing)
                pass
    except OSError as error:
        raise problem(text, error) from None
    return str(path.absolute())


def output_directory(text: str) -> str:
    """An option's directory to write into (argparse type): a directory, or one that can be
    made, in which a file can be written; its absolute path. Nothing is left behind."""
    path = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty path; name a directory")
    if os.path.lexists(path) and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory; name a directory (it is made if "
                                         f"missing)")
    if not existing_ancestor(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {existing_ancestor(path)} is not a directory; name a directory")
    try:
        try_writing_in(path)
    except OSError as error:
        raise problem(text, error) from None
    return str(path.absolute())


def write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` (making its folder): into a file beside it, then renamed over
    it, so a link planted at the name is replaced, never followed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return path
