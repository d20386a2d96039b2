"""tfopt.compile's `devices`, `cluster` and `pins`, checked once into one
PlacementDevices (tfopt.compile_devices); each bad argument named."""

import pytest

from tfopt.compile_devices import PlacementDevices, check_placement_devices


def test_devices_of_this_process_checked_into_one_value():
  where = check_placement_devices(["/device:CPU:0"], None,
                                  {"dense": "/device:CPU:0", "out": 0})
  assert where == PlacementDevices(("/device:CPU:0",), None,
                                   {"dense": 0, "out": 0}, True)
  assert not where.remote and where.target == ""
  cluster = where.cluster(1000)
  assert [d.name for d in cluster.devices] == ["/device:CPU:0"]
  assert cluster.devices[0].memory_bytes == 1000
  assert cluster.devices[0].device_type == "CPU"
  assert cluster.comm.shared_buffers


@pytest.mark.parametrize("devices", ["/device:CPU:0", [], [""], [0], None])
def test_devices_that_are_not_a_list_of_strings(devices):
  with pytest.raises(ValueError, match=r"Argument `devices` must be a "
                     r"non-empty list of TF device strings"):
    check_placement_devices(devices, None, None)


def test_a_device_this_process_does_not_have():
  with pytest.raises(ValueError, match=r"Argument `devices` must be devices "
                     r"of this process \(\[.*CPU:0.*\]\).*Received: "
                     r"devices=\['/device:CPU:0', '/device:CPU:9'\]"):
    check_placement_devices(["/device:CPU:0", "/device:CPU:9"], None, None)


def test_a_cluster_for_devices_of_this_process():
  with pytest.raises(ValueError, match="Argument `cluster` must be given "
                     "only when `devices` name tasks"):
    check_placement_devices(["/device:CPU:0"], {"worker": ["127.0.0.1:1"]},
                            None)


def test_pins_to_a_device_not_given():
  with pytest.raises(ValueError, match=r"Argument `pins\['dense'\]` must be "
                     r"a device index in \[0, 1\)"):
    check_placement_devices(["/device:CPU:0"], None, {"dense": 1})


def test_the_host_of_each_task_and_this_process_address_toward_them():
  from tfopt.runtime import remote
  spec = {"worker": ["10.0.0.1:2222", "10.0.0.1:2223", "10.0.0.2:2222"]}
  devices = [f"/job:worker/task:{k}/device:CPU:0" for k in (2, 0, 1)]
  assert remote.task_hosts(spec, devices + ["/device:CPU:0"]) == [
      "10.0.0.2", "10.0.0.1", "10.0.0.1", "localhost"]
  # Tasks on this machine's loopback reach this process at "localhost":
  # nothing to advertise.
  assert remote.client_address({"worker": ["127.0.0.1:2222"]}) is None
  with pytest.raises(ValueError, match="devices"):
    remote.task_hosts(spec, ["/job:worker/task:3/device:CPU:0"])


def test_tasks_of_a_cluster_carry_the_calibrated_step_dispatch():
  """On server tasks (one device each) the calibration's dispatch from
  this process is the cluster's step overhead, which the placers weigh;
  on devices of this process, or several devices of one task, none."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  from tfopt import calibration as cal  # pylint: disable=import-outside-toplevel
  from tfopt.cost import Link  # pylint: disable=import-outside-toplevel
  made = cal.Calibration(kind="processes", num_devices=2, link=Link(),
                         control_messages=True, capacity=1.0, shared=True,
                         dispatch_us=(1200.0, 1700.0), feed_gbps=0.1)
  spec = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
  tasks = PlacementDevices(("/job:worker/task:0/device:CPU:0",
                            "/job:worker/task:1/device:CPU:0"), spec, {},
                           False)
  cluster = tasks.cluster(10**6, made)
  assert cluster.step_overhead_us == (1200.0, 1700.0)
  assert cluster.step_overhead(2) == 1700.0
  assert tasks.cluster(10**6, dataclasses.replace(
      made, dispatch_us=())).step_overhead_us == ()
  one_task = PlacementDevices(("/job:worker/task:0/device:CPU:0",
                               "/job:worker/task:0/device:CPU:1"), spec, {},
                              False)
  assert one_task.cluster(10**6, made).step_overhead_us == ()
  local = PlacementDevices(("/device:CPU:0",), None, {}, True)
  assert local.cluster(10**6, made).step_overhead_us == ()


def test_the_dispatch_the_cluster_cannot_carry_is_counted_by_task():
  """Several devices of one task, or this process's devices beside tasks:
  the cluster (which counts devices) carries no step overhead, and the
  prediction adds the calibrated dispatch of the tasks used instead."""
  import types  # pylint: disable=import-outside-toplevel
  from tfopt import Cluster  # pylint: disable=import-outside-toplevel
  from tfopt import calibration as cal  # pylint: disable=import-outside-toplevel
  from tfopt.compile import _OptimizedTrainFunction  # pylint: disable=import-outside-toplevel
  from tfopt.cost import Link  # pylint: disable=import-outside-toplevel
  made = cal.Calibration(kind="processes", num_devices=2, link=Link(),
                         control_messages=True, capacity=1.0, shared=True,
                         dispatch_us=(1200.0, 1700.0))
  spec = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
  names = ("/job:worker/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:1",
           "/job:worker/task:1/device:CPU:0", "/job:localhost/device:CPU:0")
  hook = types.SimpleNamespace(calibration=made, where=PlacementDevices(
      names, spec, {}, False))
  hook._task_calibration = lambda: _OptimizedTrainFunction._task_calibration(
      hook)
  outside = _OptimizedTrainFunction._dispatch_outside_plan_us
  plain = Cluster.uniform(4)
  # Two devices of task 0: one task; with task 1: two; the client's own
  # device is no task.
  assert outside(hook, names[:2], plain) == 1200.0
  assert outside(hook, names[:3], plain) == 1700.0
  assert outside(hook, names, plain) == 1700.0
  assert outside(hook, names[3:], plain) == 0.0
  # Where the cluster carries it, the makespan holds it: nothing more.
  carried = Cluster.uniform(4, step_overhead_us=(1200.0, 1700.0))
  assert outside(hook, names, carried) == 0.0
