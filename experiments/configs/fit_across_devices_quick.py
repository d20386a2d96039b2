"""The demonstration at half the size (CI runs it): 8 x Dense(1024) with
CautiousAdamW, 100.9 MB of weights and moments, on 4 devices of 48 MiB
(50.3 MB) each.

    tfopt-fit-across-devices \
        --config=experiments/configs/fit_across_devices_quick.py

Expected (2-core CPU VM, about 2 minutes): the state is 2.0x one device's
cap; on 4 logical CPUs and on 4 server processes under a 160 MiB OS cap
each, m-stage puts 2 layers per device, the loss trajectory equals plain
Keras' to rtol 1e-5; the logical devices measure about 40 MB each (predicted
47), the servers 90-130 MB; on one capped device the step is refused: it
needs 109 MB live at once, the fewest devices of this cap holding it: 3
or 4 (m-pack may pack it onto 3).
"""

CONFIG = {
    "layers": 8,
    "width": 1024,
    "batch_size": 32,
    "steps": 4,
    "epochs": 2,
    "devices": 4,
    "cap_mib": 48.0,
    "server_limit_mib": 160.0,
}
