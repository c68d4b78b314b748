"""The data thread's ppoll sleeps and recvmmsg batches from a `bench/cpu_bench.py --record --record-events`
trace (this folder's README): perf script -F tid,time,event,trace -i record-NAME.data > ev.txt;
python3 durations.py ev.txt (the thread with the most events is the data thread)."""

import collections
import sys


def main(path: str) -> None:
    rows = [ln.split(None, 3) for ln in open(path) if ln.strip()]
    tid = collections.Counter(r[0] for r in rows).most_common(1)[0][0]
    sleeps, batches, entered = [], [], None
    for r in rows:
        if r[0] != tid or len(r) < 3:
            continue
        t, ev = float(r[1].rstrip(":")), r[2].rstrip(":")
        if ev.endswith("enter_ppoll"):
            entered = t
        elif ev.endswith("exit_ppoll") and entered is not None:
            sleeps.append((t - entered) * 1e6)
            entered = None
        elif ev.endswith("exit_recvmmsg") and len(r) > 3 and int(r[3], 16) < 1 << 63:
            batches.append(int(r[3], 16))
    sleeps.sort()
    q = {p: sleeps[int(p * (len(sleeps) - 1))] for p in (0.1, 0.25, 0.5, 0.75, 0.9)}
    print(f"ppolls {len(sleeps)}, us: " + ", ".join(f"p{int(p * 100)} {v:.0f}" for p, v in q.items()))
    for lim in (5, 10, 20, 50, 100, 200, 500):
        print(f"  <= {lim} us: {sum(1 for x in sleeps if x <= lim)}")
    print(f"recvmmsg that returned datagrams: {len(batches)}, messages (GRO trains) per call:")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(collections.Counter(batches).items())))


if __name__ == "__main__":
    main(sys.argv[1])
