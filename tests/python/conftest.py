"""Runs ps jobs for the Python tests: the tracker launches scheduler,
servers and workers as real processes running a script of this folder.
The module comes from an installed `ps` or from PS_PYTHONPATH (default:
build/python/pkg of the checkout, as scripts/test.sh builds it)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


def module_path():
    return os.environ.get("PS_PYTHONPATH",
                          os.path.join(ROOT, "build", "python", "pkg"))


def launch(script, servers, workers, args=(), env=None, timeout=120,
           launch_args=()):
    """Runs tracker/launch.py -s S -w W [launch_args] -- python script args;
    returns the CompletedProcess (stdout and stderr merged into .stdout)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = module_path() + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    cmd = ([sys.executable, os.path.join(ROOT, "tracker", "launch.py"),
            "-s", str(servers), "-w", str(workers), "--timeout", str(timeout)]
           + list(launch_args)
           + ["--", sys.executable, os.path.join(HERE, script)] + list(args))
    return subprocess.run(cmd, env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout + 30)


def run_alone(script, args=(), timeout=60):
    """Runs python script args as one process, no tracker and no node
    environment; returns the CompletedProcess (output merged as launch)."""
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("DMLC_", "PS_"))}
    e["PYTHONPATH"] = module_path() + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, os.path.join(HERE, script)] +
                          list(args), env=e, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.fixture
def run_job():
    return launch


@pytest.fixture
def run_script():
    return run_alone
