"""Keras callbacks that rank a training `SuperNet` and write its report.

    sampler = PathSampler(constraints_file=run.file("constraints"))
    ranker = SubgraphRanker(x_cal, x_val, y_val, every_n_epochs=5,
                            constraints_file=run.file("constraints"))
    report = NASReport(run_dir, ranker=ranker)
    net.fit(x, y, epochs=30, callbacks=[sampler, ranker, report])

`SubgraphRanker` calls `tfopt.nas.rank` (inherited weights, BatchNorm
recalibrated before every score) every `every_n_epochs` epochs and at the
end of training, under the current constraints; `NASReport` writes the run
directory (`tfopt.nas.run.RunDir`): super-network weights, history,
sub-graph and component CSVs, the views, every `every_n_epochs` epochs and
at the end.
"""

from __future__ import annotations

import logging

import keras

from tfopt import summaries
from tfopt._errors import invalid_argument
from tfopt.nas.ranking import rank
from tfopt.nas.run import RunDir
from tfopt.nas.steering import Constraints


def _check_every(every_n_epochs):
  if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) \
      or every_n_epochs < 0:
    raise invalid_argument("every_n_epochs", "an integer >= 0 (0: only at "
                           "the end of training)", every_n_epochs)
  return every_n_epochs


class SubgraphRanker(keras.callbacks.Callback):
  """Ranks sub-graphs of the training super-network (see the module doc).

  Args:
    x_cal: BatchNorm calibration images (training data).
    x_val, y_val: the data the sub-graphs are scored on.
    every_n_epochs: also rank after every n-th epoch (0: only at the end).
    constraints_file: a `Constraints` file read before every ranking
      (removed / out-of-region sub-graphs are never ranked).
    **rank_kwargs: passed to `tfopt.nas.rank` (strategy, samples, ...).

  `ranking` is the latest `Ranking`; `rankings` lists (epoch, Ranking);
  the top score is added to the epoch logs as `oneshot_top1` (in the
  ranking's score: a mean log-probability, <= 0, by default).
  """

  def __init__(self, x_cal, x_val, y_val, every_n_epochs: int = 0,
               constraints_file: str | None = None, **rank_kwargs):
    super().__init__()
    self.x_cal, self.x_val, self.y_val = x_cal, x_val, y_val
    self.every_n_epochs = _check_every(every_n_epochs)
    self.constraints_file = constraints_file
    self.rank_kwargs = {"verbose": 0, **rank_kwargs}
    self.ranking = None
    self.rankings: list = []
    self.steering_errors: list[str] = []
    self._valid = None  # the last constraints that loaded
    self._epoch = -1

  def rank_now(self, epoch: int):
    constraints = self._constraints(epoch)
    self.ranking = rank(self.model, self.x_cal, self.x_val, self.y_val,
                        constraints=constraints, **self.rank_kwargs)
    self.rankings.append((epoch, self.ranking))
    return self.ranking

  def _constraints(self, epoch: int):
    """The constraints file's current constraints; while a live edit does
    not parse or validate, the last valid ones (the error is recorded in
    `steering_errors` and logged)."""
    if not self.constraints_file:
      return None
    try:
      self._valid = Constraints.load(self.constraints_file, self.model.space)
    except (ValueError, OSError) as err:
      if self._valid is None:
        raise  # never valid: bad input, not a live edit
      message = (f"epoch {epoch}: steering file {self.constraints_file} not "
                 f"applied to the ranking ({err}); the last valid "
                 f"constraints are used")
      self.steering_errors.append(message)
      logging.getLogger("tfopt").warning("%s", message)
    return self._valid

  def on_train_begin(self, logs=None):
    # Bad input fails before training; later reads are live edits.
    self._constraints(-1)

  def on_epoch_end(self, epoch, logs=None):
    self._epoch = epoch
    if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
      ranking = self.rank_now(epoch)
      if logs is not None:
        logs["oneshot_top1"] = ranking.scores[0][1]

  def ensure_current(self):
    """The ranking of the last finished epoch (ranks now if needed)."""
    if not self.rankings or self.rankings[-1][0] != self._epoch:
      self.rank_now(self._epoch)
    return self.ranking

  def on_train_end(self, logs=None):
    self.ensure_current()


class NASReport(keras.callbacks.Callback):
  """Writes the run directory of a search (see the module doc).

  Args:
    run_dir: a `RunDir` or its path; created (with the space) on train begin
      if it holds no run yet. Its constraints file is the one the views mark.
    ranker: the `SubgraphRanker` whose latest ranking is reported (optional:
      without it the scatterplot is all grey).
    every_n_epochs: also write after every n-th epoch (0: only at the end).

  With a `keras.callbacks.TensorBoard` in the same fit (`tfopt.summaries`),
  each write also puts the scatterplot (search_space.png) there as the
  image `tfopt/nas/search_space`, at the training step.
  """

  def __init__(self, run_dir, ranker: SubgraphRanker | None = None,
               every_n_epochs: int = 0, settings: dict | None = None):
    super().__init__()
    self.run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    if ranker is not None and not isinstance(ranker, SubgraphRanker):
      raise invalid_argument("ranker", "a tfopt.nas.SubgraphRanker or None",
                             type(ranker).__name__)
    self.ranker = ranker
    self.every_n_epochs = _check_every(every_n_epochs)
    self.settings = dict(settings or {})
    self.history: dict = {}
    self.written: list = []
    self._summaries = None  # the fit's TensorBoard, if it has one

  def on_train_begin(self, logs=None):
    from tfopt.nas.supernet import SuperNet  # pylint: disable=import-outside-toplevel
    if not isinstance(self.model, SuperNet):
      raise invalid_argument("model", "a tfopt.nas.SuperNet",
                             type(self.model).__name__)
    self._summaries = summaries.for_fit(self.model, self)
    if not self.run.exists("manifest"):
      self.run.create(self.model.space, self.settings)
    elif self.run.space().to_dict() != self.model.space.to_dict():
      raise invalid_argument("run_dir", "a run of the model's search space "
                             f"{self.model.space.name!r}", self.run.path)

  def on_epoch_end(self, epoch, logs=None):
    for key, value in (logs or {}).items():
      self.history.setdefault(key, []).append(float(value))
    if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
      self.write()

  def on_train_end(self, logs=None):
    self.write()

  def write(self) -> list:
    """Writes every file of the run directory now; returns their paths."""
    space = self.model.space
    constraints = self.run.constraints(space)
    # Whatever the callbacks' order, report the last epoch's ranking.
    ranking = (self.ranker.ensure_current() if self.ranker is not None
               else None)
    self.run.save_supernet(self.model)
    self.run.write_history(self.history)
    if ranking is not None:
      self.run.write_ranking(ranking, space, constraints)
    self.written = self.run.write_views(space, ranking, constraints,
                                        self.history)
    self.run.write_manifest(self.settings)
    if self._summaries is not None:
      with open(self.run.file("scatter"), "rb") as f:
        self._summaries.write_image("nas/search_space", f.read(),
                                    summaries.training_step(self.model))
      self._summaries.flush()
    return self.written
