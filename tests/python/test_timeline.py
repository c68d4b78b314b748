"""The worker timeline (GRADSWITCH_TIMELINE, src/worker/timeline.h, gradswitch.timeline): each rank's
file is valid JSON whose events are the allreduces that ran (sizes, seqs, retransmissions as the
group counted them, the error of one that failed), `gradswitch timeline merge` joins ranks on one
axis (also when a host's clock is off), a file cut short is still read, and torch's collectives and
overlap appear as spans."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from _ranks import in_threads

import gradswitch
from gradswitch import timeline
from gradswitch.cli import main as cli

SIZES = [1000, 50_000, 10]  # elements; then a burst of 3 queued allreduces of BURST
BURST = 2000


def events(doc: dict, name: str, ph: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("name") == name and e.get("ph") == ph]


def spans(doc: dict, name: str) -> list[dict]:
    """Complete and async spans called `name`, in the order they begin."""
    return [s for s in timeline.spans(doc) if s["name"] == name]


@pytest.fixture
def traced(tmp_path, monkeypatch, switch):
    """Two ranks in threads, with loss, writing timelines: their files and their stats."""
    monkeypatch.setenv("GRADSWITCH_TIMELINE", str(tmp_path / "tl.json"))

    def work(r: int) -> dict:
        with gradswitch.connect(
            switch.address, job="tl", rank=r, world_size=2, drop_rate=0.05, seed=r + 1, timeout=20
        ) as g:
            for n in SIZES:
                g.allreduce(np.ones(n, np.float32))
            handles = [g.allreduce_async(np.ones(BURST, np.float32)) for _ in range(3)]
            for h in handles:
                h.wait()
            # ranks that disagree on the length: the switch aborts the job, both calls fail
            with pytest.raises(gradswitch.JobAborted):
                g.allreduce(np.ones(500 + 400 * r, np.float32))
            stats = g.stats()
        return stats

    stats = in_threads(work)
    files = [tmp_path / f"tl.rank{r}.json" for r in range(2)]
    return files, stats


def test_each_rank_file_holds_its_allreduces(traced):
    files, stats = traced
    payload_elems = 1440 // 4
    want_sizes = [*SIZES, BURST, BURST, BURST]
    for r, path in enumerate(files):
        doc = json.loads(path.read_text())  # strictly valid JSON once the group closed
        assert doc["otherData"]["rank"] == r and doc["otherData"]["wall_clock_ns"] > 0
        names = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "M"}
        assert names["process_name"]["pid"] == r and f"rank {r}" in names["process_name"]["args"]["name"]
        for e in doc["traceEvents"]:
            assert e["pid"] == r and isinstance(e["tid"], int), e
        assert all(s["dur"] >= 0 and s["ts"] >= 0 for s in timeline.spans(doc))
        ar = spans(doc, "allreduce")
        assert [e["args"].get("seq") for e in ar] == list(range(len(want_sizes) + 1)), ar
        for e, n in zip(ar, want_sizes, strict=False):
            a = e["args"]
            assert a["elements"] == n and a["bytes"] == 4 * n and a["status"] == "ok", a
            assert a["chunks"] == math.ceil(n / payload_elems) and a["wire"] == "float32", a
            assert a["algorithm"] == "switch" and a["first_result_us"] >= 0, a
        failed = ar[-1]["args"]
        assert failed["status"] != "ok" and "disagree" in failed["status"], failed
        # the retransmissions the group counted, each one on the timeline (up to 32 per allreduce)
        assert sum(e["args"]["retransmissions"] for e in ar) == stats[r]["retransmissions"]
        retx = events(doc, "retransmit", "n")
        assert len(retx) == sum(min(32, e["args"]["retransmissions"]) for e in ar)
        assert stats[r]["retransmissions"] > 0, "the injected loss caused no retransmission"
        # the adaptive window's decisions are counted; an undo needs a loss cut before it
        assert {"window_delay_cuts", "window_loss_cuts", "window_undos"} <= stats[r].keys(), stats[r]
        assert stats[r]["window_undos"] <= stats[r]["window_loss_cuts"], stats[r]
        # the phases of an allreduce (its async id) lie inside it, on its lane; so do its retransmissions
        assert len({e["id"] for e in ar}) == len(ar)
        for e in ar[:-1]:
            inner = spans(doc, "first packet to first result") + spans(doc, "results")
            inner = [x for x in inner if x["id"] == e["id"]]
            assert inner and all(x["tid"] == e["tid"] for x in inner), e
            end = e["ts"] + e["dur"] + 0.01
            assert all(e["ts"] <= x["ts"] and x["ts"] + x["dur"] <= end for x in inner), (e, inner)
            for x in retx:
                if x["id"] == e["id"]:
                    assert e["ts"] <= x["ts"] <= end, (e, x)
        # the wait in the queue: ends when the allreduce was admitted
        queued = {q["args"]["seq"]: q for q in spans(doc, "queued")}
        assert len(queued) >= len(want_sizes)
        for e in ar:
            if e["args"]["seq"] in queued:
                q = queued[e["args"]["seq"]]
                assert abs(q["ts"] + q["dur"] - e["ts"]) < 0.01 and e["args"]["queued_us"] >= 0, (q, e)


def test_merge_aligns_ranks_by_clock_and_by_results(traced, tmp_path, capsys):
    files, _ = traced
    out = tmp_path / "merged.json"
    assert cli(["timeline", "merge", *map(str, files), "-o", str(out)]) == 0
    merged = json.loads(out.read_text())
    evs = [e for e in merged["traceEvents"] if e["ph"] != "M"]
    assert {e["pid"] for e in evs} == {0, 1}
    assert [e["ts"] for e in evs] == sorted(e["ts"] for e in evs)
    singles = [json.loads(f.read_text()) for f in files]
    assert len(merged["traceEvents"]) == sum(len(d["traceEvents"]) for d in singles)

    def end_gaps(doc: dict) -> list[float]:
        ends = {}
        for e in spans(doc, "allreduce"):
            if e["args"]["status"] == "ok":
                ends.setdefault(e["args"]["seq"], {})[e["pid"]] = e["ts"] + e["dur"]
        return [abs(v[0] - v[1]) for v in ends.values() if len(v) == 2]

    # one host: the clocks agree, and every rank gets an allreduce's last result at about the same time
    assert np.median(end_gaps(merged)) < 20_000  # µs; a loaded 2-core machine schedules late
    # a host whose clock is 10 s ahead: --align clock keeps the error, --align results removes it
    skewed = json.loads(files[1].read_text())
    skewed["otherData"]["wall_clock_ns"] += 10_000_000_000
    files[1].write_text(json.dumps(skewed))
    assert cli(["timeline", "merge", *map(str, files), "-o", str(out)]) == 0
    assert np.median(end_gaps(json.loads(out.read_text()))) > 9_000_000
    assert cli(["timeline", "merge", "--align", "results", *map(str, files), "-o", str(out)]) == 0
    assert np.median(end_gaps(json.loads(out.read_text()))) < 20_000
    capsys.readouterr()
    assert cli(["timeline", "summary", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rank 0" in text and "rank 1" in text and f"{len(SIZES) + 4} allreduces" in text, text
    assert "1 failed" in text and "disagree" in text, text


def test_a_file_cut_short_is_read_up_to_the_cut(traced, tmp_path):
    files, _ = traced
    whole = json.loads(files[0].read_text())
    text = files[0].read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: int(len(text) * 0.6)])  # a process killed in the middle of a flush
    doc = timeline.load(cut)
    assert 0 < len(doc["traceEvents"]) < len(whole["traceEvents"])
    assert doc["traceEvents"] == whole["traceEvents"][: len(doc["traceEvents"])]
    (tmp_path / "junk.json").write_text("not a timeline")
    with pytest.raises(timeline.TimelineError):
        timeline.load(tmp_path / "junk.json")
    assert cli(["timeline", "merge", str(tmp_path / "junk.json"), "-o", str(tmp_path / "x.json")]) == 1


def test_an_unwritable_timeline_fails_connect_before_joining(tmp_path, monkeypatch, switch):
    monkeypatch.setenv("GRADSWITCH_TIMELINE", str(tmp_path / "no" / "such" / "dir" / "tl.json"))
    with pytest.raises(gradswitch.GradswitchError, match="GRADSWITCH_TIMELINE: cannot create"):
        gradswitch.connect(switch.address, job="nope", rank=0, world_size=1)
    assert switch.jobs() == []  # nothing joined


def test_torch_collectives_and_overlap_on_the_timeline(tmp_path, monkeypatch, switch):
    torch = pytest.importorskip("torch", reason="torch is not installed (scripts/install-deps.sh)")
    from gradswitch.torch import ChunkedOverlap
    from gradswitch.torch._channel import Channel

    monkeypatch.setenv("GRADSWITCH_TIMELINE", str(tmp_path / "torch-{rank}.json"))
    with gradswitch.connect(switch.address, job="tt", rank=0, world_size=1) as g:
        ch = Channel(g, owns_group=False)
        ch.submit(torch.ones(1000), label="bucket A").wait()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
        overlap = ChunkedOverlap(model, comm=g, chunk_bytes=4096)
        model(torch.ones(8, 64)).sum().backward()
        overlap.synchronize()
        overlap.remove()
        overlap.channel.close()  # its completer thread holds the group
        ch.close()
    doc = json.loads((tmp_path / "torch-0.json").read_text())
    lanes = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    begins = events(doc, "bucket A", "b")  # an async span: buckets overlap
    assert len(begins) == 1 and lanes[begins[0]["tid"]] == "torch: collectives"
    assert begins[0]["args"]["bytes"] == 4000 and begins[0]["args"]["status"] == "ok"
    assert len(events(doc, "bucket A", "e")) == 1
    chunks = [e for e in doc["traceEvents"] if e["ph"] == "b" and e["name"].startswith("overlap chunk")]
    assert len(chunks) == len(overlap.chunks) >= 2
    assert spans(doc, "backward") and lanes[spans(doc, "backward")[0]["tid"]] == "torch: backward"
    # every allreduce the channel issued is on the C++ side's lane too
    assert len(spans(doc, "allreduce")) == 1 + len(chunks)
