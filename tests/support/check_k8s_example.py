#!/usr/bin/python3
"""Checks examples/kubernetes/rl-rls.yaml against what docs/envoy.md says
of it: upstream's Service name and ports (8080, 8081, 6070), only
variables rl-rls reads (rls/rls_settings.c's table), the descriptors'
ConfigMap mounted at RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, the binary
from /opt/rl, and /healthcheck as the readiness probe. Writes the
ConfigMap's files into the folder given, for rl-rls to load. Exit 0 when
it holds; else the reason on stderr."""
import os
import re
import sys

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def known_variables():
    text = open(os.path.join(ROOT, "rls", "rls_settings.c")).read()
    return set(re.findall(r'^    \{"([A-Z0-9_]+)"', text, re.M))


def main():
    docs = list(yaml.safe_load_all(open(os.path.join(
        ROOT, "examples", "kubernetes", "rl-rls.yaml"))))
    kinds = {d["kind"]: d for d in docs}
    svc, dep, cm = kinds["Service"], kinds["Deployment"], kinds["ConfigMap"]
    assert svc["metadata"]["name"] == "ratelimit", svc["metadata"]
    assert sorted(p["port"] for p in svc["spec"]["ports"]) == \
        [6070, 8080, 8081], svc["spec"]["ports"]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    unknown = set(env) - known_variables()
    assert not unknown, "variables rl-rls does not read: %s" % unknown
    assert sorted(p["containerPort"] for p in c["ports"]) == \
        [6070, 8080, 8081]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    config = [n for n, v in vols.items()
              if v.get("configMap", {}).get("name") ==
              cm["metadata"]["name"]]
    assert len(config) == 1, vols
    want = os.path.join(env["RUNTIME_ROOT"], env["RUNTIME_SUBDIRECTORY"],
                        "config")
    assert mounts[config[0]] == want, (mounts, want)
    assert "exec /opt/rl/bin/rl-rls" in c["args"][0], c["args"]
    assert c["readinessProbe"]["httpGet"] == \
        {"path": "/healthcheck", "port": 8080}
    for name, text in cm["data"].items():
        with open(os.path.join(sys.argv[1], name), "w") as f:
            f.write(text)
    print(" ".join("%s=%s" % kv for kv in sorted(env.items())))


try:
    main()
except (AssertionError, KeyError) as e:
    sys.stderr.write("examples/kubernetes/rl-rls.yaml: %r\n" % (e,))
    sys.exit(1)
