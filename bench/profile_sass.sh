#!/usr/bin/env bash
# On the GPU machine: one launch of a kernel profiled by ncu's source page, SASS view; prints the
# executed-instruction total, the SASS lines with the most executed instructions (and their warp
# stall samples when ncu reports them) and the executed instructions per opcode.
# Usage: bench/profile_sass.sh KERNEL_REGEX SKIP LINES -- COMMAND [ARGS...]
#   KERNEL_REGEX  ncu --kernel-name regex (e.g. quantize_tiles_kernel)
#   SKIP          launches of that kernel to skip first (warm-up calls)
#   LINES         how many of the hottest SASS lines to print
# With SFMOE_PROFILE_CSV=PATH the whole source page (every SASS line's counters) is kept there.
set -uo pipefail
kernel=$1 skip=$2 lines=$3
shift 3
[ "${1:-}" = "--" ] && shift
csv=$(mktemp /tmp/profile_sass.XXXXXX.csv)
ncu --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  "$@" > "$csv" 2>/dev/null
python3 - "$csv" "$lines" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
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
stall = next((i for i, n in enumerate(names) if n.startswith("Warp Stall Sampling (All")), None)
data = []
for r in rows[head + 1:]:
    try:
        n = int(r[col].replace(",", ""))
        s = int(r[stall].replace(",", "")) if stall is not None and r[stall] else 0
        data.append((n, s, r[0], r[src]))
    except (ValueError, IndexError):
        pass
total = sum(d[0] for d in data)
samples = sum(d[1] for d in data) or 1
print(f"warp instructions executed: {total}  (stall samples {samples})")
for n, s, addr, text in sorted(data, reverse=True)[: int(sys.argv[2])]:
    print(f"{n:>11} {100.0 * n / total:5.2f}%  stall {100.0 * s / samples:5.2f}%  {addr} {text}")
print("hottest stall lines:")
for n, s, addr, text in sorted(data, key=lambda d: -d[1])[:15]:
    print(f"{n:>11} {100.0 * n / total:5.2f}%  stall {100.0 * s / samples:5.2f}%  {addr} {text}")
ops = {}
for n, _, _, text in data:
    parts = text.split()
    if not parts:
        continue
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    ops[op.split(".")[0]] = ops.get(op.split(".")[0], 0) + n
print("per opcode:", ", ".join(f"{k} {100.0 * v / total:.1f}%" for k, v in
                               sorted(ops.items(), key=lambda kv: -kv[1])[:25]))
PY
if [ -n "${SFMOE_PROFILE_CSV:-}" ]; then cp "$csv" "$SFMOE_PROFILE_CSV"; fi
rm -f "$csv"
