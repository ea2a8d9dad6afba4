#!/usr/bin/python3
"""ShouldRateLimit and Health calls to rl-rls with grpcio and Envoy's own
message types (protoc compiles rls/proto for Python once for the files'
content: see cache_dir). Run with /usr/bin/python3: Debian's
python3-grpcio and python3-protobuf are installed there.

  rls_call.py [--ca FILE [--cert FILE --key FILE] [--name NAME]] TARGET
              CALL [CALL ...]

With --ca, over TLS: the server's certificate checked against that CA
(for NAME if given, else for TARGET's host), with --cert and --key a
client certificate; without it, cleartext (h2c).

Each CALL is JSON: {"domain": "d", "hits_addend": 0, "timeout": 2,
"repeat": 1, "clients": 1, "targets": ["host:port", ...], "every_ms": 10,
"stamp": false, "descriptors": [{"entries": [["key", "value"],
...], "hits_addend": 0, "limit": [3, "HOUR"]}]}, {"health": true}, or
{"handshake": ["http/1.1"]}: a TLS handshake alone (Python's ssl, --ca's
options) offering those ALPN protocols (none: no ALPN at all), with
"tls": "1.1" as TLS 1.1 at most (and OpenSSL's security level 0). The
calls go one after the other on one channel; with "clients": N, N threads
make them at once, each on a channel (a connection) of its own, and their
lines come in no particular order. With "targets", client i calls
targets[i % len(targets)] instead of TARGET; with "every_ms", each client
makes its calls that far apart (on a schedule: a late one does not push
the next back); with "stamp", each line starts with the wall clock's ms
when its answer came. One line per call (repeat makes more): "OK <overall> <status>;<status>... [| <header>=<value>,...]
[|| <request header>=<value>,...]" with
each status as code:remaining:rpu/unit:name:reset ("-" for no current
limit), "HEALTH <status>", "TLS <alpn>" or "TLS_ERROR <reason>", or
"ERROR <code> <details>".
"""
import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import google.protobuf
import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join(HERE, "..", "..", "rls", "proto")
FILES = ["envoy/service/ratelimit/v3/rls.proto",
         "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
         "envoy/type/v3/ratelimit_unit.proto",
         "envoy/config/core/v3/base.proto",
         "google/protobuf/duration.proto",
         "google/protobuf/wrappers.proto",
         "grpc/health/v1/health.proto"]


def cache_dir():
    # protoc's output for these .proto files' bytes (and this protobuf),
    # made once and shared by every call of a run: beside the run's
    # daemon logs (make test's build tree) if there are any, else for this
    # call alone.
    key = hashlib.sha256(google.protobuf.__version__.encode())
    for name in FILES:
        key.update(name.encode() + b"\0" + read(os.path.join(PROTO, name)))
    logs = os.environ.get("RL_TEST_LOGDIR")
    if not logs:
        out = tempfile.mkdtemp(prefix="rls-py-")
        atexit.register(shutil.rmtree, out, True)
        protoc(out)
        return out
    root = os.path.join(os.path.dirname(logs), "rls-py")
    final = os.path.join(root, key.hexdigest()[:16])
    if not os.path.isdir(final):
        # Made aside and renamed: a call beside this one sees all or none.
        os.makedirs(root, exist_ok=True)
        out = tempfile.mkdtemp(prefix="new-", dir=root)
        protoc(out)
        try:
            os.rename(out, final)
        except OSError:
            shutil.rmtree(out, True)  # another call's came first
    return final


def protoc(out):
    subprocess.run(["protoc", "-I", PROTO, "--python_out", out] + FILES,
                   check=True)


def compiled():
    out = cache_dir()
    sys.path.insert(0, out)
    from envoy.service.ratelimit.v3 import rls_pb2
    # Its package, grpc, is grpcio's name too: loaded from its path.
    path = os.path.join(out, "grpc", "health", "v1", "health_pb2.py")
    spec = importlib.util.spec_from_file_location("health_pb2", path)
    health_pb2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(health_pb2)
    return rls_pb2, health_pb2


def request(rls_pb2, spec):
    r = rls_pb2.RateLimitRequest(domain=spec.get("domain", ""),
                                 hits_addend=spec.get("hits_addend", 0))
    for d in spec.get("descriptors", []):
        desc = r.descriptors.add()
        for k, v in d.get("entries", []):
            e = desc.entries.add()
            e.key, e.value = k, v
        if "hits_addend" in d:
            desc.hits_addend.value = d["hits_addend"]
        if "limit" in d:
            desc.limit.requests_per_unit = d["limit"][0]
            desc.limit.unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Value(
                d["limit"][1])
    return r


