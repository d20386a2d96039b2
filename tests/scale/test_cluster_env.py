"""Where a worker sits when a cluster manager started it: TF_CONFIG and
SLURM's variables against layouts worked out by hand (SLURM's documented
block and cyclic distributions)."""

import json

import pytest

from tfopt.scale.cluster_env import (expand_hostlist, expand_tasks_per_node,
                                     place_from_environ, slurm_cluster)
from tfopt.scale.worker import WorkerEnv


def _tf_config(cluster, kind, index):
  return json.dumps({"cluster": cluster, "task": {"type": kind,
                                                 "index": index}})


def test_tf_config_ranks_the_chief_first_then_the_workers():
  cluster = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
  ranks = [(kind, index, place_from_environ(
      {"TF_CONFIG": _tf_config(cluster, kind, index)}))
           for kind, index in (("chief", 0), ("worker", 0), ("worker", 1))]
  assert [(p.worker, p.workers, p.source) for _, _, p in ranks] == [
      (0, 3, "tf_config"), (1, 3, "tf_config"), (2, 3, "tf_config")]
  only_workers = place_from_environ(
      {"TF_CONFIG": _tf_config({"worker": ["b:1", "c:1"]}, "worker", 1),
       "TFOPT_RUN_DIR": "/shared/run", "TFOPT_ATTEMPT": "2"})
  assert (only_workers.worker, only_workers.workers, only_workers.run_dir,
          only_workers.attempt, only_workers.cluster) == (
              1, 2, "/shared/run", 2, None)


def test_the_launchers_variables_win_over_its_tf_config():
  env = WorkerEnv.from_environ({
      "TFOPT_WORKER": "1", "TFOPT_NUM_WORKERS": "2",
      "TF_CONFIG": _tf_config({"worker": ["a:1", "b:1", "c:1"]}, "worker",
                              2)})
  assert (env.worker, env.workers, env.source) == (1, 2, "launcher")


@pytest.mark.parametrize("config,match", [
    ("{not json", "must be JSON"),
    (_tf_config({"worker": ["a:1"], "ps": ["p:1"]}, "worker", 0),
     "data-parallel"),
    (_tf_config({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0),
     "data-parallel"),
    (_tf_config({"worker": ["a:1"]}, "worker", 3), "name a task"),
])
def test_unusable_tf_config_is_named(config, match):
  with pytest.raises(ValueError, match=match) as err:
    place_from_environ({"TF_CONFIG": config})
  assert "TF_CONFIG" in str(err.value)


@pytest.mark.parametrize("text,hosts", [
    ("node1", ["node1"]),
    ("node[09-11,20],gpu1", ["node09", "node10", "node11", "node20",
                             "gpu1"]),
    ("10.201.0.[1-2]", ["10.201.0.1", "10.201.0.2"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
])
def test_node_lists_expand_in_slurms_order(text, hosts):
  assert expand_hostlist(text) == hosts


def test_tasks_per_node_expand():
  assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
  with pytest.raises(ValueError, match="2\\(x3\\)"):
    expand_tasks_per_node("two")


def test_the_batch_script_outside_srun_is_one_process_alone():
  # sbatch runs the script itself with job variables but no job step:
  # rank 0 of N would wait for peers that were never started.
  place = place_from_environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4",
                              "SLURM_JOB_NODELIST": "node[1-2]",
                              "SLURM_TASKS_PER_NODE": "2(x2)"})
  assert (place.worker, place.workers, place.source) == (0, 1, "single")


def _slurm(rank, node, local, distribution=None, **extra):
  env = {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node),
         "SLURM_LOCALID": str(local), "SLURM_STEP_NUM_TASKS": "5",
         "SLURM_STEP_NODELIST": "node[9-10],gpu01",
         "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", **extra}
  if distribution:
    env["SLURM_DISTRIBUTION"] = distribution
  return env


def test_slurm_block_and_cyclic_layouts():
  # block: ranks fill node9, then node10, then gpu01, in SLURM's node
  # order (TensorFlow's resolver would sort node10 before node9).
  cluster, rank = slurm_cluster(_slurm(3, 1, 1), port_base=7000)
  assert rank == 3 and cluster == {"worker": [
      "node9:7000", "node9:7001", "node10:7000", "node10:7001",
      "gpu01:7000"]}
  # cyclic: one rank per node in turn, skipping full nodes (",Pack"
  # changes nothing once SLURM gave the counts per node).
  cluster, rank = slurm_cluster(_slurm(2, 2, 0, "cyclic:block,Pack"), 7000)
  assert rank == 2 and cluster == {"worker": [
      "node9:7000", "node10:7000", "gpu01:7000", "node9:7001",
      "node10:7001"]}


def test_slurm_place_with_port_base_and_requeue_count():
  place = place_from_environ(_slurm(4, 2, 0, TFOPT_SLURM_PORT_BASE="2300",
                                    SLURM_RESTART_COUNT="1"))
  assert (place.worker, place.workers, place.attempt, place.source) == (
      4, 5, 1, "slurm")
  assert place.cluster["worker"][4] == "gpu01:2300"
  env = WorkerEnv.from_environ(_slurm(0, 0, 0))
  assert env.is_chief and env.cluster["worker"][0] == "node9:8888"


@pytest.mark.parametrize("changes,match", [
    ({"SLURM_NODEID": "2"}, "`SLURM_NODEID` must be 0 for task 1.*"
                            "Received: SLURM_NODEID=2"),  # on node9
    ({"SLURM_STEP_NUM_TASKS": "4"}, "must agree.*SLURM_STEP_NUM_TASKS=4"),
    ({"SLURM_DISTRIBUTION": "plane=2"},
     "Received: SLURM_DISTRIBUTION=plane=2"),
    ({"SLURM_PROCID": "7"}, "Received: SLURM_PROCID=7"),
    ({"SLURM_STEP_NODELIST": ""}, "`SLURM_STEP_NODELIST` must be set.*srun"),
    ({"TFOPT_SLURM_PORT_BASE": "eighty"}, "`TFOPT_SLURM_PORT_BASE` must be "
                                          "an integer"),
    ({"SLURM_STEP_NODELIST": "n[a-b]"}, "`SLURM_STEP_NODELIST` must have "
                                        "numeric ranges"),
    ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "`SLURM_STEP_TASKS_PER_NODE` "
                                           "must look like"),
])
def test_slurm_variables_that_cannot_be_used_are_named(changes, match):
  with pytest.raises(ValueError, match=match):
    place_from_environ({**_slurm(1, 0, 1), **changes})


def test_alone_is_worker_zero_of_one():
  place = place_from_environ({})
  assert (place.worker, place.workers, place.source) == (0, 1, "single")
  # A TF_CONFIG naming no task (a client of server tasks) is no place.
  client = place_from_environ({"TF_CONFIG": json.dumps(
      {"cluster": {"worker": ["a:1", "b:1"]}})})
  assert (client.worker, client.workers, client.source) == (0, 1, "single")
