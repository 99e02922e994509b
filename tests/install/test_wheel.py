#!/usr/bin/env python3
"""The psd wheel, as a Python user gets it: built from a copy of the
source tree with meson-python (python3 -m build --wheel --no-isolation),
installed into a fresh venv made by Debian's python3 (-m venv
--system-site-packages, for numpy and torch), and used from there, with
no PSD_LIBPSCLIENT and no source tree on the path: the package must load
the libpsclient it carries and train a step of a PyTorch model through a
real psd. The same copy installed with pip install --no-build-isolation
must give the same package, and a user's mypy must read the wheel's type
hints (py.typed) from the venv. Exits 77 where python3-mesonpy or
python3-build is not installed (deploy/install-deps.sh installs both).

usage: test_wheel.py PSD SOURCE_ROOT"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
PY = "/usr/bin/python3"  # Debian's, with numpy and torch
MYPY = shutil.which("mypy", path="/usr/bin")
DEADLINE_S = 30

# One step of a small model through the installed package; prints what
# the test checks.
STEP = r'''
import os, sys
import numpy as np
import torch
import psd, psd.torch
assert "PSD_LIBPSCLIENT" not in os.environ
lib, path = psd.library()
print("package", os.path.dirname(psd.__file__))
print("library", path)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
client = psd.Client(sys.argv[1], rank=0, workers=1)
opt = psd.torch.DistributedOptimizer(model, "sgd", lr=0.5, client=client)
before = {k: v.detach().clone() for k, v in model.state_dict().items()}
x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
opt.zero_grad()
torch.nn.functional.cross_entropy(model(x), y).backward()
grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
opt.step()
moved = 0
for k, p in model.named_parameters():
    want = before[k] - 0.5 * grads[k]
    if not torch.allclose(p.detach(), want, atol=1e-6):
        raise SystemExit("%s: %s after the step, %s expected" % (k, p.detach(), want))
    moved += int((p.detach() != before[k]).sum())
w = np.empty(model[0].weight.numel(), np.float32)
client.pull("0.weight", w).wait()
assert np.array_equal(w, model[0].weight.detach().numpy().ravel()), "the server disagrees"
print("trained one step: %d weights moved" % moved)
opt.close()
client.close()
'''


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print("FAIL: %s exited %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout[-4000:],
                                            r.stderr[-4000:]))
        sys.exit(1)
    return r.stdout


def copy_tree(src, dst):
    """The source tree without build folders, git's data or caches."""
    def ignore(d, names):
        top = os.path.abspath(d) == os.path.abspath(src)
        return [n for n in names
                if (top and (n.startswith("build") or n.startswith(".mesonpy") or
                             n in (".git", "dist")))
                or n == "__pycache__" or (n == "debs" and d.endswith(os.path.join("tests", "gpu")))]
    shutil.copytree(src, dst, ignore=ignore)


def start_psd(psd, tmp):
    ep = os.path.join(tmp, "endpoint")
    log = open(os.path.join(tmp, "psd.log"), "w")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    p = subprocess.Popen([psd, "--listen", "tcp://127.0.0.1:0", "--endpoint-file", ep,
                          "--shard", "0", "--shards", "1", "--workers", "1"],
                         stdout=subprocess.DEVNULL, stderr=log, env=env)
    deadline = time.monotonic() + DEADLINE_S
    while not (os.path.exists(ep) and open(ep).read().strip()):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            p.wait()
            print("FAIL: psd did not start:\n" + open(os.path.join(tmp, "psd.log")).read())
            sys.exit(1)
        time.sleep(0.01)
    return p, open(ep).read().strip()


def venv(path):
    run([PY, "-m", "venv", "--system-site-packages", path])
    return os.path.join(path, "bin", "python")


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PSD_LIBPSCLIENT", "PYTHONPATH", "LD_PRELOAD", "ASAN_OPTIONS")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def main():
    psd, root = sys.argv[1:3]
    for mod, pkg in (("mesonpy", "python3-mesonpy"), ("build", "python3-build")):
        if subprocess.run([PY, "-c", "import " + mod], capture_output=True).returncode != 0:
            print("SKIP: %s is not installed (deploy/install-deps.sh installs it)" % pkg)
            return SKIP
    tmp = tempfile.mkdtemp(prefix="psd-wheel-")
    proc = None
    try:
        src = os.path.join(tmp, "src")
        copy_tree(root, src)
        env = clean_env()
        t0 = time.monotonic()
        run([PY, "-m", "build", "--wheel", "--no-isolation", "--outdir",
             os.path.join(tmp, "dist"), src], env=env)
        wheels = glob.glob(os.path.join(tmp, "dist", "psd-*.whl"))
        if len(wheels) != 1:
            print("FAIL: expected one wheel, found %s" % wheels)
            return 1
        listing = run([PY, "-m", "zipfile", "-l", wheels[0]])
        for f in ("psd/libpsclient.so", "psd/py.typed", "psd/torch.py", "psd/link.py"):
            if f not in listing:
                print("FAIL: the wheel has no %s:\n%s" % (f, listing))
                return 1
        print("built %s in %.1f s" % (os.path.basename(wheels[0]), time.monotonic() - t0))

        a = venv(os.path.join(tmp, "venv-wheel"))
        run([a, "-m", "pip", "install", "--no-index", "--no-deps", wheels[0]], env=env)
        proc, ep = start_psd(psd, tmp)
        out = run([a, "-c", STEP, ep], env=env, cwd=tmp)  # cwd: not the source tree
        print(out.strip())
        site = os.path.join(tmp, "venv-wheel", "lib")
        lines = dict(l.split(" ", 1) for l in out.splitlines() if " " in l)
        if not lines.get("package", "").startswith(site) or \
                lines.get("library") != os.path.join(lines["package"], "libpsclient.so"):
            print("FAIL: the package or its library was not the venv's own")
            return 1

        if MYPY is not None:  # PEP 561: the installed package's hints reach a user's mypy
            user = os.path.join(tmp, "user.py")
            with open(user, "w") as f:
                f.write('import psd\nc = psd.Client("tcp://127.0.0.1:1")\nn: str = c.shards\n')
            r = subprocess.run([MYPY, "--python-executable", a, "--cache-dir",
                                os.path.join(tmp, "mypy-cache"), user], capture_output=True,
                               text=True, cwd=tmp, env=env)
            if r.returncode != 1 or "user.py:3: error: Incompatible types in assignment" \
                    not in r.stdout:
                print("FAIL: mypy did not read the wheel's hints:\n" + r.stdout + r.stderr)
                return 1
            print("mypy reads the installed hints: " + r.stdout.splitlines()[0])
        else:
            print("(mypy is not installed: the installed hints were not checked)")

        b = venv(os.path.join(tmp, "venv-pip"))
        run([b, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", src],
            env=env)
        got = run([b, "-c", "import psd, os; print(psd.library()[1])"], env=env, cwd=tmp).strip()
        if not got.startswith(os.path.join(tmp, "venv-pip")):
            print("FAIL: pip install . loaded %s, not the venv's own library" % got)
            return 1
        print("pip install --no-build-isolation: %s" % got)
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
