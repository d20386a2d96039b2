"""tfopt's summaries in the TensorBoard of the same `fit`.

When a `keras.callbacks.TensorBoard` is among a `fit`'s callbacks, tfopt's
callbacks and the `tfopt.compile` hook of that fit write what they know
into its `log_dir`, under the run `<log_dir>/tfopt` (beside Keras' own
`train` and `validation` runs), every tag starting with `tfopt/`. The run
is a directory of its own, never Keras' `train/`: TensorBoard reads the
event files of one run directory one after the other, so two writers
appending to one directory at once can lose events, and Keras' writer is
its private state. Without a TensorBoard callback nothing is looked up
per step, nothing opened and nothing written.

Finding the fit's TensorBoard callback (`fit_callbacks`): Keras builds a
`keras.callbacks.CallbackList` inside `fit` and hands no reference to it
to the callbacks (they get `set_model` and `set_params`), the model or the
train function. It is, however, a local of the frames that run them: the
`CallbackList` method calling a callback's `on_train_begin` (as `self`),
and `fit` calling the train function (as `callbacks`). `fit_callbacks`
walks up the Python stack, once per fit and caller, to the first
`CallbackList` of this model (holding the calling callback). The route
depends on no private name of Keras, only on the list being on the stack;
tests/test_summaries.py fails if a Keras release moves it off.

Written with TensorFlow's core `tf.summary.write` op and each TensorBoard
plugin's metadata (scalars, text, images: PNG bytes as the image plugin
stores them), so the `tensorboard` package is not needed to write; and
inside `tf.summary.record_if(True)`, so Keras' `update_freq` gating of its
own batch summaries does not drop tfopt's.
"""

from __future__ import annotations

import numbers
import os
import sys
import tempfile
import threading
import warnings
from typing import Callable

from tfopt._errors import TfoptWarning, invalid_argument

SUBDIR = "tfopt"  # the run under the TensorBoard callback's log_dir
PREFIX = "tfopt/"  # every tag written into the fit's TensorBoard

# One tf.summary file writer per directory and process, shared by every
# writer of that directory (the hook and each callback of a fit, and the
# fits after it): one events file per directory, never two at once. At
# most _MAX_WRITERS stay open (a sweep over many log_dirs in one process
# keeps no file handle per run): the oldest is flushed and closed, and
# opened again (a new events file) if its directory is written again.
_WRITERS: dict = {}
_MAX_WRITERS = 4
_LOCK = threading.Lock()
_MAX_DEPTH = 64  # frames walked up from the caller to find the fit
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_WARNED: set = set()


def fit_callbacks(model, member=None):
  """The `keras.callbacks.CallbackList` of the `fit` of `model` running
  below the caller on this thread's stack, or None (not inside a fit).

  With `member` (a callback), only a list holding that very callback: a
  callback's nested `fit` of another model, or of the same model with
  other callbacks, is not taken for its own.
  """
  import keras  # pylint: disable=import-outside-toplevel
  frame = sys._getframe(1)  # pylint: disable=protected-access
  try:
    for _ in range(_MAX_DEPTH):
      if frame is None:
        return None
      for value in frame.f_locals.values():
        if isinstance(value, keras.callbacks.CallbackList) and \
            value.model is model and (
                member is None or any(c is member for c in value.callbacks)):
          return value
      frame = frame.f_back
    return None
  finally:
    del frame  # no reference cycle through the frames


def fit_tensorboard(model, member=None):
  """The first `keras.callbacks.TensorBoard` of the running fit of `model`
  (see `fit_callbacks`), or None."""
  import keras  # pylint: disable=import-outside-toplevel
  callbacks = fit_callbacks(model, member)
  if callbacks is None:
    return None
  return next((c for c in callbacks.callbacks
               if isinstance(c, keras.callbacks.TensorBoard)), None)


def for_fit(model, member=None) -> "Summaries | None":
  """Summaries into the TensorBoard of the running fit of `model` (tags
  under `tfopt/`, in `<log_dir>/tfopt`), or None when that fit has no
  TensorBoard callback (or no fit is running). Call it once per fit, from
  `on_train_begin` (with `member=self`) or from the train function, and
  keep the result: it walks the stack."""
  board = fit_tensorboard(model, member)
  if board is None or not _is_chief(model):
    return None
  return Summaries(os.path.join(os.fspath(board.log_dir), SUBDIR), PREFIX)


def _is_chief(model) -> bool:
  """Whether this process writes for a multi-worker fit: only the chief
  does (every worker writing the same tags into one run directory is the
  many-writers case above). True outside multi-worker strategies."""
  strategy = getattr(model, "distribute_strategy", None)
  extended = getattr(strategy, "extended", None)
  return bool(getattr(extended, "should_checkpoint", True))


def for_directory(logdir) -> "Summaries":
  """Summaries into `logdir` itself, tags as given (no prefix)."""
  if not isinstance(logdir, (str, os.PathLike)) or not os.fspath(logdir):
    raise invalid_argument("logdir", "a directory path", logdir)
  return Summaries(os.fspath(logdir), "")


