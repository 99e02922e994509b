"""Every PS_E* code has its constant and its kind in psd.errors, equal to
common/protocol/ps_errcodes.h's list and to what the library calls it;
and a libpsclient that cannot be loaded says why."""
import os
import re
import subprocess
import sys

import psd
from psd import errors

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
HEADER = os.path.join(TOP, "common", "protocol", "ps_errcodes.h")
PACKAGE = os.path.join(TOP, "worker", "python")


def header_codes():
    text = open(HEADER).read()
    found = re.findall(r"X\((E[A-Z]+), (-\d+), \"", text)
    assert len(found) >= 26, "the X-macro list was not read from %s" % HEADER
    return {"PS_" + name: int(v) for name, v in found}


def test_every_code_of_the_header_is_here_with_its_value():
    assert errors.CODES == header_codes()


def test_every_code_has_a_kind_of_its_own_below_error():
    for name, code in errors.CODES.items():
        e = errors.error(code, name, "what went wrong")
        assert type(e) is not errors.Error, "%s has no kind" % name
        assert isinstance(e, psd.Error) and e.code == code and e.name == name
        assert type(e).__name__ in psd.__all__, "%s is not exported" % type(e).__name__
        assert e.args[0] == "%s: what went wrong" % name and e.message == "what went wrong"


def test_the_library_names_the_codes_as_the_package_does():
    lib, _ = psd.library()
    for name, code in errors.CODES.items():
        assert lib.psc_err_name(code).decode() == name
        assert lib.psc_strerror(code)


def test_kinds_are_also_the_builtin_exceptions_they_mean():
    assert issubclass(psd.TimeoutError, TimeoutError)
    assert issubclass(psd.NoTableError, KeyError)
    assert issubclass(psd.OutOfMemoryError, MemoryError)
    assert issubclass(psd.NotSupportedError, NotImplementedError)
    assert issubclass(psd.NotPrimaryError, ConnectionError)


def test_a_library_that_cannot_load_says_why(tmp_path):
    """A file that is not a library, then the library when the loader says
    libzmq is missing: the import error lists what was tried and names
    the package to install."""
    bad = tmp_path / "libpsclient.so.1"
    bad.write_bytes(b"not an ELF file")
    code = "import psd; psd.library()"
    env = dict(os.environ, PSD_LIBPSCLIENT=str(bad), PYTHONPATH=PACKAGE)
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "cannot load libpsclient" in r.stderr and str(bad) in r.stderr
    assert "PSD_LIBPSCLIENT" in r.stderr
    real = os.environ.get("PSD_LIBPSCLIENT") or psd.library()[1]
    # the loader's own words when libzmq is missing, for the real library
    env = dict(os.environ, PSD_LIBPSCLIENT=real, PYTHONPATH=PACKAGE)
    env.pop("LD_PRELOAD", None)
    code = ("import ctypes, sys\n"
            "real = ctypes.CDLL\n"
            "def fake(path, *a, **k):\n"
            "    if 'psclient' in str(path):\n"
            "        raise OSError('libzmq.so.5: cannot open shared object file: No such file "
            "or directory')\n"
            "    return real(path, *a, **k)\n"
            "ctypes.CDLL = fake\n"
            "import psd; psd.library()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "libpsclient needs libzmq.so.5" in r.stderr and "apt-get install libzmq5" in r.stderr
