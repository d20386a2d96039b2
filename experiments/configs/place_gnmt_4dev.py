"""Place the profiled GNMT training graph (shipped with tfopt) on 4
devices that each hold 0.35 of its memory, with the whole portfolio.

    tfopt-place --config=experiments/configs/place_gnmt_4dev.py \
        --gantt=/tmp/gnmt.png

Expected (about 1 s): m-SCT on the coarsened graph, refined by group moves
("m-sct/coarse+refine"), makespan 374.12 ms against 520.45 ms on one device
(which is over the cap), lower bound 337.43 ms (the critical path; work
/ devices and the memory LP give 130.11 ms), plan / bound 1.109, feasible
True, and the table of all 15 candidates; /tmp/gnmt.png is the schedule's Gantt chart. The
reference implementation's best valid plan at this cap is 396.0 ms (m-SCT
with its fusion pass; its plain m-ETF and m-SCT fail).
"""

CONFIG = {
    "costgraph": "msr_gnmt_training_layers",
    "devices": 4,
    "memory_fraction": 0.35,
    "placer": "auto",
}
