"""zmtp_proxy.py's parser, faults and replay on bytes built here: ZMTP 3
greetings, commands and messages of short and long frames, fed whole and
byte by byte; each fault on the message it names; a replay paced by a
server on a local socket. No root needed (unittest; pytest runs it too).
"""

import os
import socket
import struct
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmtp_proxy as z  # noqa: E402

HELLO = z.HELLO_MAGIC + bytes(64)


def sealed(seq, size=40, frames=1):
    """A sealed message's bytes: `frames` frames, the first numbered."""
    first = struct.pack("<Q", seq) + bytes(size - 8)
    out = z.encode_frame(first, more=frames > 1)
    for i in range(1, frames):
        out += z.encode_frame(bytes(size), more=i < frames - 1)
    return out


def client_stream():
    return (z.greeting() + z.encode_command("HELLO", b"\x09ps-seal-1") +
            z.encode_command("INITIATE") + z.encode_frame(HELLO) +
            sealed(1) + z.encode_command("PING", b"\x00\x10") +
            sealed(2, size=300, frames=3) + sealed(5))


class ParserTest(unittest.TestCase):

    def check_items(self, items):
        data = b"".join(i.raw for i in items if isinstance(i, z.Greeting))
        self.assertEqual(data, z.greeting())
        rest = [i for i in items if not isinstance(i, z.Greeting)]
        self.assertEqual([type(i).__name__ for i in rest],
                         ["Command", "Command", "Message", "Message",
                          "Command", "Message", "Message"])
        self.assertEqual([i.name for i in rest if isinstance(i, z.Command)],
                         ["HELLO", "INITIATE", "PING"])
        msgs = [i for i in rest if isinstance(i, z.Message)]
        self.assertEqual([m.kind("c2s") for m in msgs],
                         ["hello", "sealed", "sealed", "sealed"])
        self.assertEqual([m.seq() for m in msgs[1:]], [1, 2, 5])
        self.assertEqual([len(m.frames) for m in msgs], [1, 1, 3, 1])
        self.assertEqual(len(msgs[2].frames[2]), 300)  # a LONG frame
        self.assertEqual(b"".join(i.raw for i in items), client_stream())

    def test_whole_stream(self):
        self.check_items(z.Parser().feed(client_stream()))

    def test_byte_by_byte(self):
        parser = z.Parser()
        items = []
        for b in client_stream():
            items += parser.feed(bytes([b]))
        self.check_items(items)

    def test_answers_by_kind(self):
        kinds = [z.Message([bytes([c]) + bytes(4)], b"").kind("s2c")
                 for c in b"WAR?x"]
        self.assertEqual(kinds, ["welcome", "ack", "reset", "unknown",
                                 "other"])

    def test_not_zmtp_is_refused_saying_why(self):
        with self.assertRaisesRegex(z.ZmtpError, "not a ZMTP 3 greeting"):
            z.Parser().feed(b"GET / HTTP/1.1\r\n" + bytes(64))
        with self.assertRaisesRegex(z.ZmtpError, "reserved bits"):
            z.Parser().feed(z.greeting() + b"\x80\x00")


class FaultTest(unittest.TestCase):

    def run_pipe(self, fault):
        said = []
        pipe = z.Pipe("test", "c2s", [z.Fault(fault)], said.append)
        out = pipe.process(client_stream())
        items = z.Parser().feed(out)
        seqs = [i.seq() for i in items if isinstance(i, z.Message)
                and i.kind("c2s") == "sealed"]
        return seqs, said

    def test_drop_the_nth_sealed(self):
        seqs, said = self.run_pipe({"listen": "x", "action": "drop",
                                    "kind": "sealed", "nth": 2})
        self.assertEqual(seqs, [1, 5])
        self.assertEqual(len(said), 1)
        self.assertIn("fault: drop c2s message 3", said[0])

    def test_repeat_by_size(self):
        seqs, _ = self.run_pipe({"listen": "x", "action": "repeat",
                                 "min_bytes": 500})
        self.assertEqual(seqs, [1, 2, 2, 5])

    def test_swap_with_the_next(self):
        seqs, said = self.run_pipe({"listen": "x", "action": "swap",
                                    "kind": "sealed", "nth": 1})
        self.assertEqual(seqs, [2, 1, 5])
        self.assertIn("fault: swap", said[0])

    def test_a_fault_fires_once_and_commands_pass(self):
        pipe = z.Pipe("t", "c2s", [z.Fault({"listen": "x", "action": "drop",
                                            "kind": "hello"})],
                      lambda line: None)
        out = pipe.process(client_stream()) + pipe.process(
            z.encode_frame(HELLO))
        items = z.Parser().feed(out)
        self.assertEqual(
            [i.name for i in items if isinstance(i, z.Command)],
            ["HELLO", "INITIATE", "PING"])
        hellos = [i for i in items if isinstance(i, z.Message)
                  and i.kind("c2s") == "hello"]
        self.assertEqual(len(hellos), 1)  # the second one passed

    def test_bad_fault_names_the_field(self):
        with self.assertRaisesRegex(ValueError, "action must be"):
            z.Fault({"listen": "x", "action": "burn"})
        with self.assertRaisesRegex(ValueError, "kind must be"):
            z.Fault({"listen": "x", "action": "drop", "kind": "big"})


def fake_server(listener, got):
    """Answers as a ZMTP server and a ps receiver would; records what it
    read."""
    conn, _ = listener.accept()
    with conn:
        parser = z.Parser()
        while True:
            data = conn.recv(4096)
            if not data:
                return
            for item in parser.feed(data):
                if isinstance(item, z.Greeting):
                    if parser.greeted:
                        conn.sendall(z.greeting(as_server=True))
                    continue
                got.append(item)
                if isinstance(item, z.Command):
                    answer = {"HELLO": "WELCOME", "INITIATE": "READY"}
                    conn.sendall(z.encode_command(answer[item.name]))
                elif item.kind("c2s") == "hello":
                    conn.sendall(z.encode_frame(b"W" + bytes(40)))
                else:
                    conn.sendall(z.encode_frame(b"?"))


class ReplayTest(unittest.TestCase):

    def test_replay_is_paced_by_the_answers(self):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        got = []
        t = threading.Thread(target=fake_server, args=(listener, got))
        t.start()
        with tempfile.NamedTemporaryFile() as f:
            f.write(client_stream())
            f.flush()
            lines = z.replay(f.name, "127.0.0.1:%d" %
                             listener.getsockname()[1], answer_seconds=0.5)
        t.join(timeout=10)
        listener.close()
        self.assertEqual(lines[0], "replay: sent HELLO, got WELCOME")
        self.assertEqual(lines[1], "replay: sent INITIATE, got READY")
        self.assertEqual(lines[2],
                         "replay: sent the session HELLO, got welcome")
        self.assertEqual(lines[3], "replay: sent 4 messages; then got "
                         "unknown, unknown, unknown")
        # The recorded PING is not replayed; every message is, in order.
        self.assertEqual([i.name for i in got if isinstance(i, z.Command)],
                         ["HELLO", "INITIATE"])
        self.assertEqual([i.seq() for i in got if isinstance(i, z.Message)
                          and i.kind("c2s") == "sealed"], [1, 2, 5])


if __name__ == "__main__":
    unittest.main()
