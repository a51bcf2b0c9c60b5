"""The parts of tracker/launch.py's ssh, mpi and slurm launchers that need
no cluster tool: hostfiles, placement, flag checks, and the --as-rank entry
that mpirun and srun run (given the variables they would set)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from test_launch import LAUNCH, launch

PRINT_ENV = r'''
import json, os, sys
keys = ["DMLC_ROLE", "PS_RANK", "DMLC_NODE_HOST", "DMLC_PS_ROOT_URI"]
print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
sys.exit(int(sys.argv[1]))
'''


class HostfileTest(unittest.TestCase):

    def hostfile(self, text):
        tmp = tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False)
        self.addCleanup(os.unlink, tmp.name)
        with tmp:
            tmp.write(text)
        return tmp.name

    def test_hosts_slots_and_comments(self):
        path = self.hostfile("# rack 1\nnode1 slots=2\n\n  node2  # spare\n"
                             "user@node3 slots=1\n")
        self.assertEqual(launch.read_hostfile(path),
                         [("node1", 2), ("node2", 1), ("user@node3", 1)])

    def test_bad_lines_are_named(self):
        for text, message in [
                ("a\nb slots=0\n", "line 2: slots must be an integer >= 1, "
                                   "got '0'"),
                ("a cpus=2\n", "line 1: expected HOST [slots=N], got "
                               "'a cpus=2'"),
                ("-oProxyCommand=x\n", "line 1: '-oProxyCommand=x' is not "
                                       "a host"),
                ("# nothing\n", "names no host")]:
            path = self.hostfile(text)
            result = subprocess.run(
                [sys.executable, str(LAUNCH), "--launcher", "ssh", "-H", path,
                 "-s", "1", "-w", "1", "--", "true"],
                capture_output=True, text=True, timeout=30)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(f"hostfile '{path}'", result.stderr)
            self.assertIn(message, result.stderr)

    def test_placement_fills_slots_then_wraps(self):
        hosts = [("a", 2), ("b", 1)]
        self.assertEqual(launch.place(hosts, 2, 3),
                         (["a", "a"], ["b", "a", "a"]))
        self.assertEqual(launch.place([("a", 1)], 0, 2), ([], ["a", "a"]))


class SshEnvTest(unittest.TestCase):

    def ssh_env(self, child, **settings):
        """launch.ssh_env of child, the launcher's environment holding
        PS_VERBOSE=1 and variables that must not be sent."""
        args = type("Args", (), dict(
            num_servers=1, num_workers=2, worker_processes=2,
            scheduler_host="me@head",
            extra_env={"EXTRA": "x"}, **settings))()
        env = dict(os.environ)
        try:
            for name in env:
                if name.startswith(("DMLC_", "PS_", "OMP_")):
                    del os.environ[name]
            os.environ.update(PS_VERBOSE="1", DMLC_NODE_HOST="wrong",
                              PS_RANK="9", OTHER="not sent",
                              PS_MAX_RESTARTS="5", PS_RESTART_COUNT="7")
            return launch.ssh_env(args, 9000, child)
        finally:
            os.environ.clear()
            os.environ.update(env)

    def test_settings_and_addresses_of_a_session(self):
        got = self.ssh_env(launch.Child("worker", 1, "me@node2"))
        self.assertEqual(got, {
            "PS_VERBOSE": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "DMLC_PS_ROOT_URI": "head", "DMLC_PS_ROOT_PORT": "9000",
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "EXTRA": "x",
            "DMLC_ROLE": "worker", "PS_RANK": "1",
            "DMLC_NODE_HOST": "node2"})

    def test_restart_settings_of_a_session(self):
        worker = launch.Child("worker", 1, "me@node2")
        server = launch.Child("server", 0, "me@node1")
        for max_restarts in (None, 0):
            settings = ({} if max_restarts is None
                        else {"max_restarts": max_restarts})
            got = self.ssh_env(worker, **settings)
            self.assertNotIn("PS_MAX_RESTARTS", got)
            self.assertNotIn("PS_RESTART_COUNT", got)
        got = self.ssh_env(server, max_restarts=2)
        self.assertEqual(got["PS_MAX_RESTARTS"], "2")
        self.assertNotIn("PS_RESTART_COUNT", got)
        worker.restarts = 1  # Its second run.
        got = self.ssh_env(worker, max_restarts=2)
        self.assertEqual((got["PS_MAX_RESTARTS"], got["PS_RESTART_COUNT"],
                          got["PS_RANK"], got["DMLC_ROLE"]),
                         ("2", "1", "1", "worker"))


class FlagTest(unittest.TestCase):

    def run_launch(self, *flags):
        return subprocess.run([sys.executable, str(LAUNCH), *flags, "--",
                               "true"], capture_output=True, text=True,
                              timeout=30)

    def test_flags_of_other_launchers_are_refused(self):
        for flags, message in [
                (["--launcher", "ssh"], "--launcher ssh needs -H/--hostfile"),
                (["-H", "x"], "-H/--hostfile is for --launcher ssh or mpi, "
                              "not local"),
                (["--launcher", "mpi", "--scheduler-host", "a"],
                 "--scheduler-host is for --launcher ssh, not mpi"),
                (["--launcher-arg=-v"], "--launcher-arg is for --launcher "
                                        "ssh, mpi or slurm"),
                (["--launcher", "mpi", "--host", "a"],
                 "--host is for --launcher local"),
                (["--launcher", "mpi", "--tolerate", "server"],
                 "--tolerate is for --launcher local or ssh: mpirun stops "
                 "the job when a process fails"),
                (["--launcher", "mpi", "--max-restarts", "1"],
                 "--max-restarts is for --launcher local or ssh: mpirun "
                 "stops the job when a process fails"),
                (["--launcher", "slurm", "--max-restarts", "2"],
                 "--max-restarts is for --launcher local or ssh: srun "
                 "stops the job when a process fails"),
                (["--launcher", "ssh", "-H", "/nonexistent/hosts",
                  "--max-restarts", "-1"],
                 "--max-restarts must be >= 0, got -1")]:
            result = self.run_launch("-s", "1", "-w", "1", *flags)
            self.assertEqual(result.returncode, 2, flags)
            self.assertIn(message, result.stderr)


class AsRankTest(unittest.TestCase):
    """launch.py --as-rank as mpirun or srun would run it."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.child = Path(tmp.name) / "child.py"
        self.child.write_text(PRINT_ENV)

    def as_rank(self, variables, code=0):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "SLURM", "DMLC_", "PS_"))}
        env.update({"DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3",
                    "DMLC_PS_ROOT_URI": "127.0.0.1",
                    "DMLC_PS_ROOT_PORT": "9000"}, **variables)
        return subprocess.run(
            [sys.executable, str(LAUNCH), "--as-rank", "--", sys.executable,
             str(self.child), str(code)], capture_output=True, text=True,
            env=env, timeout=30)

    def seen(self, result):
        tag, payload = result.stdout.rstrip("\n").split("] ", 1)
        return tag[1:], json.loads(payload)

    def test_roles_from_the_mpi_rank(self):
        expect = ["scheduler", "server 0", "server 1", "worker 0", "worker 1",
                  "worker 2"]
        for rank, name in enumerate(expect):
            result = self.as_rank({"OMPI_COMM_WORLD_RANK": str(rank),
                                   "OMPI_COMM_WORLD_SIZE": "6"})
            self.assertEqual(result.returncode, 0, result.stderr)
            tag, env = self.seen(result)
            self.assertRegex(tag, rf"^{name} @\S+$")
            role, _, index = name.partition(" ")
            self.assertEqual(env, {"DMLC_ROLE": role, "PS_RANK": index or None,
                                   "DMLC_NODE_HOST": "127.0.0.1",
                                   "DMLC_PS_ROOT_URI": "127.0.0.1"})

    def test_worker_processes_of_several_customers(self):
        # launch.py -w 4 --worker-customers 2 (DMLC_NUM_WORKER=4): two
        # worker processes, ranks 3 and 4 of 1 + 2 + 2.
        for rank, name in ((3, "worker 0"), (4, "worker 1")):
            result = self.as_rank({"OMPI_COMM_WORLD_RANK": str(rank),
                                   "OMPI_COMM_WORLD_SIZE": "5",
                                   "DMLC_NUM_WORKER": "4",
                                   "PS_LAUNCH_WORKER_PROCESSES": "2"})
            self.assertEqual(result.returncode, 0, result.stderr)
            tag, env = self.seen(result)
            self.assertRegex(tag, rf"^{name} @\S+$")
            self.assertEqual(env["PS_RANK"], name[-1])
        result = self.as_rank({"OMPI_COMM_WORLD_RANK": "0",
                               "OMPI_COMM_WORLD_SIZE": "7",
                               "DMLC_NUM_WORKER": "4",
                               "PS_LAUNCH_WORKER_PROCESSES": "2"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("OMPI_COMM_WORLD_SIZE=7, but the job has 1 + 2 + 2 = 5 "
                      "processes", result.stderr)

    def test_slurm_node_addresses(self):
        result = self.as_rank({
            "SLURM_PROCID": "4", "SLURM_NTASKS": "6",
            "SLURMD_NODENAME": "n2", "DMLC_PS_ROOT_URI": "10.0.0.1",
            "PS_LAUNCH_SCHEDULER_NODE": "n1",
            "PS_LAUNCH_NODE_ADDRS": "n1=10.0.0.1,n2=10.0.0.2"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.seen(result), ("worker 1 @n2", {
            "DMLC_ROLE": "worker", "PS_RANK": "1",
            "DMLC_NODE_HOST": "10.0.0.2", "DMLC_PS_ROOT_URI": "10.0.0.1"}))

    def test_the_scheduler_must_run_where_expected(self):
        result = self.as_rank({"SLURM_PROCID": "0", "SLURM_NTASKS": "6",
                               "SLURMD_NODENAME": "n2",
                               "PS_LAUNCH_SCHEDULER_NODE": "n1"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("the scheduler (rank 0) runs on n2, not on n1 where "
                      "the others look for it", result.stderr)

    def test_a_failure_is_reported_and_passed_on(self):
        result = self.as_rank({"SLURM_PROCID": "2", "SLURM_NTASKS": "6",
                               "SLURMD_NODENAME": "n1"}, code=3)
        self.assertEqual(result.returncode, 3)
        self.assertRegex(result.stderr, r"(?m)^launch: server 1 \(pid \d+\) "
                         r"on n1 exited with code 3$")

    def test_bad_variables_are_named(self):
        for variables, message in [
                ({}, "neither OMPI_COMM_WORLD_RANK (mpirun) nor SLURM_PROCID "
                     "(srun) is set"),
                ({"SLURM_PROCID": "x", "SLURM_NTASKS": "6"},
                 "SLURM_PROCID='x' is not a non-negative integer"),
                ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "5"},
                 "OMPI_COMM_WORLD_SIZE=5, but the job has 1 + 2 + 3 = 6 "
                 "processes")]:
            result = self.as_rank(variables)
            self.assertEqual(result.returncode, 2, variables)
            self.assertIn(f"launch --as-rank: {message}", result.stderr)


if __name__ == "__main__":
    unittest.main()
