#!/usr/bin/env bash
# The per-delivery benchmarks in one command: the throughput suite (every
# variant, backend, blocking and async, 1 and 8 connections, round trips;
# see `throughput/main.rs`), then what observability costs (`observe.sh`:
# the `#[idempotent]` handler built with inbox-runtime's `tracing` and
# `metrics` features off and on, run alternately). Pruning (`prune.rs`)
# stays apart: it loads PostgreSQL with a million rows.
#
# Usage: tests/benches/bench.sh [OBSERVE_ROUNDS=15]
# The throughput suite reads its INBOX_BENCH_* variables (backends, modes,
# connections, variants, rounds, slice length); see `throughput/main.rs`.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo bench -p inbox-tests --bench throughput --features postgres,mysql,async
echo
echo "observability (observe.sh):"
tests/benches/observe.sh "${1:-15}" sqlite,postgres
