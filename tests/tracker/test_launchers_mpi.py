"""launch.py --launcher mpi: one real mpirun (Open MPI) starts the job.

Each process runs "launch.py --as-rank", which takes its role from
OMPI_COMM_WORLD_RANK; no MPI library is linked. As root, mpirun needs
OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM); on 2 cores, --oversubscribe.
"""

import os
import unittest

from cluster_tools import KV_JOB, LauncherCase, need, temp_dir


class MpiLauncherTest(LauncherCase):

    @classmethod
    def setUpClass(cls):
        need("mpirun")
        cls.dir = temp_dir(cls)
        cls.env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    def flags(self, servers, workers):
        return ["--launcher", "mpi", "--launcher-arg=--oversubscribe",
                "-s", str(servers), "-w", str(workers)]

    def test_kv_job_under_mpirun(self):
        result = self.launch(self.flags(2, 3), [str(KV_JOB), "sum"],
                             env=self.env, cwd=self.dir)
        self.assert_kv_sum(result, 2, 3)
        self.assertEqual(os.listdir(self.dir), [])  # The key dir is gone.
        self.assert_none_left()

    def test_a_killed_worker_is_named_and_the_rest_stopped(self):
        result = self.launch(self.flags(2, 3), [str(KV_JOB), "kill-worker"],
                             env=self.env, cwd=self.dir)
        self.assertEqual(result.returncode, 1, result.stderr)
        # A node may declare it dead first (its connection closed).
        self.assertRegex(self.last_line(result),
                         r"^launch: worker 0 (on \S+ |was declared dead by "
                         r"[a-z]+( \d+)?: .*; it )was killed by signal "
                         r"SIGKILL( on \S+)?; mpirun stopped the rest and "
                         r"exited with code \d+$")
        self.assert_none_left()

    def test_a_timeout_stops_mpirun_and_every_process(self):
        result = self.launch(self.flags(1, 2) + ["--timeout", "5"],
                             ["/bin/sleep", "300"], env=self.env,
                             cwd=self.dir)
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertRegex(self.last_line(result),
                         r"^launch: timeout after 5 s; killed 1 still "
                         r"running: mpirun \(pid \d+\) and the processes it "
                         r"started$")
        self.assert_none_left()

    def test_a_wrong_world_size_is_refused(self):
        # mpirun starting more ranks than the job has (a user's -n).
        result = self.launch(self.flags(1, 1) + ["--launcher-arg=-n",
                                                 "--launcher-arg=4"],
                             [str(KV_JOB), "sum"], env=self.env,
                             cwd=self.dir)
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertIn("launch --as-rank: OMPI_COMM_WORLD_SIZE=4, but the job "
                      "has 1 + 1 + 1 = 3 processes", result.stderr)
        self.assert_none_left()


if __name__ == "__main__":
    unittest.main()
