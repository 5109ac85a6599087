#!/usr/bin/env bash
# Instructions per request (valgrind's callgrind), server and client, for each peer given:
# each side runs under callgrind twice, for a short and a long sequential run; the difference
# divided by the difference in requests removes startup and the connection's setup.
#
#   Benchmarks/scripts/instructions-per-request.sh raw-nio tether tether-callback
#
# Needs valgrind (apt-get install valgrind) and a release build of tether-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=.build/release/tether-bench
[ -x "$bench" ] || { echo "build first: swift build -c release --product tether-bench" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
short=${SHORT:-1000}
long=${LONG:-5000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Total instructions (Ir) of one callgrind output file.
instructions() { awk '/^summary:/ { print $2 }' "$1"; }

# Runs `peer` for `requests` sequential requests, server and client under callgrind.
measure() {
    local peer=$1 requests=$2 tag=$3
    valgrind --tool=callgrind --callgrind-out-file="$work/server-$tag" "$bench" serve "$peer" >"$work/server-$tag.log" 2>/dev/null &
    local server=$!
    local port=""
    for _ in $(seq 1 600); do
        port=$(sed -n 's/^ready \([0-9]*\)$/\1/p' "$work/server-$tag.log" | head -1)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "the $peer server did not start" >&2; kill "$server"; exit 1; }
    valgrind --tool=callgrind --callgrind-out-file="$work/client-$tag" "$bench" drive "$peer" --port "$port" \
        --requests "$requests" >/dev/null 2>&1
    kill -INT "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
}

printf '| Peer | server instructions / request | client instructions / request |\n|---|---|---|\n'
for peer in "$@"; do
    measure "$peer" "$short" short
    measure "$peer" "$long" long
    # `drive` sends requests/10 warm-up requests before the measured ones.
    count=$(( (long + long / 10) - (short + short / 10) ))
    server=$(( ($(instructions "$work/server-long") - $(instructions "$work/server-short")) / count ))
    client=$(( ($(instructions "$work/client-long") - $(instructions "$work/client-short")) / count ))
    printf '| %s | %d | %d |\n' "$peer" "$server" "$client"
done
