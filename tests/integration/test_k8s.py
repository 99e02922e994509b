#!/usr/bin/env python3
"""deploy/k8s without a cluster: every manifest parses and passes
tests/tools/k8s_check.py (kinds, required fields, the ConfigMaps and the
Secret the pods read, psd-counts' last-shard), and a broken copy of each
kind of mistake is caught, by name; the INI files in the ConfigMap are
options psd and psworker take. Where kubectl is installed (it is not a
Debian package: elsewhere that part says it is skipped), kubectl
kustomize renders the CPU, GPU, pipeline and replicated clusters offline
with throwaway CURVE keys, the rendered objects pass the checker, shard
and worker counts set in psd-counts reach the StatefulSet's replicas and
the Job's completions and parallelism, and the replicated overlay's pods
are each shard's two replicas as its comment says (pod o is shard o mod
S: psd --shard=auto --etcd is run to see).

Running the pods is test_k8s_play.py's part (podman kube play)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

from pstest import check, failures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(ROOT, "deploy", "k8s")
CHECK = os.path.join(ROOT, "tests", "tools", "k8s_check.py")


def checker(*args):
    return subprocess.run([sys.executable, CHECK] + list(args), capture_output=True, text=True,
                          timeout=60)


def broken(tmp, name, path, edit, overlay="base"):
    """A copy of deploy/k8s with edit(docs) applied to overlay/path's
    documents; returns the checker's answer on that overlay."""
    d = os.path.join(tmp, name)
    shutil.copytree(K8S, d)
    f = os.path.join(d, overlay, path)
    docs = list(yaml.safe_load_all(open(f)))
    edit(docs)
    with open(f, "w") as out:
        yaml.safe_dump_all(docs, out)
    return checker(os.path.join(d, overlay))


def sts(docs):
    return [d for d in docs if d.get("kind") == "StatefulSet"][0]


