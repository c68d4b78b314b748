"""One line per configuration of a testbed-configs.sh .jsonl: the median of the runs' medians, the
workers' and the switch's CPU seconds (medians over the runs), the switch's datagrams per GSO write
(RESULTs sent to one rank in one train) and the share of packets resent.

Usage: python3 summarize.py FILE.jsonl
"""

import collections
import json
import statistics
import sys


def main(path: str) -> None:
    runs = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            extra, switch, workers = r["extra"], r["extra"]["switch"], r["extra"]["timed_workers"]
            runs[r["config"]].append(
                (
                    r["median_s"] * 1e3,
                    sum(extra["worker_cpu_s"]),
                    extra["switch_cpu_s"],
                    switch["pkts_in"] / max(switch["udp.gso_writes"], 1),
                    100 * workers["retransmissions"] / workers["packets_sent"],
                )
            )
    for name, v in sorted(runs.items()):

        def med(i: int, v=v) -> float:
            return statistics.median(x[i] for x in v)

        print(
            f"{name:10s} n={len(v)} median {med(0):6.1f} ms  workers cpu {med(1):5.2f} s  "
            f"switch cpu {med(2):5.2f} s  pkts/gso-write {med(3):5.1f}  resent {med(4):.2f}%  "
            f"all {[round(x[0]) for x in v]}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
