"""--launcher local (the default): every process a child of the launcher,
in a process group of its own, on this machine, gone with the launcher."""

import subprocess

from .common import die_with_parent
from .env import child_env
from .supervisor import Child, Job


class LocalJob(Job):

    def plan(self):
        return ([Child("scheduler", None)]
                + [Child("server", i) for i in range(self.args.num_servers)]
                + [Child("worker", i) for i in range(self.args.worker_processes)])

    def popen(self, child, port):
        """The job's key: its memfd inherited (PS_KEY_FD), or the user's
        --key-file (PS_KEY_FILE). SIGKILL if the launcher dies."""
        key_fds = () if self.key_fd is None else (self.key_fd,)
        return subprocess.Popen(
            self.args.command, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=child_env(self.args, port, child.role, child.rank,
                          self.key_path, child.restarts, key_fd=self.key_fd),
            pass_fds=key_fds, start_new_session=True,
            preexec_fn=die_with_parent())
