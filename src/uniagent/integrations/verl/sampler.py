"""The infrastructure-failure stop under verl's V1 trainer: a replay buffer that checks the step's batch.

Under V1 (`main_ppo` with `trainer.use_v1=True`) `UniAgentLoop` cannot stop a step by raising (verl
0.9.1, `verl/trainer/ppo/v1/`): `AgentLoopWorkerTQ.generate_sequences` fires and forgets one task per
prompt (`agent_loop_tq.py:100-105`); `_run_prompt` gathers the prompt's sessions with
`return_exceptions=True` (`agent_loop_tq.py:47-49`, `133`), logs each exception and tags the prompt
`failure` (`agent_loop_tq.py:134-143`); the sync `ReplayBuffer.sample` keeps a failed group sampleable
and trains on its other sessions, the missing ones padded (`replay_buffer.py:104-113`, `336-341`).
Only a batch in which no group has any output stops the run (`replay_buffer.py:505-510`).

What V1 does offer is its replay buffer: `trainer.v1.sampler.custom_sampler.{path,name}` names a
`ReplayBuffer` subclass (`trainer_base.py:139-185`), and its `sample` is the first thing each step
does (`trainer_base.py:567`): an exception there leaves `fit`, the task runner and `main_ppo` before
anything is trained. `InfraCheckedReplayBuffer.sample` takes verl's batch and counts, per session, the
exit reason `UniAgentLoop` put in the session's last output (`extra_fields`), and each session a
selected group lacks (its loop raised) as an `internal_error`; more infrastructure failures than the
smallest `max_infra_failure_share` the batch's outputs carry (each loop's setting, `extra_fields`)
raise `TrainingError` (`check_infra_failures`, the local trainer's rule). So under V1 the check covers
the step's whole batch, and the loop itself does not raise (`loop.py`). The selected groups are read
where verl materializes them (`_materialize_batch`, `replay_buffer.py:394-406`), the one place that
also names a group with no output.

Only for `trainer.v1.trainer_mode=sync` (the subclass is verl's sync `ReplayBuffer`; the async modes
evict and refill failed groups instead). verl gives a custom sampler none of the built-in one's DAPO
settings (`trainer_base.py:163-166`), so `algorithm.filter_groups` is refused alongside it
(`launch.check_trainer_path`). `sampler_kwargs.rollout_n` (`${actor_rollout_ref.rollout.n}`) is how
many sessions a group has.
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from uniagent.agent import ExitReason
from uniagent.agent.result import check_infra_failures
from uniagent.errors import ConfigError
from uniagent.integrations.verl.settings import SHARE_FIELD

RAISED = "the agent loop raised; verl logged the error and tagged the group `failure`"


def session_outcomes(
    keys: list[str], extra_fields: list[dict[str, Any]], selected: list[str], rollout_n: int
) -> tuple[list[tuple[ExitReason, str | None]], float]:
    """Each sampled session's (exit reason, error) and the smallest share any of them allows (1.0 when
    no row is uniagent's). `keys` are verl's `{uid}_{session_id}_{index}` with their `extra_fields`;
    a session's last output carries the episode's exit reason; a session of a `selected` group with no
    output raised."""
    last: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
    for key, fields in zip(keys, extra_fields, strict=True):
        uid, session, index = key.rsplit("_", 2)
        if (uid, session) not in last or int(index) > last[uid, session][0]:
            last[uid, session] = (int(index), fields)
    outcomes: list[tuple[ExitReason, str | None]] = []
    shares = [1.0]
    for uid in selected:
        sessions = [fields for (u, _), (_, fields) in last.items() if u == uid]
        for fields in sessions:
            if "exit_reason" in fields:  # a row of another agent loop is not ours to judge
                outcomes.append((ExitReason(fields["exit_reason"]), fields.get("error")))
                shares.append(float(fields.get(SHARE_FIELD, 1.0)))
        outcomes += [(ExitReason.INTERNAL_ERROR, RAISED)] * max(0, rollout_n - len(sessions))
    return outcomes, min(shares)


class InfraCheckedReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer whose `sample` refuses a training batch with too many infrastructure
    failures (module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        options = dict(kwargs.get("sampler_kwargs") or {})
        if kwargs.get("trainer_mode") != "sync":
            raise ConfigError(
                f"{type(self).__name__} is verl's sync replay buffer; trainer.v1.trainer_mode="
                f"{kwargs.get('trainer_mode')} needs its own (or +uniagent.max_infra_failure_share=1.0 "
                "and verl's sampler)"
            )
        if not isinstance(options.get("rollout_n"), int) or options["rollout_n"] < 1:
            raise ConfigError(
                "trainer.v1.sampler.sampler_kwargs.rollout_n must be the group size: "
                "+trainer.v1.sampler.sampler_kwargs.rollout_n=${actor_rollout_ref.rollout.n}"
            )
        self.rollout_n = int(options["rollout_n"])
        self._selected: list[str] = []
        super().__init__(**kwargs)

    def _materialize_batch(
        self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]
    ) -> KVBatchMeta:
        # the selected groups, including a failed one with no output (its key is then in no row)
        self._selected = list(selected_prompt_uids)
        return super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id != "train":
            return batch, metrics
        extra: list[Any] = []
        if batch.keys:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["extra_fields"])
            extra = [getattr(value, "data", value) for value in data["extra_fields"]]
        where = f"verl V1 training batch of step {global_steps}"
        return batch, {**metrics, **check_batch(batch.keys, extra, self._selected, self.rollout_n, where)}


def check_batch(
    keys: list[str], extra_fields: list[Any], selected: list[str], rollout_n: int, where: str
) -> dict[str, int]:
    """Raise `TrainingError` when the batch's sessions hold more infrastructure failures than its
    outputs' smallest `max_infra_failure_share` allows; else the counts, as step metrics."""
    fields = [value if isinstance(value, dict) else {} for value in extra_fields]
    outcomes, share = session_outcomes(keys, fields, selected, rollout_n)
    if share < 1.0:
        where = f"{where} ({len(selected)} group(s) x {rollout_n})"
        check_infra_failures(outcomes, share, "uniagent.max_infra_failure_share", where=where)
    failed = sum(not reason.trainable for reason, _ in outcomes)
    return {"training/infra_failures": failed, "training/sessions_checked": len(outcomes)}
