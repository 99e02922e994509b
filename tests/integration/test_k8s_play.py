#!/usr/bin/env python3
"""deploy/k8s/base run for real with podman kube play: the StatefulSet and
the Indexed Job expanded into the pods their controllers would make
(psd-0, psd-1 with host names psd-N and subdomain psd, and a volume claim
each; psworker-0, psworker-1 with JOB_COMPLETION_INDEX), the ConfigMaps
as kustomize generates them, on one podman network, on an image built
from a debootstrap base as the compose test builds it. Checks that each
shard took its index from its host name, that training ends with the
accuracy of the quick start run in the same image (same shards, workers
and flags), to the digits, and that a stopped shard's volume holds a
checkpoint.

Where podman cannot give what a cluster would, the nearest equivalent:
the headless Service's psd-N.psd names are hostAliases to fixed
addresses, the Secret is a read-only host directory laid out as its
items, $(VAR) in args is expanded here as the kubelet would, and
readiness probes, preStop and the Job controller's retries are not
exercised (deploy/README.md, "Kubernetes"). Slow (the image build, 5
epochs). Exits 77 where containers cannot run (not root, podman,
debootstrap or catatonit missing, or podman cannot start a container)."""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

import test_compose as tc
from pstest import check, failures

ROOT = tc.ROOT
BASE_DIR = os.path.join(ROOT, "deploy", "k8s", "base")
PROJECT = "pstestk8s%d" % os.getpid()
IMAGE = "localhost/psd:" + PROJECT
SUBNET = "10.89.%d" % (100 + os.getpid() % 100)
# The ConfigMaps podman kube play makes volumes of; a volume left by an
# earlier run is rewritten under the next run's starting pods.
MAP_VOLUMES = ["psd-conf", "psd-counts"]


def generated(kust):
    """The ConfigMaps psd-counts and psd-conf as kustomize makes them."""
    out = []
    for g in kust["configMapGenerator"]:
        data = {}
        for lit in g.get("literals", []):
            k, v = str(lit).split("=", 1)
            data[k] = v.split("#")[0].strip()
        for f in g.get("files", []):
            data[os.path.basename(f)] = open(os.path.join(BASE_DIR, f)).read()
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]},
                    "data": data})
    return out


