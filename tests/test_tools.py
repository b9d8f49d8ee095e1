"""Tool contract, registry, `bash`, `submit` and `finish`, run in a real sandbox."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tools_sandbox import open_sandbox
from uniagent.errors import ToolError
from uniagent.parsers import get_parser
from uniagent.parsers.base import normalize_tools
from uniagent.tools import (
    BashTool,
    EditorTool,
    FinishTool,
    SubmitTool,
    Tool,
    ToolResult,
    available_tools,
    build_tools,
    get_tool,
    install_tool_scripts,
)


@pytest.fixture
async def sb(tmp_path):
    async with open_sandbox(tmp_path) as box:
        yield box


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


# -- schemas ------------------------------------------------------------------------------
def test_builtin_specs_are_accepted_by_the_parsers():
    tools = build_tools(["bash", "str_replace_editor", "submit", "finish"])
    tools.append(get_tool("search", url="http://127.0.0.1:9/search"))
    specs = [t.spec() for t in tools]
    normalized = normalize_tools(specs)
    assert normalized is not None and list(normalized) == [
        "bash",
        "str_replace_editor",
        "submit",
        "finish",
        "search",
    ]
    for parser in ("hermes", "xml"):
        assert "str_replace_editor" in get_parser(parser).format_instructions(specs)


def test_schema_is_generated_from_the_args_model():
    params = EditorTool.parameters()
    assert params["type"] == "object"
    assert params["required"] == ["command", "path"]
    assert params["additionalProperties"] is False
    assert params["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo_edit"]
    # Optional fields read as their plain type, not anyOf[..., null]; no pydantic titles.
    assert params["properties"]["view_range"]["type"] == "array"
    assert params["properties"]["insert_line"] == {
        "type": "integer",
        "minimum": 0,
        "description": params["properties"]["insert_line"]["description"],
    }
    assert "title" not in json.dumps(params)
    bash = BashTool(max_timeout_s=90).with_command_timeout(30).spec()["function"]
    assert bash["parameters"]["properties"]["timeout"]["type"] == "number"
    assert "default 30s" in bash["description"] and "at most 90s" in bash["description"]
    assert SubmitTool.parameters() == {"type": "object", "properties": {}, "additionalProperties": False}


# -- validation errors become observations ------------------------------------------------
async def test_missing_and_unknown_arguments_are_explained(sb):
    res = await EditorTool().call({"comand": "view"}, sb)
    assert res.status == "error" and not res.done
    assert "`command` is required but missing (expected one of" in res.text
    assert "`path` is required but missing (expected string)" in res.text
    assert "`comand` is not a parameter of `str_replace_editor`; allowed: command, path" in res.text
    assert "- command (one of" in res.text and "required)" in res.text
    assert "- view_range (array of integer, optional)" in res.text
    assert "Call `str_replace_editor` again" in res.text


async def test_wrong_types_and_values_are_explained(sb):
    res = await EditorTool().call({"command": "edit", "path": "x", "view_range": [1]}, sb)
    assert res.status == "error"
    assert "`command`: Input should be 'view', 'create'" in res.text and 'got "edit"' in res.text
    assert "`view_range`: List should have at least 2 items" in res.text
    res = await BashTool().call({"command": "ls", "timeout": "soon"}, sb)
    assert "`timeout`: Input should be a valid number" in res.text and 'got "soon"' in res.text


async def test_arguments_as_json_strings(sb):
    bash = BashTool()
    assert (await bash.call('{"command": "echo hi"}', sb)).text == "hi"
    bad = await bash.call('{"command": "echo hi"', sb)
    assert (
        bad.status == "error" and "not valid JSON" in bad.text and "- command (string, required)" in bad.text
    )
    arr = await bash.call("[1, 2]", sb)
    assert arr.status == "error" and "must be a JSON object, got list" in arr.text
    # No arguments at all is an empty object: fine for submit, a missing field for bash.
    assert (await SubmitTool().call("", sb)).done
    assert "`command` is required" in (await bash.call(None, sb)).text


# -- registry -----------------------------------------------------------------------------
def test_registry_builds_by_name_and_mapping(tmp_path):
    tools = build_tools(["bash", {"name": "submit", "base_ref": "HEAD"}, FinishTool()])
    assert [t.name for t in tools] == ["bash", "submit", "finish"]
    assert isinstance(tools[1], SubmitTool) and tools[1].config.base_ref == "HEAD"
    assert {"bash", "str_replace_editor", "submit", "finish", "search"} <= set(available_tools())


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["bsh"], "unknown tool 'bsh'; known: bash, str_replace_editor, submit, finish, search"),
        ([{"name": "bash", "timeout": 3}], "tool 'bash' config: timeout: Extra inputs are not permitted"),
        ([{"name": "bash", "max_timeout_s": -1}], "max_timeout_s: Input should be greater than 0"),
        ([{"corpus": "x"}], "tools[0]: a tool given as a mapping needs a `name`"),
        (["bash", "bash"], "tools[1]: tool 'bash' is listed twice"),
        ([3], "tools[0]: expected a tool name or a mapping"),
        ([{"name": "search"}], "set exactly one of `corpus`"),
        (
            [{"name": "search", "corpus": "/nonexistent/c.jsonl"}],
            "corpus /nonexistent/c.jsonl does not exist",
        ),
    ],
)
def test_registry_errors_say_what_to_fix(specs, message):
    with pytest.raises(ToolError) as err:
        build_tools(specs)
    assert message in str(err.value)


def test_bad_config_names_allowed_keys():
    with pytest.raises(ToolError, match=r"allowed config keys: max_timeout_s, session"):
        get_tool("bash", time=3)


# -- bash ---------------------------------------------------------------------------------
async def test_bash_session_persists_and_reports_exit_codes(sb):
    bash = BashTool()
    res = await bash.call({"command": "mkdir -p sub && cd sub && export X=42 && echo $X"}, sb)
    assert res.ok and res.text == "42" and res.metadata["exit_code"] == 0
    res = await bash.call({"command": "pwd; echo $X"}, sb)
    assert res.text.endswith("/sub\n42")
    res = await bash.call({"command": "(echo oops >&2; exit 3)"}, sb)
    assert res.status == "ok" and res.text == "oops\n[exit code 3]" and res.metadata["exit_code"] == 3
    res = await bash.call({"command": "ls /nonexistent-dir"}, sb)
    assert res.status == "ok" and res.text.endswith("[exit code 2]") and "No such file" in res.text


async def test_bash_no_output_and_empty_command(sb):
    bash = BashTool()
    assert (await bash.call({"command": "true"}, sb)).text == "[the command produced no output]"
    res = await bash.call({"command": "false"}, sb)
    assert res.text == "[the command produced no output]\n[exit code 1]"
    res = await bash.call({"command": "   "}, sb)
    assert res.status == "error" and "The command is empty" in res.text


async def test_bash_timeout_is_reported_and_capped(sb):
    bash = BashTool(max_timeout_s=0.6).with_command_timeout(0.3)
    res = await bash.call({"command": "echo started; sleep 30"}, sb)
    assert res.status == "timeout" and res.metadata["timed_out"]
    assert res.text.startswith("started\n") and "[the command timed out after 0.3s" in res.text
    assert "pass a larger `timeout` (at most 0.6s)" in res.text
    res = await bash.call({"command": "sleep 30", "timeout": 300}, sb)
    assert res.status == "timeout"
    assert "[timeout 300s is above the maximum; the command ran with 0.6s]" in res.text
    assert res.metadata["duration_s"] < 5
    # The session survived the interruption.
    assert (await bash.call({"command": "echo alive"}, sb)).text == "alive"


async def test_bash_output_is_clipped_by_the_sandbox(tmp_path):
    async with open_sandbox(tmp_path, max_output_chars=1000) as box:
        res = await BashTool().call({"command": "seq 1 100000"}, box)
    assert res.metadata["clipped"] and len(res.text) < 1500
    assert res.text.startswith("1\n2\n") and res.text.endswith("100000")


# -- tool-as-bash -------------------------------------------------------------------------
async def test_installed_editor_runs_from_a_shell(sb, tmp_path):
    tools = build_tools(["bash", "str_replace_editor", "submit"])
    paths = await install_tool_scripts(sb, tools)
    assert paths == [f"{sb.tools_dir}/str_replace_editor"]
    bash = tools[0]
    res = await bash.call({"command": "str_replace_editor create demo.py --file_text 'a = 1\nb = 2\n'"}, sb)
    assert res.ok and "File created successfully" in res.text
    res = await bash.call(
        {"command": "str_replace_editor str_replace demo.py --old_str 'b = 2' --new_str 'b = 3'"}, sb
    )
    assert "has been edited" in res.text and "     2\tb = 3" in res.text
    assert (tmp_path / "demo.py").read_text() == "a = 1\nb = 3\n"
    res = await bash.call({"command": "str_replace_editor view demo.py --view_range 2 -1"}, sb)
    assert res.text.endswith("     2\tb = 3")
    res = await bash.call({"command": "str_replace_editor str_replace demo.py --old_str nope"}, sb)
    assert "matched 0 times" in res.text and res.text.endswith("[exit code 1]")
    res = await bash.call({"command": "str_replace_editor view"}, sb)
    assert "give a command and a path" in res.text and res.text.endswith("[exit code 2]")


# -- submit / finish ----------------------------------------------------------------------
def make_repo(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    (root / "app.py").write_text("def f():\n    return 1\n")
    (root / "gone.txt").write_text("bye\n")
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / ".gitignore").write_text("*.log\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")


async def test_submit_patch_has_changes_and_new_files_and_keeps_the_index(sb, tmp_path):
    make_repo(tmp_path)
    await install_tool_scripts(sb, [EditorTool()])  # must not end up in the patch
    (tmp_path / "app.py").write_text("def f():\n    return 2\n")
    (tmp_path / "crlf.txt").write_bytes(b"one\r\nTWO\r\n")
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "new.py").write_text("NEW = True\n")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "debug.log").write_text("ignored\n")
    git(tmp_path, "add", "app.py")  # something staged by the model stays staged
    index_before = (tmp_path / ".git" / "index").read_bytes()
    status_before = git(tmp_path, "status", "--porcelain")

    res = await SubmitTool(base_ref="HEAD").call({}, sb)

    assert res.done and res.ok and res.patch and res.text.startswith("Submitted.")
    patch = res.patch
    assert "+    return 2" in patch and "pkg/new.py" in patch and "GIT binary patch" in patch
    assert "deleted file mode" in patch and "gone.txt" in patch
    assert "debug.log" not in patch and ".uniagent" not in patch and "str_replace_editor" not in patch
    assert (tmp_path / ".git" / "index").read_bytes() == index_before
    assert git(tmp_path, "status", "--porcelain") == status_before

    # The patch is byte-exact: applied to a fresh checkout of the base it reproduces the tree.
    clone = tmp_path.parent / (tmp_path.name + "-clone")
    git(tmp_path.parent, "clone", "-q", str(tmp_path), str(clone))
    (clone / "p.diff").write_bytes(patch.encode("utf-8", "surrogateescape"))
    git(clone, "apply", "--binary", "p.diff")
    for rel in ("app.py", "crlf.txt", "pkg/new.py", "blob.bin"):
        assert (clone / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel
    assert not (clone / "gone.txt").exists()


async def test_submit_sees_a_same_size_edit_made_in_the_second_of_the_checkout(sb, tmp_path):
    # git compares a file's cached stat (whole seconds) unless the file is as new as the index: an
    # edit of the same size within the checkout's second is found only by content.
    for _ in range(20):
        shutil.rmtree(tmp_path / ".git", ignore_errors=True)
        make_repo(tmp_path)
        (tmp_path / "app.py").write_text("def f():\n    return 2\n")  # same size as "return 1"
        index = (tmp_path / ".git" / "index").stat()
        if int((tmp_path / "app.py").stat().st_ctime) == int(index.st_mtime):
            break
    else:
        pytest.skip("could not edit within the checkout's second")
    time.sleep(1.1)  # a copy of the index made now is newer than the edit
    res = await SubmitTool(base_ref="HEAD").call({}, sb)
    assert res.done and res.patch and "+    return 2" in res.patch


async def test_submit_without_changes_without_ref_and_with_a_bad_ref(sb, tmp_path):
    make_repo(tmp_path)
    res = await SubmitTool(base_ref="HEAD").call({}, sb)
    assert res.done and res.patch == "" and "with no changes" in res.text
    res = await SubmitTool().call({}, sb)
    assert res.done and res.patch is None
    res = await SubmitTool(base_ref="no-such-ref").call({}, sb)
    assert res.done and res.status == "error" and res.patch is None
    assert "no-such-ref" in res.metadata["patch_error"]
    res = await SubmitTool().call({"patch": "x"}, sb)
    assert not res.done and "`patch` is not a parameter of `submit`; allowed: none" in res.text


async def test_submit_in_a_subdirectory_repo(sb, tmp_path):
    make_repo(tmp_path / "repo")
    (tmp_path / "repo" / "app.py").write_text("changed\n")
    res = await SubmitTool(base_ref="HEAD", repo_dir="repo", exclude=["gone.txt"]).call({}, sb)
    assert res.ok and "+changed" in res.patch


async def test_finish_ends_with_the_answer(sb):
    res = await FinishTool().call({"answer": "Paris"}, sb)
    assert res == ToolResult("Answer recorded. The task is over.", done=True, answer="Paris")
    res = await FinishTool().call({}, sb)
    assert not res.done and "`answer` is required" in res.text


class Echo(Tool):
    """A tool defined outside the package: the contract is all it needs."""

    name = "echo"
    description = "Echo the text."

    async def run(self, args, sandbox):
        return ToolResult("echo")


async def test_custom_tool_without_args_rejects_extra_arguments(sb):
    res = await Echo().call({"text": "x"}, sb)
    assert res.status == "error" and "allowed: none" in res.text
    assert (await Echo().call({}, sb)).text == "echo"
    with pytest.raises(ToolError, match="has no script"):
        await Echo().ensure_script(sb)
