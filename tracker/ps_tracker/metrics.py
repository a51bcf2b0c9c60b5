"""--metrics DIR: every node serves Prometheus metrics (PS_METRICS_PORT=0,
an ephemeral port each) and says its port in a "ps-event:" line; the
launcher keeps DIR/targets.json, in Prometheus's file_sd format, naming
each node's current address with its role and rank. The file is replaced
whole (a temporary file renamed over it), so Prometheus never reads half
of it; a restarted node's new port replaces its old one."""

import json
import os
import threading


class MetricsTargets:
    """The scrape targets of a job's nodes, written to DIR/targets.json."""

    def __init__(self, directory):
        self.directory = directory
        self.path = os.path.join(directory, "targets.json")
        self._lock = threading.Lock()
        self._targets = {}  # node name: (address, role, rank)

    def prepare(self):
        """Makes DIR and writes an empty list (no node has said its port
        yet). OSError when DIR cannot be made or written."""
        os.makedirs(self.directory, exist_ok=True)
        with self._lock:
            self._write_locked()

    def node_serves(self, name, role, rank, host, port):
        """Node `name` (e.g. "worker 1") serves /metrics at host:port."""
        with self._lock:
            self._targets[name] = (f"{host}:{port}", role, str(rank))
            self._write_locked()

    def _write_locked(self):
        groups = [{"targets": [address],
                   "labels": {"role": role, "rank": rank}}
                  for address, role, rank in
                  (self._targets[n] for n in sorted(self._targets))]
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(groups, out, indent=1)
            out.write("\n")
        os.replace(tmp, self.path)
