#!/usr/bin/python3
"""ShouldRateLimit and Health calls to rl-rls with grpcio and Envoy's own
message types (protoc compiles rls/proto for Python into a temporary
folder). Run with /usr/bin/python3: Debian's python3-grpcio and
python3-protobuf are installed there.

  rls_call.py TARGET CALL [CALL ...]

Each CALL is JSON: {"domain": "d", "hits_addend": 0, "timeout": 2,
"repeat": 1, "clients": 1, "descriptors": [{"entries": [["key", "value"],
...], "hits_addend": 0, "limit": [3, "HOUR"]}]}, or {"health": true}. The
calls go one after the other on one channel; with "clients": N, N threads
make them at once, each on a channel (a connection) of its own, and their
lines come in no particular order. One line per call (repeat makes
more): "OK <overall> <status>;<status>... [| <header>=<value>,...]
[|| <request header>=<value>,...]" with
each status as code:remaining:rpu/unit:name:reset ("-" for no current
limit), "HEALTH <status>", or "ERROR <code> <details>".
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading

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


def compiled():
    out = tempfile.mkdtemp(prefix="rls-py-")
    subprocess.run(["protoc", "-I", PROTO, "--python_out", out] + FILES,
                   check=True)
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


def stubs(target, rls_pb2, health_pb2, own):
    # grpcio shares connections between channels unless told not to.
    options = [("grpc.use_local_subchannel_pool", 1)] if own else []
    channel = grpc.insecure_channel(target, options=options)
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


def client(target, rls_pb2, health_pb2, spec, lines, own):
    should, health = stubs(target, rls_pb2, health_pb2, own)
    for _ in range(spec.get("repeat", 1)):
        lines.append(one(rls_pb2, health_pb2, should, health, spec))


def main():
    rls_pb2, health_pb2 = compiled()
    target = sys.argv[1]
    should, health = stubs(target, rls_pb2, health_pb2, False)
    for arg in sys.argv[2:]:
        spec = json.loads(arg)
        lines = []
        n = spec.get("clients", 1)
        if n == 1:
            for _ in range(spec.get("repeat", 1)):
                lines.append(one(rls_pb2, health_pb2, should, health, spec))
        else:
            threads = [threading.Thread(target=client,
                                        args=(target, rls_pb2, health_pb2,
                                              spec, lines, True))
                       for _ in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        for line in lines:
            print(line)
        sys.stdout.flush()


main()
