#!/usr/bin/python3
"""Unary gRPC calls through grpcio's generic API (raw bytes, no
serializers), for tests of rl-rls's HTTP/2 transport (test_rls_h2.c).
Run with /usr/bin/python3: Debian's python3-grpcio is installed there.

  grpc_raw_call.py TARGET [--concurrent N] PATH MESSAGE TIMEOUT [...]

MESSAGE is x<hex> (x alone: empty) or n<size> (size bytes, byte i being
i % 251); TIMEOUT is seconds, or - for none. The calls go one after the
other on one channel (one connection). With --concurrent N there is one
PATH MESSAGE TIMEOUT, made N times at once on that channel, message i
being the decimal text of i.

One line a call, in the calls' order: "<i> <code> <what>", code being
gRPC's number; what is, for OK, "same <len>" when the response equals the
request and the response's hex otherwise; for an error, the details' hex
(UTF-8), or "-" for none.
"""
import sys

import grpc


def message(spec):
    if spec.startswith("x"):
        return bytes.fromhex(spec[1:])
    if spec.startswith("n"):
        return bytes(i % 251 for i in range(int(spec[1:])))
    raise SystemExit("grpc_raw_call: bad MESSAGE " + spec)


def line(i, request, outcome):
    if isinstance(outcome, grpc.RpcError):
        details = outcome.details()
        what = details.encode().hex() if details else "-"
        return "%d %d %s" % (i, outcome.code().value[0], what)
    if outcome == request:
        return "%d 0 same %d" % (i, len(outcome))
    return "%d 0 %s" % (i, outcome.hex() or "-")


def call(channel, path, request, timeout):
    method = channel.unary_unary(path)
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as e:
        return e


def concurrent(channel, n, path, timeout):
    method = channel.unary_unary(path)
    requests = [str(i).encode() for i in range(n)]
    futures = [method.future(r, timeout=timeout) for r in requests]
    for i, (r, f) in enumerate(zip(requests, futures)):
        try:
            outcome = f.result()
        except grpc.RpcError as e:
            outcome = e
        print(line(i, r, outcome))


def main(argv):
    if len(argv) < 4:
        raise SystemExit(__doc__)
    target, rest = argv[0], argv[1:]
    n = 0
    if rest[0] == "--concurrent":
        n, rest = int(rest[1]), rest[2:]
    if len(rest) % 3 != 0 or (n and len(rest) != 3):
        raise SystemExit(__doc__)
    with grpc.insecure_channel(target) as channel:
        if n:
            timeout = None if rest[2] == "-" else float(rest[2])
            concurrent(channel, n, rest[0], timeout)
            return
        for i in range(0, len(rest), 3):
            request = message(rest[i + 1])
            timeout = None if rest[i + 2] == "-" else float(rest[i + 2])
            print(line(i // 3, request, call(channel, rest[i], request,
                                              timeout)))
            sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
