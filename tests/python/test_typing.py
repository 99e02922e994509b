"""The package's type hints, with Debian's mypy and the settings in
pyproject.toml ([tool.mypy]: every def annotated in full): the package
checks clean, a program using the public API as documented checks clean,
and the same program with mistakes a user makes is refused, line by line
(so the hints are there and say something)."""
import os
import shutil
import subprocess
import textwrap

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MYPY = shutil.which("mypy", path="/usr/bin")

pytestmark = pytest.mark.skipif(MYPY is None, reason="mypy is not installed (Debian: mypy)")

GOOD = """\
import numpy as np
import psd
import psd.torch

def train(servers: str) -> float:
    with psd.Client(servers, rank=0, workers=1, timeout_ms=5000) as c:
        name: str = c.create_table("w", (4, 3), "adam", 0.01, beta1=0.9)
        w = np.zeros(12, np.float32)
        h: psd.Handle = c.pull(name, w)
        h.wait()
        c.push(name, np.ones(12, np.float32), offset=0).wait(1000)
        c.create_sparse_table("e", 8, rows_max=1000)
        c.pull_rows("e", np.arange(3, dtype=np.uint64), np.zeros((3, 8), np.float32)).wait()
        top = psd.TopK(12, 0.25, momentum=0.9)
        keys, vals = top.select(np.ones(12, np.float32))
        c.push_keys(name, keys, vals).wait()
        skip: bool = c.vote("found_inf", False)
        return float(w.sum()) + c.shards + int(skip)

def scaler() -> float:
    s = psd.torch.GradScaler(init_scale=1024.0)
    s.update()
    return s.get_scale()

def tensors(path: str) -> int:
    t = psd.load_safetensors(path)
    psd.save_safetensors(path, t, metadata={"step": 3})
    return len(t)

try:
    psd.Client("tcp://127.0.0.1:1")
except psd.TimeoutError as e:
    code: int = e.code
"""

# each line a mistake, and what mypy says of it
BAD = [
    ('c.pull("w", np.zeros(4, np.float32), offset="0")', 'Argument "offset"'),
    ('n: str = c.shards', 'Incompatible types in assignment'),
    ('c.create_table("w", 10, lr="fast")', 'Argument "lr"'),
    ('h: psd.Handle = c.vote("v", True)', 'Incompatible types in assignment'),
    ('psd.TopK("ten", 0.1)', 'Argument 1 to "TopK"'),
    ('psd.Link(0, 2, windows=4)', 'Unexpected keyword argument "windows"'),
    ('x: int = psd.load_safetensors("m.safetensors")', 'Incompatible types in assignment'),
]


def mypy(tmp_path, text):
    f = tmp_path / "user.py"
    f.write_text(text)
    r = subprocess.run([MYPY, "--config-file", os.path.join(ROOT, "pyproject.toml"),
                        "--cache-dir", str(tmp_path / "cache"), str(f)],
                       capture_output=True, text=True, cwd=ROOT)
    return r.returncode, r.stdout + r.stderr


def test_the_package_checks_clean(tmp_path):
    r = subprocess.run([MYPY, "--config-file", os.path.join(ROOT, "pyproject.toml"),
                        "--cache-dir", str(tmp_path / "cache")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no issues found" in r.stdout


def test_a_program_on_the_public_api_checks_clean(tmp_path):
    rc, out = mypy(tmp_path, GOOD)
    assert rc == 0, out


def test_mistakes_are_refused_each_on_its_line(tmp_path):
    head = "import numpy as np\nimport psd\nc = psd.Client('tcp://127.0.0.1:1')\n"
    body = "".join(line + "\n" for line, _ in BAD)
    rc, out = mypy(tmp_path, head + textwrap.dedent(body))
    assert rc == 1, out
    for i, (line, said) in enumerate(BAD):
        where = "user.py:%d:" % (i + 4)
        mine = [l for l in out.splitlines() if l.startswith(where) or (":%d:" % (i + 4)) in l]
        assert any(said in l for l in mine), "%r: mypy said %s" % (line, mine or out)
