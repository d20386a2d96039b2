"""Place the profiled GNMT training graph (shipped with tfopt) on 4
devices that each hold 0.35 of its memory, with the whole portfolio.

    tfopt-place --config=experiments/configs/place_gnmt_4dev.py \
        --gantt=/tmp/gnmt.png

Expected (under 2 s): placer m-sct/coarse chosen, makespan 470.35 ms against
520.45 ms on one device (which is over the cap), lower bound 337.43 ms,
feasible True, and the table of all 11 candidates; /tmp/gnmt.png is the
schedule's Gantt chart. The reference implementation's m-ETF and m-SCT fail
at this cap and its m-TOPO gives 520.4 ms.
"""

CONFIG = {
    "costgraph": "msr_gnmt_training_layers",
    "devices": 4,
    "memory_fraction": 0.35,
    "placer": "auto",
}
