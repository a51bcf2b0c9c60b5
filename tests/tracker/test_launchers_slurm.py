"""launch.py --launcher slurm in a real one-node Slurm the test starts.

munged, slurmctld and slurmd run from a temp dir (no cgroups:
proctrack/linuxproc, task/none) on unused ports; the launcher runs inside
an allocation, under salloc or as the batch script of sbatch, and starts
every process with one srun; each takes its role from SLURM_PROCID.
"""

import os
import subprocess
import sys
import unittest
from pathlib import Path

from cluster_tools import (KV_JOB, LAUNCH, RUN_TIMEOUT, LauncherCase, Slurm,
                           need, temp_dir)


class SlurmLauncherTest(LauncherCase):

    @classmethod
    def setUpClass(cls):
        need("munged", "slurmctld", "slurmd", "salloc", "sbatch", "srun",
             "scontrol", "sinfo", root=True)
        cls.slurm = Slurm(temp_dir(cls))
        cls.addClassCleanup(cls.slurm.stop)
        cls.dir = Path(temp_dir(cls))

    def salloc(self, tasks, flags, program):
        argv = ["salloc", "-n", str(tasks), "--time=5",
                *self.launch_argv(flags, program)]
        return subprocess.run(argv, capture_output=True, text=True,
                              env=self.slurm.env(), cwd=self.dir,
                              timeout=RUN_TIMEOUT)

    def last_line(self, result):  # The launcher's, not salloc's.
        lines = [line for line in result.stderr.splitlines()
                 if line.startswith("launch: ")]
        return lines[-1] if lines else ""

    def test_kv_job_under_salloc(self):
        result = self.salloc(6, ["--launcher", "slurm", "-s", "2", "-w", "3"],
                             [str(KV_JOB), "sum"])
        node = Slurm.NODE
        self.assert_kv_sum(result, 2, 3, tags=[
            f"server 0 @{node}", f"server 1 @{node}", f"worker 0 @{node}",
            f"worker 1 @{node}", f"worker 2 @{node}"])
        self.assertEqual(os.listdir(self.dir), [])  # The key dir is gone.
        self.assert_none_left()

    def test_kv_job_as_a_batch_script(self):
        # As docs/clusters.md's example, with this checkout's paths.
        out = self.dir / "job.out"
        script = self.dir / "job.sh"
        launch = " ".join(self.launch_argv(
            ["--launcher", "slurm", "-s", "1", "-w", "2"],
            [str(KV_JOB), "sum"]))
        script.write_text(f"#!/bin/sh\n#SBATCH --ntasks=4\n"
                          f"#SBATCH --output={out}\n#SBATCH --time=5\n"
                          f"exec {launch}\n")
        self.addCleanup(script.unlink)
        self.addCleanup(out.unlink)
        result = subprocess.run(["sbatch", "--wait", str(script)],
                                capture_output=True, text=True,
                                env=self.slurm.env(), cwd=self.dir,
                                timeout=RUN_TIMEOUT)
        self.assertEqual(result.returncode, 0, result.stderr + out.read_text())
        text = out.read_text()
        # sbatch writes stdout and stderr to one file.
        job = subprocess.CompletedProcess(
            [], 0, "\n".join(line for line in text.splitlines()
                             if not line.startswith("launch: ")),
            "\n".join(line for line in text.splitlines()
                      if line.startswith("launch: ")))
        self.assert_kv_sum(job, 1, 2)
        self.assert_none_left()

    def test_a_killed_worker_is_named_and_the_rest_stopped(self):
        result = self.salloc(6, ["--launcher", "slurm", "-s", "2", "-w", "3"],
                             [str(KV_JOB), "kill-worker"])
        self.assertEqual(result.returncode, 1, result.stderr)
        # A node may declare it dead first (its connection closed).
        self.assertRegex(self.last_line(result),
                         rf"^launch: worker 0 (on {Slurm.NODE} |was declared "
                         r"dead by [a-z]+( \d+)?: .*; it )was killed by "
                         rf"signal SIGKILL( on {Slurm.NODE})?; srun stopped "
                         r"the rest and exited with code \d+$")
        self.assert_none_left()

    def test_a_timeout_stops_srun_and_every_process(self):
        result = self.salloc(4, ["--launcher", "slurm", "-s", "1", "-w", "2",
                                 "--timeout", "5"], ["/bin/sleep", "300"])
        self.assertEqual(result.returncode, 124, result.stderr)
        self.assertRegex(self.last_line(result),
                         r"^launch: timeout after 5 s; killed 1 still "
                         r"running: srun \(pid \d+\) and the processes it "
                         r"started$")
        self.assert_none_left()

    def test_outside_an_allocation_is_a_usage_error(self):
        env = {k: v for k, v in self.slurm.env().items()
               if not k.startswith("SLURM_JOB")}
        result = subprocess.run(
            [sys.executable, str(LAUNCH), "--launcher", "slurm", "-s", "1",
             "-w", "1", "--", str(KV_JOB), "sum"], capture_output=True,
            text=True, env=env, timeout=RUN_TIMEOUT)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--launcher slurm runs inside a Slurm allocation "
                      "(salloc or sbatch): SLURM_JOB_ID is not set",
                      result.stderr)


if __name__ == "__main__":
    unittest.main()
