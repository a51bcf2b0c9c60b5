"""--launcher local (the default): every process a child of the launcher,
in a process group of its own, on this machine."""

import subprocess

from .env import child_env
from .supervisor import Child, Job


class LocalJob(Job):

    def plan(self):
        return ([Child("scheduler", None)]
                + [Child("server", i) for i in range(self.args.num_servers)]
                + [Child("worker", i) for i in range(self.args.num_workers)])

    def popen(self, child, port):
        return subprocess.Popen(
            self.args.command, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=child_env(self.args, port, child.role, child.rank,
                          self.key_path, child.restarts),
            start_new_session=True)
