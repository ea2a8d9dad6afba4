#!/bin/sh
# Runs the test command, keeping its output in a log, and fails if the
# command failed or if any sanitizer reported an error. Criterion reports a
# test's result before the test process exits, so a leak found by
# LeakSanitizer at exit, or a ThreadSanitizer warning, would otherwise not
# fail the run.
#
#   run-tests.sh LOG COMMAND [ARG...]
set -u
log=$1
shift
mkdir -p "$(dirname "$log")"
status_file=$log.status
{ "$@"; echo $? > "$status_file"; } 2>&1 | tee "$log"
status=$(cat "$status_file")
rm -f "$status_file"
reports=$(grep -cE '(ERROR|WARNING): (Address|Leak|Thread|Memory|UndefinedBehavior)Sanitizer|runtime error:' "$log")
if [ "$reports" -gt 0 ]; then
    echo "run-tests: $reports sanitizer report(s) above; see $log" >&2
    [ "$status" -eq 0 ] && status=1
fi
# A run that ran no test checked nothing (a filter that matches no test
# name, say): that is not a pass. The TSan runner fails on it by itself.
if grep -q 'Synthesis: Tested: 0 |' "$log"; then
    echo "run-tests: no test ran; check the --filter pattern" >&2
    [ "$status" -eq 0 ] && status=1
fi
exit "$status"
