"""The ps job launcher (tracker/launch.py is its command).

Modules: cli (flags, checks, --help), run (main: key, job, last line),
supervisor (the process table: output, restarts, which failure stops the
job, what the job says of itself), local, ssh, mpi and slurm (one per
launcher; tool: what mpi and slurm share; rank: their per-process
--as-rank shim), keys (job key files), env (DMLC_*/PS_* of each
process), common (exit statuses, timings, output). Standard library only.
"""
