#!/usr/bin/env python3
"""Launches a ps job: one scheduler, S servers, W workers.

Every process runs the same PROGRAM ARGS; its role comes from the
environment (ps-lite style). The processes run on this machine (local), on
the hosts of a hostfile (ssh), under one mpirun (mpi) or one srun in a Slurm
allocation (slurm). Output lines are prefixed with the role and rank; the
first process to fail stops the others. Standard library only.

This is the command; the launcher is the package next to it, ps_tracker
(see its __init__ for the modules). The names below are the ones other
scripts and tests import from launch.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))

from ps_tracker.common import (  # noqa: E402
    DEAD_REPORT_GRACE, EXIT_FAILED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE,
    POLL_SECONDS, OutputMux, describe_exit)
from ps_tracker.env import child_env, job_settings  # noqa: E402
from ps_tracker.keys import (JobKey, check_key_file, write_key_file,  # noqa
                             z85_decode, z85_encode)
from ps_tracker.run import main  # noqa: E402
from ps_tracker.ssh import place, read_hostfile, ssh_env  # noqa: E402
from ps_tracker.supervisor import Child, Job  # noqa: E402

__all__ = ["DEAD_REPORT_GRACE", "EXIT_FAILED", "EXIT_OK", "EXIT_TIMEOUT",
           "EXIT_USAGE", "POLL_SECONDS", "OutputMux", "describe_exit",
           "child_env", "job_settings", "JobKey", "check_key_file",
           "write_key_file", "z85_decode", "z85_encode", "main", "place",
           "read_hostfile", "ssh_env", "Child", "Job"]

if __name__ == "__main__":
    sys.exit(main())
