#!/usr/bin/env python3
"""The compose cluster, for real: builds deploy/docker/Dockerfile on a
Debian bookworm base made with debootstrap (no registry is reachable
here), runs deploy/docker-compose.yml with podman-compose (2 shards with
CURVE, checkpoint volumes and healthchecks, 2 CPU workers), and checks
that the workers train to the quick start's accuracy, that the healthcheck
and /metrics answer inside the containers, and that a stopped shard leaves
a checkpoint in its volume.

Slow (a few minutes: debootstrap, the image build, 5 epochs). Exits 77
(skipped) where containers cannot run at all (not root, podman missing, or
podman cannot start a container); a failure of our image build or of the
cluster is a failure. Everything it makes is named after its pid and
removed at the end; the base image is kept for the next run.
PSD_COMPOSE_EPOCHS changes the epochs (5, as the quick start)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from pstest import check, failures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PSD = os.environ["PSD_BIN"]
BASE = "localhost/psd-debian:bookworm"
PROJECT = "pstest%d" % os.getpid()
IMAGE = "localhost/psd:" + PROJECT
EPOCHS = os.environ.get("PSD_COMPOSE_EPOCHS", "5")
MIRROR = os.environ.get("PSD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
QUICKSTART_ACCURACY = 0.8831  # deploy/quickstart.sh on this machine, same model, workers and epochs


class Skip(Exception):
    pass


def run(*args, timeout=900, ok=True, env=None, quiet=False):
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)
    if ok and r.returncode != 0:
        raise RuntimeError("%s: exit %d\n%s%s" % (" ".join(args), r.returncode, r.stdout[-3000:],
                                                  r.stderr[-3000:]))
    if not quiet and r.returncode != 0:
        print("     %s: exit %d: %s" % (" ".join(args), r.returncode, r.stderr.strip()[-500:]))
    return r


def base_image(tmp):
    """A Debian bookworm image from debootstrap, kept between runs."""
    if run("podman", "image", "exists", BASE, ok=False, quiet=True).returncode == 0:
        return
    root = os.path.join(tmp, "rootfs")
    t0 = time.monotonic()
    r = run("debootstrap", "--variant=minbase", "bookworm", root, MIRROR, ok=False, timeout=1200)
    if r.returncode != 0:
        raise Skip("debootstrap failed (is %s reachable?): %s" % (MIRROR, r.stderr[-300:]))
    tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
    try:
        imp = subprocess.run(["podman", "import", "-", BASE], stdin=tar.stdout,
                             capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        imp = None
    # the pipe's read end is podman's alone now: if podman stopped reading,
    # tar gets SIGPIPE instead of blocking on a reader that will never come
    tar.stdout.close()
    try:
        tar.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tar.kill()
        tar.wait()
    shutil.rmtree(root, ignore_errors=True)
    if imp is None or imp.returncode != 0:
        raise Skip("podman import failed (nested containers?): "
                   + (imp.stderr[-300:] if imp else "no answer in 900 s"))
    print("     base image from debootstrap in %.0f s" % (time.monotonic() - t0))


def can_run():
    """Skips where podman has the image but cannot start a container from it
    (nested containers without the rights): not a fault of ours."""
    r = run("podman", "run", "--rm", BASE, "true", ok=False, quiet=True, timeout=300)
    if r.returncode != 0:
        raise Skip("podman cannot run a container here: "
                   + (r.stderr.strip().splitlines() or ["?"])[-1])


def containers():
    """{service: container name} of this project ({} when podman cannot say)."""
    r = run("podman", "ps", "-a", "--filter", "label=io.podman.compose.project=" + PROJECT,
            "--format", "json", ok=False, quiet=True)
    if r.returncode != 0:
        return {}
    out = {}
    for c in json.loads(r.stdout or "[]"):
        svc = c.get("Labels", {}).get("com.docker.compose.service")
        if svc:
            out[svc] = c["Names"][0]
    return out


def make_keys(keys):
    os.makedirs(os.path.join(keys, "allow"))
    for who in ("server", "worker"):
        run(PSD, "--keygen", os.path.join(keys, who))
        os.chown(os.path.join(keys, who), 10001, 10001)  # the image's psd user
    shutil.copy(os.path.join(keys, "worker.pub"), os.path.join(keys, "allow", "worker.pub"))


def probe():
    """Skips where podman cannot work at all (a container without the
    rights or the storage nested containers need)."""
    r = run("podman", "info", ok=False, quiet=True, timeout=120)
    if r.returncode != 0:
        raise Skip("podman does not work here: " + (r.stderr.strip().splitlines() or ["?"])[-1])


def clean_up(env, names):
    """Removes what this run made; never raises (podman may be unusable)."""
    steps = [["podman-compose", "-p", PROJECT, "-f",
              os.path.join(ROOT, "deploy/docker-compose.yml"), "down", "-v"],
             ["podman", "rm", "-f"] + list(names.values()),
             ["podman", "volume", "rm", "-f", PROJECT + "_ckpt0", PROJECT + "_ckpt1"],
             ["podman", "rmi", "-f", IMAGE]]
    for cmd in steps:
        try:
            subprocess.run(cmd, capture_output=True, env=env, timeout=300)
        except (OSError, subprocess.SubprocessError):
            pass


def main(tmp, env):
    probe()
    base_image(tmp)
    can_run()
    t0 = time.monotonic()
    r = run("podman", "build", "-f", os.path.join(ROOT, "deploy/docker/Dockerfile"),
            "--build-arg", "BUILD_BASE=" + BASE, "--build-arg", "RUNTIME_BASE=" + BASE,
            "-t", IMAGE, ROOT, ok=False, timeout=1800)
    check(r.returncode == 0, "the image builds from deploy/docker/Dockerfile (%.0f s)"
          % (time.monotonic() - t0))
    if r.returncode != 0:
        print(r.stdout[-4000:] + r.stderr[-4000:])
        return
    keys = os.path.join(tmp, "keys")
    make_keys(keys)
    env.update(PSD_IMAGE=IMAGE, PSD_KEYS=keys, EPOCHS=EPOCHS)
    compose = ["podman-compose", "-p", PROJECT, "-f", os.path.join(ROOT, "deploy/docker-compose.yml")]
    t0 = time.monotonic()
    run(*compose, "up", "-d", "psd0", "psd1", "worker0", "worker1", env=env)
    names = containers()
    check(sorted(names) == ["psd0", "psd1", "worker0", "worker1"],
          "4 containers: %s" % sorted(names))
    if sorted(names) != ["psd0", "psd1", "worker0", "worker1"]:
        return
    codes = [run("podman", "wait", names[w], timeout=1800).stdout.strip()
             for w in ("worker0", "worker1")]
    took = time.monotonic() - t0
    logs = run("podman", "logs", names["worker0"]).stderr + run("podman", "logs",
                                                               names["worker0"]).stdout
    check(codes == ["0", "0"], "both workers exited 0 (%s) after %.0f s" % (codes, took))
    m = re.search(r"W0100 done: (\d+) steps, test accuracy ([0-9.]+)", logs)
    acc = float(m.group(2)) if m else -1
    print("     compose cluster: %s epochs, rank 0 test accuracy %.4f (quick start %.4f)"
          % (EPOCHS, acc, QUICKSTART_ACCURACY))
    if EPOCHS == "5":
        check(acc >= QUICKSTART_ACCURACY - 0.01, "the quick start's accuracy within 1 point")
    else:
        check(acc > 0.7, "it learned")
    psd_log = run("podman", "logs", names["psd0"]).stderr
    check("CURVE on" in psd_log, "psd0 runs with CURVE on")
    check(run("podman", "healthcheck", "run", names["psd0"], ok=False).returncode == 0,
          "psd0's healthcheck passes")
    metrics = run("podman", "exec", names["psd0"], "curl", "-fsS",
                  "http://127.0.0.1:9100/metrics", ok=False).stdout
    pushes = re.search(r'^psd_requests_total\{op="push_pull"\} (\S+)$', metrics, re.M)
    check(pushes is not None and float(pushes.group(1)) > 0,
          "psd0's /metrics counted the push-pulls (%s)" % (pushes.group(1) if pushes else None))
    # a stopped shard (SIGTERM) leaves a checkpoint in its volume
    run("podman", "stop", "-t", "30", names["psd0"])
    vol = run("podman", "volume", "inspect", PROJECT + "_ckpt0").stdout
    mount = json.loads(vol)[0]["Mountpoint"]
    files = [f for f in os.listdir(mount) if f.endswith(".safetensors")]
    check(len(files) >= 1, "psd0's checkpoint volume holds %s" % files)


if __name__ == "__main__":
    need = ["podman", "podman-compose", "debootstrap"]
    if os.geteuid() != 0 or any(shutil.which(n) is None for n in need):
        print("needs root and %s: skipped" % ", ".join(need))
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pstest-compose.")
    env = dict(os.environ)
    # podman on these machines: runc, and no default ulimits (see deploy/README.md, "Containers")
    conf = os.path.join(tmp, "containers.conf")
    with open(conf, "w") as f:
        f.write('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n')
    os.environ["CONTAINERS_CONF"] = env["CONTAINERS_CONF"] = conf
    code = 0
    try:
        main(tmp, env)
    except Skip as e:
        print("skipped: %s" % e)
        code = 77
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check(False, str(e))
    finally:
        names = containers()
        if failures:
            for svc, name in sorted(names.items()):
                r = run("podman", "logs", "--tail", "30", name, ok=False)
                print("---- %s\n%s%s" % (svc, r.stdout, r.stderr))
        clean_up(env, names)
        shutil.rmtree(tmp, ignore_errors=True)
    if code == 77:
        sys.exit(77)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
