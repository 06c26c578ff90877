"""The `kvspec` command line: its entry point (`kvspec`, `python -m kvspec.conformance.cli`).

This module imports nothing of kvspec at its top: a Ctrl-C, a SIGTERM or a closed terminal
at any moment, also while the commands are still being imported, ends the command with
its exit status and one line, never a traceback. The commands themselves are in
commands.py. Exit status, for every command: 0 conformant, 1 a violation (or a crash, a
hang, a divergence), 2 usage, adapter or trace errors, 128 + the signal's number when
interrupted.
"""

import io
import os
import signal
import sys

STOPPING_SIGNALS = {"SIGHUP": signal.SIGHUP, "SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}


class Stopped(KeyboardInterrupt):
    """A signal that stops a command: it unwinds like Ctrl-C, so the workers are stopped and
    a check still writes the report of what finished."""

    def __init__(self, name: str = "SIGINT"):
        super().__init__(name)
        self.signal_name = name


def stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def signal_name(stop: KeyboardInterrupt) -> str:
    return getattr(stop, "signal_name", "SIGINT")


class GuardedOutput(io.TextIOBase):
    """Standard output that outlives its reader: a pipe closed early (`| head -1`), a full
    disk (`> /dev/full`) or a character the terminal's encoding lacks never ends a command
    (its verdict, exit status and reports stand); what cannot be written is dropped, and an
    unencodable character written escaped."""

    def __init__(self, stream):
        self.stream = stream
        self.lost: BaseException | None = None
        if isinstance(stream, io.TextIOWrapper):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass

    def write(self, text: str) -> int:
        if self.lost is None:
            try:
                self.stream.write(text)
            except (OSError, ValueError) as error:
                self.give_up(error)
        return len(text)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self.stream.flush()
            except (OSError, ValueError) as error:
                self.give_up(error)

    def give_up(self, error: BaseException) -> None:
        """From now on write nothing; the process's own last flush at exit must not raise either."""
        self.lost = error
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        except (OSError, ValueError, io.UnsupportedOperation):
            pass

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.lost is None and self.stream.isatty()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")


def main(argv=None) -> int:
    handlers = {name: signal.getsignal(number) for name, number in STOPPING_SIGNALS.items() if name != "SIGINT"}
    for name in handlers:
        signal.signal(STOPPING_SIGNALS[name], stop)
    stdout = sys.stdout
    sys.stdout = GuardedOutput(stdout)
    try:
        from .commands import run  # imported here: a signal while it loads is an interruption too

        return run(argv)
    except KeyboardInterrupt as stopped:  # before or after the runs: nothing to report
        name = signal_name(stopped)
        print(f"kvspec: interrupted ({name})", file=sys.stderr)
        return 128 + STOPPING_SIGNALS[name]
    finally:
        try:
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - nothing left to tell
            pass
        sys.stdout = stdout
        for name, handler in handlers.items():
            signal.signal(STOPPING_SIGNALS[name], handler)


if __name__ == "__main__":
    sys.exit(main())
