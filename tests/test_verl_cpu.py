"""verl on a CPU-only machine: the plugin's registrations, and verl's real legacy trainer for 2 GRPO steps.

Real parts, nothing faked: `python -m verl.trainer.main_ppo` (trainer.use_v1=False, the legacy
`RayPPOTrainer`), a local Ray cluster, verl's FSDP2 engine over gloo on the CPU platform registered by
`uniagent.integrations.verl.cpu`, verl's agent-loop workers running `UniAgentLoop` on the multi-turn
lookup suite (bubblewrap sandboxes), and the `uniagent_local` rollout: a `LocalEngine` server actor
that serves the packaged SmolLM2 and takes verl's weight sync. The end-to-end test reads verl's own
step metrics from the console, the server's event log (`rollout.custom.uniagent_local_events`) for the
weight updates, and, through the test-only plugin `verl_cpu_probe.py`, the per-token difference
between the rollout's logprobs and verl's recomputed old logprobs. Its 2 steps take two launches of
the same command: the first checkpoints step 1 and loses its rollout server (SIGKILL) in step 2's
rollout, which must end it with one clear line and nothing of step 2 trained; the second resumes from
the checkpoint and trains step 2. Select it with `-k verl_cpu`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import require_module

verl = require_module("verl", "verl is the training backend (pip install -e .[verl])")

from uniagent.integrations.verl.cpu.platform import PlatformCPU  # noqa: E402
from uniagent.integrations.verl.cpu.rollout import (  # noqa: E402
    ROLLOUT_NAME,
    LocalRolloutReplica,
    LocalServerAdapter,
)
from verl_cpu_helpers import (  # noqa: E402
    ROOT,
    cpu_env,
    events_override,
    parse_steps,
    read_metrics,
    run_command,
    run_recipe,
)


# -- registrations ------------------------------------------------------------------------------------
def test_registrations_resolve_through_verls_registries() -> None:
    from verl.plugin.platform import PlatformRegistry
    from verl.utils import distributed
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    import uniagent.integrations.verl.cpu as cpu

    cpu.register()  # idempotent: importing the package registered already
    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert get_rollout_class(ROLLOUT_NAME, "async") is LocalServerAdapter
    assert get_rollout_replica_class(ROLLOUT_NAME) is LocalRolloutReplica
    for backend in ("fsdp", "fsdp2"):
        assert EngineRegistry._engines["language_model"][backend]["cpu"] is FSDPEngineWithLMHead
    assert getattr(distributed.initialize_global_process_group_ray, "__uniagent_cpu_backend__", False)

    platform = PlatformCPU()
    assert (platform.device_name, platform.current_device(), platform.communication_backend_name()) == (
        "cpu",
        "cpu",
        "gloo",
    )
    module = platform.device_module
    assert module.empty_cache() is None and module.memory_allocated() == 0
    free, total = module.mem_get_info()
    assert 0 < free <= total
    assert module.current_stream() is not None  # falls through to torch.cpu
    assert not platform.is_platform_available(use_smi_check=True) or os.environ.get("VERL_PLATFORM") == "cpu"


def test_plugin_hook_makes_a_fresh_process_a_cpu_verl() -> None:
    """What every Ray worker does: `import verl` alone (the plugin hook) picks the CPU platform, the
    FSDP engine resolves for it, and verl's process-group call comes up on gloo."""
    code = r"""
import json, os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
import verl
from verl.utils.device import get_device_name, get_nccl_backend, get_torch_device
from verl.workers.engine import EngineRegistry
from verl.workers.engine_workers import initialize_global_process_group_ray
import torch.distributed as dist
initialize_global_process_group_ray(timeout_second=None)
print(json.dumps({
    "device": get_device_name(), "backend": get_nccl_backend(), "pg": str(dist.get_backend()),
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "empty_cache": repr(get_torch_device().empty_cache()),
}))
"""
    env = {**cpu_env(), "RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "device": "cpu",
        "backend": "gloo",
        "pg": "cpu:gloo",
        "engine": "FSDPEngineWithLMHead",
        "empty_cache": "None",
    }


