"""Bad input from Python raises an exception naming the thing and its value
and the process goes on (none reaches a CHECK of the library); a buffer
stays exported while a request may read or write it, so growing an
array.array meanwhile raises BufferError instead of leaving the request
with freed memory. The jobs are job_errors.py."""

import re


def outcomes(stdout, who):
    """{label: "ExceptionType: message" or "no error"} printed by `who`."""
    got = {}
    for m in re.finditer(rf"^(?:\[[^\]]*\] )?{who}: ([^:\n]+): (.*)$", stdout,
                         re.M):
        got[m.group(1)] = m.group(2)
    return got


def check(got, label, exc, *parts, stdout=""):
    assert label in got, f"{label} not run:\n{stdout}"
    assert got[label].startswith(exc + ": "), f"{label}: {got[label]}"
    for p in parts:
        assert p in got[label], f"{label}: {got[label]!r} lacks {p!r}"


def test_bad_placement_layout_and_calls_before_start_raise(run_script):
    r = run_script("job_errors.py", ["pure"])
    assert r.returncode == 0, r.stdout
    assert "pure: alive" in r.stdout, r.stdout
    got = outcomes(r.stdout, "pure")
    c = lambda *a: check(got, *a, stdout=r.stdout)  # noqa: E731
    c("even_keys(0, 10)", "ValueError", "Placement.even_keys",
      "num_servers=0")
    c("even_keys(-2, 10)", "ValueError", "num_servers=-2")
    c("even_keys(4, 2)", "ValueError", "max_key=2", "num_servers=4")
    c("by_bytes unsorted", "ValueError", "Placement.by_bytes",
      "not sorted and unique at index 1")
    c("by_bytes sizes", "ValueError", "1 keys but 2 sizes")
    c("by_bytes servers", "ValueError", "num_servers=0")
    c("begin(99)", "IndexError", "Placement.begin: server 99",
      "for 1 servers")
    c("end(-1)", "IndexError", "Placement.end: server -1")
    c("offset(5)", "IndexError", "DenseLayout.offset: key 5", "4 keys")
    c("length(4)", "IndexError", "DenseLayout.length: key 4")
    c("DenseLayout chunk 0", "ValueError", "chunk must be > 0")
    c("shared_array(2**62)", "ValueError", "n=4611686018427387904")
    c("encode_dense_cmd", "ValueError", "step=-1")
    c("barrier(12345)", "ValueError", "group 12345")
    c("barrier before start", "Error", "barrier: ps.start() has not been")
    c("KVWorker before start", "Error", "KVWorker: ps.start() has not been")
    c("KVServer before start", "Error", "KVServer: ps.start() has not been")


def test_bad_calls_on_running_nodes_raise_and_the_job_ends_well(run_job):
    r = run_job("job_errors.py", 1, 1, ["node"], timeout=60)
    assert r.returncode == 0, r.stdout
    for who in ("scheduler", "server", "worker"):
        assert f"{who}: alive" in r.stdout, r.stdout
        got = outcomes(r.stdout, who)
        c = lambda *a: check(got, *a, stdout=r.stdout)  # noqa: E731
        c("barrier(12345)", "ValueError", "barrier: group 12345",
          "ps.SCHEDULER (1)")
        c("start twice", "Error", "ps.start() called twice")
        c("barrier after finalize", "Error",
          "barrier: ps.finalize() has been called")
        c("KVWorker after finalize", "Error",
          "KVWorker: ps.finalize() has been called")
    got = outcomes(r.stdout, "scheduler")
    check(got, "barrier(WORKER_GROUP)", "ValueError",
          "this scheduler is not in group 4 (workers)")
    got = outcomes(r.stdout, "server")
    c = lambda *a: check(got, *a, stdout=r.stdout)  # noqa: E731
    c("barrier(WORKER_GROUP)", "ValueError",
      "this server is not in group 4 (workers)")
    c("KVServer handler", "TypeError", "handler must be callable",
      "<class 'int'>")
    c("second KVServer", "ValueError", "app_id 0 already has a server")
    c("DenseServer same app", "ValueError", "app_id 0 already has a server")
    c("DenseServer max_delay", "ValueError", "max_delay=-1 is negative")
    c("DenseServer continue", "ValueError",
      "on_worker_failure='continue' is not supported from Python")
    c("DenseServer restart", "ValueError", "on_worker_failure='restart'",
      "PS_MAX_RESTARTS is 0")
    c("DenseServer policy", "ValueError", "later")
    c("DenseServer replica", "ValueError",
      "replica_weights given but PS_REPLICAS is 0")
    c("DenseServer checkpoint_every", "ValueError", "checkpoint_every=5",
      "need checkpoint_dir")
    c("DenseServer checkpoint async", "ValueError",
      "checkpoint_dir needs consistency='bsp'", "got 'async'")
    got = outcomes(r.stdout, "worker")
    c = lambda *a: check(got, *a, stdout=r.stdout)  # noqa: E731
    c("barrier(SERVER_GROUP)", "ValueError",
      "this worker is not in group 2 (servers)")
    c("second KVWorker", "ValueError",
      "app_id 0 and customer_id 0 already exists")
    c("set_placement", "ValueError", "placement has 3 servers",
      "the job has 1")
    c("keys unsorted", "ValueError", "sorted ascending and unique",
      "keys[1] = 3")
    c("keys duplicate", "ValueError", "keys[1] = 3")
    c("keys dtype", "TypeError", "keys: expected int64, got format 'i'")
    c("keys empty", "ValueError", "keys is empty")
    c("vals size", "ValueError", "vals has 5 floats",
      "not a multiple of its 2 keys")
    c("lens negative", "ValueError", "lens[0] = -1 is negative")
    c("lens count", "ValueError", "lens has 1 entries for 2 keys")
    c("out empty", "ValueError", "out is empty")
    c("pushpull sizes", "ValueError", "vals has 4 floats but out has 6")
    c("wait unknown", "ValueError", "timestamp 12345")
    c("push after finalize", "Error", "push: ps.finalize() has been called")
    c("wait after finalize", "Error", "wait: ps.finalize() has been called")


def test_buffers_stay_exported_until_the_wait(run_job):
    # Keys and values pushed from array.array and a pull into one: growing
    # (or shrinking) any of them before the wait raises BufferError; after
    # it the pulled values are exact and the arrays grow again. A worker
    # dropped with a pull in flight lets go of its destination; one whose
    # wait failed keeps it (a late answer might still land).
    r = run_job("job_errors.py", 1, 1, ["node"], timeout=60)
    assert r.returncode == 0, r.stdout
    assert "worker: pulled [1.5, 2.5, 3.5, 4.5]" in r.stdout, r.stdout
    got = outcomes(r.stdout, "worker")
    for label in ("grow pushed vals", "grow pushed keys",
                  "grow pull destination", "shrink pull destination",
                  "grow before drop", "grow after failed wait"):
        check(got, label, "BufferError", "exporting buffers",
              stdout=r.stdout)
    assert "worker: alive" in r.stdout, r.stdout
