"""The calibration file: round trip, what it builds, and every way a file
can be wrong for this machine."""

import dataclasses
import datetime
import json

import pytest

import tfopt
from tfopt import zoo
from tfopt import calibration as cal
from tfopt.cost import Link


def _calibration(**changes):
  base = cal.Calibration(kind="logical", num_devices=2,
                         link=Link(14.0, 1e6, overhead_us=1.0),
                         control_messages=True, capacity=1.3, shared=True)
  return dataclasses.replace(base, **changes)


def test_round_trip_and_the_cluster_it_builds(tmp_path):
  path = tmp_path / "c.json"
  made = _calibration()
  made.save(path)
  loaded = cal.load_calibration(path)
  assert loaded == made and loaded.path == str(path)
  cluster = loaded.cluster(["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"],
                           64 << 20)
  assert cluster.comm.control_messages
  assert not cluster.comm.cpu_work  # logical: hand-overs in one process
  assert cluster.comm.default.channel_us(0) == 1.0
  assert cluster.sharing.groups == (0, 0, 0)
  assert cluster.sharing.capacity == 1.3
  assert cluster.memory_caps == (64 << 20,) * 3
  # Logical CPUs draw on their process's one inter-op pool (TensorFlow's
  # default: a thread per usable core); a pinned task on its own.
  assert cluster.sharing.threads == cal.machine_fingerprint()["cores"]
  pinned = _calibration(kind="pinned", shared=False, capacity=1.0,
                        inter_op_threads=2)
  assert pinned.sharing(2).groups == (0, 1)
  assert pinned.sharing(2).threads == 2
  assert pinned.comm().cpu_work  # gRPC's work runs on the tasks' cores
  assert _calibration(kind="processes").sharing(2).threads is None
  assert "not saved" in made.describe() and "STALE" not in made.describe()
  with pytest.raises(FileExistsError):
    made.save(path)
  made.save(path, overwrite=True)


def test_files_that_cannot_be_used_here_are_refused(tmp_path):
  path = tmp_path / "c.json"
  with pytest.raises(FileNotFoundError, match="tfopt-calibrate"):
    cal.load_calibration(path)
  path.write_text("{not json")
  with pytest.raises(cal.CalibrationError, match="does not parse as JSON"):
    cal.load_calibration(path)
  path.write_text(json.dumps({"format": "tfopt.costgraph/1"}))
  with pytest.raises(cal.CalibrationError, match=r"not in the "
                     r"tfopt.calibration/1 format \(format: "
                     r"'tfopt.costgraph/1'\)"):
    cal.load_calibration(path)
  doc = _calibration().to_json()
  del doc["link"]
  path.write_text(json.dumps(doc))
  with pytest.raises(cal.CalibrationError, match="lacks the field 'link'"):
    cal.load_calibration(path)
  doc = _calibration().to_json()
  doc["capacity"] = 0.5
  path.write_text(json.dumps(doc))
  with pytest.raises(cal.CalibrationError, match="capacity"):
    cal.load_calibration(path)
  other = _calibration(machine=dict(cal.machine_fingerprint(),
                                    cpu="Some Other CPU", cores=64))
  other.save(path, overwrite=True)
  with pytest.raises(cal.CalibrationError, match=r"another machine \(Some "
                     r"Other CPU, 64 cores.*Run `tfopt-calibrate` here"):
    cal.load_calibration(path)
  assert cal.load_calibration(path, check_machine=False).machine["cores"] == 64
  _calibration(tensorflow="2.0.0").save(path, overwrite=True)
  with pytest.raises(cal.CalibrationError, match="made with TensorFlow 2.0.0"):
    cal.load_calibration(path)


def test_a_stale_file_loads_and_says_so(tmp_path):
  old = (datetime.datetime.now(datetime.timezone.utc) -
         datetime.timedelta(days=cal.STALE_AFTER_DAYS + 10))
  path = tmp_path / "old.json"
  _calibration(created=old.isoformat(timespec="seconds")).save(path)
  loaded = cal.load_calibration(path)
  assert loaded.stale
  assert f"STALE: {cal.STALE_AFTER_DAYS + 10} days old" in loaded.describe()