# -- the engine reports what verl recomputes ----------------------------------------------------------
@pytest.mark.slow
async def test_scaled_logprobs_are_the_temperature_distributions() -> None:
    """`logprobs_mode="scaled"` (what the uniagent_local server runs for verl): each logprob is
    log_softmax(logits / temperature) of a teacher-forced pass, verl's recompute."""
    import torch

    from uniagent.models.base import SamplingParams
    from uniagent.models.loading import load_causal_lm, load_tokenizer, smollm2_source
    from uniagent.models.local import LocalEngine

    prompt = load_tokenizer(smollm2_source()).encode("<|im_start|>user\nName a colour.<|im_end|>\n")
    sampling = SamplingParams(temperature=0.7, max_tokens=12, seed=3)
    async with LocalEngine(logprobs_mode="scaled") as engine:
        out = await engine.generate(prompt, sampling, "r")
    model = load_causal_lm(smollm2_source())
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    want = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(out.logprobs), want, atol=2e-4), (out.logprobs, want.tolist())


# -- the server actor's protocol, without Ray --------------------------------------------------------
@pytest.mark.slow
async def test_local_rollout_server_generates_aborts_and_takes_weights(tmp_path: Path) -> None:
    """`LocalRolloutServer` as verl's client and weight sync call it: ids + logprobs, a partial
    rollout abort that returns the tokens so far, and a full state dict (tied `lm_head` included)."""
    from uniagent.integrations.verl.cpu.rollout import LocalRolloutServer
    from uniagent.models.loading import load_tokenizer, smollm2_hf_dirs, smollm2_source

    events = tmp_path / "events.jsonl"
    config = {
        "prompt_length": 256,
        "response_length": 64,
        "max_num_seqs": 4,
        "logprobs_mode": "processed_logprobs",
        "custom": {"uniagent_local_events": str(events)},
    }
    server = LocalRolloutServer(config, {"path": str(smollm2_hf_dirs()[0])})
    try:
        ids = load_tokenizer(smollm2_source()).encode("<|im_start|>user\nCount to twenty.<|im_end|>\n")
        params = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 8, "logprobs": True}
        out = await server.generate(ids, dict(params), "a")
        assert out.stop_reason == "completed" and len(out.token_ids) == len(out.log_probs) == 8
        running = asyncio.ensure_future(server.generate(ids, {**params, "max_tokens": 60}, "b"))
        while server.engine.stats.generated_tokens < 10:
            await asyncio.sleep(0.01)
        assert (await server.abort_all_requests())["request_ids"] == ["b"]
        cut = await running
        assert cut.stop_reason == "aborted" and 0 < len(cut.token_ids) == len(cut.log_probs) < 60
        await server.resume_generation()
        state = {k: v + 0.001 for k, v in server.engine.model.state_dict().items()}
        record = await server.update_weights(state, 1)
        assert record["version"] == 1 and record["tensors"] == len(state)
        logged = [json.loads(line) for line in events.read_text().splitlines()]
        kinds = ["start", "generating", "generated", "generating", "abort", "aborted", "update"]
        assert [e["event"] for e in logged] == kinds
        assert [e["request_id"] for e in logged if e["event"] == "generating"] == ["a", "b"]
        start, generated, abort, aborted, update = (e for e in logged if e["event"] != "generating")
        assert (generated["prompt_tokens"], generated["tokens"]) == (len(ids), 8)
        assert abort["request_ids"] == ["b"] and aborted["tokens"] == len(cut.token_ids)
        assert start["logprobs_mode"] == "scaled" and update["global_steps"] == 1
        assert update["weight_sum"] != pytest.approx(start["weight_sum"])
    finally:
        server.engine.close()


