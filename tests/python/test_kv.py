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
