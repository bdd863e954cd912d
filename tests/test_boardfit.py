"""The board model against the Vitis AI 2.5 Model Zoo's fps tables (issue 33, runtime/boardfit.py): the table and its
faithful topologies, the training / held-out split, and the host fit on hand-made points."""
import csv

import pytest

from opendpu.isa.boards import BOARDS
from opendpu.quant import zoo
from opendpu.runtime import boardfit as bf


def test_table_rows_and_topologies():
    table = bf.load_table()
    assert len(table) == 384 and {m.board for m in table} == {"zcu102", "zcu104", "kv260"}
    pts = bf.points(table)
    assert len(pts) == 3 * len(bf.TOPOLOGIES) == 75                # every faithful row on all three boards
    train = [p for p in pts if p.topo.family in bf.TRAIN_FAMILIES]
    assert len(pts) - len(train) >= 40 and len(train) <= len(pts) // 2   # at least half, and 40 points, held out
    # each row's GOPs (the last field of its standard name) against our topology's count, within 3 % (SqueezeNet's
    # name gives MACs: 351.7 M against its 0.35 G multiply-adds)
    with open(bf.TABLE, newline="") as f:
        names = {r["model"]: r["standard_name"] for r in csv.DictReader(f)}
    counted = {}
    for tp in bf.TOPOLOGIES:
        name, _, size = tp.zoo[4:].partition("@")
        hw = tuple(int(v) for v in size.split("x")) if size else None
        if tp.zoo not in counted:
            counted[tp.zoo] = zoo.count(zoo.build(name, hw))
        g = names[tp.row].rsplit("_", 1)[1]
        gops = float(g[:-1]) * (1e-3 if g.endswith("M") else 1.0)
        ours = counted[tp.zoo]["macs"] / 1e9 if tp.row == "SqueezeNet_pt" else counted[tp.zoo]["gops"]
        assert ours == pytest.approx(gops, rel=0.03), (tp.row, gops, ours)


def test_fit_host_by_hand():
    """One-core points made from a host of 200 us + 2,000 us per MB at 1,200 MHz (the kv260's A53s run at 1,333 MHz):
    the multi-thread period is the core's, the single-thread period adds the host; fit_host gives both back."""
    t = BOARDS["kv260"]
    pts, frames = [], {}
    for i, (io, period_us) in enumerate(((50_000, 400.0), (150_000, 3000.0), (800_000, 70_000.0))):
        spec = f"zoo:model{i}"
        frames[spec] = bf.Frame(spec, [], io)
        host = (200 + 2000 * io / 1e6) * 1200 / t.cpu_mhz
        pts.append(bf.Point(bf.Topology(f"row{i}", spec, "f", ""), bf.Measured(f"row{i}", "kv260",
                                                                                1e6 / (period_us + host),
                                                                                1e6 / period_us)))
    # a multi-core point carries no such information and is ignored
    pts.append(bf.Point(bf.Topology("row9", "zoo:model0", "f", ""), bf.Measured("row9", "zcu102", 100.0, 300.0)))
    assert bf.fit_host(pts, frames) == {"host_frame_us": 200, "host_us_per_mb": 2000}