# -- verl's legacy trainer, 2 GRPO steps ---------------------------------------------------------------
class ServerKiller(threading.Thread):
    """SIGKILLs the rollout server actor (its pid from its `start` event) once its event log shows a
    request under way under `version`, i.e. while that version's rollout runs (step version+1's under
    main_ppo), `delay_s` later. Not on a finished reply: a step whose episodes all end after one
    batched reply finishes its rollout within a fraction of a second of the first one (as sampled on
    some CPUs), and the kill then lands in training instead."""

    def __init__(self, events: Path, version: int, delay_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.events, self.version, self.delay_s = events, version, delay_s
        self.killed: dict | None = None  # pid, the triggering event, requests in flight at it
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.1):
            lines = self.events.read_text().splitlines() if self.events.exists() else []
            seen = [json.loads(x) for x in lines]
            hit = next(
                (e for e in seen if e["event"] == "generating" and e["global_steps"] == self.version), None
            )
            if hit is None:
                continue
            pid = [e for e in seen if e["event"] == "start"][-1]["pid"]
            done = sum(e["event"] in ("generated", "aborted") for e in seen[: seen.index(hit) + 1])
            time.sleep(self.delay_s)
            os.kill(pid, signal.SIGKILL)
            self.killed = {"pid": pid, "event": hit, "in_flight": hit["requests"] - done, "time": time.time()}
            return

    def __enter__(self) -> ServerKiller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two launches: ~9 min on a 2-core machine, far more when it is shared
