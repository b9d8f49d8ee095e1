"""`uniagent tokens check`: a tokenizer folder's end-of-turn, BOS, template kind and codec action."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import real_tokenizers as real
from conftest import SHARED_TEMPLATES, require
from uniagent.cli import app


def test_json_report_of_a_stateful_template() -> None:
    result = CliRunner().invoke(app, ["tokens", "check", str(real.folder("deepseek_v3")), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert [t["text"] for t in report["end_of_turn"]] == ["<｜end▁of▁sentence｜>"]
    assert report["bos"].startswith("<｜begin▁of▁sentence｜> once, written by the template")
    assert (report["kind"], report["codec_action"], report["at_message"]) == ("stateful", "re-render", 4)
    # the generic fast tokenizer, not the config's class that drops spaces
    assert report["tokenizer_class"] != "LlamaTokenizer"


def test_table_with_a_shared_template_and_a_folder_without_one(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from uniagent.models import token_report

    # the tokenizers this session already loaded (the same loader): the load is the slow part
    loaded = {str(real.folder(f)): real.tokenizer(f) for f in ("deepseek_v3", "gptoss")}
    monkeypatch.setattr(token_report, "load_tokenizer", lambda source: loaded[source.path])
    v31 = SHARED_TEMPLATES / "deepseek-ai-DeepSeek-V3.1.jinja"
    require("the shared chat templates", v31.is_file(), f"{v31} is missing")
    folder = str(real.folder("deepseek_v3"))
    result = CliRunner().invoke(app, ["tokens", "check", folder, "--template", str(v31)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "append_only" in result.output and "fast path" in result.output
    assert "<｜Assistant｜><think></think>" in result.output  # the generation prompt
    result = CliRunner().invoke(app, ["tokens", "check", str(real.folder("gptoss"))])
    assert result.exit_code != 0
    assert "no chat template" in str(result.exception) and "--template FILE" in str(result.exception)


def test_the_report_says_where_a_replys_answer_and_reasoning_go() -> None:
    """Qwen3's own template: the answer after the think block, reasoning in `reasoning_content`."""
    result = CliRunner().invoke(app, ["tokens", "check", str(real.folder("qwen3")), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    said = (report["reply_head"], report["reasoning_field"])
    assert said == ("<think>\n\n</think>\n\n", "reasoning_content")
