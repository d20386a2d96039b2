"""The demonstration: 16 x Dense(1024) trained with CautiousAdamW, 201.6 MB
of weights and moments, on 4 devices of 88 MiB (92.3 MB) each.

    tfopt-fit-across-devices \
        --config=experiments/configs/fit_across_devices.py

Expected (2-core CPU VM, about 3 minutes): the state is 2.2x one device's
cap (one device's liveness peak, 256 MB, 2.8x); on 4 logical CPUs and on 4
server processes under a 300 MiB OS cap each, m-stage puts 4 layers per
device (25 % of the parameters each), the loss trajectory equals plain
Keras' to rtol 1e-5, the logical devices measure 15-20 % below the
predicted 89 MB per device, the server processes 120-200 MB each (their
runtime's own memory beside the tensors); on one capped device the step
is refused before training: it needs 210 MB live at once, the fewest
devices of this cap holding it: 3 or 4 (m-pack may pack it onto 3).
"""

CONFIG = {
    "layers": 16,
    "width": 1024,
    "batch_size": 64,
    "steps": 4,
    "epochs": 2,
    "devices": 4,
    "cap_mib": 88.0,
    "server_limit_mib": 300.0,
}