def png_size(png: bytes) -> tuple[int, int]:
  """(width, height) from a PNG's header.

  >>> png_size(_PNG_SIGNATURE + bytes(4) + b"IHDR" + (640).to_bytes(4, "big")
  ...          + (480).to_bytes(4, "big"))
  (640, 480)
  """
  if not isinstance(png, bytes) or len(png) < 24 or \
      not png.startswith(_PNG_SIGNATURE) or png[12:16] != b"IHDR":
    raise invalid_argument("png", "the bytes of a PNG image",
                           png[:16] if isinstance(png, bytes) else png)
  return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def png_of(draw: Callable[[str], None]) -> bytes | None:
  """The bytes of the PNG that `draw(path)` writes, or None, warning once
  per process, when drawing needs matplotlib and it is not installed."""
  with tempfile.TemporaryDirectory(prefix="tfopt-summary-") as tmp:
    path = os.path.join(tmp, "image.png")
    try:
      draw(path)
    except ImportError as err:
      if "matplotlib" not in _WARNED:
        _WARNED.add("matplotlib")
        warnings.warn(f"tfopt writes no images to TensorBoard: drawing needs "
                      f"matplotlib ({err})", TfoptWarning, stacklevel=2)
      return None
    with open(path, "rb") as f:
      return f.read()


class Summaries:
  """Scalars, text and PNG images into one directory's events file.

  `prefix` is put before every tag. Each write is one eager
  `tf.summary.write` op (outside any graph being traced); `flush()` puts
  what was written on disk (callbacks flush at train end and after their
  rare writes).
  """

  def __init__(self, logdir: str, prefix: str = ""):
    self.logdir = logdir
    self.prefix = prefix
    self._key = os.path.realpath(logdir)
    self._open_writer()

  def _open_writer(self):
    """This directory's shared writer, opened (again) if needed."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with _LOCK:
      writer = _WRITERS.pop(self._key, None)
      if writer is None:
        with tf.init_scope():
          writer = tf.summary.create_file_writer(self.logdir)
      _WRITERS[self._key] = writer  # the most recent last
      while len(_WRITERS) > _MAX_WRITERS:
        oldest = next(iter(_WRITERS))
        with tf.init_scope():
          _WRITERS.pop(oldest).close()
      return writer

  def write_scalar(self, tag: str, value, step: int) -> None:
    """`value` (a float) at `step`, for TensorBoard's scalars dashboard."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    self._write(tag, "scalars", "DATA_CLASS_SCALAR",
                lambda: tf.constant(float(value), tf.float32), step)

  def write_text(self, tag: str, text: str, step: int,
                 preformatted: bool = False) -> None:
    """`text` (Markdown) at `step`, for the text dashboard; with
    `preformatted`, shown as written (a fenced block: fixed-width tables
    keep their columns)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not isinstance(text, str):
      raise invalid_argument("text", "a string", text)
    body = f"```\n{text}\n```" if preformatted else text
    self._write(tag, "text", "DATA_CLASS_TENSOR",
                lambda: tf.constant(body), step)

  def write_image(self, tag: str, png: bytes, step: int) -> None:
    """One PNG image at `step`, for the images dashboard: the tensor
    [width, height, png] (as strings) that the image plugin stores."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    width, height = png_size(png)
    self._write(tag, "images",
                "DATA_CLASS_BLOB_SEQUENCE",
                lambda: tf.constant([str(width).encode(),
                                     str(height).encode(), png]), step)

  def flush(self) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    with tf.init_scope():
      self._open_writer().flush()

  def _write(self, tag, plugin, data_class, tensor, step) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not isinstance(tag, str) or not tag:
      raise invalid_argument("tag", "a non-empty string", tag)
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
      raise invalid_argument("step", "an integer", step)
    # The data class by its enum name (summary.proto's DataClass has no
    # public TF symbol); TensorBoard files the tag by it.
    metadata = tf.compat.v1.SummaryMetadata(data_class=data_class)
    # Each plugin's content proto at version 0 serializes to no bytes.
    metadata.plugin_data.plugin_name = plugin
    # init_scope: eager even when called while a graph is being built; and
    # recorded whatever record_if Keras' TensorBoard pushed for its own.
    with tf.init_scope(), self._open_writer().as_default(), \
        tf.summary.record_if(True):
      tf.summary.write(self.prefix + tag, tensor(), step=int(step),
                       metadata=metadata)


def training_step(model) -> int:
  """The model's optimizer's step count (0 without an optimizer): the x
  of the events tfopt writes once per occasion (one device read)."""
  import keras  # pylint: disable=import-outside-toplevel
  iterations = getattr(getattr(model, "optimizer", None), "iterations", None)
  if iterations is None:
    return 0
  return int(keras.ops.convert_to_numpy(iterations))
