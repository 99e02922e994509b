#!/usr/bin/env python3
"""deploy/k8s/base and deploy/k8s/replicated run for real with podman kube
play: the StatefulSets and the Indexed Job expanded into the pods their
controllers would make (psd-0, psd-1 with host names psd-N and subdomain
psd, and a volume claim each; psworker-0, psworker-1 with
JOB_COMPLETION_INDEX), the ConfigMaps and patches as kustomize makes
them, on one podman network, on an image built from a debootstrap base
as the compose test builds it.

The base: each shard took its index from its host name, training ends
with the accuracy of the quick start run in the same image (same shards,
workers and flags), to the digits, and a stopped shard's volume holds a
checkpoint. The replicated variant (etcd-0 and psd-0..psd-3): pod o took
shard o mod 2, each shard has a primary and a backup that loaded its
state, and with shard 0's primary killed (SIGKILL) after the first
epoch its backup takes over and training ends with the base's accuracy,
to the digits.

Where podman cannot give what a cluster would, the nearest equivalent:
the headless Services' names (psd-N.psd, etcd-0.etcd) are hostAliases to
fixed addresses, the Secret and the ConfigMaps are read-only host
directories laid out as their items (podman rewrites a ConfigMap's
volume each time a file that holds it is played, under pods already
reading it), $(VAR) in args and the pod's name from a fieldRef are filled
in here as the kubelet would, etcd's image (in a registry this machine
cannot reach) is this project's image with the host's Debian etcd
mounted in, and readiness probes, preStop and the Job controller's
retries are not exercised (deploy/README.md, "Kubernetes"). Slow (the
image build, 2 x 5 epochs). Exits 77 where containers cannot run (not
root, podman, debootstrap or catatonit missing, or podman cannot start
a container)."""
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
REPLICATED_DIR = os.path.join(ROOT, "deploy", "k8s", "replicated")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
PROJECT = "pstestk8s%d" % os.getpid()
IMAGE = "localhost/psd:" + PROJECT
SUBNET = "10.89.%d" % (100 + os.getpid() % 100)
# The ConfigMaps podman kube play would make volumes of (the test gives
# the pods host directories instead: see pod_of), removed where an older
# run of this test left them.
MAP_VOLUMES = ["psd-conf", "psd-counts"]


