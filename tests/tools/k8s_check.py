#!/usr/bin/env python3
"""Checks Kubernetes manifests without a cluster (python3-yaml only).

usage: k8s_check.py DIR [DIR...]      a kustomization directory each
       k8s_check.py --rendered FILE   the output of kubectl kustomize

Each object needs a known apiVersion and kind and the fields its kind
requires: a name; a Service's ports and selector; a StatefulSet's
serviceName, replicas, a selector its pod template's labels match, and
claim templates; an Indexed Job's completions, parallelism and restart
policy; every container a name and an image, every volume mount a volume
(or claim template), every probe a named port the container has. Across
objects: each ConfigMap and Secret a pod reads (volumes, configMapKeyRef,
secret items) exists with the keys it reads, from the kustomization's
generators or as objects; the files a kustomization names exist; and
psd-counts' last-shard is shards - 1, and with replicas (an overlay's
literals merged into the base's) pods is shards x replicas, last-pod
pods - 1, and replicas 2 (the workers' pattern names two). Prints each problem and exits 1,
or prints what it checked and exits 0."""
import os
import sys

import yaml

KINDS = {
    ("v1", "Service"), ("v1", "ConfigMap"), ("v1", "Secret"),
    ("apps/v1", "StatefulSet"), ("batch/v1", "Job"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}


class Checker:
    def __init__(self):
        self.problems = []
        self.objects = []                 # (where, object)
        self.config_maps = {}             # name -> set of keys
        self.secrets = {}                 # name -> set of keys
        self.loaded = set()               # kustomization directories read
        self.counts_kv = {}               # psd-counts' literals, overlays merged in
        self.counts_where = None

    def bad(self, where, what):
        self.problems.append("%s: %s" % (where, what))

    def need(self, where, obj, path):
        """The value at the dotted path, or None after naming it missing."""
        cur = obj
        for part in path.split("."):
            if not isinstance(cur, dict) or part not in cur:
                self.bad(where, "%s is missing" % path)
                return None
            cur = cur[part]
        return cur

    # -- loading ------------------------------------------------------------
    def load_file(self, path):
        try:
            with open(path) as f:
                docs = [d for d in yaml.safe_load_all(f) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            self.bad(path, "does not parse: %s" % e)
            return []
        for i, d in enumerate(docs):
            where = "%s[%d]" % (path, i) if len(docs) > 1 else path
            if not isinstance(d, dict):
                self.bad(where, "is not a mapping")
                continue
            self.objects.append((where, d))
        return docs

    def load_dir(self, d):
        if os.path.realpath(d) in self.loaded:
            return  # an overlay's base, read already
        self.loaded.add(os.path.realpath(d))
        kust = os.path.join(d, "kustomization.yaml")
        docs = self.load_file(kust)
        if not docs:
            return
        k = docs[0]
        for r in k.get("resources", []):
            p = os.path.normpath(os.path.join(d, r))
            if os.path.isdir(p):
                if not os.path.exists(os.path.join(p, "kustomization.yaml")):
                    self.bad(kust, "resource %s is a directory without a kustomization" % r)
                else:
                    self.load_dir(p)
            elif not os.path.exists(p):
                self.bad(kust, "resource %s does not exist" % r)
            else:
                self.load_file(p)
        for gen, store in (("configMapGenerator", self.config_maps),
                           ("secretGenerator", self.secrets)):
            for g in k.get(gen, []):
                keys = store.setdefault(g.get("name", "?"), set())
                for lit in g.get("literals", []):
                    keys.add(str(lit).split("=", 1)[0])
                for f in g.get("files", []):
                    name, _, src = str(f).partition("=")
                    src = src or name
                    keys.add(os.path.basename(name))
                    # key files are made by the operator (psctl keygen):
                    # they need not be in the tree
                    if gen == "configMapGenerator" and not os.path.exists(os.path.join(d, src)):
                        self.bad(kust, "%s %s: file %s does not exist" % (gen, g.get("name"), src))
                if g.get("name") == "psd-counts":
                    # an overlay merges its literals into the base's
                    self.counts_kv.update(dict(str(x).split("=", 1)
                                               for x in g.get("literals", []) if "=" in str(x)))
                    self.counts_where = kust

    def counts(self, where, kv):
        try:
            shards, last, workers = int(kv["shards"]), int(kv["last-shard"]), int(kv["workers"])
        except (KeyError, ValueError):
            self.bad(where, "psd-counts needs whole numbers shards, last-shard and workers")
            return
        if shards < 1 or workers < 1:
            self.bad(where, "psd-counts: shards and workers must be at least 1")
        if last != shards - 1:
            self.bad(where, "psd-counts: last-shard is %d, but shards is %d (last-shard must be "
                     "shards - 1)" % (last, shards))
        if "replicas" not in kv and "pods" not in kv:
            return
        try:  # replicated shards: pod o is shard o mod shards, replica o div shards
            replicas, pods, last_pod = int(kv["replicas"]), int(kv["pods"]), int(kv["last-pod"])
        except (KeyError, ValueError):
            self.bad(where, "psd-counts with replicas needs whole numbers replicas, pods and "
                     "last-pod")
            return
        if replicas != 2:
            self.bad(where, "psd-counts: replicas is %d, but the workers' --servers pattern "
                     "names 2 replicas of each shard" % replicas)
        if pods != shards * replicas:
            self.bad(where, "psd-counts: pods is %d, but shards x replicas is %d"
                     % (pods, shards * replicas))
        if last_pod != pods - 1:
            self.bad(where, "psd-counts: last-pod is %d, but pods is %d (last-pod must be "
                     "pods - 1)" % (last_pod, pods))

    # -- objects -----------------------------------------------------------
    def check(self):
        if self.counts_where is not None:
            self.counts(self.counts_where, self.counts_kv)
        for where, o in self.objects:
            if o.get("kind") == "ConfigMap" and o.get("metadata", {}).get("name") == "psd-counts" \
                    and self.counts_where is None:
                self.counts(where, o.get("data") or {})  # a rendered one
        for where, o in self.objects:
            if o.get("kind") == "ConfigMap":
                self.config_maps.setdefault(o.get("metadata", {}).get("name"), set()).update(
                    (o.get("data") or {}).keys())
            if o.get("kind") == "Secret":
                self.secrets.setdefault(o.get("metadata", {}).get("name"), set()).update(
                    (o.get("data") or {}).keys())
        for where, o in self.objects:
            kind = (o.get("apiVersion"), o.get("kind"))
            if kind not in KINDS:
                self.bad(where, "apiVersion %r with kind %r is not one this project uses (%s)"
                         % (kind[0], kind[1], ", ".join("%s %s" % k for k in sorted(KINDS))))
                continue
            if kind[1] == "Kustomization":
                continue
            name = self.need(where, o, "metadata.name")
            where = "%s (%s %s)" % (where, kind[1], name)
            getattr(self, "check_" + kind[1].lower(), lambda w, o: None)(where, o)

    def check_service(self, where, o):
        ports = self.need(where, o, "spec.ports")
        if isinstance(ports, list) and not ports:
            self.bad(where, "spec.ports is empty")
        for p in ports or []:
            if not isinstance(p.get("port"), int):
                self.bad(where, "a port without a whole-number port: %r" % p)
        self.need(where, o, "spec.selector")

    def check_statefulset(self, where, o):
        self.need(where, o, "spec.serviceName")
        r = self.need(where, o, "spec.replicas")
        if r is not None and (not isinstance(r, int) or r < 1):
            self.bad(where, "spec.replicas must be a whole number >= 1 (got %r)" % (r,))
        match = self.need(where, o, "spec.selector.matchLabels") or {}
        labels = self.need(where, o, "spec.template.metadata.labels") or {}
        for k, v in match.items():
            if labels.get(k) != v:
                self.bad(where, "the pod template's labels do not match selector %s=%s" % (k, v))
        claims = [c.get("metadata", {}).get("name") for c in
                  o.get("spec", {}).get("volumeClaimTemplates", [])]
        self.pod(where, self.need(where, o, "spec.template.spec") or {}, claims)

    def check_job(self, where, o):
        spec = o.get("spec", {})
        if spec.get("completionMode") == "Indexed":
            for f in ("completions", "parallelism"):
                v = self.need(where, o, "spec." + f)
                if v is not None and (not isinstance(v, int) or v < 1):
                    self.bad(where, "spec.%s must be a whole number >= 1 (got %r)" % (f, v))
        pod = self.need(where, o, "spec.template.spec") or {}
        if pod.get("restartPolicy") not in ("Never", "OnFailure"):
            self.bad(where, "a Job's pods need restartPolicy Never or OnFailure")
        self.pod(where, pod, [])

    def pod(self, where, spec, claims):
        volumes = {}
        for v in spec.get("volumes", []):
            volumes[v.get("name")] = v
            if "configMap" in v:
                self.ref(where, "ConfigMap", self.config_maps, v["configMap"].get("name"),
                         [i.get("key") for i in v["configMap"].get("items", [])])
            if "secret" in v:
                self.ref(where, "Secret", self.secrets, v["secret"].get("secretName"),
                         [i.get("key") for i in v["secret"].get("items", [])])
        containers = spec.get("containers")
        if not containers:
            self.bad(where, "the pod has no containers")
        for c in containers or []:
            cw = "%s container %s" % (where, c.get("name"))
            for f in ("name", "image"):
                if not c.get(f):
                    self.bad(cw, "%s is missing" % f)
            for m in c.get("volumeMounts", []):
                if m.get("name") not in volumes and m.get("name") not in claims:
                    self.bad(cw, "volume mount %s has no volume or claim template" % m.get("name"))
                if not str(m.get("mountPath", "")).startswith("/"):
                    self.bad(cw, "volume mount %s needs an absolute mountPath" % m.get("name"))
            ports = {p.get("name") for p in c.get("ports", [])} | {
                p.get("containerPort") for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if probe in c and port not in ports:
                    self.bad(cw, "%s reads port %r, which the container does not name"
                             % (probe, port))
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("configMapKeyRef")
                if ref is not None:
                    self.ref(cw, "ConfigMap", self.config_maps, ref.get("name"), [ref.get("key")])

    def ref(self, where, kind, store, name, keys):
        if name not in store:
            self.bad(where, "%s %s is neither generated nor defined" % (kind, name))
            return
        for k in keys:
            if k not in store[name]:
                self.bad(where, "%s %s has no key %s (it has %s)"
                         % (kind, name, k, ", ".join(sorted(store[name]))))


def main(argv):
    c = Checker()
    if len(argv) == 2 and argv[0] == "--rendered":
        c.load_file(argv[1])
    elif argv and not argv[0].startswith("-"):
        for d in argv:
            c.load_dir(d)
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    c.check()
    for p in c.problems:
        print("k8s_check: " + p)
    if c.problems:
        return 1
    kinds = sorted("%s %s" % (o.get("kind"), o.get("metadata", {}).get("name", ""))
                   for _, o in c.objects)
    print("k8s_check: %d objects, no problem: %s" % (len(kinds), ", ".join(kinds)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
