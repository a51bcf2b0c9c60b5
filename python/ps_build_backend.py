"""PEP 517 build backend of the `ps` Python package: CMake builds the
extension (target ps_python), and the wheel is zipped here by hand, so that
`pip install .` needs nothing beyond CMake, a compiler, pybind11-dev and
the C++ dependencies -- no setuptools and no download, even under pip's
build isolation.

Environment: PS_BUILD_DIR (default: build-wheel in the checkout),
CMAKE_BUILD_PARALLEL_LEVEL (default: the number of cores), PS_CMAKE_ARGS
(extra -D settings, space-separated).
"""

import base64
import hashlib
import io
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

NAME = "ps"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_FILES = ("__init__.py", "dense.py", "sparse.py", "_ps.pyi",
                 "py.typed")

METADATA = f"""\
Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Python binding of the ps parameter server (worker, DenseShard server)
Requires-Python: >=3.8
Requires-Dist: numpy
"""


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _tag():
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{plat}"


def _build_extension():
    build = os.environ.get("PS_BUILD_DIR", os.path.join(ROOT, "build-wheel"))
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count()))
    configure = [
        "cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
        "-DPS_BUILD_PYTHON=ON", "-DPS_BUILD_TESTS=OFF", "-DPS_BUILD_BENCH=OFF",
        "-DPS_BUILD_EXAMPLES=OFF", "-DPS_WITH_CUDA=OFF",
        f"-DPython3_EXECUTABLE={sys.executable}",
    ] + os.environ.get("PS_CMAKE_ARGS", "").split()
    subprocess.check_call(configure, stdout=sys.stderr)
    subprocess.check_call(["cmake", "--build", build, "-j", jobs, "--target",
                           "ps_python"], stdout=sys.stderr)
    pkg = os.path.join(build, "python", "pkg", NAME)
    ext = [f for f in os.listdir(pkg) if f.startswith("_ps") and
           f.endswith(".so")]
    if len(ext) != 1:
        raise RuntimeError(f"expected one _ps*.so in {pkg}, found {ext}")
    return pkg, list(PACKAGE_FILES) + ext


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return f"{path},sha256={digest.rstrip(b'=').decode()},{len(data)}"


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    pkg, files = _build_extension()
    tag = _tag()
    dist_info = f"{NAME}-{VERSION}.dist-info"
    wheel_name = f"{NAME}-{VERSION}-{tag}.whl"
    entries = []
    for f in files:
        with open(os.path.join(pkg, f), "rb") as fh:
            entries.append((f"{NAME}/{f}", fh.read()))
    entries.append((f"{dist_info}/METADATA", METADATA.encode()))
    entries.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: ps_build_backend\n"
        f"Root-Is-Purelib: false\nTag: {tag}\n").encode()))
    record = [_record_line(p, d) for p, d in entries]
    record.append(f"{dist_info}/RECORD,,")
    entries.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w",
                         zipfile.ZIP_DEFLATED) as zf:
        for path, data in entries:
            zf.writestr(path, data)
    return wheel_name


def build_sdist(sdist_directory, config_settings=None):
    """The tracked files of the checkout (git ls-files)."""
    files = subprocess.check_output(["git", "ls-files"], cwd=ROOT,
                                    text=True).split()
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tar:
        for f in files:
            tar.add(os.path.join(ROOT, f), arcname=f"{base}/{f}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return name