def test_hook_arguments_are_checked_at_compile(tmp_path):
  model = zoo.mlp(hidden=(8,), input_dim=4).model
  loss = "sparse_categorical_crossentropy"
  cpu = ["/device:CPU:0"]
  with pytest.raises(ValueError, match=r"Argument `select` must be one of "
                     r"\['simulated', 'measured'\]. Received: select='fast'"):
    tfopt.compile(model, optimizer="adam", loss=loss, placement="auto",
                  devices=cpu, select="fast")
  with pytest.raises(ValueError, match="Argument `measure_steps` must be a "
                     "positive integer with select='measured'"):
    tfopt.compile(model, optimizer="adam", loss=loss, placement="auto",
                  devices=cpu, select="measured", measure_steps=0)
  with pytest.raises(ValueError, match="`select` must be given only with "
                     "`placement`"):
    tfopt.compile(model, optimizer="adam", loss=loss, select="measured")
  bad = tmp_path / "bad.json"
  bad.write_text("[]")
  with pytest.raises(cal.CalibrationError, match="format"):
    tfopt.compile(model, optimizer="adam", loss=loss, placement="auto",
                  devices=cpu, calibration=str(bad))
  with pytest.raises(ValueError, match="Argument `calibration`"):
    tfopt.compile(model, optimizer="adam", loss=loss, placement="auto",
                  devices=cpu, calibration=3)


def test_a_calibration_across_hosts_charges_each_pair_by_its_link(tmp_path):
  inside, between = Link(600.0, 1.0, overhead_us=50.0), Link(200.0, 0.0125)
  made = _calibration(kind="processes", link=inside, host_link=between,
                      hosts_share_cores=False, capacity=1.2)
  made.save(tmp_path / "c.json")
  loaded = cal.load_calibration(tmp_path / "c.json")
  assert loaded == made and loaded.host_link == between
  assert "between hosts 200 us" in loaded.describe()
  names = [f"/job:worker/task:{k}/device:CPU:0" for k in range(4)]
  hosts = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]
  cluster = loaded.applied_to(tfopt.Cluster.uniform(4, names=names), hosts)
  comm = cluster.comm
  assert comm.link(0, 1) == inside and comm.link(3, 2) == inside
  # 100 kB between hosts: 200 us + 8 ms on the wire, holding the channels
  # all that time; the cores process the bytes at the rate inside a host.
  for a, b in ((0, 2), (2, 0), (1, 3)):
    assert comm.transfer_us(100_000, a, b) == pytest.approx(200.0 + 8000.0)
    assert comm.link(a, b).cpu_us(100_000) == pytest.approx(200.0 + 100.0)
  # Hosts on cores of their own: a sharing group per host.
  assert cluster.sharing.groups == (0, 0, 1, 1)
  assert cluster.sharing.capacity == 1.2
  shared = dataclasses.replace(made, hosts_share_cores=True)
  assert shared.sharing(4, hosts).groups == (0, 0, 0, 0)
  # Hosts on one machine's cores, two hosts' tasks measured 1.6 side by
  # side: a group per host of its own 1.2, the machine's 1.6 over them
  # (one host's own 1.2, one group, without hosts).
  measured = dataclasses.replace(shared, hosts_capacity=1.6)
  assert measured.sharing(4, hosts) == tfopt.ComputeSharing(
      (0, 0, 1, 1), 1.2, machine_capacity=1.6)
  assert measured.sharing(4) == tfopt.ComputeSharing((0,) * 4, 1.2)
  assert dataclasses.replace(shared, hosts_capacity=1.0).sharing(
      4, hosts).machine_capacity == 1.2
  assert "side by side 1.60 (shared cores)" in measured.describe()
  measured.save(tmp_path / "m.json")
  assert cal.load_calibration(tmp_path / "m.json") == measured
  with pytest.raises(ValueError, match=r"Argument `hosts_capacity` must be "
                     r"a number in \[1, 2\] or None.*Received: "
                     r"hosts_capacity=2.5"):
    dataclasses.replace(measured, hosts_capacity=2.5)
  # Without hosts, or without a host link: one level.
  assert made.comm().pairs == {} and _calibration().comm(hosts).pairs == {}
  with pytest.raises(ValueError, match="`hosts`"):
    made.applied_to(tfopt.Cluster.uniform(4, names=names), hosts[:3])
  # A host link whose cores' rate is given keeps it, through the file too.
  given = dataclasses.replace(made, host_link=Link(
      200.0, 0.0125, cpu_bandwidth_gbps=0.5))
  given.save(tmp_path / "g.json")
  assert cal.load_calibration(tmp_path / "g.json") == given
  assert given.comm(hosts).link(0, 2).cpu_bandwidth_gbps == 0.5
  with pytest.raises(ValueError, match="Argument `host_link` must be"):
    _calibration(host_link="fast")
  # Files of the one-level format read as one level.
  doc = made.to_json()
  del doc["host_link"], doc["hosts_share_cores"]
  assert cal.from_json(doc).host_link is None


