"""The harness agents: third-party agents run as black boxes through a gateway session.

Each is an `Agent` of the registry (agent/registry.py): `mini-swe-agent` (mini_swe_agent.py, run
in-process with its commands in our sandbox, mini_environment.py), and the real CLIs inside the
episode's sandbox, `claude-code` and `codex` (claude_code.py and codex.py over cli_agent.py;
forward.py is the stdlib relay Codex runs in there). What they share, the episode's gateway
session and its token record, is session.py. The gateway below (`uniagent.gateway`) knows
sessions, not tasks or agents; grading is `run_episode`'s, never a harness's.

Nothing is imported here: each module loads its own heavy dependencies (mini-swe-agent, uvicorn)
only when its agent is chosen.
"""
