"""CostModel.scaled_to: a profile brought to another moment's step time."""

import pytest

from tfopt.cost.cost_model import CostModel, OpCost


def _costs():
  return CostModel({"a": OpCost(2.0, temp_bytes=8), "b": OpCost(6.0),
                    "c": OpCost(4.0, persistent_bytes=16, profiled=False)},
                   source="profiled", notes={"c": "estimated"})


def test_measured_ops_are_scaled_to_the_total_estimates_kept():
  # 20 us in all, 4 of them estimated: the measured 8 us become 16 (x2).
  scaled = _costs().scaled_to(20.0, why="to the clock")
  assert scaled.total_compute_us() == pytest.approx(20.0)
  assert scaled["a"].compute_us == pytest.approx(4.0)
  assert scaled["b"].compute_us == pytest.approx(12.0)
  assert scaled["c"] == _costs()["c"]
  assert scaled["a"].temp_bytes == 8 and scaled["c"].persistent_bytes == 16
  assert scaled.source == "profiled, scaled x2.00 to the clock"
  assert dict(scaled.notes) == {"c": "estimated"}


def test_slower_and_unscalable_totals():
  assert _costs().scaled_to(8.0)["b"].compute_us == pytest.approx(3.0)
  # The estimates alone exceed the total, or nothing was measured: as is.
  costs = _costs()
  assert costs.scaled_to(3.0) is costs
  estimated = CostModel({"x": OpCost(1.0, profiled=False)})
  assert estimated.scaled_to(5.0) is estimated


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), True, "5"])
def test_bad_totals_are_named(bad):
  with pytest.raises(ValueError, match="Argument `total_us` must be a "
                     "positive finite number"):
    _costs().scaled_to(bad)
