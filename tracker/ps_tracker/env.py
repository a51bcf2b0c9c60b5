"""The environment of the job's processes: the DMLC_* and PS_* mapping
of roles, ranks, the scheduler's address, keys and restarts."""

import os

# Variables the launcher sets per process; --env may not override them.
RESERVED_ENV = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT",
                "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "PS_RANK", "PS_KEY_FILE",
                "PS_KEY_FD", "PS_JOB_TOKEN", "PS_MAX_RESTARTS",
                "PS_RESTART_COUNT")

# Of those, the ones a process never inherits from the launcher: set only
# where the launcher means them (--max-restarts; a restarted worker).
RESTART_ENV = ("PS_MAX_RESTARTS", "PS_RESTART_COUNT")

# Variables a launcher gives remote processes besides its own: the job's
# settings from the launcher's environment (PS_VERBOSE, PS_*_TIMEOUT_MS, ...).
FORWARDED_PREFIXES = ("DMLC_", "PS_")


def restart_env(args, restarts=0):
    """PS_MAX_RESTARTS with --max-restarts N > 0; PS_RESTART_COUNT in a
    restarted worker. (getattr: a Job may be given args without the flag.)
    """
    env = {}
    max_restarts = getattr(args, "max_restarts", 0)
    if max_restarts > 0:
        env["PS_MAX_RESTARTS"] = str(max_restarts)
    if restarts > 0:
        env["PS_RESTART_COUNT"] = str(restarts)
    return env


def token_env(args):
    """PS_JOB_TOKEN with --insecure: the job's random token, which the
    scheduler asks of every registration (so that two jobs without a key
    never mix). (getattr: a Job may be given args without it.)"""
    token = getattr(args, "job_token", None)
    return {"PS_JOB_TOKEN": token} if token else {}


def metrics_env(args):
    """PS_METRICS_PORT=0 with --metrics DIR (each node an ephemeral port,
    which it says in a ps-event line), and PS_METRICS_TOKEN_FILE with
    --metrics-token-file FILE. (getattr: a Job may be given args without
    them.)"""
    if not getattr(args, "metrics", None):
        return {}
    env = {"PS_METRICS_PORT": "0"}
    token_file = getattr(args, "metrics_token_file", None)
    if token_file:
        env["PS_METRICS_TOKEN_FILE"] = token_file
    return env


def child_env(args, port, role, rank, key_path, restarts=0, key_fd=None):
    """A local process's environment; restarts: how many times this one
    was restarted (its PS_RESTART_COUNT). The key: PS_KEY_FILE=key_path,
    or PS_KEY_FD=key_fd (a descriptor the process inherits), or none."""
    env = dict(os.environ)
    for name in ("PS_RANK", "PS_KEY_FILE", "PS_KEY_FD",
                 "PS_JOB_TOKEN") + RESTART_ENV:
        env.pop(name, None)
    if key_path is not None:
        env["PS_KEY_FILE"] = key_path
    elif key_fd is not None:
        env["PS_KEY_FD"] = str(key_fd)
    env.update(token_env(args))
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.update({
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": args.host,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(args.num_servers),
        "DMLC_NUM_WORKER": str(args.num_workers),
        "DMLC_NODE_HOST": "127.0.0.1",
    })
    if rank is not None:
        env["PS_RANK"] = str(rank)
    env.update(restart_env(args, restarts))
    env.update(metrics_env(args))
    env.update(args.extra_env)
    return env


def job_settings(args, root, port):
    """What every process of a job on other hosts gets, whatever its role.

    The launcher's DMLC_* and PS_* variables (not those it sets itself, nor
    DMLC_NODE_HOST, which is per host), OMP_WAIT_POLICY (PASSIVE unless
    set), the scheduler's address and the job's shape, PS_MAX_RESTARTS with
    --max-restarts, PS_JOB_TOKEN with --insecure; the --env ones last.
    """
    env = {k: v for k, v in os.environ.items()
           if k.startswith(FORWARDED_PREFIXES) and k not in RESERVED_ENV
           and k != "DMLC_NODE_HOST"}
    env["OMP_WAIT_POLICY"] = os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    env.update({
        "DMLC_PS_ROOT_URI": root,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(args.num_servers),
        "DMLC_NUM_WORKER": str(args.num_workers),
    })
    if args.worker_processes != args.num_workers:
        # For --as-rank, which tells roles from the process's rank.
        env["PS_LAUNCH_WORKER_PROCESSES"] = str(args.worker_processes)
    env.update(restart_env(args))
    env.update(token_env(args))
    env.update(metrics_env(args))
    env.update(args.extra_env)
    return env
