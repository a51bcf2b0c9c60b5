"""--launcher ssh: one ssh session per process to the hosts of a
hostfile; the remote side runs the program in a process group of its own
and stops it when the session's stdin ends."""

import os
import shlex
import subprocess
import time

from .common import REMOTE_STOP_SLACK, usage_error
from .env import job_settings
from .supervisor import Child, Job


def read_hostfile(path):
    """[(host, slots)] of a hostfile: "HOST" or "HOST slots=N" a line.

    '#' starts a comment; blank lines are skipped. The format is Open MPI's,
    so one file serves mpirun too. Exits 2 naming the line that is wrong.
    """
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as err:
        usage_error(f"cannot read hostfile '{path}': "
                    f"{err.strerror or err}")
    hosts = []
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"hostfile '{path}' line {number}"
        slots = 1
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if key != "slots" or not sep:
                usage_error(f"{where}: expected HOST [slots=N], got '{line}'")
            if not value.isdigit() or int(value) < 1:
                usage_error(f"{where}: slots must be an integer >= 1, "
                            f"got '{value}'")
            slots = int(value)
        if fields[0].startswith("-"):
            usage_error(f"{where}: '{fields[0]}' is not a host")
        hosts.append((fields[0], slots))
    if not hosts:
        usage_error(f"hostfile '{path}' names no host")
    return hosts


def place(hosts, num_servers, num_workers):
    """The host of each server and worker: slot by slot, cyclically.

    The slots are the hostfile's hosts each repeated slots times; servers
    take the first ones, then workers, starting over when they run out.
    """
    slots = [host for host, count in hosts for _ in range(count)]
    servers = [slots[i % len(slots)] for i in range(num_servers)]
    workers = [slots[(num_servers + i) % len(slots)]
               for i in range(num_workers)]
    return servers, workers


def remote_script(env, command, cwd, with_key, grace):
    """The sh script an ssh session runs for one process.

    With a key, its one line comes first on the session's stdin; the script
    keeps it in a variable and hands it to the program through a pipe, as
    descriptor 4 (PS_KEY_FD=4): never a file, nor a command line (printf is
    the shell's own). The program runs in a new session (its own process
    group) with stdin from /dev/null; the rest of the session's stdin is
    watched: when it ends (the launcher closed it, or the launcher or its
    ssh died), the group gets SIGCONT and SIGTERM, and SIGKILL `grace`
    seconds later. What the program leaves in its group when it ends is
    killed (as the local launcher does; before a restart, too). The script
    exits with the program's status (128+N for signal N).
    """
    if with_key:
        env = dict(env, PS_KEY_FD="4")
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    program = f"env {assignments} setsid " + " ".join(
        shlex.quote(arg) for arg in command)
    lines = ["umask 077", "exec 3<&0 </dev/null"]
    if with_key:
        lines.append("IFS= read -r k <&3 || exit 1")
    lines.append(f"[ -d {shlex.quote(cwd)} ] && cd {shlex.quote(cwd)}")
    if with_key:  # $! is the pipeline's last process: the program.
        lines += [
            'printf "%s\\n" "$k" | { exec 4<&0 </dev/null; '
            f"exec {program} 3<&-; }} &",
            "p=$!; k="]
    else:
        lines += [f"{program} 3<&- &", "p=$!"]
    lines += [
        "{ while IFS= read -r l; do :; done; kill -CONT -$p; kill -TERM -$p;"
        f" sleep {grace:g}; kill -KILL -$p; }} <&3 >/dev/null 2>&1 &",
        "w=$!",
        "exec 3<&-",
        "wait $p 2>/dev/null; r=$?",
        "kill -KILL -$p 2>/dev/null",
        "kill $w 2>/dev/null; exit $r"]
    return "\n".join(lines)


def address(host):
    """The address part of an ssh destination: "node1" of "user@node1"."""
    return host.rsplit("@", 1)[-1]


def ssh_env(args, port, child):
    """The environment an ssh session gives one process (no PS_KEY_FD:
    the remote script sets it)."""
    env = job_settings(args, address(args.scheduler_host), port)
    env["DMLC_ROLE"] = child.role
    if child.rank is not None:
        env["PS_RANK"] = str(child.rank)
    if child.restarts > 0:
        env["PS_RESTART_COUNT"] = str(child.restarts)
    if "DMLC_NODE_HOST" not in env and "DMLC_INTERFACE" not in env:
        env["DMLC_NODE_HOST"] = address(child.host)  # As the others see it.
    return env


class SshJob(Job):
    """Each child is the ssh client of one process's session (see
    remote_script); the hosts come from -H FILE (args.hosts)."""

    def plan(self):
        servers, workers = place(self.args.hosts, self.args.num_servers,
                                 self.args.worker_processes)
        return ([Child("scheduler", None, self.args.scheduler_host)]
                + [Child("server", i, h) for i, h in enumerate(servers)]
                + [Child("worker", i, h) for i, h in enumerate(workers)])

    def popen(self, child, port):
        script = remote_script(ssh_env(self.args, port, child),
                               self.args.command, os.getcwd(),
                               self.key_line() is not None, self.args.grace)
        argv = ["ssh", "-T", "-o", "BatchMode=yes", *self.args.launcher_arg,
                child.host, "exec /bin/sh -c " + shlex.quote(script)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                start_new_session=True)
        line = self.key_line()
        if line is not None:  # Its one line, through the session.
            try:
                proc.stdin.write(line + b"\n")
                proc.stdin.flush()
            except OSError:
                pass  # ssh failed already; its exit says why.
        return proc

    def kill(self, child):
        """Ends the session's stdin: the remote side stops the process
        (SIGCONT, SIGTERM, SIGKILL --grace seconds later)."""
        try:
            child.proc.stdin.close()
        except OSError:
            pass

    def before_stop(self, children):
        """Ends the stdin of the sessions: the remote side then stops its
        process group (remote_script); waits for the sessions to end."""
        for child in children:
            self.kill(child)
        end = time.monotonic() + self.args.grace + REMOTE_STOP_SLACK
        for child in children:
            try:
                child.proc.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
