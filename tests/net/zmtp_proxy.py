#!/usr/bin/env python3
"""A man in the middle of ZeroMQ connections: a TCP proxy that parses ZMTP
3.x both ways and deletes, repeats or swaps whole messages; and a replayer
of a recorded connection. Standard library only.

Each --forward LISTEN=TARGET (host:port each) accepts connections on LISTEN
and opens one to TARGET for each; connections are numbered per listener
from 0. Both directions ("c2s": the connecting side's, "s2c": the answers
on the same connection) are parsed: the 64-byte greeting, then frames
(flags: bit 0 MORE, bit 1 LONG: an 8-byte big-endian size, else one byte;
bit 2 COMMAND). Commands (HELLO, WELCOME, INITIATE, READY, PING, PONG...)
pass untouched, at once; data frames are grouped into whole messages (up to
a frame without MORE), to which the faults apply. A fault (--fault JSON,
repeatable) fires once, on the nth message (1-based) of its direction of
its connection that matches it:

  {"listen": "198.18.0.1:9100", "conn": 0, "dir": "c2s", "action": "drop",
   "kind": "sealed", "nth": 3, "min_bytes": 0, "max_bytes": null}

action: drop | repeat (sent twice) | swap (held and sent after the next
message of that direction). kind: any | hello (a ps session's HELLO: one
frame of 72 bytes starting "ps-hello") | sealed (a message numbered by its
sender: not a HELLO) | welcome | ack | reset | unknown (answers: one frame
starting W, A, R or ?). Every fault applied is printed on stdout as a
line starting "fault:". --record LISTEN,CONN,FILE writes the connecting
side's bytes of that connection to FILE as they pass.

  zmtp_proxy.py proxy --forward A=B [--fault JSON]... [--record L,C,F]
  zmtp_proxy.py replay FILE HOST:PORT   # the recording, as a new connection

The replay sends the recorded greeting and handshake commands as a client
would, each after the answer it needs (a ZMTP server refuses a command
that comes before it is ready), then the recorded messages (the session's
HELLO first, awaiting its answer), and prints what came back.
"""

import argparse
import json
import select
import socket
import struct
import sys
import threading
import time

GREETING_BYTES = 64
SIGNATURE_FIRST, SIGNATURE_LAST = 0xFF, 0x7F
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
HELLO_MAGIC, HELLO_BYTES = b"ps-hello", 72
HOLD_SECONDS = 2.0  # A swapped message waits at most this for its partner.
POLL_SECONDS = 0.1
ANSWER_KINDS = {ord("W"): "welcome", ord("A"): "ack", ord("R"): "reset",
                ord("?"): "unknown"}


class ZmtpError(ValueError):
    """Bytes that are not ZMTP 3.x; the message says where and why."""


class Message:
    """A whole message: its frames' bodies and its bytes on the wire."""

    def __init__(self, frames, raw):
        self.frames = frames
        self.raw = raw

    def kind(self, direction):
        first = self.frames[0] if self.frames else b""
        if direction == "s2c":
            if len(self.frames) == 1 and first[:1]:
                return ANSWER_KINDS.get(first[0], "other")
            return "other"
        if (len(self.frames) == 1 and len(first) == HELLO_BYTES
                and first.startswith(HELLO_MAGIC)):
            return "hello"
        return "sealed"

    def seq(self):
        """The sealed frame's sequence number (little-endian), or None."""
        first = self.frames[0] if self.frames else b""
        return struct.unpack("<Q", first[:8])[0] if len(first) >= 8 else None

    def describe(self, direction):
        kind = self.kind(direction)
        seq = f", seq {self.seq()}" if kind == "sealed" else ""
        return (f"{kind}, {len(self.frames)} frame(s), {len(self.raw)} "
                f"bytes{seq}")


class Command:
    def __init__(self, name, raw):
        self.name = name
        self.raw = raw


class Greeting:
    def __init__(self, raw):
        self.raw = raw


