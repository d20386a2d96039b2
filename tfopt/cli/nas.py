"""One-shot NAS with visual steering, from the command line.

    tfopt-nas --mode=search --run_dir=/tmp/nas --steps=2000
    open /tmp/nas/report.html                 # scatterplot, components, curves
    tfopt-nas --mode=steer --run_dir=/tmp/nas \
        --remove=layer0:skip --lock=layer2:conv3
    tfopt-nas --mode=search --run_dir=/tmp/nas --resume
    tfopt-nas --mode=rank --run_dir=/tmp/nas
    tfopt-nas --mode=export --run_dir=/tmp/nas   # top-1
    tfopt-nas --mode=benchmark --run_dir=/tmp/nas --seed=0

Modes:
- search: trains the super-network of `--space` (a preset name or a space
  JSON file) on scikit-learn's digits (1000 / 400 / 397 split by `--seed`)
  with uniform single-path sampling, re-reading the run's constraints file
  every epoch (edit it with --mode=steer while it runs), ranks the
  sub-graphs (BatchNorm recalibrated) and writes the run directory
  (`tfopt.nas.run`). `--resume` continues from the run's weights.
- rank: ranks the saved super-network again under the current constraints.
- steer: edits the run's constraints file (remove / restore / lock / unlock
  / prefer / select a region / limits), validated, versioned.
- report: redraws the views from the run's files.
- export: the chosen sub-graph (`--arch`, default the one-shot top-1) as
  `.keras` and SavedModel under <run_dir>/export, reload-checked.
- benchmark: one seed of `tfopt.nas.benchmark` (trains all 64 tiny64
  sub-graphs stand-alone, ~10 min) into <run_dir>/benchmark.json.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
from tfopt.cli._main import run_main

from tfopt.cli._config import apply_config, define_config_flag

import tfopt  # noqa: F401  (OR-Tools before TensorFlow)

MODES = ("search", "rank", "steer", "report", "export", "benchmark")
FLAGS = flags.FLAGS
define_config_flag()
flags.DEFINE_enum("mode", "search", MODES, "What to do.")
flags.DEFINE_string("run_dir", None, "The run directory.")
flags.DEFINE_string("space", "tiny64", "A preset name or a space JSON file "
                    "(search only; later modes read the run's space).")
flags.DEFINE_integer("steps", 2000, "Super-network training steps.")
flags.DEFINE_integer("batch_size", 32, "Batch size.")
flags.DEFINE_float("lr", 3e-3, "Adam learning rate (cosine decay to 0).")
flags.DEFINE_integer("seed", 0, "Data split, initialisation and sampling "
                     "seed (search; later modes and --resume use the run's "
                     "own and refuse another).")
flags.DEFINE_enum("execution", "switch", ["switch", "mask"],
                  "Super-network execution.")
flags.DEFINE_integer("rank_every", 0, "Also rank every n epochs (0: at the "
                     "end only).")
flags.DEFINE_enum("strategy", "auto", ["auto", "exhaustive", "random",
                                       "evolution"], "Ranking strategy.")
flags.DEFINE_enum("score", "log_likelihood", ["accuracy", "log_likelihood"],
                  "One-shot score of a sub-graph on the validation data "
                  "(log_likelihood ranked closer to stand-alone training "
                  "on every seed of benchmarks/nas.py).")
flags.DEFINE_integer("samples", 100, "Sub-graphs ranked when not "
                     "exhaustive.")
flags.DEFINE_bool("resume", False, "search: continue from the run's weights.")
flags.DEFINE_bool("overwrite", False, "Replace an existing run / export.")
flags.DEFINE_string("tensorboard_dir", None, "search: also write TensorBoard "
                    "scalars there.")
# steer
flags.DEFINE_list("remove", [], "steer: layer:op pairs to remove.")
flags.DEFINE_list("restore", [], "steer: layer:op pairs to take back.")
flags.DEFINE_list("lock", [], "steer: layer:op pairs to lock.")
flags.DEFINE_list("unlock", [], "steer: layers to unlock.")
flags.DEFINE_list("prefer", [], "steer: layer:op:weight sampling weights.")
flags.DEFINE_list("select", [], "steer: sub-graph indices (as in "
                  "subgraphs.csv / the report) for the region.")
flags.DEFINE_enum("how", "union", ["union", "intersection", "complement"],
                  "steer: how --select combines with the region.")
flags.DEFINE_bool("clear_region", False, "steer: drop the region.")
flags.DEFINE_integer("max_params", None, "steer: parameter limit.")
flags.DEFINE_integer("min_params", None, "steer: parameter floor.")
# export / benchmark
flags.DEFINE_list("arch", [], "export: op names, one per layer (default: "
                  "the one-shot top-1).")
flags.DEFINE_integer("epochs", 15, "benchmark: stand-alone epochs.")


def _pairs(values, flag, parts=2):
  out = []
  for value in values:
    items = value.split(":")
    if len(items) != parts or not all(items):
      form = "layer:op" if parts == 2 else "layer:op:weight"
      raise app.UsageError(f"--{flag} takes {form} items. Received: {value}")
    out.append(items)
  return out


def _space():
  from tfopt.nas.space import PRESETS, SearchSpace  # pylint: disable=import-outside-toplevel
  if FLAGS.space in PRESETS:
    return PRESETS[FLAGS.space]()
  if not os.path.exists(FLAGS.space):
    raise app.UsageError(f"--space must be a preset {sorted(PRESETS)} or a "
                         f"space JSON file. Received: {FLAGS.space}")
  with open(FLAGS.space, encoding="utf-8") as f:
    return SearchSpace.from_json(f.read())


def _split_seed(run) -> int:
  """The seed of the run's data split: the one it was started with (in its
  manifest), so that resuming, ranking and exporting never train or
  recalibrate on the run's validation and test rows. A --seed given that
  disagrees is refused."""
  recorded = run.manifest().get("settings", {}).get("seed")
  if recorded is None:  # a run recorded without its seed
    return FLAGS.seed
  if FLAGS["seed"].present and FLAGS.seed != recorded:
    raise app.UsageError(
        f"--seed={FLAGS.seed} disagrees with the run in {run.path}, started "
        f"with seed {recorded}: its data split. Another split would put this "
        f"run's validation and test rows into training and calibration; "
        f"leave --seed out.")
  return int(recorded)


def _data(space, seed: int):
  """The built-in data split by `seed` (printed, with where it came from)."""
  from tfopt.nas.data import digits  # pylint: disable=import-outside-toplevel
  if tuple(space.input_shape) != (8, 8, 1) or space.num_classes != 10:
    raise app.UsageError(
        "The built-in data are 8x8x1 digits with 10 classes; the space "
        f"{space.name!r} takes {tuple(space.input_shape)} with "
        f"{space.num_classes} classes. Use tfopt.nas from Python with your "
        "own data.")
  print(f"data: digits split by seed {seed}")
  return digits(seed)


def _search(run):
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.nas import callbacks as cb  # pylint: disable=import-outside-toplevel
  from tfopt.nas.sampler import PathSampler  # pylint: disable=import-outside-toplevel
  from tfopt.nas.search import make_loss, make_optimizer  # pylint: disable=import-outside-toplevel
  from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
  settings = {k: getattr(FLAGS, k) for k in (
      "steps", "batch_size", "lr", "seed", "execution", "strategy", "score")}
  if FLAGS.resume:
    space = run.space()
    net = run.load_supernet(FLAGS.execution)
    settings["seed"] = _split_seed(run)
  else:
    space = _space()
    run.create(space, settings, overwrite=FLAGS.overwrite)
    keras.utils.set_random_seed(FLAGS.seed)
    net = SuperNet(space, execution=FLAGS.execution)
  seed = settings["seed"]
  split = _data(space, seed)
  per_epoch = -(-len(split.x_train) // FLAGS.batch_size)
  epochs = -(-FLAGS.steps // per_epoch)
  net.compile(make_optimizer(FLAGS.lr, epochs * per_epoch), make_loss(),
              metrics=["accuracy"])
  constraints_file = run.file("constraints")
  ranker = cb.SubgraphRanker(split.x_train[:500], split.x_val, split.y_val,
                             every_n_epochs=FLAGS.rank_every,
                             constraints_file=constraints_file,
                             strategy=FLAGS.strategy, samples=FLAGS.samples,
                             seed=seed, score=FLAGS.score)
  callbacks = [PathSampler(seed=seed,
                           constraints_file=constraints_file), ranker,
               cb.NASReport(run, ranker=ranker, settings=settings)]
  if FLAGS.tensorboard_dir:
    callbacks.append(keras.callbacks.TensorBoard(FLAGS.tensorboard_dir))
  net.fit(split.x_train, split.y_train, batch_size=FLAGS.batch_size,
          epochs=epochs,
          callbacks=callbacks, verbose=2)
  _print_top(space, ranker.ranking)
  print(f"run directory: {run.path} (open {run.file('html')})")


def _print_top(space, ranking, k=5):
  print(f"top {k} of {len(ranking.scores)} ranked sub-graphs "
        f"(one-shot validation {ranking.score}):")
  for arch, score in ranking.scores[:k]:
    print(f"  #{space.index(arch):<5d} {score:.4f}  {space.describe(arch)}  "
          f"({space.param_count(arch)} params)")


def _rank(run):
  seed = _split_seed(run)  # a refused --seed before Keras is imported
  from tfopt.nas.ranking import rank  # pylint: disable=import-outside-toplevel
  space = run.space()
  net = run.load_supernet()
  split = _data(space, seed)
  constraints = run.constraints(space)
  ranking = rank(net, split.x_train[:500], split.x_val, split.y_val,
                 constraints=constraints, strategy=FLAGS.strategy,
                 samples=FLAGS.samples, seed=seed, score=FLAGS.score)
  run.write_ranking(ranking, space, constraints)
  run.write_views(space, ranking, constraints, run.history())
  _print_top(space, ranking)


def _steer(run):
  space = run.space()
  c = run.constraints(space)
  before = c.version
  try:
    for layer, op in _pairs(FLAGS.restore, "restore"):
      c.restore_op(space, layer, op)
    for layer, op in _pairs(FLAGS.remove, "remove"):
      c.remove_op(space, layer, op)
    for layer in FLAGS.unlock:
      c.unlock(layer, space)
    for layer, op in _pairs(FLAGS.lock, "lock"):
      c.lock_layer(space, layer, op)
    for layer, op, weight in _pairs(FLAGS.prefer, "prefer", 3):
      c.prefer_op(space, layer, op, float(weight))
    if FLAGS.clear_region:
      c.clear_region(space)
    if FLAGS.select:
      c.select(space, [int(i) for i in FLAGS.select], FLAGS.how)
    if FLAGS.max_params is not None or FLAGS.min_params is not None:
      c.set_limits(space, FLAGS.max_params, FLAGS.min_params)
  except ValueError as err:  # nothing is written when an edit is refused
    raise app.UsageError(str(err)) from None
  if c.version == before:
    raise app.UsageError("--mode=steer needs an edit: --remove, --restore, "
                         "--lock, --unlock, --prefer, --select, "
                         "--clear_region, --max_params or --min_params.")
  c.save(run.file("constraints"))
  print(f"constraints version {c.version}: "
        f"{json.dumps({k: v for k, v in c.to_dict().items() if k not in ('history', 'format')})}")


def _report(run):
  space = run.space()
  constraints = run.constraints(space)
  ranking = run.ranking(space) if run.exists("subgraphs") else None
  for path in run.write_views(space, ranking, constraints, run.history()):
    print(path)


def _export(run):
  from tfopt.nas.export import export_subgraph  # pylint: disable=import-outside-toplevel
  space = run.space()
  net = run.load_supernet()
  arch = tuple(FLAGS.arch) if FLAGS.arch else run.ranking(space).top(1)[0]
  split = _data(space, _split_seed(run))
  try:
    result = export_subgraph(net, arch, run.file("export"),
                             x_cal=split.x_train[:500],
                             overwrite=FLAGS.overwrite)
  except FileExistsError as err:
    raise app.UsageError(f"{err}; pass --overwrite to replace it.") from None
  print(f"exported {space.describe(result.arch)}: {result.keras_path}, "
        f"{result.saved_model_path} (reload max |diff| "
        f"{max(result.keras_max_abs_diff, result.saved_model_max_abs_diff):.2g})")


def _benchmark(run):
  from tfopt.nas.benchmark import goals, run_seed  # pylint: disable=import-outside-toplevel
  from tfopt.nas.space import tiny64  # pylint: disable=import-outside-toplevel
  os.makedirs(run.path, exist_ok=True)
  out = os.path.join(run.path, "benchmark.json")
  if os.path.exists(out) and not FLAGS.overwrite:
    raise app.UsageError(f"{out} exists; pass --overwrite to replace it.")
  result = run_seed(tiny64(), FLAGS.seed, epochs=FLAGS.epochs)
  result["goals"] = goals(result)
  from tfopt._io import atomic_write_text  # pylint: disable=import-outside-toplevel
  atomic_write_text(out, json.dumps(result, indent=1), overwrite=True)
  print(f"seed {FLAGS.seed}: Kendall tau {result['kendall_tau']:.3f}, "
        f"compute ratio {result['compute_ratio']:.4f}; goals "
        f"{result['goals']}; wrote {out}")


def main(argv):
  del argv
  apply_config()
  from tfopt.nas.run import RunDir  # pylint: disable=import-outside-toplevel
  if not FLAGS.run_dir:
    raise app.UsageError("--run_dir is required.")
  if FLAGS.steps <= 0 or FLAGS.batch_size <= 0:
    raise app.UsageError(f"--steps and --batch_size must be positive. "
                         f"Received: {FLAGS.steps}, {FLAGS.batch_size}")
  run = RunDir(FLAGS.run_dir)
  if FLAGS.mode == "search" and not FLAGS.resume and \
      run.exists("manifest") and not FLAGS.overwrite:
    raise app.UsageError(f"--run_dir {FLAGS.run_dir} holds a run; pass "
                         "--resume to continue it or --overwrite to start "
                         "over.")
  try:
    {"search": _search, "rank": _rank, "steer": _steer, "report": _report,
     "export": _export, "benchmark": _benchmark}[FLAGS.mode](run)
  except (ValueError, FileNotFoundError, FileExistsError) as err:
    # Bad input (a corrupt run directory, an unknown op...): the message
    # names the item; a traceback would only bury it.
    raise app.UsageError(str(err)) from None
  return 0


def run() -> None:
  """The console script's entry point."""
  run_main(main, __doc__)


if __name__ == "__main__":
  run()
