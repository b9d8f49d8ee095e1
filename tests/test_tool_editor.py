"""`str_replace_editor` in a real sandbox: every command and every error the model can hit."""

from __future__ import annotations

import pytest

from tools_sandbox import open_sandbox
from uniagent.tools import BashTool, EditorTool

SOURCE = "".join(f"line {i}\n" for i in range(1, 21))


@pytest.fixture
async def sb(tmp_path):
    async with open_sandbox(tmp_path) as box:
        yield box


@pytest.fixture
def ed():
    return EditorTool()


async def edit(tool, sb, **args):
    return await tool.call(args, sb)


# -- view ---------------------------------------------------------------------------------
async def test_view_file_with_line_numbers_and_ranges(ed, sb, tmp_path):
    (tmp_path / "f.txt").write_text(SOURCE)
    res = await edit(ed, sb, command="view", path="f.txt")
    assert res.ok
    assert res.text.startswith(f"Here is the result of running `cat -n` on {sb.workdir}/f.txt:\n")
    assert "     1\tline 1\n     2\tline 2\n" in res.text and res.text.endswith("    20\tline 20")
    res = await edit(ed, sb, command="view", path="f.txt", view_range=[18, -1])
    assert res.text.splitlines()[1:] == ["    18\tline 18", "    19\tline 19", "    20\tline 20"]
    res = await edit(ed, sb, command="view", path="f.txt", view_range=[3, 4])
    assert res.text.splitlines()[1:] == ["     3\tline 3", "     4\tline 4"]
    res = await edit(ed, sb, command="view", path="f.txt", view_range=[19, 99])
    assert res.ok and "[the file has only 20 lines; showed lines 19-20]" in res.text


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        ([0, 5], "view_range start 0 is out of range: {p} has 20 lines, so start must be between 1 and 20"),
        ([21, 30], "view_range start 21 is out of range"),
        ([5, 3], "view_range end 3 is before start 5. Use [start, end] with end >= start"),
    ],
)
async def test_view_bad_range(ed, sb, tmp_path, view_range, message):
    (tmp_path / "f.txt").write_text(SOURCE)
    res = await edit(ed, sb, command="view", path="f.txt", view_range=view_range)
    assert res.status == "error" and message.format(p=f"{sb.workdir}/f.txt") in res.text


async def test_view_range_must_be_two_numbers(ed, sb):
    res = await edit(ed, sb, command="view", path="f.txt", view_range=[1, 2, 3])
    assert res.status == "error" and "`view_range`: List should have at most 2 items" in res.text


async def test_view_large_file_is_clipped_with_a_hint(sb, tmp_path):
    (tmp_path / "big.txt").write_text("".join(f"{'x' * 40} {i}\n" for i in range(1, 501)))
    res = await edit(EditorTool(max_view_chars=2000), sb, command="view", path="big.txt")
    assert res.ok and len(res.text) < 2600
    last = int(res.text.split("[clipped: showed lines 1-")[1].split(" ")[0])
    assert 30 < last < 50
    assert f"View the rest with view_range, e.g. [{last + 1}, {2 * last}]" in res.text
    assert "grep -n" in res.text