class Parser:
    """Incremental ZMTP 3.x parser of one direction: feed() bytes, get
    Greeting (each piece of it as it comes), Command and Message items in
    order (a command that comes between the frames of a message is given
    before that message). `greeting`: the greeting's bytes so far."""

    def __init__(self):
        self.buf = b""
        self.greeted = False
        self.greeting = b""  # of the peer, so far
        self.frames = []
        self.raw = b""

    def feed(self, data):
        items = []
        if not self.greeted:
            # Given on at once, in pieces: each side sends part of its
            # greeting and awaits the other's before the rest.
            part = data[:GREETING_BYTES - len(self.greeting)]
            data = data[len(part):]
            self.greeting += part
            items.append(Greeting(part))
            if len(self.greeting) < GREETING_BYTES:
                return items
            g = self.greeting
            if g[0] != SIGNATURE_FIRST or g[9] != SIGNATURE_LAST or g[10] != 3:
                raise ZmtpError(f"not a ZMTP 3 greeting: {g[:12]!r}")
            self.greeted = True
        self.buf += data
        while True:
            frame = self._next_frame()
            if frame is None:
                return items
            flags, body, raw = frame
            if flags & COMMAND:
                if not body or len(body) < 1 + body[0]:
                    raise ZmtpError(f"a command frame of {len(body)} bytes "
                                    f"has no name")
                items.append(Command(body[1:1 + body[0]].decode("ascii",
                                                                "replace"),
                                     raw))
                continue
            self.frames.append(body)
            self.raw += raw
            if not flags & MORE:
                items.append(Message(self.frames, self.raw))
                self.frames, self.raw = [], b""

    def _next_frame(self):
        if len(self.buf) < 2:
            return None
        flags = self.buf[0]
        if flags & ~(MORE | LONG | COMMAND):
            raise ZmtpError(f"frame flags 0x{flags:02x} have reserved bits")
        head = 9 if flags & LONG else 2
        if len(self.buf) < head:
            return None
        size = (struct.unpack(">Q", self.buf[1:9])[0] if flags & LONG
                else self.buf[1])
        if len(self.buf) < head + size:
            return None
        raw = self.buf[:head + size]
        self.buf = self.buf[head + size:]
        return flags, raw[head:], raw