def expand_vars(args, env):
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def pod_of(template, name, maps, keydir, aliases, extra_env=None, hostname=None):
    spec = copy.deepcopy(template["spec"])
    meta = copy.deepcopy(template.get("metadata", {}))
    meta["name"] = name
    if hostname:
        spec["hostname"], spec["subdomain"] = hostname, "psd"
    spec["hostAliases"] = aliases
    for c in spec["containers"]:
        c["image"] = IMAGE
        c.pop("readinessProbe", None)  # podman has no readiness; liveness becomes a healthcheck
        # containerPort is a note to Kubernetes, but podman publishes it on
        # the host, where every shard's 5570 would clash: the probe's named
        # port becomes its number and the list goes
        named = {p["name"]: p["containerPort"] for p in c.pop("ports", []) if "name" in p}
        get = c.get("livenessProbe", {}).get("httpGet")
        if get is not None:
            get["port"] = named.get(get["port"], get["port"])
        env = {}
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            env[e["name"]] = maps[ref["name"]][ref["key"]] if ref else e.get("value", "")
        env.update(extra_env or {})
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
        c["args"] = expand_vars(c.get("args", []), env)
    for v in spec.get("volumes", []):
        if "secret" in v:  # a host directory laid out as the Secret's items
            d = os.path.join(keydir, name, v["name"])
            for it in v["secret"].get("items", []):
                dst = os.path.join(d, it["path"])
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy(os.path.join(keydir, it["key"]), dst)
                os.chown(dst, 10001, 10001)
                os.chmod(dst, 0o440)
            os.chmod(d, 0o755)
            v.pop("secret")
            v["hostPath"] = {"path": d, "type": "Directory"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pods(tmp, keydir):
    kust = yaml.safe_load(open(os.path.join(BASE_DIR, "kustomization.yaml")))
    docs = [d for f in kust["resources"]
            for d in yaml.safe_load_all(open(os.path.join(BASE_DIR, f))) if d]
    maps_objs = generated(kust)
    maps = {m["metadata"]["name"]: m["data"] for m in maps_objs}
    shards, workers = int(maps["psd-counts"]["shards"]), int(maps["psd-counts"]["workers"])
    sts = [d for d in docs if d["kind"] == "StatefulSet"][0]
    job = [d for d in docs if d["kind"] == "Job"][0]
    psd_ips = ["%s.%d" % (SUBNET, 10 + i) for i in range(shards)]
    aliases = [{"ip": ip, "hostnames": ["psd-%d.psd" % i]} for i, ip in enumerate(psd_ips)]
    shard_docs = list(maps_objs)
    for i in range(shards):  # what the StatefulSet controller makes
        claim = "checkpoints-psd-%d" % i
        shard_docs.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": claim},
                           "spec": sts["spec"]["volumeClaimTemplates"][0]["spec"]})
        p = pod_of(sts["spec"]["template"], "psd-%d" % i, maps, keydir, aliases,
                   hostname="psd-%d" % i)
        p["spec"].setdefault("volumes", []).append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
        shard_docs.append(p)
    worker_docs = list(maps_objs)
    for r in range(workers):  # what the Job controller makes, one pod per index
        worker_docs.append(pod_of(job["spec"]["template"], "psworker-%d" % r, maps, keydir,
                                  aliases, extra_env={"JOB_COMPLETION_INDEX": str(r)}))
    files = []
    for name, d in (("shards", shard_docs), ("workers", worker_docs)):
        f = os.path.join(tmp, name + ".yaml")
        with open(f, "w") as out:
            yaml.safe_dump_all(d, out)
        files.append(f)
    return files, psd_ips, ["%s.%d" % (SUBNET, 20 + r) for r in range(workers)], shards, workers


# The quick start's run inside the image: 2 shards and 2 workers on one
# host, bsp, the quick start's flags; prints the rank 0 worker's last line.
IN_IMAGE = r"""
set -e
cd /tmp
for i in 0 1; do
  psd --listen tcp://127.0.0.1:0 --endpoint-file ep$i --shard $i --shards 2 --workers 2 \
      --consistency bsp 2>psd$i.log &
done
for i in 0 1; do n=0; until [ -s ep$i ]; do n=$((n+1)); [ $n -lt 300 ]; sleep 0.1; done; done
for r in 0 1; do
  psworker --servers "$(cat ep0),$(cat ep1)" --rank $r --workers 2 --epochs 5 --batch 64 \
      --lr 0.04 --device auto 2>w$r.log &
  pids="$pids $!"
done
wait $pids
grep W0100 w0.log
"""


def image_accuracy():
    """The accuracy the image's own binaries train the quick start to: what
    the pods must match to the digits. The host's quick start may round
    otherwise: OpenBLAS's kernels follow OPENBLAS_CORETYPE where the host
    sets it, and containers do not inherit it (its figure is printed too)."""
    r = tc.run("podman", "run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGE, "-c",
               IN_IMAGE, ok=False, timeout=900)
    m = re.search(r"test accuracy ([0-9.]+)", r.stdout)
    return float(m.group(1)) if m else -1