def test_the_step_dispatch_and_feed_round_trip_and_add_up(tmp_path):
  """Server tasks' step costs beyond its ops (tfopt.runtime.dispatch):
  per task count as measured, each further task the last measured step,
  the batch at the feed's rate; a file without them (made before) costs
  nothing extra."""
  made = _calibration(kind="processes", dispatch_us=(1200.0, 1600.0, 1900.0),
                      feed_gbps=0.125)
  made.save(tmp_path / "c.json")
  loaded = cal.load_calibration(tmp_path / "c.json")
  assert loaded == made and loaded.dispatch_us == (1200.0, 1600.0, 1900.0)
  assert loaded.step_overhead_us(1) == 1200.0
  assert loaded.step_overhead_us(3) == 1900.0
  assert loaded.step_overhead_us(5) == 1900.0 + 2 * 300.0
  # 32 x 256 float32 at 0.125 GB/s (125 bytes per us): 262.144 us.
  assert loaded.step_overhead_us(2, feed_bytes=32 * 256 * 4) == \
      pytest.approx(1600.0 + 262.144)
  assert "step dispatch 1.20-1.90 ms on 1-3 tasks, the batch fed at " \
      "0.125 GB/s" in loaded.describe()
  doc = json.loads((tmp_path / "c.json").read_text())
  del doc["dispatch_us"], doc["feed_gbps"]
  older = cal.from_json(doc)
  assert older.dispatch_us == () and older.step_overhead_us(4, 10**6) == 0.0
  for bad in ((1.0, -1.0), ("1",), (True,), 3, "12", {1.0}):
    with pytest.raises(ValueError, match="Argument `dispatch_us` must be a "
                       "list or tuple of finite times >= 0 \\(microseconds"
                       "\\), one per count of tasks"):
      _calibration(dispatch_us=bad)
  for bad in (0, float("inf")):
    with pytest.raises(ValueError, match="Argument `feed_gbps` must be a "
                       "finite number > 0 or None. Received: feed_gbps="):
      _calibration(feed_gbps=bad)
  with pytest.raises(ValueError, match="Argument `tasks` must be"):
    made.step_overhead_us(0)
  with pytest.raises(ValueError, match="Argument `feed_bytes` must be an "
                     "integer >= 0. Received: feed_bytes=-1"):
    made.step_overhead_us(1, feed_bytes=-1)


def test_the_feed_bandwidth_is_fitted_through_the_origin():
  from tfopt.runtime.dispatch import feed_bandwidth_gbps
  # 125 bytes per us (0.125 GB/s) exactly, and with a point +-10 %.
  assert feed_bandwidth_gbps([(125_000, 1000.0), (250_000, 2000.0)]) == \
      pytest.approx(0.125)
  noisy = feed_bandwidth_gbps([(125_000, 1100.0), (250_000, 1800.0)])
  assert 0.11 < noisy < 0.14
  # A token bucket's burst let the 64 KiB feed through at memory speed
  # (LocalHosts at 1 Gbit/s, measured): the rate is the large feeds'.
  burst = feed_bandwidth_gbps([(65_536, 51.4), (262_144, 1376.7),
                               (1_048_576, 8436.4)])
  assert 0.12 < burst < 0.13
  # Feeds no slower than the 4-byte call: no rate to fit.
  assert feed_bandwidth_gbps([(65_536, 0.0), (262_144, 0.0)]) is None
