"""--launcher mpi: one mpirun starts all 1+S+W processes (-H FILE becomes
its --hostfile): rank 0 the scheduler, 1..S the servers, S+1..S+W the
workers (OMPI_COMM_WORLD_RANK; no MPI library is linked)."""

from .env import job_settings
from .tool import ToolJob


class MpiJob(ToolJob):
    tool = "mpirun"

    def command(self, port):
        """The settings reach each rank through mpirun's -x (named there,
        their values never on a command line)."""
        args = self.args
        root = args.hosts[0][0] if args.hosts else "127.0.0.1"
        settings = job_settings(args, root, port)
        if self.key_path is not None:
            settings["PS_KEY_FILE"] = self.key_path
        env = self.base_env()
        env.update(settings)
        argv = ["mpirun", "-n", str(self.total)]
        if args.hostfile is not None:
            argv += ["--hostfile", args.hostfile]
        argv += args.launcher_arg
        for name in sorted(settings):
            argv += ["-x", name]
        return argv + self.shim(), env
