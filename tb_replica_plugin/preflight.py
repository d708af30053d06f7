"""Pre-flight inspector: per-replica shapes of the first batches of a dataset, without training.

Keras 3 `fit` reduces the first distributed batch while building the model, so a first batch that
splits unevenly over the replicas (global batch 7 over 2 replicas → [4, 3]) crashes `fit` with
`InvalidArgumentError: Inputs to operation AddN ... must have the same size and shape` before any
callback runs. `inspect_dataset` shows what each replica would get, and why.
"""

import dataclasses
import os

import tensorflow as tf

from tb_replica_plugin import group
from tb_replica_plugin.families.inputs import record as inputs_record
from tb_replica_plugin.probe import ReplicaProbe
from tb_replica_plugin.read import judge


@dataclasses.dataclass
class Inspection:
    """What `inspect_dataset` recorded.

    Attributes:
      run_dir: the directory written (a TensorBoard run).
      batch_sizes: `batch_sizes[step][replica]`, e.g. `[[4, 3], [4, 3], [1, 0]]`.
      findings: the `analysis.Finding`s for the run, most severe first.
    """

    run_dir: str
    batch_sizes: list
    findings: list


def inspect_dataset(strategy, dataset, log_dir, steps=10, run_name="inspect_dataset"):
    """Records per-replica shapes of the first `steps` distributed batches, without training.

    Args:
      strategy: the `tf.distribute.Strategy` the dataset is meant for.
      dataset: a batched `tf.data.Dataset` (distributed with
        `strategy.experimental_distribute_dataset`) or an already distributed dataset.
      log_dir: the log directory; the run `log_dir/run_name` is written.
      steps: how many batches to read (int >= 1).
      run_name: the run (sub-directory) to write.

    Returns:
      An `Inspection` with the per-step per-replica batch sizes and the findings, e.g. for a
      global batch 7 on 2 replicas `batch_sizes[0] == [4, 3]` and a finding of kind
      `first_batch_uneven` explaining that `fit` would fail and how to fix it.

    Raises:
      ValueError: if `steps` is not a positive integer or `dataset` is not a dataset.

    Example:
      ```python
      result = tb_replica_plugin.inspect_dataset(strategy, dataset.batch(7), "logs", steps=3)
      print(result.batch_sizes)           # [[4, 3], [4, 3], [1, 0]]
      print(result.findings[0].message)
      ```
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"`steps` must be a positive integer. Received: steps={steps!r}")
    if isinstance(dataset, tf.data.Dataset):
        dataset = strategy.experimental_distribute_dataset(dataset)
    elif not isinstance(dataset, tf.distribute.DistributedDataset):
        raise ValueError(
            "`dataset` must be a tf.data.Dataset or a distributed dataset. "
            f"Received: dataset={type(dataset).__name__}"
        )
    run_dir = os.path.join(os.fspath(log_dir), run_name)
    probe = ReplicaProbe(run_dir, strategy=strategy, update_freq=1, source="inspect_dataset")
    with strategy.scope():
        for step, batch in enumerate(dataset):
            if step >= steps:
                break
            probe.observe_inputs(inputs_record.name_fit_batch(batch), step=step)
    probe.close()
    run_data = next(iter(group.read_log_dir(run_dir).values()), None)
    if run_data is None:
        return Inspection(run_dir=run_dir, batch_sizes=[], findings=[])
    return Inspection(
        run_dir=run_dir,
        batch_sizes=run_data.inputs.batch_size.tolist(),
        findings=judge.find_run(run_data),
    )