def test_verl_cpu_main_ppo_takes_two_grpo_steps(tmp_path: Path) -> None:
    """The user's command, launched twice. Run A trains step 1, checkpoints it, and loses its rollout
    server (SIGKILL) during step 2's rollout: it must stop non-zero with one clear last line and train
    nothing of step 2. Run B, the same command, resumes from the step-1 checkpoint and trains step 2.
    Across the two: both steps trained with a gradient, the engine took every weight sync (the
    resumed one carrying the step-1 weights), rollout and trainer logprobs agree, context is never
    trained."""
    from uniagent.models.loading import smollm2_hf_dirs

    ckpt = tmp_path / "ckpt"
    sets = [
        # the local config, sized down (2 tasks x 2 samples, 2 steps), as multiturn_grpo_cpu's local_set
        "trainer.tasks_per_step=2",
        "trainer.group_size=2",
        "trainer.steps=2",
        "trainer.tensorboard=false",
        # verl keys: a checkpoint every step (run B resumes from step 1's; resume_mode=auto is verl's
        # default), the server's event log, and a gradient every step whatever the 4 episodes score
        # (GRPO's advantage is 0 when a group's rewards are equal, often at 2 samples, and the test is
        # about the weights moving)
        "trainer.save_freq=1",
        f"trainer.default_local_dir={ckpt}",
        events_override(tmp_path),
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        # verl recomputes the old logprobs (the local config's rollout_correction bypasses that and
        # trains on the rollout's), so the two can be compared token by token
        "algorithm.rollout_correction.bypass_mode=False",
    ]
    # exactly what a user types: the CLI translates the local config onto the CPU recipe (model.device
    # cpu), writes the parquet data under the working directory, and launches with the recipe's env
    uniagent = str(Path(sys.executable).with_name("uniagent"))
    config = str(ROOT / "configs" / "train_multiturn.yaml")
    command = [uniagent, "train", "--engine", "verl", "--config", config]
    command += [arg for item in sets for arg in ("--set", item)]
    env = dict(os.environ)
    env["PYTHONPATH"] = cpu_env()["PYTHONPATH"]  # Ray workers import the probe from tests/
    env["VERL_USE_EXTERNAL_MODULES"] = "verl_cpu_probe"  # joined after the recipe's CPU plugin
    env["UNIAGENT_PROBE_TOKENIZER"] = str(smollm2_hf_dirs()[1])

    # -- run A: step 1, its checkpoint, then the rollout server dies in step 2's rollout ----------------
    with ServerKiller(tmp_path / "rollout_events.jsonl", version=1) as killer:
        killed = run_command(tmp_path, command, env, "main_ppo_killed", timeout=1200)
    assert killer.killed, killed.log[-6000:]
    last = killed.log.strip().splitlines()[-1]
    assert killed.returncode != 0, killed.log[-6000:]
    server = f"rollout server uniagent_local_server_0_0 (pid {killer.killed['pid']})"
    # the step is named when a reply of it came back before the kill (replies carry their weights
    # version); killed under its first requests, the line says "a rollout"
    said = re.match(rf"error: {re.escape(server)} died during (step 2's|a) rollout: ", last)
    assert said, killed.log[-6000:]
    assert "the step is not trained" in last
    steps = parse_steps(killed.log)
    assert sorted(steps) == [1], sorted(steps)  # nothing of step 2 reached verl's update
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_1"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    first_updates = killed.events_of("update")
    assert [u["global_steps"] for u in first_updates] == [0, 1]

    # -- run B: the same command resumes from step 1's checkpoint and trains step 2 -------------------
    resumed = run_command(tmp_path, command, env, "main_ppo_resumed", timeout=1200)
    assert resumed.returncode == 0, resumed.log[-6000:]
    assert f"Load from checkpoint folder: {ckpt / 'global_step_1'}" in resumed.log
    resumed_steps = parse_steps(resumed.log)
    assert sorted(resumed_steps) == [2], sorted(resumed_steps)
    steps.update(resumed_steps)
    starts = [i for i, e in enumerate(resumed.events) if e["event"] == "start"]
    assert len(starts) == 2, starts
    started = [resumed.events[i] for i in starts]
    updates = [e for e in resumed.events[starts[1] :] if e["event"] == "update"]

    keys = (
        "critic/score/mean",
        "actor/grad_norm",
        "actor/pg_loss",
        "actor/entropy",
        "response_length/mean",
        "num_turns/mean",
        "training/rollout_probs_diff_max",
        "training/rollout_logprob_abs_diff_max",
        "training/rollout_logprob_abs_diff_mean",
        "training/context_tokens",
        "training/context_tokens_trained",
        "timing_s/gen",
        "timing_s/old_log_prob",
        "timing_s/update_actor",
        "timing_s/update_weights",
        "timing_s/save_checkpoint",
        "timing_s/step",
    )
    summary = {
        "wall_s": {"killed": round(killed.wall_s, 1), "resumed": round(resumed.wall_s, 1)},
        "peak_rss_gib": max(killed.peak_rss_gib, resumed.peak_rss_gib),
        "peak_pss_gib": max(killed.peak_pss_gib, resumed.peak_pss_gib),
        "killed": killer.killed,
        "error_line": last,
        "steps": {n: {k: m.get(k) for k in keys} for n, m in steps.items()},
        "engine": {"start": started, "updates": first_updates + updates},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))

    # verl trained: both steps computed a gradient and applied it
    for metrics in steps.values():
        assert metrics["actor/grad_norm"] > 0
        assert metrics["training/rollout_logprob_abs_diff_max"] < 0.05  # fp32 on both sides
        # tool results and the chat template's headers reached verl as context, never trained
        assert metrics["training/context_tokens"] > 0 and metrics["training/context_tokens_trained"] == 0
    # the engine took verl's weight sync: the initial one and step 1's in run A; in run B the initial
    # sync after the resume carries the step-1 weights (what run A's engine got after step 1), then step 2
    assert [u["global_steps"] for u in updates] == [1, 2]
    assert updates[0]["weight_sum"] == pytest.approx(first_updates[1]["weight_sum"], abs=1e-6)
    assert updates[-1]["version"] == 2 and updates[-1]["tensors"] > 0
    assert first_updates[0]["weight_sum"] == pytest.approx(started[0]["weight_sum"], abs=1e-3)
    assert first_updates[1]["weight_sum"] != pytest.approx(started[0]["weight_sum"], abs=1e-3)
    assert updates[-1]["weight_sum"] != pytest.approx(updates[0]["weight_sum"], abs=1e-3)
    assert updates[-1]["requests"] > 0
    # the run's metrics file (verl's file logger, beside the checkpoints) holds both steps after the
    # resume, with uniagent's figures, as the dashboard's training page reads it; progress lines printed
    from uniagent.dashboard.training import read_metrics_live

    rows, _ = read_metrics_live(ckpt / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("uniagent/trainable_frac" in r for r in rows), rows
    assert "[uniagent] step 1/2 |" in killed.log and "[uniagent] step 2/2 |" in resumed.log
    shutil.rmtree(ckpt)  # ~1.6 GB of model and optimizer state; kept when an assertion fails


# -- verl's fully-async trainer, GSPO with partial rollout, 2 trainer steps --------------------------
@pytest.mark.slow
def test_verl_cpu_fully_async_gspo_resumes_a_turn_across_a_weight_sync(tmp_path: Path) -> None:
    """`fully_async_main` on CPU: a standalone uniagent_local replica, weights through the uniagent_ray
    checkpoint engine, GSPO, partial rollout. One prompt (x2 samples) per trainer step and at most
    one prompt in flight, so the second prompt generates while the trainer takes step 1; the engine is
    paced (`step_delay_s`) so that generation outlasts the step whatever the machine, and the weight
    sync after step 1 aborts it mid-turn. It must resume under version 1 and be what step 2 trains on
    (verl's `fully_async/partial/*`), and no trained sample may be staler than the bound."""
    run = run_recipe(
        tmp_path,
        "multiturn_gspo_fully_async_cpu",
        [
            "+actor_rollout_ref.rollout.engine_kwargs.uniagent_local.step_delay_s=2.0",
            "+uniagent.agent.max_turns=2",  # bounds the first prompt's episodes (the pace makes turns slow)
            "trainer.logger=[console,file]",
            "actor_rollout_ref.actor.entropy_coeff=0.001",  # a gradient even when a group ties
        ],
    )
    assert run.returncode == 0, run.log[-6000:]
    metrics = read_metrics(tmp_path / "metrics.jsonl")
    trained = [m for m in metrics if "actor/grad_norm" in m["data"]]
    aborts = [e for e in run.events_of("abort") if e["request_ids"]]
    updates = run.events_of("update")
    keys = (
        "actor/grad_norm",
        "actor/pg_loss",
        "critic/score/mean",
        "response_length/mean",
        "num_turns/mean",
        "fully_async/partial/total_partial_num",
        "fully_async/partial/max_partial_span",
        "fully_async/count/stale_trajectory_processed",
        "fully_async/count/staleness_samples",
        "fully_async/count/current_param_version",
        "rollout_corr/rollout_is_mean",
        "timing_s/gen",
        "timing_s/old_log_prob",
        "timing_s/update_actor",
        "timing_s/timing_s/param_sync",  # sic: verl prefixes the name twice
        "timing_s/step",
    )
    summary = {
        "wall_s": round(run.wall_s, 1),
        "peak_rss_gib": run.peak_rss_gib,
        "peak_pss_gib": run.peak_pss_gib,
        "trained": [{"step": m["step"], **{k: m["data"].get(k) for k in keys}} for m in trained],
        "aborts": aborts,
        "aborted": run.events_of("aborted"),
        "updates": [
            {k: u.get(k) for k in ("global_steps", "version", "interrupted", "seconds")} for u in updates
        ],
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))

    # the trainer took its 2 steps, each with a gradient; the rollout took every sync through the
    # object store (the initial one, then one per step)
    assert len(trained) == 2, [m["step"] for m in metrics]
    assert all(m["data"]["actor/grad_norm"] > 0 for m in trained)
    assert [u["global_steps"] for u in updates][:2] == [0, 1] and updates[-1]["version"] >= 2
    # a weight sync landed mid-generation: the server cut running requests short ...
    assert aborts, "no request was in flight at any weight sync"
    cut = run.events_of("aborted")
    assert cut and all(a["tokens"] > 0 for a in cut), cut
    # ... and each came back: verl's client re-sends prompt + the tokens so far (under a fresh request
    # id), and that continuation was sampled by the newer weights only
    for a in cut:
        resumed = [
            e
            for e in run.events_of("generated")
            if e["prompt_tokens"] == a["prompt_tokens"] + a["tokens"]
            and e["time"] > a["time"]
            and e["min_version"] > a["version"]
        ]
        assert resumed, (a, run.events_of("generated"))
    # ... and verl trained on it: a trajectory whose tokens span two policy versions
    assert max(m["data"]["fully_async/partial/total_partial_num"] for m in trained) >= 1
    assert max(m["data"]["fully_async/partial/max_partial_span"] for m in trained) >= 1
    # the staleness bound: samples started per policy version never exceed
    # required_samples x (1 + staleness_threshold) x trigger_parameter_sync_step = 1 x 2 x 1
    assert all(m["data"]["fully_async/count/staleness_samples"] <= 2 for m in trained)
