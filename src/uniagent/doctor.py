"""What works on this machine: engines and sandbox backends, each with the reason when not."""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

Check = tuple[str, bool | None, str]


async def _sandbox(cfg: dict[str, Any]) -> tuple[bool, str]:
    from uniagent import sandbox

    try:
        async with sandbox.create({**cfg, "start_retries": 0, "start_timeout_s": 30}) as sb:
            res = await sb.exec("echo ok", timeout=20)
            return res.output.strip() == "ok", f"started in {sb.start_time_s or 0:.2f}s"
    except Exception as exc:
        return False, str(exc).splitlines()[0][:160]


async def run_checks() -> list[Check]:
    out: list[Check] = []
    try:
        from uniagent.models.loading import smollm2_source

        src = smollm2_source()
        out.append(("engine local (SmolLM2)", True, f"{src.path}/{src.gguf_file or ''}"))
    except Exception as exc:
        out.append(("engine local (SmolLM2)", False, str(exc)))
    import torch

    out.append(("torch", True, f"{torch.__version__}, cuda={'yes' if torch.cuda.is_available() else 'no'}"))
    key = bool(os.environ.get("OPENAI_API_KEY"))
    out.append(
        ("engine openai:URL", True, "openai SDK installed" + ("" if key else "; OPENAI_API_KEY not set"))
    )
    verl = importlib.util.find_spec("verl") is not None
    out.append(("verl", verl, "installed" if verl else "pip install 'uniagent[verl]'"))
    if shutil.which("bwrap"):
        ok, detail = await _sandbox({"type": "local"})
        out.append(("sandbox local (bubblewrap)", ok, detail))
    else:
        out.append(("sandbox local (bubblewrap)", False, "bwrap not found: apt-get install bubblewrap"))
    for runtime in ("docker", "podman", "apptainer"):
        exe = shutil.which(runtime)
        out.append((f"sandbox container ({runtime})", None if not exe else True, exe or "not installed"))
    swerex = importlib.util.find_spec("swerex") is not None
    out.append(("sandbox swerex", swerex, "swe-rex installed" if swerex else "pip install swe-rex"))
    modal = importlib.util.find_spec("modal") is not None
    has_cred = bool(os.environ.get("MODAL_TOKEN_ID")) or os.path.exists(os.path.expanduser("~/.modal.toml"))
    detail = (
        "SDK and credentials present"
        if modal and has_cred
        else ("no credentials (modal token new)" if modal else "pip install 'uniagent[modal]'")
    )
    out.append(("sandbox modal", modal and has_cred if modal else None, detail))
    ray = importlib.util.find_spec("ray") is not None
    out.append(("runner backend ray", ray, "installed" if ray else "pip install ray"))
    return out
