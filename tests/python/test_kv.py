"""Zero-copy push/pull with exact sums through real processes, and clear
errors for a wrong dtype or shape."""


def test_handler_server_sums_exactly_and_rejects_bad_buffers(run_job):
    r = run_job("job_kv.py", 2, 2, ["handler"], timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert f"worker {w}: handler sums exact" in r.stdout, r.stdout
    lines = [l for l in r.stdout.splitlines() if "[worker 0] error:" in l]
    assert len(lines) == 6, r.stdout
    assert "no error" not in "".join(lines)
    assert "vals: expected float32, got format 'd'" in lines[0]
    assert "keys: expected int64" in lines[1]
    assert "vals has 11 floats: not a multiple of its 3 keys" in lines[2]
    assert "sorted ascending and unique" in lines[3]
    assert "out: expected a C-contiguous, writable float32" in lines[4]
    assert "out: expected float32" in lines[5]


def test_dense_shards_apply_averaged_gradients_exactly(run_job):
    r = run_job("job_kv.py", 2, 2, ["dense"], timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert f"worker {w}: dense updates exact" in r.stdout, r.stdout


def test_dense_shards_apply_a_one_cycle_lr_by_the_push_step(run_job):
    r = run_job("job_kv.py", 1, 2, ["onecycle"], timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert f"worker {w}: one-cycle lr exact" in r.stdout, r.stdout


# The frame counts below are exact: a request resent because a loaded
# machine answered it late (the measured-RTO resend) would count twice, so
# these jobs resend only after 30 s.
NO_EARLY_RESEND = {"PS_RESEND_TIMEOUT_MS": "30000"}


def test_shared_arrays_go_by_reference_to_a_colocated_server(run_job):
    # One worker and one server on this host: 3 pushes of the gradient and
    # 4 pulls of the weights (initial + 3 steps), every data frame a
    # reference, and the pulled weights written in place.
    r = run_job("job_kv.py", 1, 1, ["shared"], env=NO_EARLY_RESEND,
                timeout=60)
    assert r.returncode == 0, r.stdout
    assert ("worker 0: shared updates exact; shared frames sent 3 "
            "received 4") in r.stdout, r.stdout
    assert "server 0: shared frames received 3 sent 4" in r.stdout, r.stdout


def test_pulls_from_two_servers_are_written_in_place(run_job):
    # S=2, W=2, 10,007 floats in keys of 1,000 (the last one 7): each pull is
    # one request per server into its segment of the destination, so both
    # servers write their share in place. Per worker: 3 pushes and 4 pulls
    # to each of 2 servers; per server: 3 pushes and 4 pulls from each of 2
    # workers. The weights are exact (job_kv.py checks them).
    r = run_job("job_kv.py", 2, 2, ["shared", "10007"], env=NO_EARLY_RESEND,
                timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert (f"worker {w}: shared updates exact; shared frames sent 6 "
                "received 8") in r.stdout, r.stdout
    for s in range(2):
        assert (f"server {s}: shared frames received 6 sent 8"
                in r.stdout), r.stdout


def test_shared_arrays_travel_as_bytes_without_shared_memory(run_job):
    r = run_job("job_kv.py", 1, 2, ["shared"], env={"PS_SHM": "0"},
                timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert (f"worker {w}: shared updates exact; shared frames sent 0 "
                "received 0") in r.stdout, r.stdout


def test_compressed_pushes_sum_to_what_error_feedback_sent(run_job, tmp_path):
    # Values through the sockets (on one host they would go by reference).
    r = run_job("job_kv.py", 2, 2, ["compress", str(tmp_path)],
                env={"PS_SHM": "0"}, timeout=60)
    assert r.returncode == 0, r.stdout
    for w in range(2):
        assert f"worker {w}: compressed sums exact" in r.stdout, r.stdout
    errors = [l for l in r.stdout.splitlines() if "[worker 0] error:" in l]
    assert len(errors) == 2, r.stdout
    assert "compress='topk:2'" in errors[0] and "(0, 1]" in errors[0]
    assert "unknown codec 'gzip'" in errors[1]
