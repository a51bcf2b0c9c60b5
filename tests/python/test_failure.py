"""A server that dies makes the worker's wait raise ps.Error (naming the
dead server) within the heartbeat timeout, instead of hanging."""

import re


def test_dead_server_raises_instead_of_hanging(run_job):
    env = {"PS_HEARTBEAT_INTERVAL_MS": "200", "PS_HEARTBEAT_TIMEOUT_MS": "2000"}
    r = run_job("job_fail.py", 1, 1, env=env, timeout=60)
    m = re.search(r"worker: raised ps.Error after ([0-9.]+) s: (.*)", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) < 15, r.stdout
    assert "server 0" in m.group(2), m.group(2)
