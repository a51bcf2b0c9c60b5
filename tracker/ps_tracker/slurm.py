"""--launcher slurm: inside an allocation (salloc, sbatch), one srun
--kill-on-bad-exit=1 starts all 1+S+W processes, roles from SLURM_PROCID;
the scheduler runs on the allocation's first node, at its NodeAddr."""

import os
import subprocess

from .common import usage_error
from .env import job_settings
from .tool import ToolJob


def slurm_nodes():
    """The allocation's node names and {name: address}, from scontrol."""
    def scontrol(*argv):
        try:
            return subprocess.run(["scontrol", *argv], capture_output=True,
                                  text=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as err:
            usage_error(f"--launcher slurm: scontrol {' '.join(argv)} "
                        f"failed: {getattr(err, 'stderr', '') or err}")
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        usage_error("--launcher slurm: SLURM_JOB_NODELIST is not set")
    names = scontrol("show", "hostnames", nodelist).split()
    addrs = {}
    for line in scontrol("show", "node", "-o", nodelist).splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            addrs[fields["NodeName"]] = fields.get("NodeAddr",
                                                   fields["NodeName"])
    if not names:
        usage_error(f"--launcher slurm: no node in SLURM_JOB_NODELIST="
                    f"{nodelist}")
    return names, {n: addrs.get(n, n) for n in names}


class SlurmJob(ToolJob):
    tool = "srun"

    def command(self, port):
        """srun exports the whole environment, the settings in it."""
        args = self.args
        names, addrs = slurm_nodes()
        settings = job_settings(args, addrs[names[0]], port)
        if self.key_path is not None:
            settings["PS_KEY_FILE"] = self.key_path
        settings["PS_LAUNCH_SCHEDULER_NODE"] = names[0]
        settings["PS_LAUNCH_NODE_ADDRS"] = ",".join(f"{n}={addrs[n]}"
                                                    for n in names)
        env = self.base_env()
        env.update(settings)
        argv = ["srun", "-n", str(self.total), "--kill-on-bad-exit=1",
                "--export=ALL", *args.launcher_arg]
        return argv + self.shim(), env
