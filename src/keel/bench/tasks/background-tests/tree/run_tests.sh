#!/usr/bin/env bash
# A slow suite: it takes a couple of seconds before it reports.
set -e
sleep 2
python3 -m unittest -q test_calc 2>&1 | tail -n 1
echo "suite finished: 3 checks, 0 failures"
