#!/usr/bin/env bash
# On the GPU machine: the router forward kernel's SASS lines with the most executed instructions
# (ncu's source page), for the DeepSeek-V3 configuration of bench/profile_moe_ops.py, or its
# sigmoid top-8 one with SFMOE_PROFILE_ROUTER=sigmoid.
# Usage: PYTHONPATH=<build-py>/python bench/profile_router_sass.sh [lines]
set -uo pipefail
cd "$(dirname "$0")"
ncu --kernel-name regex:router_forward_kernel --launch-skip 1 --launch-count 1 \
  --section SourceCounters --page source --print-source sass --csv python3 profile_moe_ops.py \
  > /tmp/router_sass.csv 2>/dev/null
python3 - "${1:-70}" <<'PY'
import csv, sys
rows = list(csv.reader(open("/tmp/router_sass.csv")))
try:
    head = next(i for i, r in enumerate(rows) if "Source" in r)
    names = rows[head]
    col = next(i for i, n in enumerate(names) if "Instructions Executed" in n or n == "inst_executed")
    src = names.index("Source")
except StopIteration:
    print("unexpected ncu output; first rows:")
    for r in rows[:8]:
        print(r[:12])
    sys.exit(0)
data = []
for r in rows[head + 1:]:
    try:
        data.append((int(r[col].replace(",", "")), r[0], r[src]))
    except (ValueError, IndexError):
        pass
total = sum(d[0] for d in data)
print("columns:", names[col], "total", total)
for n, addr, s in sorted(data, reverse=True)[: int(sys.argv[1])]:
    print(f"{n:>10} {100.0 * n / total:5.2f}% {addr} {s}")
# group by opcode
ops = {}
for n, _, s in data:
    op = s.split()[0] if s.split() else "?"
    if op.startswith("@"):
        op = s.split()[1]
    ops[op.split(".")[0]] = ops.get(op.split(".")[0], 0) + n
print(sorted(ops.items(), key=lambda kv: -kv[1])[:25])
PY
