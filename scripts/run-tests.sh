#!/bin/sh
# Runs the test command, keeping its output in a log, and fails if the
# command failed or if any sanitizer reported an error. Criterion reports a
# test's result before the test process exits, so a leak found by
# LeakSanitizer at exit, or a ThreadSanitizer warning, would otherwise not
# fail the run.
#
# The programs the tests start (rl-aggregator, rl-gateway) write their
# stderr, and so their sanitizer reports, to logs in RL_TEST_LOGDIR, a
# directory next to LOG, scanned here too: a daemon that a test kills, or
# whose death the test tolerates, fails no test by itself. The directory
# is emptied first, so that logs of an earlier run count neither way.
#
#   run-tests.sh LOG COMMAND [ARG...]
set -u
log=$1
shift
mkdir -p "$(dirname "$log")"
RL_TEST_LOGDIR=$(cd "$(dirname "$log")" && pwd)/daemon-logs
export RL_TEST_LOGDIR
rm -rf "$RL_TEST_LOGDIR"
mkdir -p "$RL_TEST_LOGDIR"

status_file=$log.status
{ "$@"; echo $? > "$status_file"; } 2>&1 | tee "$log"
status=$(cat "$status_file")
rm -f "$status_file"

pattern='(ERROR|WARNING): (Address|Leak|Thread|Memory|UndefinedBehavior)Sanitizer|runtime error:'
reports=$(grep -cE "$pattern" "$log")
for f in "$RL_TEST_LOGDIR"/*; do
    n=$(grep -cE "$pattern" "$f" 2>/dev/null) || continue
    # CI keeps only what a run printed: the report, not the log's start.
    echo "--- $f: $n sanitizer report(s) ---" >&2
    grep -m 1 -A 60 -E "$pattern" "$f" >&2
    reports=$((reports + n))
done
if [ "$reports" -gt 0 ]; then
    # The test processes' own reports were printed as they came, far from
    # the end CI keeps: the first one again, here.
    if grep -qE "$pattern" "$log"; then
        echo "--- $log: the first sanitizer report ---" >&2
        grep -m 1 -A 40 -E "$pattern" "$log" >&2
    fi
    echo "run-tests: $reports sanitizer report(s) above; see $log and $RL_TEST_LOGDIR" >&2
    [ "$status" -eq 0 ] && status=1
fi
# A run that ran no test checked nothing (a filter that matches no test
# name, say): that is not a pass. The TSan runner fails on it by itself.
if grep -q 'Synthesis: Tested: 0 |' "$log"; then
    echo "run-tests: no test ran; check the --filter pattern" >&2
    [ "$status" -eq 0 ] && status=1
fi
# CI keeps only the end of what a run printed: name the failures there.
if [ "$status" -ne 0 ]; then
    grep -E '^\[(----|FAIL)\]|Assertion|CRASH|Timed out|signal' "$log" \
        | grep -v 'Synthesis' | tail -n 40 >&2
fi
exit "$status"
