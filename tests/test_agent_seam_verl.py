"""The verl agent loop runs whatever agent `uniagent.agent_kind` names, through the one episode entry.

Real parts and the one fake (`EngineServer`, verl's LLMServerClient stand-in) as in test_verl_loop.py,
whose helpers this uses; the agent is test_agent_seam.py's registered `ProbeAgent`.
"""

from __future__ import annotations

from conftest import needs_bwrap, require_module

require_module("verl", "verl is the training backend (pip install -e .[verl])")

from test_agent_seam import probe  # noqa: E402,F401  (the fixture that registers the probe agent)
from test_verl_loop import (  # noqa: E402,F401  (fixtures, then helpers)
    GOLD,
    EngineServer,
    base_config,
    data_dir,
    dataset_batch,
    make_config,
    make_worker,
    run,
    scripted_engine,
    tokenizer,
)
from uniagent.tokens import ChatCodec  # noqa: E402

pytestmark = needs_bwrap


def test_the_verl_loop_runs_a_registered_agent(base_config, tokenizer, data_dir, probe) -> None:  # noqa: F811
    codec = ChatCodec(tokenizer)
    server = EngineServer(scripted_engine(codec, {}))
    config = make_config(base_config, uniagent={"agent_kind": "probe"})
    worker = make_worker(config, server, tokenizer)
    out = run(worker, dataset_batch(data_dir, config, tokenizer, [GOLD]))

    nt = out.non_tensor_batch
    assert list(nt["exit_reason"]) == ["finished"] and list(nt["instance_id"]) == [GOLD]
    assert [e for e, _ in probe] == ["start", "run", "close"]
    assert probe[0][1] == ("VerlEngine", True, None), "the agent got this sample's engine"
    assert probe[1][1] == (GOLD, "TokenChatModel")
    assert not server.calls, "the probe never asks the model"
