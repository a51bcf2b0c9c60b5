"""The job's key material: 32-byte secret keys in Z85 (RFC 32), the
per-job key in a memfd (local, ssh) or in a file in a private directory
(mpi, slurm), --key-file checks, --make-key."""

import fcntl
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

from .common import EXIT_OK, EXIT_USAGE, usage_error

# ZeroMQ's Z85 (RFC 32): 4 bytes, big-endian, as 5 base-85 digits.
Z85_ALPHABET = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                ".-:+=^!/*?&<>()[]{}@%$#")
_Z85_DIGIT = {ch: i for i, ch in enumerate(Z85_ALPHABET)}

# A job key (a CurveZMQ secret key's format): 32 bytes, 40 Z85 characters.
KEY_BYTES = 32
KEY_CHARS = KEY_BYTES * 5 // 4


def z85_encode(data):
    """Z85 text of data (bytes, a multiple of 4 long)."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes a multiple of 4 bytes, got {len(data)}")
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(Z85_ALPHABET[digit])
        out.extend(reversed(digits))
    return "".join(out)


def z85_decode(text):
    """The bytes of Z85 text; ValueError saying what is wrong with it."""
    if len(text) % 5:
        raise ValueError(f"Z85 text is a multiple of 5 characters long, "
                         f"got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for ch in text[i:i + 5]:
            digit = _Z85_DIGIT.get(ch)
            if digit is None:
                raise ValueError(f"{ch!r} is not a Z85 character")
            value = value * 85 + digit
        if value >> 32:
            raise ValueError(f"{text[i:i + 5]!r} is more than 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out)


def check_key_file(path):
    """None if path's first line is a 40-character Z85 key, else why not."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as err:
        return err.strerror or str(err)
    line = head.split(b"\n", 1)[0]
    try:
        line = line.decode("ascii")
    except UnicodeDecodeError:
        return "its first line is not ASCII text"
    if len(line) != KEY_CHARS:
        return (f"its first line has {len(line)} characters, expected a "
                f"{KEY_CHARS}-character Z85 key")
    try:
        z85_decode(line)
    except ValueError as err:
        return f"its first line is not a Z85 key: {err}"
    return None


def new_key():
    """A new secret key: 32 bytes from the OS, as 40 Z85 characters."""
    return z85_encode(secrets.token_bytes(KEY_BYTES))


def write_key_file(path):
    """Writes a new key to path (0600; O_EXCL: never an existing file)."""
    key = new_key()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # Exactly 0600, whatever the umask.
        with os.fdopen(fd, "w", closefd=False) as f:
            f.write(key + "\n")
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


class KeyMemfd:
    """A new key in a sealed memfd: on no filesystem, and gone once the
    last process that holds it has closed it or died (the launcher
    included, kill -9 or not).

    The launcher keeps fd open for the whole job: each local process, a
    restarted one too, inherits it (pass_fds) and reads it by its number
    (PS_KEY_FD; the node closes it once read). Sealed: nobody can change
    it. line() reads it back (ssh sends it down each session).
    """

    def __init__(self):
        self.fd = os.memfd_create("ps-job-key",
                                  os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            data = (new_key() + "\n").encode()
            if os.write(self.fd, data) != len(data):
                raise OSError("short write to the key's memfd")
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                        | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
        except BaseException:
            self.close()
            raise

    def line(self):
        """The key's line, without its newline (pread: no offset moves)."""
        return os.pread(self.fd, KEY_CHARS + 1, 0).rstrip(b"\n")

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# What JobKey's reaper runs: it waits for the end of a pipe whose other end
# only the launcher holds, then removes the key's directory.
_REAPER = ("import os, shutil, sys\n"
           "while os.read(0, 512):\n"
           "    pass\n"
           "shutil.rmtree(sys.argv[1], ignore_errors=True)\n")


class JobKey:
    """The job's key file: a new one in a private directory, or the user's.

    remove() deletes the directory of a new key; the user's file is kept.
    A new key's directory also has a reaper: a process of its own session
    that removes the directory once the launcher is gone, however it ends
    (kill -9 included), so that no key file outlives its job.
    """

    def __init__(self, path=None, parent=None):
        """parent: where the new key's directory goes (default: $TMPDIR)."""
        self.dir = None
        self.path = path
        self._reaper = None
        self._alive = None  # The reaper's pipe end: closed, it removes.
        if path is None:
            self.dir = tempfile.mkdtemp(prefix="ps-key-", dir=parent)  # 0700
            try:
                os.chmod(self.dir, 0o700)
                self._start_reaper()
                self.path = os.path.join(self.dir, "job.key")
                write_key_file(self.path)
            except BaseException:
                self.remove()
                raise

    def _start_reaper(self):
        """Before the key is written: no key without its reaper."""
        watched, self._alive = os.pipe()  # Neither end is inheritable.
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER, self.dir], stdin=watched,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        finally:
            os.close(watched)

    def remove(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._alive is not None:
            os.close(self._alive)
            self._alive = None
        if self._reaper is not None:
            try:
                self._reaper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass  # It removes nothing now; it ends on its own.
            self._reaper = None


def make_key(path):
    """--make-key FILE: writes a new key file and exits."""
    try:
        write_key_file(path)
    except FileExistsError:
        print(f"launch: --make-key: '{path}' exists; not overwriting it",
              file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        print(f"launch: --make-key: cannot write '{path}': {err.strerror}",
              file=sys.stderr)
        return EXIT_USAGE
    print(f"launch: wrote a new key to '{path}' (mode 0600); give every node "
          f"PS_KEY_FILE={path}", file=sys.stderr)
    return EXIT_OK


def check_user_key_file(path):
    """Exits 2 unless path is a key file; warns if others may read it."""
    if not os.path.exists(path):
        usage_error(f"--key-file '{path}' not found")
    if not os.path.isfile(path):
        usage_error(f"--key-file '{path}' is not a file")
    problem = check_key_file(path)
    if problem is not None:
        usage_error(f"--key-file '{path}' is not a key file: {problem}")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        print(f"launch: warning: --key-file '{path}' is open to group/others "
              f"(mode {mode:04o}); chmod 600 it", file=sys.stderr)
