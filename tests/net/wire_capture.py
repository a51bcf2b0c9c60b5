#!/usr/bin/env python3
"""Writes every frame seen on one interface to a file until SIGTERM or a
time limit: the bytes an eavesdropper on that link gets (AF_PACKET, all
protocols, both directions). Run inside a host's namespaces (netns_hosts);
needs root. Standard library only.

  wire_capture.py IFACE OUT_FILE SECONDS
"""

import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003


def main():
    iface, out_path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                         socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    sock.bind((iface, 0))
    sock.settimeout(0.2)
    end = time.monotonic() + seconds
    with open(out_path, "wb") as out:
        print("capturing", flush=True)
        while not stop and time.monotonic() < end:
            try:
                out.write(sock.recv(65536))
            except socket.timeout:
                continue
            except InterruptedError:
                continue


if __name__ == "__main__":
    main()
