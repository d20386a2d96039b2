"""Views: the MDS projection against exact geometry, the scatterplot's
points / colours / markers in the HTML, PNGs written, nothing overwritten
without asking."""

import re

import numpy as np
import pytest

from tfopt.nas import views
from tfopt.nas.space import ChoiceLayer, SearchSpace, tiny64
from tfopt.nas.steering import Constraints


def _pairwise(coords):
  return np.linalg.norm(coords[:, None] - coords[None], axis=-1)


def test_mds_is_exact_where_hamming_is_euclidean_in_2d():
  # One layer of three ops: every pair differs in one layer, an
  # equilateral triangle of side 1.
  ops = {"a": {"type": "skip"}, "b": {"type": "maxpool"},
         "c": {"type": "conv", "kernel": 3}}
  space = SearchSpace("tri", (8, 8, 1), 10, (ChoiceLayer("l0", ops, 4),))
  coords = views.hamming_mds(space)
  d = _pairwise(coords)
  np.testing.assert_allclose(d[np.triu_indices(3, 1)], 1.0, atol=1e-9)
  # Two layers of two ops: Hamming 1 / 2 on a square; squared distances
  # 1 / 4 are not Euclidean, but the projection keeps the order.
  ops2 = {"a": {"type": "skip"}, "b": {"type": "maxpool"}}
  sq = SearchSpace("sq", (8, 8, 1), 10,
                   (ChoiceLayer("l0", ops2, 4), ChoiceLayer("l1", ops2, 4)))
  d = _pairwise(views.hamming_mds(sq))
  archs = list(sq.enumerate())
  for i in range(4):
    for j in range(4):
      ham = sum(x != y for x, y in zip(archs[i], archs[j]))
      for k in range(4):
        hk = sum(x != y for x, y in zip(archs[i], archs[k]))
        if ham < hk:
          assert d[i, j] < d[i, k]


def test_mds_is_deterministic():
  space = tiny64()
  np.testing.assert_array_equal(views.hamming_mds(space),
                                views.hamming_mds(space))
  with pytest.raises(ValueError, match="Argument `archs`"):
    views.hamming_mds(space, [])


def test_statuses_and_html(tmp_path):
  space = tiny64()
  archs = list(space.enumerate())
  c = Constraints()
  c.remove_op(space, "layer0", "skip")
  c.lock_layer(space, "layer2", "conv3")
  status = views.statuses(space, archs, c)
  for arch, s in zip(archs, status):
    if arch[0] == "skip":
      assert s == "excluded"
    elif arch[2] == "conv3":
      assert s == "locked"
    else:
      assert s == "excluded"  # the lock excludes other layer2 ops
  scores = [0.5 + 0.005 * i if i % 2 == 0 else None
            for i in range(len(archs))]
  coords = views.hamming_mds(space)
  path = tmp_path / "r.html"
  views.report_html(str(path), space, archs, coords, scores, status,
                    {("layer0", "conv3"): (0.7, 16)},
                    {"loss": [2.0, 1.5, 1.0]}, c, run_dir="runs/x")
  text = path.read_text()
  points = re.findall(r'class="pt" data-index="(\d+)"', text)
  assert sorted(map(int, points)) == list(range(64))
  assert text.count(views._GREY) == 32  # the unevaluated half is grey
  # The best score is the darkest blue, the worst the darkest red.
  assert "#2166ac" in text and "#b2182b" in text
  assert "<script>" in text and "http" not in text.split("<script>")[1]
  assert "runs/x" in text and "layer0:conv3" in text
  with pytest.raises(FileExistsError):
    views.report_html(str(path), space, archs, coords, scores, status, {},
                      {})
  odd = tmp_path / "odd.html"
  views.report_html(str(odd), space, archs, coords, scores, status, {}, {},
                    run_dir="a</script>b")
  assert odd.read_text().count("</script>") == 1
  with pytest.raises(ValueError, match="one entry per architecture"):
    views.report_html(str(tmp_path / "s.html"), space, archs, coords,
                      scores[:3], status, {}, {})


def test_pngs(tmp_path):
  space = tiny64()
  archs = list(space.enumerate())
  scores = list(np.linspace(0.2, 0.9, 64))
  views.scatter_png(str(tmp_path / "s.png"), space, archs,
                    views.hamming_mds(space), scores, ["open"] * 64)
  views.components_png(str(tmp_path / "c.png"),
                       {("layer0", "conv3"): (0.7, 16)})
  views.curves_png(str(tmp_path / "h.png"), {"loss": [2.0, 1.0]})
  for name in ("s.png", "c.png", "h.png"):
    data = (tmp_path / name).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
