#!/bin/sh
# The published runs of docs/benchmarks.md ("Results"), one after another.
# `sh bench/published_runs.sh [DATE]` writes bench/results/DATE-*/ (DATE defaults
# to today's). Operation counts are modest so the whole set takes about half an
# hour on a 2-core machine; every run interleaves its targets 3 times (--repeat 3).
set -u  # not -e: a run whose target failed exits 1, and the next runs still go
cd "$(dirname "$0")/.."
DATE=${1:-$(date -u +%Y-%m-%d)}
DJCB=${DJCB:-.venv/bin/djcachebench}
OUT=bench/results
ALL=locmem,sqlite,tiered,redis,memcached,diskcache

"$DJCB" bench --scenario reference --ops 20000 --repeat 3 --backends "$ALL" \
    --out "$OUT/$DATE-reference"
"$DJCB" bench --scenario api-json --ops 5000 --warmup 200 --repeat 3 --backends "$ALL" \
    --out "$OUT/$DATE-api-json"
"$DJCB" bench --scenario html-pages --ops 5000 --warmup 200 --repeat 3 --backends "$ALL" \
    --out "$OUT/$DATE-html-pages"
"$DJCB" bench --scenario many-keys --ops 10000 --repeat 3 --backends "$ALL" \
    --out "$OUT/$DATE-many-keys"
"$DJCB" sweep --vary procs=1,2,4,8,16 --scenario reference --ops 2000 --warmup 200 \
    --repeat 3 --backends "$ALL" --out "$OUT/$DATE-sweep-procs"
"$DJCB" bench --scenario api-json --ops 5000 --warmup 200 --repeat 3 \
    --backends sqlite,tiered,redis --serializer pickle,msgpack \
    --out "$OUT/$DATE-serializers"
"$DJCB" serializers --out "$OUT/$DATE-serializers"
