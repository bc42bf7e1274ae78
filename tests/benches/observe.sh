#!/usr/bin/env bash
# What observability costs per delivery (see `observe.rs`): builds the
# `observe` benchmark twice, with inbox-runtime's `tracing` and `metrics`
# features off and on, runs its modes (off, idle, installed, subscriber,
# recorder) as processes of their own, alternately, rotating their order
# every round, and prints the medians and throughput ratios.
#
# Usage: tests/benches/observe.sh [ROUNDS=15] [BACKENDS=sqlite,postgres]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-15}
backends=${2:-sqlite,postgres}

# The path of the benchmark's executable built with `features`.
build() {
    cargo bench -p inbox-tests --bench observe --no-run --message-format=json --features "$1" |
        grep -o '"executable":"[^"]*/observe-[^"]*"' | tail -n 1 | cut -d '"' -f 4
}
off=$(build "$backends")
on=$(build "$backends,tracing,metrics")
runs=("$off --bench off" "$on --bench idle" "$on --bench installed"
    "$on --bench subscriber" "$on --bench recorder")
for round in $(seq 1 "$rounds"); do
    for offset in "${!runs[@]}"; do
        ${runs[$(((round + offset) % ${#runs[@]}))]}
    done
done | "$on" --summarize
