# SPDX-License-Identifier: MIT
"""A PEP 517 build backend for the fanout package, with no dependency but
cffi, so that `pip install ./python` works offline.

pip builds in an isolated environment by default and would fetch the
backend's requirements (setuptools, wheel) from an index; this backend
requires nothing, and finds cffi in the site-packages of the interpreter
running pip (or Debian's /usr/lib/python3/dist-packages) when the
isolated environment hides it.  It compiles the extension with cffi
(fanout_build.py) and writes the wheel itself (a zip with METADATA, WHEEL
and RECORD), so the `wheel` package is not needed either.
"""
import base64
import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
import zipfile

NAME = "fanout"
VERSION = "0.2.0"
HERE = os.path.dirname(os.path.abspath(__file__))


def _find_cffi():
    try:
        import cffi  # noqa: F401
        return
    except ImportError:
        pass
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix,
            "installed_platbase": sys.base_exec_prefix}
    dirs = []
    for key in ("platlib", "purelib"):
        try:
            dirs.append(sysconfig.get_paths(vars=base)[key])
        except KeyError:
            pass
    dirs += ["/usr/lib/python3/dist-packages",
             "/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2]]
    for d in dirs:
        if os.path.isdir(os.path.join(d, "cffi")) and d not in sys.path:
            sys.path.append(d)
    import cffi  # noqa: F401 - now or never


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _tag():
    impl = "cp%d%d" % sys.version_info[:2]
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{plat}"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: fan a batch of children out and get ONE event back\n"
            "License: MIT\nRequires-Python: >=3.9\n"
            "Requires-Dist: cffi>=1.15\n")


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return f"{name},sha256={digest.rstrip(b'=').decode()},{len(data)}"


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    _find_cffi()
    sys.path.insert(0, HERE)
    import fanout_build

    tmp = tempfile.mkdtemp(prefix="fanout-build-")
    try:
        so = fanout_build.ffibuilder.compile(tmpdir=tmp, verbose=False)
        files = {}
        pkg = os.path.join(HERE, "fanout")
        for f in sorted(os.listdir(pkg)):
            if f.endswith((".py", ".c")):
                with open(os.path.join(pkg, f), "rb") as fh:
                    files[f"fanout/{f}"] = fh.read()
        with open(so, "rb") as fh:
            files[f"fanout/{os.path.basename(so)}"] = fh.read()
        tag = _tag()
        di = f"{NAME}-{VERSION}.dist-info"
        files[f"{di}/METADATA"] = _metadata().encode()
        files[f"{di}/WHEEL"] = (
            "Wheel-Version: 1.0\nGenerator: fanout _build_backend\n"
            f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
        files[f"{di}/top_level.txt"] = b"fanout\n"
        record = [_record_line(n, d) for n, d in files.items()]
        record.append(f"{di}/RECORD,,")
        files[f"{di}/RECORD"] = ("\n".join(record) + "\n").encode()
        name = f"{NAME}-{VERSION}-{tag}.whl"
        with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                             zipfile.ZIP_DEFLATED) as z:
            for n, d in files.items():
                z.writestr(n, d)
        return name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError(
        "fanout: no sdist; the extension compiles the library sources of "
        "the checkout (pip install ./python from it)")
