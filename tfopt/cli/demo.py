"""The all-five job: a keras-hub MoE LM from architecture search to serving.

    tfopt-demo --out_dir=.demo                   # what `make demo` runs
    tfopt-demo --quick --out_dir=/tmp/demo       # the test-sized job

Search (one-shot NAS over a Qwen3-MoE LM's layers, experts, top-k and
expert width, with an analyst's constraint), train the chosen model placed
across capped TensorFlow server tasks under the launcher with a server task
killed mid-run, prune it with MoE-Pruner and expert-wise distillation,
serve it through TF Serving's protos (`tfopt.demo`). Text and tokenizer are
built in code; nothing is downloaded. Memory caps need root (cgroups).

Expected (2-core CPU, defaults: about 4 minutes; --quick: about 2): a line
per stage, ending with the report's path; `report.json` holds each stage's
figures and `report.html` its pictures. The faulted run loses and repeats
no step and its losses equal the run without the fault (relative
difference 1e-5 or less: each attempt places the step afresh); the
served logits equal `model.predict`'s (max |diff| about 1e-6).
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

from tfopt.cli._config import read_config  # noqa: E402
from tfopt.cli._main import run_main  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", ".demo", "Directory for the report and every "
                    "stage's files.")
flags.DEFINE_bool("quick", False, "The test-sized job (a few minutes).")
flags.DEFINE_string("config", None, "Config file (experiments/configs/"
                    "*.py) whose CONFIG overrides the built-in settings "
                    "(nested dicts merged key by key).")
flags.DEFINE_bool("overwrite", False, "Replace an existing --out_dir.")


def main(argv) -> int:
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.demo import job  # pylint: disable=g-import-not-at-top
  # Ranking and perplexity predict with many small models: TensorFlow's
  # retracing warnings would bury the progress lines.
  tf.get_logger().setLevel("ERROR")
  from tfopt.runtime import caps  # pylint: disable=g-import-not-at-top
  out_dir = FLAGS.out_dir
  if os.path.exists(out_dir) and os.listdir(out_dir) and not FLAGS.overwrite:
    raise app.UsageError(f"--out_dir={out_dir} exists and is not empty; "
                         f"pass --overwrite to replace what the demo wrote "
                         f"there.")
  reason = caps.unavailable_reason()
  if reason is not None:
    raise app.UsageError(f"The demo trains on server tasks with OS memory "
                         f"caps, which are unavailable here: {reason}")
  cfg = job.merged(job.DEFAULTS, job.QUICK) if FLAGS.quick else job.DEFAULTS
  if FLAGS.config:
    cfg = job.merged(cfg, read_config(FLAGS.config))
  os.makedirs(out_dir, exist_ok=True)
  start = time.time()

  def say(line: str) -> None:
    print(f"[{time.time() - start:6.0f} s] {line}", flush=True)

  report, page = job.run(cfg, out_dir, say)
  say(f"done in {report['seconds']:.0f} s; report: {page}")
  return 0


def run():
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