async def test_view_directory_two_levels_without_hidden(ed, sb, tmp_path):
    for rel in (
        "src/pkg/mod.py",
        "src/pkg/deep/x.py",
        "src/top.py",
        "README.md",
        ".git/HEAD",
        "src/.cache/c",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    res = await edit(ed, sb, command="view", path=".")
    w = sb.workdir
    listed = res.text.splitlines()[2:]
    assert f"{w}/src/" in listed and f"{w}/src/pkg/" in listed and f"{w}/src/top.py" in listed
    assert f"{w}/README.md" in listed
    assert not any("mod.py" in x or "deep" in x or ".git" in x or ".cache" in x for x in listed)
    res = await edit(ed, sb, command="view", path="src", view_range=[1, 2])
    assert res.status == "error" and "is a directory" in res.text


async def test_view_missing_and_binary_files(ed, sb, tmp_path):
    (tmp_path / "there.py").write_text("")
    res = await edit(ed, sb, command="view", path="not_there.py")
    assert res.status == "error"
    assert f"The path {sb.workdir}/not_there.py does not exist" in res.text
    assert "there.py" in res.text and "use `create`" in res.text
    assert (await edit(ed, sb, command="view", path="there.py")).text.endswith("is empty.")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02")
    res = await edit(ed, sb, command="view", path="b.bin")
    assert res.status == "error" and "looks binary" in res.text and "xxd" in res.text


# -- create -------------------------------------------------------------------------------
async def test_create_makes_parents_and_refuses_to_overwrite(ed, sb, tmp_path):
    res = await edit(ed, sb, command="create", path="pkg/sub/new.py", file_text="A = 1\n")
    assert res.ok and "File created successfully" in res.text
    assert (tmp_path / "pkg/sub/new.py").read_text() == "A = 1\n"
    res = await edit(ed, sb, command="create", path="pkg/sub/new.py", file_text="B = 2\n")
    assert res.status == "error" and "already exists" in res.text and "Use `str_replace`" in res.text
    assert (tmp_path / "pkg/sub/new.py").read_text() == "A = 1\n"
    res = await edit(ed, sb, command="create", path="other.py")
    assert res.status == "error" and "`create` needs `file_text`" in res.text


async def test_create_large_file_goes_through_a_request_file(ed, sb, tmp_path):
    text = "".join(f"value_{i} = {i}\n" for i in range(20_000))  # ~300 KB: too big for argv
    res = await edit(ed, sb, command="create", path="large.py", file_text=text)
    assert res.ok, res.text
    assert (tmp_path / "large.py").read_text() == text


# -- str_replace --------------------------------------------------------------------------
async def test_str_replace_once_shows_snippet(ed, sb, tmp_path):
    (tmp_path / "f.txt").write_text(SOURCE)
    res = await edit(ed, sb, command="str_replace", path="f.txt", old_str="line 10\n", new_str="ten\nTEN\n")
    assert res.ok
    assert "has been edited" in res.text
    assert "     9\tline 9\n    10\tten\n    11\tTEN\n    12\tline 11" in res.text
    assert "     5\tline 5" not in res.text  # only a few lines of context
    assert (tmp_path / "f.txt").read_text() == SOURCE.replace("line 10\n", "ten\nTEN\n")
    res = await edit(ed, sb, command="str_replace", path="f.txt", old_str="TEN\n")
    assert res.ok and "TEN" not in (tmp_path / "f.txt").read_text()


async def test_str_replace_no_match_hints_at_whitespace(ed, sb, tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    if x:\n        return 1\n")
    res = await edit(ed, sb, command="str_replace", path="m.py", old_str="if x:\n    return 1", new_str="")
    assert res.status == "error"
    assert "old_str matched 0 times" in res.text and "whitespace and indentation" in res.text
    assert "Ignoring differences in whitespace it would match lines 2-3" in res.text
    assert "     2\t    if x:\n     3\t        return 1" in res.text
    res = await edit(ed, sb, command="str_replace", path="m.py", old_str="def f():\n    pass")
    assert "The first line of old_str appears near these lines" in res.text and "     1\tdef f():" in res.text
    res = await edit(ed, sb, command="str_replace", path="m.py", old_str="nothing like it")
    assert "matched 0 times" in res.text and "appears near" not in res.text
    assert (tmp_path / "m.py").read_text() == "def f():\n    if x:\n        return 1\n"


async def test_str_replace_several_matches_lists_lines(ed, sb, tmp_path):
    (tmp_path / "d.py").write_text("x = 1\ny = 2\nx = 1\n\nx = 1\n")
    res = await edit(ed, sb, command="str_replace", path="d.py", old_str="x = 1", new_str="x = 0")
    assert res.status == "error"
    assert "old_str matched 3 times" in res.text and "(starting at lines 1, 3, 5)" in res.text
    assert "add surrounding lines" in res.text


async def test_str_replace_other_errors(ed, sb, tmp_path):
    (tmp_path / "s.py").write_text("a\n")
    res = await edit(ed, sb, command="str_replace", path="s.py", new_str="b")
    assert res.status == "error" and "needs a non-empty `old_str`" in res.text and "`insert`" in res.text
    res = await edit(ed, sb, command="str_replace", path="s.py", old_str="a", new_str="a")
    assert res.status == "error" and "the same" in res.text
    res = await edit(ed, sb, command="str_replace", path="missing.py", old_str="a", new_str="b")
    assert res.status == "error" and "does not exist" in res.text
    res = await edit(ed, sb, command="str_replace", path=".", old_str="a", new_str="b")
    assert res.status == "error" and "is a directory" in res.text


async def test_str_replace_keeps_crlf_and_file_mode(ed, sb, tmp_path):
    target = tmp_path / "w.bat"
    target.write_bytes(b"echo one\r\necho two\r\n")
    target.chmod(0o755)
    res = await edit(
        ed, sb, command="str_replace", path="w.bat", old_str="echo one\necho two", new_str="echo 1\necho 2"
    )
    assert res.ok, res.text
    assert target.read_bytes() == b"echo 1\r\necho 2\r\n"
    assert target.stat().st_mode & 0o777 == 0o755


# -- insert -------------------------------------------------------------------------------
async def test_insert_at_top_middle_and_end(ed, sb, tmp_path):
    (tmp_path / "i.txt").write_text("a\nb\n")
    assert (await edit(ed, sb, command="insert", path="i.txt", insert_line=0, new_str="top")).ok
    res = await edit(ed, sb, command="insert", path="i.txt", insert_line=2, new_str="m1\nm2\n")
    assert res.ok and "     3\tm1\n     4\tm2\n     5\tb" in res.text
    assert (await edit(ed, sb, command="insert", path="i.txt", insert_line=5, new_str="end")).ok
    assert (tmp_path / "i.txt").read_text() == "top\na\nm1\nm2\nb\nend\n"


async def test_insert_errors(ed, sb, tmp_path):
    (tmp_path / "i.txt").write_text("a\nb\n")
    res = await edit(ed, sb, command="insert", path="i.txt", insert_line=3, new_str="x")
    assert res.status == "error"
    assert (
        "insert_line 3 is out of range" in res.text and "between 0 (before the first line) and 2" in res.text
    )
    res = await edit(ed, sb, command="insert", path="i.txt", insert_line=-1, new_str="x")
    assert res.status == "error" and "`insert_line`: Input should be greater than or equal to 0" in res.text
    res = await edit(ed, sb, command="insert", path="i.txt", new_str="x")
    assert res.status == "error" and "`insert` needs `insert_line`" in res.text
    res = await edit(ed, sb, command="insert", path="i.txt", insert_line=1)
    assert res.status == "error" and "`insert` needs `new_str`" in res.text
    assert (tmp_path / "i.txt").read_text() == "a\nb\n"


# -- undo_edit ----------------------------------------------------------------------------
async def test_undo_steps_back_through_edits_then_refuses(ed, sb, tmp_path):
    target = tmp_path / "u.py"
    target.write_text("v = 1\n")
    await edit(ed, sb, command="str_replace", path="u.py", old_str="v = 1", new_str="v = 2")
    await edit(ed, sb, command="insert", path="u.py", insert_line=1, new_str="w = 3")
    assert target.read_text() == "v = 2\nw = 3\n"
    res = await edit(ed, sb, command="undo_edit", path="u.py")
    assert res.ok and "Last edit to" in res.text and "     1\tv = 2" in res.text
    assert target.read_text() == "v = 2\n"
    await edit(ed, sb, command="undo_edit", path="u.py")
    assert target.read_text() == "v = 1\n"
    res = await edit(ed, sb, command="undo_edit", path="u.py")
    assert res.status == "error" and "nothing to undo" in res.text
    assert target.read_text() == "v = 1\n"


async def test_undo_of_create_removes_the_file(ed, sb, tmp_path):
    await edit(ed, sb, command="create", path="made.py", file_text="x\n")
    res = await edit(ed, sb, command="undo_edit", path="made.py")
    assert res.ok and "did not exist before" in res.text
    assert not (tmp_path / "made.py").exists()


async def test_undo_history_is_per_file(ed, sb, tmp_path):
    (tmp_path / "a.py").write_text("a\n")
    (tmp_path / "b.py").write_text("b\n")
    await edit(ed, sb, command="str_replace", path="a.py", old_str="a", new_str="A")
    res = await edit(ed, sb, command="undo_edit", path="b.py")
    assert res.status == "error" and "No edit history" in res.text
    assert (tmp_path / "a.py").read_text() == "A\n"


# -- paths and plumbing -------------------------------------------------------------------
async def test_relative_paths_use_the_workdir_not_the_shell_cwd(ed, sb, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.txt").write_text("root\n")
    await BashTool().call({"command": "cd sub"}, sb)
    res = await edit(ed, sb, command="view", path="root.txt")
    assert res.ok and "root" in res.text
    res = await edit(ed, sb, command="view", path=f"{sb.workdir}/root.txt")
    assert res.ok


async def test_text_that_would_break_a_shell_is_passed_verbatim(ed, sb, tmp_path):
    text = "echo \"$HOME\" `id` $(rm -rf /) 'q' \\n \u00e9\u4e2d\n"
    assert (await edit(ed, sb, command="create", path="odd.sh", file_text=text)).ok
    assert (tmp_path / "odd.sh").read_text() == text


async def test_a_deleted_script_is_reinstalled(ed, sb, tmp_path):
    (tmp_path / "f.txt").write_text("x\n")
    assert (await edit(ed, sb, command="view", path="f.txt")).ok
    if sb.kind == "local":
        pytest.skip("the local backend's tools directory is read-only inside the sandbox")
    await sb.exec(f"rm {sb.tools_dir}/str_replace_editor")
    res = await edit(ed, sb, command="view", path="f.txt")
    assert res.ok and "     1\tx" in res.text


async def test_editing_through_a_symlink_keeps_the_link(ed, sb, tmp_path):
    (tmp_path / "real.py").write_text("a = 1\n")
    (tmp_path / "link.py").symlink_to("real.py")
    assert (await edit(ed, sb, command="str_replace", path="link.py", old_str="a = 1", new_str="a = 2")).ok
    assert (tmp_path / "link.py").is_symlink()
    assert (tmp_path / "real.py").read_text() == "a = 2\n"


async def test_a_sandbox_without_python_gets_a_usable_message(ed, sb, tmp_path):
    (tmp_path / "f.txt").write_text("x\n")
    # Hide every interpreter from the tool's own shell session.
    await sb.exec("export PATH=/nonexistent", session="_tools")
    res = await edit(ed, sb, command="view", path="f.txt")
    assert res.status == "error" and "needs python3 in the sandbox" in res.text and "heredoc" in res.text
