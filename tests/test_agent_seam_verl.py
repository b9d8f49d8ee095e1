"""The verl agent loop runs whatever agent `uniagent.agent.kind` names, through the one episode entry.

Real parts and the one fake (`EngineServer`, verl's LLMServerClient stand-in) as in test_verl_loop.py,
whose helpers this uses; the agent is test_agent_seam.py's registered `ProbeAgent`.
"""

from __future__ import annotations

from conftest import needs_bwrap, require_module

require_module("verl", "verl is the training backend (pip install -e .[verl])")

from test_agent_seam import ProbeAgent, mini_turns, probe  # noqa: E402,F401  (probe: the fixture registering it)
from test_verl_loop import (  # noqa: E402,F401  (fixtures, then helpers)
    GOLD,
    EngineServer,
    base_config,
    by_instance,
    calls_of,
    check_against_calls,
    data_dir,
    dataset_batch,
    make_config,
    make_worker,
    run,
    scripted_engine,
    starter,
    tokenizer,
    unpad,
)
from uniagent.tokens import ChatCodec  # noqa: E402

pytestmark = needs_bwrap


def test_the_verl_loop_runs_a_registered_agent(base_config, tokenizer, data_dir, probe) -> None:  # noqa: F811
    codec = ChatCodec(tokenizer)
    server = EngineServer(scripted_engine(codec, {}))
    # the shared model section acts in the loop too: history and template_tools reach the model
    section = {"agent": {"kind": "probe"}, "model": {"history": "template", "template_tools": False}}
    config = make_config(base_config, uniagent=section)
    worker = make_worker(config, server, tokenizer)
    out = run(worker, dataset_batch(data_dir, config, tokenizer, [GOLD]))

    nt = out.non_tensor_batch
    assert list(nt["exit_reason"]) == ["finished"] and list(nt["instance_id"]) == [GOLD]
    assert [e for e, _ in probe] == ["start", "run", "close"]
    assert probe[0][1] == ("VerlEngine", True, None), "the agent got this sample's engine"
    assert probe[1][1] == (GOLD, "TokenChatModel")
    assert [(m.follow_template, m.native_tools) for m in ProbeAgent.MODELS] == [(True, False)]
    assert not server.calls, "the probe never asks the model"


def test_the_verl_loop_runs_mini_swe_agent(base_config, tokenizer, data_dir) -> None:  # noqa: F811
    """A harness agent under verl: a gateway over the sample's VerlEngine, mini-swe-agent's scripted
    gold fix, the task's verifier; what verl gets is the exact token record of its requests."""
    codec = ChatCodec(tokenizer)
    server = EngineServer(scripted_engine(codec, {GOLD: mini_turns(starter(GOLD))}), by_instance)
    config = make_config(base_config, uniagent={"agent": {"kind": "mini-swe-agent"}})
    worker = make_worker(config, server, tokenizer)
    out = run(worker, dataset_batch(data_dir, config, tokenizer, [GOLD]))

    nt = out.non_tensor_batch
    assert list(nt["exit_reason"]) == ["finished"], nt["error"]
    assert list(nt["resolved"]) == [1.0] and list(nt["trainable"]) == [True]
    sample = unpad(out, 0)
    calls = calls_of(server, nt["request_id"][0])
    assert len(calls) == 2, "one sticky request id for the harness's whole episode"
    check_against_calls(sample, calls)
    assert sample["score"] == 1.0
