#!/usr/bin/env bash
# Samples the machine every N seconds (default 5) into FILE until killed: memory, load, pressure
# stall information, and the processes with the most resident memory. For reading a benchmark's
# behaviour afterwards (e.g. parallel builds: CPU-bound, or thrashing near memory exhaustion?).
# Usage: bench/sysmon.sh FILE [SECONDS] &
out="$1"; every="${2:-5}"
while :; do
  {
    echo "=== $(date +%s.%N | cut -c1-14) load $(cut -d' ' -f1-4 /proc/loadavg)"
    free -m | sed -n 2p
    for p in cpu memory io; do [ -r /proc/pressure/$p ] && echo "psi $p $(head -1 /proc/pressure/$p)"; done
    ps -eo rss=,pcpu=,etimes=,comm= --sort=-rss | head -12 | awk '{printf "  %6.0f MB %5s%% %5ss %s\n", $1/1024, $2, $3, $4}'
    echo "  procs: $(ps -e --no-headers | wc -l); cc1plus $(pgrep -c cc1plus) cicc $(pgrep -c cicc) cudafe++ $(pgrep -c cudafe) ptxas $(pgrep -c ptxas)"
  } >> "$out"
  sleep "$every"
done