def pod_shard(ordinal, shards):
    """The shard psd --shard=auto --etcd takes in pod psd-ORDINAL (read
    from its log; etcd need not answer)."""
    tmp = tempfile.mkdtemp(prefix="pstest-k8s-pod.")
    ep = os.path.join(tmp, "ep")
    env = dict(os.environ, PSD_SHARD=str(ordinal))
    p = subprocess.Popen([os.environ["PSD_BIN"], "--listen", "tcp://127.0.0.1:0",
                          "--endpoint-file", ep, "--shard", "auto", "--shards", str(shards),
                          "--etcd", "http://127.0.0.1:9"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ep) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        p.terminate()
        err = p.communicate(timeout=30)[1]
        shutil.rmtree(tmp, ignore_errors=True)
    m = re.search(r"shard (\d+) of %d listening" % shards, err)
    return int(m.group(1)) if m else err


def kustomize_checks(tmp):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("skip kubectl kustomize: kubectl is not installed (not a Debian package)")
        return
    d = os.path.join(tmp, "render")
    shutil.copytree(K8S, d)
    for who in ("server", "worker"):
        r = subprocess.run([os.environ["PSD_BIN"], "--keygen", os.path.join(d, "base", "keys",
                                                                              who)],
                           capture_output=True, text=True)
        check(r.returncode == 0, "psd --keygen makes the %s key pair (%s)" % (who, r.stderr))
    for overlay in ("base", "gpu", "pipeline", "replicated"):
        r = subprocess.run([kubectl, "kustomize", os.path.join(d, overlay)], capture_output=True,
                           text=True, timeout=120)
        check(r.returncode == 0, "kubectl kustomize renders deploy/k8s/%s (%s)"
              % (overlay, r.stderr.strip()[-300:]))
        if r.returncode != 0:
            continue
        out = os.path.join(tmp, overlay + ".yaml")
        open(out, "w").write(r.stdout)
        c = checker("--rendered", out)
        check(c.returncode == 0, "the rendered %s objects pass the checker: %s"
              % (overlay, c.stdout.strip()))
        docs = list(yaml.safe_load_all(r.stdout))
        job = [x for x in docs if x["kind"] == "Job"][0]["spec"]["template"]["spec"]
        if overlay == "gpu":
            ctr = job["containers"][0]
            check(ctr["resources"]["limits"].get("nvidia.com/gpu") == 1
                  and "--device=cuda" in ctr["args"] and ctr["image"].endswith(":cuda"),
                  "the GPU overlay's workers ask for one GPU each, run --device=cuda on the CUDA "
                  "image")
        if overlay == "pipeline":
            ctr = job["containers"][0]
            counts = [x for x in docs if x["kind"] == "ConfigMap" and
                      x["metadata"]["name"] == "psd-counts"][0]["data"]
            check(job.get("subdomain") == "psworker-stages" and "--stages=2" in ctr["args"] and
                  any(a.startswith("--stage-endpoints=tcp://psworker-[0-$(PSD_LAST_RANK)]")
                      for a in ctr["args"]) and counts.get("workers") == "4"
                  and any(x["kind"] == "Service" and x["metadata"]["name"] == "psworker-stages"
                          and x["spec"].get("clusterIP") == "None" for x in docs),
                  "the pipeline overlay's workers are stages that find each other by name "
                  "through a headless Service, 4 of them")
        if overlay == "replicated":
            ctr = [x for x in docs if x["kind"] == "StatefulSet" and
                   x["metadata"]["name"] == "psd"][0]["spec"]
            args = ctr["template"]["spec"]["containers"][0]["args"]
            probe = ctr["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
            wargs = job["containers"][0]["args"]
            check(ctr["replicas"] == 4 and "--shard=auto" in args and
                  "--replica-name=$(POD_NAME)" in args and "--etcd=$(PSD_ETCD)" in args and
                  "--advertise=tcp://$(POD_NAME).psd:5570" in args and probe["path"] == "/readyz"
                  and any(x["kind"] == "StatefulSet" and x["metadata"]["name"] == "etcd"
                          for x in docs),
                  "the replicated overlay runs 2 shards x 2 replicas (4 pods named for their "
                  "replicas, ready by /readyz) beside an etcd")
            check("--servers=tcp://psd-[0-$(PSD_LAST_SHARD)].psd:5570|"
                  "tcp://psd-[$(PSD_SHARDS)-$(PSD_LAST_POD)].psd:5570" in wargs,
                  "the replicated overlay's workers name pods 0..S-1 and S..2S-1 as each shard's "
                  "two replicas: %s" % wargs)
            # the mapping the comment promises: pod o is shard o mod S
            for o, want in ((0, 0), (1, 1), (2, 0), (3, 1)):
                check(pod_shard(o, 2) == want, "psd --shard=auto --etcd in pod psd-%d of 2 "
                      "shards is shard %d" % (o, want))
    # the counts, set in one place, reach every field that needs them
    k = os.path.join(d, "base", "kustomization.yaml")
    text = open(k).read().replace("shards=2", "shards=3").replace("last-shard=1", "last-shard=2")
    open(k, "w").write(text.replace("workers=2", "workers=5"))
    r = subprocess.run([kubectl, "kustomize", os.path.join(d, "base")], capture_output=True,
                       text=True, timeout=120)
    docs = list(yaml.safe_load_all(r.stdout)) if r.returncode == 0 else []
    s = [x for x in docs if x["kind"] == "StatefulSet"]
    j = [x for x in docs if x["kind"] == "Job"]
    check(s and j and s[0]["spec"]["replicas"] == 3 and j[0]["spec"]["completions"] == 5
          and j[0]["spec"]["parallelism"] == 5,
          "shards=3 and workers=5 in psd-counts give 3 replicas and 5 completions in parallel")


def main(tmp):
    c = checker(os.path.join(K8S, "base"), os.path.join(K8S, "gpu"), os.path.join(K8S, "pipeline"))
    check(c.returncode == 0, "deploy/k8s passes the checker: %s" % (c.stdout + c.stderr).strip())
    c = checker(os.path.join(K8S, "replicated"))
    check(c.returncode == 0, "deploy/k8s passes the checker: %s" % (c.stdout + c.stderr).strip())
    cases = [
        ("no-api", "psd.yaml", lambda d: sts(d).pop("apiVersion"), "apiVersion None"),
        ("no-image", "psd.yaml",
         lambda d: sts(d)["spec"]["template"]["spec"]["containers"][0].pop("image"),
         "image is missing"),
        ("labels", "psd.yaml",
         lambda d: sts(d)["spec"]["template"]["metadata"]["labels"].update(
             {"app.kubernetes.io/name": "other"}),
         "do not match selector"),
        ("mount", "psd.yaml",
         lambda d: sts(d)["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].append(
             {"name": "nowhere", "mountPath": "/x"}),
         "volume mount nowhere has no volume"),
        ("probe", "psd.yaml",
         lambda d: sts(d)["spec"]["template"]["spec"]["containers"][0]["readinessProbe"][
             "httpGet"].update({"port": "web"}),
         "readinessProbe reads port 'web'"),
        ("key", "psworker.yaml",
         lambda d: d[0]["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"][
             "configMapKeyRef"].update({"key": "workerz"}),
         "ConfigMap psd-counts has no key workerz"),
        ("secret", "psworker.yaml",
         lambda d: d[0]["spec"]["template"]["spec"]["volumes"][1]["secret"]["items"][0].update(
             {"key": "admin"}),
         "Secret psd-curve has no key admin"),
        ("restart", "psworker.yaml",
         lambda d: d[0]["spec"]["template"]["spec"].update({"restartPolicy": "Always"}),
         "restartPolicy Never or OnFailure"),
        ("counts", "kustomization.yaml",
         lambda d: d[0]["configMapGenerator"][0].update(
             {"literals": ["shards=3", "last-shard=1", "workers=2"]}),
         "last-shard is 1, but shards is 3"),
        ("file", "kustomization.yaml",
         lambda d: d[0]["resources"].append("missing.yaml"), "resource missing.yaml does not exist"),
    ]
    replicated_cases = [
        ("pods", lambda d: d[0]["configMapGenerator"][0].update(
            {"literals": ["replicas=2", "pods=5", "last-pod=4", "etcd=http://etcd-0.etcd:2379"]}),
         "pods is 5, but shards x replicas is 4"),
        ("three", lambda d: d[0]["configMapGenerator"][0].update(
            {"literals": ["replicas=3", "pods=6", "last-pod=5", "etcd=http://etcd-0.etcd:2379"]}),
         "names 2 replicas of each shard"),
    ]
    for name, path, edit, says in cases:
        r = broken(tmp, name, path, edit)
        check(r.returncode == 1 and says in r.stdout,
              "a broken copy (%s) is caught: %s" % (name, r.stdout.strip()[:300]))
    for name, edit, says in replicated_cases:
        r = broken(tmp, name, "kustomization.yaml", edit, overlay="replicated")
        check(r.returncode == 1 and says in r.stdout,
              "a broken copy of the replicated overlay (%s) is caught: %s"
              % (name, r.stdout.strip()[:300]))
    for prog, conf in (("PSD_BIN", "psd.conf"), ("PSWORKER_BIN", "psworker.conf")):
        r = subprocess.run([os.environ[prog], "--config", os.path.join(K8S, "base", conf),
                            "--help"], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "%s: every option is one %s takes (%s)"
              % (conf, os.path.basename(os.environ[prog]), r.stderr.strip()))
    kustomize_checks(tmp)


if __name__ == "__main__":
    tmp = tempfile.mkdtemp(prefix="pstest-k8s.")
    try:
        main(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d check(s) failed" % len(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