def encode_frame(body, more=False, command=False):
    """A frame's bytes (for the tests of this parser)."""
    flags = (MORE if more else 0) | (COMMAND if command else 0)
    if len(body) > 255:
        return bytes([flags | LONG]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def encode_command(name, data=b""):
    return encode_frame(bytes([len(name)]) + name.encode() + data,
                        command=True)


def greeting(mechanism=b"PLAIN", as_server=False):
    return (bytes([SIGNATURE_FIRST]) + bytes(8) + bytes([SIGNATURE_LAST, 3, 0])
            + mechanism.ljust(20, b"\0") + bytes([1 if as_server else 0])
            + bytes(31))


class Fault:
    """One scripted fault; see the module's docstring."""

    ACTIONS = ("drop", "repeat", "swap")
    KINDS = ("any", "hello", "sealed", "welcome", "ack", "reset", "unknown")

    def __init__(self, spec):
        if isinstance(spec, str):
            spec = json.loads(spec)
        self.listen = spec["listen"]
        self.conn = int(spec.get("conn", 0))
        self.dir = spec.get("dir", "c2s")
        self.action = spec["action"]
        self.kind = spec.get("kind", "any")
        self.nth = int(spec.get("nth", 1))
        self.min_bytes = int(spec.get("min_bytes", 0))
        self.max_bytes = spec.get("max_bytes")
        if self.dir not in ("c2s", "s2c"):
            raise ValueError(f"fault: dir must be c2s or s2c, got {self.dir}")
        if self.action not in self.ACTIONS:
            raise ValueError(f"fault: action must be one of {self.ACTIONS}, "
                             f"got {self.action}")
        if self.kind not in self.KINDS:
            raise ValueError(f"fault: kind must be one of {self.KINDS}, got "
                             f"{self.kind}")
        if self.nth < 1:
            raise ValueError(f"fault: nth must be >= 1, got {self.nth}")
        self.seen = 0
        self.done = False

    def matches(self, msg, direction):
        if self.done or direction != self.dir:
            return False
        if self.kind != "any" and msg.kind(direction) != self.kind:
            return False
        if len(msg.raw) < self.min_bytes or (
                self.max_bytes is not None and len(msg.raw) > self.max_bytes):
            return False
        self.seen += 1
        return self.seen == self.nth


class Pipe:
    """One direction of one connection: parses, applies its faults, writes
    the rest on; `say` prints a line."""

    def __init__(self, name, direction, faults, say, record=None,
                 trace=False):
        self.name = name
        self.trace = trace
        self.dir = direction
        self.faults = faults
        self.say = say
        self.record = record
        self.parser = Parser()
        self.count = 0
        self.held = None  # (message, since, its number) of a swap

    def process(self, data):
        """Bytes to send on for `data` received."""
        if self.record is not None:
            self.record.write(data)
            self.record.flush()
        out = []
        for item in self.parser.feed(data):
            if not isinstance(item, Message):
                out.append(item.raw)
                continue
            self.count += 1
            out += self._message(item)
        return b"".join(out)

    def _message(self, msg):
        out = []
        if self.trace:
            self.say(f"trace: {self._what(msg)}")
        if self.held is not None:
            held, _, number = self.held
            self.held = None
            self.say(f"fault: swap {self._what(held, number)} after message "
                     f"{self.count} ({msg.describe(self.dir)})")
            return [msg.raw, held.raw]
        fault = next((f for f in self.faults if f.matches(msg, self.dir)),
                     None)
        if fault is None:
            return [msg.raw]
        fault.done = True
        if fault.action == "drop":
            self.say(f"fault: drop {self._what(msg)}")
        elif fault.action == "repeat":
            self.say(f"fault: repeat {self._what(msg)}")
            out = [msg.raw, msg.raw]
        else:
            self.held = (msg, time.monotonic(), self.count)
        return out

    def _what(self, msg, number=None):
        number = self.count if number is None else number
        return (f"{self.dir} message {number} of {self.name} "
                f"({msg.describe(self.dir)})")

    def expired(self):
        """A held message's bytes once it waited HOLD_SECONDS, else b''."""
        if self.held is None or time.monotonic() - self.held[1] < \
                HOLD_SECONDS:
            return b""
        msg = self.held[0]
        self.held = None
        self.say(f"fault: swap found no next message; sent {self.dir} "
                 f"message of {self.name} ({msg.describe(self.dir)}) late")
        return msg.raw


def pump(pipe, src, dst, closing):
    """Copies src to dst through pipe until either side ends."""
    try:
        while not closing.is_set():
            ready, _, _ = select.select([src], [], [], POLL_SECONDS)
            late = pipe.expired()
            if late:
                dst.sendall(late)
            if not ready:
                continue
            data = src.recv(1 << 16)
            if not data:
                pipe.say(f"proxy: {pipe.name} {pipe.dir} ended: closed by "
                         f"its sender")
                break
            out = pipe.process(data)
            if out:
                dst.sendall(out)
    except (OSError, ZmtpError) as err:
        pipe.say(f"proxy: {pipe.name} {pipe.dir} ended: {err}")
    finally:
        closing.set()


def parse_addr(text):
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address '{text}' is not host:port")
    return host, int(port)


class Proxy:
    def __init__(self, forwards, faults, records, say, trace=False):
        self.trace = trace
        self.forwards = forwards  # [(listen, target)] as host:port text
        self.faults = faults
        self.records = records  # {(listen, conn): path}
        self.say = say

    def serve(self, seconds):
        threads = []
        for listen, target in self.forwards:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(parse_addr(listen))
            sock.listen(16)
            t = threading.Thread(target=self._accept,
                                 args=(sock, listen, target), daemon=True)
            t.start()
            threads.append(t)
        self.say("proxy: listening on " +
                 ", ".join(f"{a} -> {b}" for a, b in self.forwards))
        time.sleep(seconds)

    def _accept(self, sock, listen, target):
        for conn in range(100000):  # bounded: one per accepted connection
            client, peer = sock.accept()
            name = f"{listen} connection {conn}"
            threading.Thread(target=self._connection,
                             args=(client, peer, name, listen, conn, target),
                             daemon=True).start()

    def _connection(self, client, peer, name, listen, conn, target):
        try:
            server = socket.create_connection(parse_addr(target), timeout=10)
        except OSError as err:
            self.say(f"proxy: {name} from {peer[0]}: cannot reach {target}: "
                     f"{err}")
            client.close()
            return
        server.settimeout(None)
        self.say(f"proxy: {name} from {peer[0]}:{peer[1]} -> {target}")
        faults = [f for f in self.faults
                  if f.listen == listen and f.conn == conn]
        path = self.records.get((listen, conn))
        record = open(path, "wb") if path else None
        closing = threading.Event()
        c2s = Pipe(name, "c2s", faults, self.say, record, self.trace)
        s2c = Pipe(name, "s2c", faults, self.say, trace=self.trace)
        t = threading.Thread(target=pump, args=(s2c, server, client, closing),
                             daemon=True)
        t.start()
        pump(c2s, client, server, closing)
        t.join()
        for s in (client, server):
            s.close()
        if record is not None:
            record.close()
        self.say(f"proxy: {name} closed ({c2s.count} messages c2s, "
                 f"{s2c.count} s2c)")


def read_items(sock, parser, want, timeout):
    """Items from sock until one satisfies want (or timeout, or the end):
    (that item or None, every item read)."""
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        ready, _, _ = select.select([sock], [], [], POLL_SECONDS)
        if not ready:
            continue
        data = sock.recv(1 << 16)
        if not data:
            return None, seen
        for item in parser.feed(data):
            seen.append(item)
            if want(item):
                return item, seen
    return None, seen


def describe_items(items):
    names = []
    for item in items:
        if isinstance(item, Command):
            names.append(item.name)
        elif isinstance(item, Message):
            names.append(item.kind("s2c"))
    return ", ".join(names) or "nothing"


def replay(path, target, connect_seconds=30, answer_seconds=2.0):
    """Sends the recording at path to target as a new connection; returns
    the lines it printed (the answers seen)."""
    recorded = Parser()
    with open(path, "rb") as f:
        items = recorded.feed(f.read())
    if not recorded.greeted:
        raise ZmtpError(f"{path}: no whole recorded greeting")
    items = [i for i in items if not isinstance(i, Greeting)]
    end = time.monotonic() + connect_seconds
    while True:
        try:
            sock = socket.create_connection(parse_addr(target), timeout=2)
            break
        except OSError as err:
            if time.monotonic() > end:
                raise OSError(f"replay: {target} did not answer within "
                              f"{connect_seconds} s: {err}")
            time.sleep(0.1)
    lines = []
    parser = Parser()
    with sock:
        sock.sendall(recorded.greeting)
        answers = {"HELLO": "WELCOME", "INITIATE": "READY"}
        sent = 0
        for item in items:
            if isinstance(item, Command):
                if item.name not in answers:
                    continue  # PING, PONG: of the recorded connection
                sock.sendall(item.raw)
                want = answers[item.name]
                got, seen = read_items(
                    sock, parser, lambda i, w=want: isinstance(i, Command)
                    and i.name in (w, "ERROR"), 10)
                lines.append(f"replay: sent {item.name}, got "
                             f"{describe_items(seen)}")
                if got is None or got.name != want:
                    return lines
                continue
            sock.sendall(item.raw)
            sent += 1
            if item.kind("c2s") == "hello":
                _, seen = read_items(sock, parser, lambda i: isinstance(
                    i, Message), answer_seconds)
                lines.append(f"replay: sent the session HELLO, got "
                             f"{describe_items(seen)}")
        _, seen = read_items(sock, parser, lambda i: False, answer_seconds)
        lines.append(f"replay: sent {sent} messages; then got "
                     f"{describe_items(seen)}")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("--forward", action="append", required=True,
                   metavar="LISTEN=TARGET")
    p.add_argument("--fault", action="append", default=[], metavar="JSON")
    p.add_argument("--record", action="append", default=[],
                   metavar="LISTEN,CONN,FILE")
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--trace", action="store_true",
                   help="print every message that passes")
    p = sub.add_parser("replay")
    p.add_argument("file")
    p.add_argument("target")
    args = parser.parse_args(argv)
    lock = threading.Lock()

    start = time.monotonic()

    def say(line):
        with lock:
            print(f"{time.monotonic() - start:8.3f} {line}", flush=True)
    if args.cmd == "replay":
        for line in replay(args.file, args.target):
            say(line)
        return 0
    forwards = [tuple(f.split("=", 1)) for f in args.forward]
    for f in forwards:
        if len(f) != 2:
            parser.error(f"--forward {f[0]}: not LISTEN=TARGET")
    records = {}
    for r in args.record:
        listen, conn, path = r.split(",", 2)
        records[(listen, int(conn))] = path
    faults = [Fault(spec) for spec in args.fault]
    Proxy(forwards, faults, records, say, args.trace).serve(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