def render(kdir):
    """The objects and generated ConfigMaps of the kustomization in kdir, as
    kustomize makes them for what this project's kustomizations use:
    resources (files and other kustomizations), ConfigMap generators
    (merged into the base's with behavior: merge) and JSON patches that add
    and replace. Replacements are left out: the counts are read from
    psd-counts where they are needed."""
    kust = yaml.safe_load(open(os.path.join(kdir, "kustomization.yaml")))
    docs, maps = [], []
    for res in kust["resources"]:
        path = os.path.join(kdir, res)
        if os.path.isdir(path):
            d, m = render(path)
            docs, maps = docs + d, maps + m
        else:
            docs += [d for d in yaml.safe_load_all(open(path)) if d]
    for g in kust.get("configMapGenerator", []):
        data = {}
        for lit in g.get("literals", []):
            k, v = str(lit).split("=", 1)
            data[k] = v.split("#")[0].strip()
        for f in g.get("files", []):
            data[os.path.basename(f)] = open(os.path.join(kdir, f)).read()
        old = [m for m in maps if m["metadata"]["name"] == g["name"]]
        if g.get("behavior") == "merge" and old:
            old[0]["data"].update(data)
        else:
            maps.append({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": g["name"]}, "data": data})
    for patch in kust.get("patches", []):
        t = patch["target"]
        for d in docs:
            if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]:
                for op in yaml.safe_load(patch["patch"]):
                    json_patch(d, op)
    return docs, maps


def json_patch(obj, op):
    """One JSON patch operation (RFC 6902): add (- appends to a list) or
    replace; any other is an error here, not silently skipped."""
    if op["op"] not in ("add", "replace"):
        raise RuntimeError("patch op %s: this test applies add and replace only" % op["op"])
    parts = op["path"].lstrip("/").split("/")
    cur = obj
    for part in parts[:-1]:
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    last = parts[-1]
    if isinstance(cur, list) and last == "-":
        cur.append(op["value"])
    elif isinstance(cur, list) and op["op"] == "add":
        cur.insert(int(last), op["value"])
    elif isinstance(cur, list):
        cur[int(last)] = op["value"]
    else:
        cur[last] = op["value"]


def expand_vars(args, env):
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def pod_of(template, name, maps, keydir, aliases, extra_env=None, hostname=None,
           subdomain="psd"):
    spec = copy.deepcopy(template["spec"])
    meta = copy.deepcopy(template.get("metadata", {}))
    meta["name"] = name
    if hostname:
        spec["hostname"], spec["subdomain"] = hostname, subdomain
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
            field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field not in (None, "metadata.name"):
                raise RuntimeError("env %s: fieldRef %s is not one this test fills in"
                                   % (e["name"], field))
            env[e["name"]] = (maps[ref["name"]][ref["key"]] if ref else name if field
                              else e.get("value", ""))
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
        elif "configMap" in v:  # a host directory of the ConfigMap's keys
            cm = v.pop("configMap")["name"]
            d = os.path.join(keydir, name, v["name"])
            os.makedirs(d, exist_ok=True)
            for key, text in maps[cm].items():
                with open(os.path.join(d, key), "w") as out:
                    out.write(text)
                os.chmod(os.path.join(d, key), 0o444)
            os.chmod(d, 0o755)
            v["hostPath"] = {"path": d, "type": "Directory"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pods(tmp, keydir, kdir, first_ip):
    """The pods (and their claims) that the controllers would
    make from the kustomization in kdir: one yaml file a StatefulSet, in
    files[name], and files["workers"] for the Job's. Addresses are given
    from SUBNET.first_ip on; each pod's DNS name (psd-3.psd, etcd-0.etcd)
    is a host alias of every pod."""
    docs, maps_objs = render(kdir)
    maps = {m["metadata"]["name"]: m["data"] for m in maps_objs}
    counts = maps["psd-counts"]
    shards, workers = int(counts["shards"]), int(counts["workers"])
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    job = [d for d in docs if d["kind"] == "Job"][0]
    # psd's replicas is a replacement's target (shards, or pods with replicas)
    size = {n: int(counts.get("pods", shards)) if n == "psd" else int(d["spec"]["replicas"])
            for n, d in sets.items()}
    members = ["%s-%d" % (n, o) for n in sorted(sets) for o in range(size[n])]
    ips = {m: "%s.%d" % (SUBNET, first_ip + k) for k, m in enumerate(members)}
    aliases = [{"ip": ip, "hostnames": ["%s.%s" % (m, m.rsplit("-", 1)[0])]}
               for m, ip in ips.items()]
    made = {}
    for n in sorted(sets):  # what each StatefulSet's controller makes
        sts, out = sets[n], made.setdefault(n, [])
        for o in range(size[n]):
            name = "%s-%d" % (n, o)
            p = pod_of(sts["spec"]["template"], name, maps, keydir, aliases, hostname=name,
                       subdomain=sts["spec"]["serviceName"])
            for t in sts["spec"].get("volumeClaimTemplates", []):
                claim = "%s-%s" % (t["metadata"]["name"], name)
                out.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": claim}, "spec": t["spec"]})
                p["spec"].setdefault("volumes", []).append(
                    {"name": t["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim}})
            if n == "etcd":
                etcd_stand_in(p)
            out.append(p)
    made["workers"] = []
    for r in range(workers):  # what the Job controller makes, one pod per index
        made["workers"].append(pod_of(job["spec"]["template"], "psworker-%d" % r, maps, keydir,
                                  aliases, extra_env={"JOB_COMPLETION_INDEX": str(r)}))
        ips["psworker-%d" % r] = "%s.%d" % (SUBNET, first_ip + len(members) + r)
    files = {}
    for n, d in made.items():
        files[n] = os.path.join(tmp, "%s-%s.yaml" % (os.path.basename(kdir), n))
        with open(files[n], "w") as out:
            yaml.safe_dump_all(d, out)
    return files, ips, counts


def etcd_stand_in(pod):
    """etcd's pod on this project's image, with the host's etcd (Debian's
    etcd-server) mounted in: the manifest's image is in a registry this
    machine cannot reach. That image runs etcd as root; so does this."""
    spec = pod["spec"]
    spec["securityContext"] = {"runAsUser": 0, "runAsGroup": 0}
    spec.setdefault("volumes", []).append(
        {"name": "etcd-bin", "hostPath": {"path": ETCD, "type": "File"}})
    for c in spec["containers"]:
        c.setdefault("volumeMounts", []).append(
            {"name": "etcd-bin", "mountPath": "/usr/local/bin/etcd", "readOnly": True})
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
    tc.run("podman", "network", "create", "--subnet", SUBNET + ".0/24", PROJECT)
    acc = base(tmp, keydir)
    remove_pods()
    replicated(tmp, keydir, acc)


def play(f, ips, names):
    """podman kube play of file f, each of the pods names at its address."""
    tc.run("podman", "kube", "play", "--network", PROJECT,
           *sum((["--ip", ips[n]] for n in names), []), f)


def log_of(container):
    return tc.run("podman", "logs", container, ok=False, quiet=True).stderr


def wait_log(container, what, seconds):
    """The container's log once what (a regular expression) is in it, or
    at the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        log = log_of(container)
        if re.search(what, log) or time.monotonic() > deadline:
            return log
        time.sleep(0.5)


def accuracy(workers):
    """Waits for every worker; their exit codes and rank 0's log."""
    codes = [tc.run("podman", "wait", "psworker-%d-psworker" % r, timeout=3600).stdout.strip()
             for r in range(workers)]
    logs = tc.run("podman", "logs", "psworker-0-psworker", ok=False).stderr
    m = re.search(r"W0100 done: (\d+) steps, test accuracy ([0-9.]+)", logs)
    return codes, logs, float(m.group(2)) if m else -1


def base(tmp, keydir):
    """deploy/k8s/base: 2 shards, 2 workers. The rank 0 worker's accuracy."""
    files, ips, counts = pods(tmp, keydir, BASE_DIR, 10)
    shards, workers = int(counts["shards"]), int(counts["workers"])
    play(files["psd"], ips, ["psd-%d" % i for i in range(shards)])
    for i in range(shards):  # listening, with the shard its host name gives
        log = wait_log("psd-%d-psd" % i, "listening on", 120)
        check("shard %d of %d listening" % (i, shards) in log,
              "psd-%d took shard %d from its host name: %s" % (i, i, log.strip()[-200:]))
    t0 = time.monotonic()
    play(files["workers"], ips, ["psworker-%d" % r for r in range(workers)])
    codes, logs, acc = accuracy(workers)
    check(codes == ["0"] * workers, "every worker exited 0 (%s) after %.0f s"
          % (codes, time.monotonic() - t0))
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
    return acc


def replicated(tmp, keydir, base_acc):
    """deploy/k8s/replicated: etcd, 2 shards x 2 replicas, 2 workers; the
    primary of shard 0 is killed after the first epoch, and the run must
    end as the base's did, to the digits."""
    check(os.path.exists(ETCD), "etcd is installed (%s, Debian's etcd-server)" % ETCD)
    if not os.path.exists(ETCD):
        return
    files, ips, counts = pods(tmp, keydir, REPLICATED_DIR, 30)
    shards, workers, npods = int(counts["shards"]), int(counts["workers"]), int(counts["pods"])
    play(files["etcd"], ips, ["etcd-0"])
    log = wait_log("etcd-0-etcd", "ready to serve client requests", 60)
    check("ready to serve client requests" in log, "etcd-0 serves: %s" % log.strip()[-200:])
    play(files["psd"], ips, ["psd-%d" % o for o in range(npods)])
    for o in range(npods):  # pod o: shard o mod S, replica o div S
        log = wait_log("psd-%d-psd" % o, "listening on", 120)
        check("shard %d of %d listening" % (o % shards, shards) in log,
              "psd-%d took shard %d from its ordinal: %s" % (o, o % shards, log.strip()[-200:]))
    # each shard: one primary (S0715), and a backup that loaded its state (S0714)
    deadline, roles = time.monotonic() + 120, {}
    while time.monotonic() < deadline:
        logs = {o: log_of("psd-%d-psd" % o) for o in range(npods)}
        roles = {s: ([o for o in logs if o % shards == s and "S0715" in logs[o]],
                     [o for o in logs if o % shards == s and "S0714" in logs[o]])
                 for s in range(shards)}
        if all(len(p) == 1 and len(b) == 1 for p, b in roles.values()):
            break
        time.sleep(0.5)
    for s, (p, b) in roles.items():
        check(len(p) == 1 and len(b) == 1 and p != b,
              "shard %d has a primary (%s) and a backup holding its state (%s)" % (s, p, b))
    if not all(len(p) == 1 and len(b) == 1 for p, b in roles.values()):
        return
    t0 = time.monotonic()
    play(files["workers"], ips, ["psworker-%d" % r for r in range(workers)])
    log = wait_log("psworker-0-psworker", "W0210 epoch 1", 300)
    primary, backup = roles[0][0][0], roles[0][1][0]
    check("W0210 epoch 1" in log, "the workers trained an epoch; then psd-%d, shard 0's "
          "primary, is killed" % primary)
    tc.run("podman", "kill", "-s", "KILL", "psd-%d-psd" % primary, ok=False)
    codes, logs, acc = accuracy(workers)
    check(codes == ["0"] * workers, "every worker exited 0 (%s) after %.0f s"
          % (codes, time.monotonic() - t0))
    log = log_of("psd-%d-psd" % backup)
    check(len(re.findall("S0715", log)) == 1 and "S0714" in log,
          "psd-%d, shard 0's backup, took over: %s" % (backup, log.strip()[-300:]))
    print("     replicated k8s pods: rank 0 test accuracy %.4f; the base's %.4f" % (acc, base_acc))
    check(acc > 0 and acc == base_acc, "training through the failover ends with the base "
          "cluster's accuracy, to the digits")


def remove_pods():
    """Every pod and volume a run may have made, one at a time: podman
    removes none of a list that names one it does not have."""
    names = ["psd-%d" % i for i in range(8)] + ["psworker-%d" % i for i in range(8)] + ["etcd-0"]
    vols = ["checkpoints-psd-%d" % i for i in range(8)] + ["data-etcd-0"] + MAP_VOLUMES
    for cmd in ([["podman", "pod", "rm", "-f", "-t", "5", n] for n in names]
                + [["podman", "volume", "rm", "-f", v] for v in vols]):
        try:
            subprocess.run(cmd, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError):
            pass


def clean_up():
    remove_pods()
    for cmd in (["podman", "network", "rm", "-f", PROJECT], ["podman", "rmi", "-f", IMAGE]):
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
            for name in ["psd-%d-psd" % o for o in range(4)] + [
                    "etcd-0-etcd", "psworker-0-psworker", "psworker-1-psworker"]:
                r = subprocess.run(["podman", "logs", "--tail", "20", name], capture_output=True,
                                   text=True)
                print("---- %s\n%s%s" % (name, r.stdout, r.stderr))
        clean_up()
        shutil.rmtree(tmp, ignore_errors=True)
    if code == 77:
        sys.exit(77)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
