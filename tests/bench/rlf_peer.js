// rlf_peer.js: rate-limiter-flexible (RateLimiterRedis on ioredis, 100
// points per 60 s), the peer the exact path is measured against, driven at
// the same depth as rl on the same redis-server. Run by bench-exact:
//
//   node rlf_peer.js HOST PORT run DEPTH RULES SECONDS
//       prints "RATE P50_US P99_US ERRORS" (requests per second)
//   node rlf_peer.js HOST PORT fill N
//       consumes one point from keys k0 .. k(N-1), twice; prints "N"
//   node rlf_peer.js version
//       prints the versions of rate-limiter-flexible and ioredis
//
// Keys are rl:key:kN (rl:ip:, rl:tenant: for the second and third rule),
// the names the C clients use, so that bytes per key compare.
'use strict';

const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const KEYS = 10000;
const PREFIXES = ['rl:key', 'rl:ip', 'rl:tenant'];

function limiters(redis, n) {
  return PREFIXES.slice(0, n).map((keyPrefix) => new RateLimiterRedis({
    storeClient: redis, points: 100, duration: 60, keyPrefix,
  }));
}

// A rejection is a RateLimiterRes; an Error is a failure.
function consume(limiter, key, stats) {
  return limiter.consume(key).catch((e) => {
    if (e instanceof Error && stats.errors++ === 0)
      console.error(`rlf_peer: ${e.message}`);
  });
}

async function worker(ls, end, lat, stats) {
  while (performance.now() < end) {
    const t0 = performance.now();
    await Promise.all(ls.map((l) => consume(l, 'k' + ((Math.random() * KEYS) | 0), stats)));
    const t1 = performance.now();
    if (t1 < end)
      lat.push((t1 - t0) * 1000);
    stats.done++;
  }
}

function percentile(sorted, p) {
  if (sorted.length === 0)
    return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function run(redis, depth, rules, seconds) {
  const ls = limiters(redis, rules);
  const lat = [];
  const stats = { done: 0, errors: 0 };
  const start = performance.now();
  const end = start + seconds * 1000;
  await Promise.all(Array.from({ length: depth }, () => worker(ls, end, lat, stats)));
  const rate = stats.done / ((performance.now() - start) / 1000);
  lat.sort((a, b) => a - b);
  console.log(`${rate.toFixed(1)} ${percentile(lat, 50).toFixed(1)} ${percentile(lat, 99).toFixed(1)} ${stats.errors}`);
}

async function fill(redis, n) {
  const [l] = limiters(redis, 1);
  const stats = { done: 0, errors: 0 };
  let next = 0;
  const one = async () => {
    while (next < 2 * n) {
      const i = next++;
      await consume(l, 'k' + (i % n), stats);
    }
  };
  await Promise.all(Array.from({ length: 64 }, one));
  console.log(`${n}`);
  if (stats.errors > 0)
    process.exitCode = 1;
}

async function main() {
  const [host, port, mode, a, b, c] = process.argv.slice(2);
  if (host === 'version') {
    console.log(`rate-limiter-flexible ${require('rate-limiter-flexible/package.json').version}, ioredis ${require('ioredis/package.json').version}`);
    return;
  }
  const redis = new Redis({ host, port: Number(port), lazyConnect: true });
  await redis.connect();
  if (mode === 'run')
    await run(redis, Number(a), Number(b), Number(c));
  else if (mode === 'fill')
    await fill(redis, Number(a));
  else
    throw new Error(`unknown mode ${mode}`);
  redis.disconnect();
}

main().catch((e) => {
  console.error(`rlf_peer: ${e.stack || e}`);
  process.exit(1);
});