def main(tmp):
    tc.probe()
    tc.base_image(tmp)
    tc.can_run()
    t0 = time.monotonic()
    r = tc.run("podman", "build", "-f", os.path.join(ROOT, "deploy/docker/Dockerfile"),
               "--build-arg", "BUILD_BASE=" + tc.BASE, "--build-arg", "RUNTIME_BASE=" + tc.BASE,
               "-t", IMAGE, ROOT, ok=False, timeout=1800)
    check(r.returncode == 0, "the image builds (%.0f s)" % (time.monotonic() - t0))
    if r.returncode != 0:
        print(r.stdout[-3000:] + r.stderr[-3000:])
        return
    keydir = os.path.join(tmp, "keys")
    os.makedirs(keydir)
    for who in ("server", "worker"):
        tc.run(tc.PSD, "--keygen", os.path.join(keydir, who))
    (shard_file, worker_file), psd_ips, worker_ips, shards, workers = pods(tmp, keydir)
    tc.run("podman", "network", "create", "--subnet", SUBNET + ".0/24", PROJECT)
    play = ["podman", "kube", "play", "--network", PROJECT]
    tc.run(*play, *sum((["--ip", ip] for ip in psd_ips), []), shard_file)
    for i in range(shards):  # listening, with the shard its host name gives
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = tc.run("podman", "logs", "psd-%d-psd" % i, ok=False, quiet=True).stderr
            if "listening on" in log:
                break
            time.sleep(0.5)
        check("shard %d of %d listening" % (i, shards) in log,
              "psd-%d took shard %d from its host name: %s" % (i, i, log.strip()[-200:]))
    t0 = time.monotonic()
    tc.run(*play, *sum((["--ip", ip] for ip in worker_ips), []), worker_file)
    codes = [tc.run("podman", "wait", "psworker-%d-psworker" % r, timeout=3600).stdout.strip()
             for r in range(workers)]
    check(codes == ["0"] * workers, "every worker exited 0 (%s) after %.0f s"
          % (codes, time.monotonic() - t0))
    logs = tc.run("podman", "logs", "psworker-0-psworker", ok=False).stderr
    m = re.search(r"W0100 done: (\d+) steps, test accuracy ([0-9.]+)", logs)
    acc = float(m.group(2)) if m else -1
    ref = image_accuracy()
    print("     k8s pods: rank 0 test accuracy %.4f; the quick start in the image %.4f (on this "
          "host's build %.4f)" % (acc, ref, tc.QUICKSTART_ACCURACY))
    check(ref > 0 and abs(acc - ref) < 0.00005,
          "training ends with the quick start's accuracy in the same image, to the digits")
    check("rank 0 of %d" % workers in logs, "psworker-0 took rank 0 from JOB_COMPLETION_INDEX")
    tc.run("podman", "pod", "stop", "-t", "30", "psd-0")
    vol = json.loads(tc.run("podman", "volume", "inspect", "checkpoints-psd-0").stdout)
    files = [f for f in os.listdir(vol[0]["Mountpoint"]) if f.endswith(".safetensors")]
    check(any(f.startswith("shard-0-of-%d-" % shards) for f in files),
          "psd-0's volume claim holds its checkpoint after the stop (%s)" % files)


def clean_up():
    for cmd in (["podman", "pod", "rm", "-f", "-t", "5"] + ["psd-%d" % i for i in range(8)]
                + ["psworker-%d" % i for i in range(8)],
                ["podman", "volume", "rm", "-f"] + ["checkpoints-psd-%d" % i for i in range(8)]
                + MAP_VOLUMES,
                ["podman", "network", "rm", "-f", PROJECT], ["podman", "rmi", "-f", IMAGE]):
        try:
            subprocess.run(cmd, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError):
            pass


if __name__ == "__main__":
    need = ["podman", "debootstrap", "catatonit"]
    if os.geteuid() != 0 or any(shutil.which(n) is None and
                                not os.path.exists("/usr/libexec/podman/" + n) for n in need):
        print("needs root and %s: skipped" % ", ".join(need))
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="pstest-k8s-play.")
    conf = os.path.join(tmp, "containers.conf")
    with open(conf, "w") as f:
        f.write('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n')
    os.environ["CONTAINERS_CONF"] = conf
    code = 0
    try:
        clean_up()  # what a run that was killed left
        main(tmp)
    except tc.Skip as e:
        print("skipped: %s" % e)
        code = 77
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        check(False, str(e))
    finally:
        if failures:
            for name in ("psd-0-psd", "psd-1-psd", "psworker-0-psworker", "psworker-1-psworker"):
                r = subprocess.run(["podman", "logs", "--tail", "20", name], capture_output=True,
                                   text=True)
                print("---- %s\n%s%s" % (name, r.stdout, r.stderr))
        clean_up()
        shutil.rmtree(tmp, ignore_errors=True)
    if code == 77:
        sys.exit(77)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
