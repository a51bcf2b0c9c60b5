"""What every part of the launcher shares: exit statuses, timings, the
output multiplexer and the words for how a process ended."""

import ctypes
import os
import signal
import sys
import threading

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124

LAUNCHERS = ("local", "ssh", "mpi", "slurm")

# How often the main loop wakes to notice a signal or the deadline.
POLL_SECONDS = 0.05

# After the first non-zero exit, how long to wait for a "declared dead"
# line before naming the cause: healthy nodes that lost a frozen peer may
# exit before the line that names it has been read.
DEAD_REPORT_GRACE = 2.0

# ssh: how long past --grace to wait for the remote processes to stop after
# their ssh sessions were told to, before the local ssh clients are killed.
REMOTE_STOP_SLACK = 5.0

INSECURE_NOTE = "--insecure: traffic is neither authenticated nor encrypted"


def signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def describe_exit(returncode):
    """'exited with code 3' or 'was killed by signal SIGKILL'."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    return f"was killed by signal {signal_name(-returncode)}"


def plural(n, word, suffix="es"):
    return f"{n} {word}" if n == 1 else f"{n} {word}{suffix}"


_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """A Popen preexec_fn: the child gets SIGKILL when the thread that
    started it ends (prctl PR_SET_PDEATHSIG), or at once if its parent is
    already gone. So the launcher's children go with it, kill -9 included.
    Call it from the thread that outlives them (the launcher's main one).
    """
    libc = ctypes.CDLL(None, use_errno=True)  # Loaded before the fork.
    parent = os.getpid()

    def in_child():
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # It died before the prctl.
            os.kill(os.getpid(), signal.SIGKILL)
    return in_child


def usage_error(message):
    print(f"launch: {message} (see --help)", file=sys.stderr)
    sys.exit(EXIT_USAGE)


class OutputMux:
    """Copies child pipes to our stdout/stderr with a prefix per line.

    One lock guards both streams, so a line is written whole: output of
    different processes never interleaves mid-line.
    """

    def __init__(self):
        self._lock = threading.Lock()

    def write(self, stream, data):
        with self._lock:
            stream.buffer.write(data)
            stream.buffer.flush()

    def say(self, message):
        self.write(sys.stderr, f"launch: {message}\n".encode())

    def start_reader(self, pipe, prefix, stream, on_line=None):
        """Copies pipe to stream; on_line(line) sees each line first."""
        thread = threading.Thread(
            target=self._copy, args=(pipe, prefix.encode(), stream, on_line),
            daemon=True)
        thread.start()
        return thread

    def _copy(self, pipe, prefix, stream, on_line):
        with pipe:
            for line in iter(pipe.readline, b""):
                if not line.endswith(b"\n"):
                    line += b"\n"
                if on_line is not None:
                    on_line(line)
                self.write(stream, prefix + line)