def status_text(rls_pb2, s):
    code = rls_pb2.RateLimitResponse.Code.Name(s.code)
    if not s.HasField("current_limit"):
        return "%s:%d:-" % (code, s.limit_remaining)
    lim = s.current_limit
    unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Name(lim.unit)
    return "%s:%d:%d/%s:%s:%d" % (code, s.limit_remaining,
                                  lim.requests_per_unit, unit, lim.name,
                                  s.duration_until_reset.seconds)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def channel_of(target, tls, options):
    if tls.get("ca") is None:
        return grpc.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=read(tls["ca"]),
        private_key=read(tls["key"]) if tls.get("key") else None,
        certificate_chain=read(tls["cert"]) if tls.get("cert") else None)
    if tls.get("name"):
        options = options + [("grpc.ssl_target_name_override", tls["name"])]
    return grpc.secure_channel(target, creds, options=options)


def handshake(target, tls, protocols, version):
    # Imported here: every other call starts as fast as it did.
    import socket
    import ssl
    import warnings
    ctx = ssl.create_default_context(cafile=tls.get("ca"))
    if version == "1.1":
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    if tls.get("cert"):
        ctx.load_cert_chain(tls["cert"], tls["key"])
    if protocols:
        ctx.set_alpn_protocols(protocols)
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=tls.get("name")
                                 or host) as conn:
                return "TLS %s" % conn.selected_alpn_protocol()
    except (ssl.SSLError, OSError) as e:
        return "TLS_ERROR %s" % e


def stubs(target, tls, rls_pb2, health_pb2, own):
    # grpcio shares connections between channels unless told not to.
    options = [("grpc.use_local_subchannel_pool", 1)] if own else []
    channel = channel_of(target, tls, options)
    should = channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
        response_deserializer=rls_pb2.RateLimitResponse.FromString)
    health = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString)
    return should, health


def one(rls_pb2, health_pb2, should, health, spec):
    try:
        if spec.get("health"):
            r = health(health_pb2.HealthCheckRequest(),
                       timeout=spec.get("timeout", 5))
            return "HEALTH %s" % health_pb2.HealthCheckResponse.\
                ServingStatus.Name(r.status)
        r = should(request(rls_pb2, spec), timeout=spec.get("timeout", 5))
    except grpc.RpcError as e:
        return "ERROR %d %s" % (e.code().value[0], e.details())
    line = "OK %s %s" % (
        rls_pb2.RateLimitResponse.Code.Name(r.overall_code),
        ";".join(status_text(rls_pb2, s) for s in r.statuses))
    if r.response_headers_to_add:
        line += " | " + ",".join("%s=%s" % (h.key, h.value)
                                  for h in r.response_headers_to_add)
    if r.request_headers_to_add:
        line += " || " + ",".join("%s=%s" % (h.key, h.value)
                                   for h in r.request_headers_to_add)
    return line


def client(target, tls, rls_pb2, health_pb2, spec, lines, own):
    should, health = stubs(target, tls, rls_pb2, health_pb2, own)
    every = spec.get("every_ms", 0) / 1000.0
    start = time.monotonic()
    for i in range(spec.get("repeat", 1)):
        wait = start + i * every - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        line = one(rls_pb2, health_pb2, should, health, spec)
        if spec.get("stamp"):
            line = "%d %s" % (int(time.time() * 1000), line)
        lines.append(line)


def main():
    rls_pb2, health_pb2 = compiled()
    args, tls = sys.argv[1:], {}
    while args and args[0].startswith("--"):
        tls[args[0][2:]] = args[1]
        args = args[2:]
    target = args[0]
    should, health = stubs(target, tls, rls_pb2, health_pb2, False)
    for arg in args[1:]:
        spec = json.loads(arg)
        lines = []
        n = spec.get("clients", 1)
        if "handshake" in spec:
            lines.append(handshake(target, tls, spec["handshake"],
                                   spec.get("tls")))
        elif n == 1 and "targets" not in spec and not spec.get("every_ms") \
                and not spec.get("stamp"):
            for _ in range(spec.get("repeat", 1)):
                lines.append(one(rls_pb2, health_pb2, should, health, spec))
        else:
            targets = spec.get("targets", [target])
            threads = [threading.Thread(target=client,
                                        args=(targets[i % len(targets)], tls,
                                              rls_pb2, health_pb2, spec,
                                              lines, True))
                       for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for line in lines:
            print(line)
        sys.stdout.flush()


main()
