#!/usr/bin/env python3
"""str_replace_editor: view, create and edit text files; every message tells a model what to do next.

Runs inside a sandbox with any python3 (3.6+, standard library only), so it stays one file
with no imports from uniagent. Two ways in:

  str_replace_editor view PATH [--view_range START END]
  str_replace_editor create PATH --file_text TEXT
  str_replace_editor str_replace PATH --old_str OLD [--new_str NEW]
  str_replace_editor insert PATH --insert_line N --new_str TEXT
  str_replace_editor undo_edit PATH

or `--json-b64 B64` / `--json-file FILE` with the same fields as a JSON object (what the
uniagent tool sends, so no argument ever needs shell quoting). Exit status: 0 done, 1 the
request was wrong (the message says how to fix it), 2 bad command line, 3 internal error.

Undo history lives in $UNIAGENT_EDITOR_STATE (default /tmp/.uniagent_editor): one folder
per file path holding numbered snapshots, so it survives between calls and processes.
"""

import argparse
import base64
import hashlib
import json
import os
import shutil
import sys

STATE_DIR = os.environ.get("UNIAGENT_EDITOR_STATE", "/tmp/.uniagent_editor")
MAX_VIEW_CHARS = 16000
MAX_LINE_CHARS = 2000
SNIPPET_CONTEXT = 4
MAX_DIR_ENTRIES = 400
MAX_HISTORY = 20
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")


class EditorError(Exception):
    """A request the editor refuses; the message is shown to the model as is."""


# -- files ----------------------------------------------------------------------------------
def read_text(path):
    """Text of a file. Undecodable bytes survive a round trip (surrogateescape)."""
    if not os.path.exists(path):
        parent = os.path.dirname(path) or "."
        hint = ""
        if os.path.isdir(parent):
            near = sorted(n for n in os.listdir(parent) if not n.startswith("."))[:20]
            hint = "\nFiles in {}: {}".format(parent, ", ".join(near) if near else "(none)")
        raise EditorError(
            f"The path {path} does not exist. Check the path (view a directory to list it), "
            f"or use `create` to make a new file.{hint}"
        )
    if os.path.isdir(path):
        raise EditorError(
            f"The path {path} is a directory; this command needs a file. Use `view` on the directory "
            "to list its files."
        )
    with open(path, "rb") as fh:
        raw = fh.read()
    if b"\0" in raw[:8192]:
        raise EditorError(
            f"The file {path} looks binary; the editor only handles text. Inspect it with bash "
            f"instead (e.g. `xxd {path} | head`)."
        )
    return raw.decode("utf-8", errors="surrogateescape")


def write_text(path, text):
    """Write through a temp file and rename, so a failed write never leaves half a file."""
    data = text.encode("utf-8", errors="surrogateescape")
    path = os.path.realpath(path)  # edit a symlink's target; never replace the link itself
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    mode = None
    if os.path.exists(path):
        mode = os.stat(path).st_mode & 0o7777
    tmp = f"{path}.uaedit{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def split_lines(text):
    """Lines without their newline; a final newline does not make an extra empty line."""
    if not text:
        return []
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n")


def numbered(lines, first):
    """`cat -n` style: right-aligned line number, a tab, the line (very long lines clipped)."""
    out = []
    for i, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS] + f" [... line clipped, {len(line)} chars in all]"
        out.append(f"{first + i:6}\t{line}")
    return "\n".join(out)


def snippet(path, text, start, end):
    """Lines start..end (1-based) with some context, after an edit, so the model sees the result."""
    lines = split_lines(text)
    lo = max(1, start - SNIPPET_CONTEXT)
    hi = min(len(lines), end + SNIPPET_CONTEXT)
    body = numbered(lines[lo - 1 : hi], lo) if lines else "(the file is now empty)"
    return f"Here is a snippet of {path} (lines {lo}-{max(lo, hi)}, as `cat -n` shows them):\n{body}"


# -- history --------------------------------------------------------------------------------
def history_dir(path):
    return os.path.join(STATE_DIR, hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:24])


def push_history(path):
    """Snapshot the file as it is now (or its absence) before it changes."""
    folder = history_dir(path)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "path"), "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(path)
    steps = sorted(int(n.split(".")[0]) for n in os.listdir(folder) if n[0].isdigit())
    n = steps[-1] + 1 if steps else 1
    if os.path.isfile(path):
        shutil.copyfile(path, os.path.join(folder, f"{n}.bak"))
    else:
        open(os.path.join(folder, f"{n}.absent"), "w").close()
    for old in steps[: max(0, len(steps) + 1 - MAX_HISTORY)]:
        for suffix in (".bak", ".absent"):
            name = os.path.join(folder, f"{old}{suffix}")
            if os.path.exists(name):
                os.remove(name)


def pop_history(path):
    """Restore the last snapshot. Returns False when there is none."""
    folder = history_dir(path)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    steps = sorted((int(n.split(".")[0]), n) for n in names if n[0].isdigit())
    if not steps:
        return False
    _, name = steps[-1]
    snap = os.path.join(folder, name)
    if name.endswith(".absent"):
        if os.path.isfile(path):
            os.remove(path)
    else:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        shutil.copyfile(snap, path)
    os.remove(snap)
    return True


# -- commands -------------------------------------------------------------------------------
def view(path, view_range=None, max_chars=MAX_VIEW_CHARS):
    if os.path.isdir(path):
        if view_range is not None:
            raise EditorError(
                f"view_range only applies to files, and {path} is a directory. View it without "
                "view_range to list it, then view one of its files."
            )
        return view_dir(path)
    text = read_text(path)
    lines = split_lines(text)
    total = len(lines)
    start, end = 1, total
    note = ""
    if view_range is not None:
        if not isinstance(view_range, list) or len(view_range) != 2:
            raise EditorError(
                "view_range must be two integers [start, end], e.g. [10, 40] (end -1 means to the "
                f"end of the file); got {json.dumps(view_range)}."
            )
        start, end = view_range
        if total == 0:
            raise EditorError(f"The file {path} is empty; view it without view_range.")
        if not 1 <= start <= total:
            raise EditorError(
                f"view_range start {start} is out of range: {path} has {total} lines, so start must "
                f"be between 1 and {total}."
            )
        if end == -1:
            end = total
        elif end < start:
            raise EditorError(
                f"view_range end {end} is before start {start}. Use [start, end] with end >= start, or "
                "end -1 for the rest of the file."
            )
        elif end > total:
            note = f"\n[the file has only {total} lines; showed lines {start}-{total}]"
            end = total
    if total == 0:
        return f"The file {path} is empty."
    shown = []
    size = 0
    last = start - 1
    for i in range(start - 1, end):
        line = numbered([lines[i]], i + 1)
        if shown and size + len(line) + 1 > max_chars:
            break
        shown.append(line)
        size += len(line) + 1
        last = i + 1
    if last < end:
        nxt = min(end, last + (last - start + 1))
        note = (
            f"\n[clipped: showed lines {start}-{last} of {end} ({total} lines in the file). View the "
            f"rest with view_range, e.g. [{last + 1}, {nxt}], or find what you need with `grep -n`.]"
        )
    header = f"Here is the result of running `cat -n` on {path}:\n"
    return header + "\n".join(shown) + note


def view_dir(path):
    """Files and folders up to 2 levels deep, hidden ones left out."""
    entries = []
    base = path.rstrip("/") or "/"
    more = 0
    for root, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        names = [d + "/" for d in dirs] + sorted(f for f in files if not f.startswith("."))
        if root != base:
            dirs[:] = []  # this is level 1: list its entries (level 2), go no deeper
        for name in names:
            if len(entries) >= MAX_DIR_ENTRIES:
                more += 1
                continue
            entries.append(os.path.join(root, name))
    entries.sort()
    text = (
        f"Files and directories up to 2 levels deep in {base}, hidden items excluded:\n{base}\n"
        + "\n".join(entries)
    )
    if more:
        text += f"\n[... {more} more entries not shown; view a subdirectory to see them]"
    return text


def create(path, file_text):
    if file_text is None:
        raise EditorError("`create` needs `file_text`: the full content of the new file.")
    if os.path.isdir(path):
        raise EditorError(f"{path} is a directory; give create a file path inside it.")
    if os.path.exists(path):
        raise EditorError(
            f"The file {path} already exists; `create` does not overwrite files. Use `str_replace` "
            "to change part of it (view it first), or `undo_edit` to revert your edits."
        )
    push_history(path)
    write_text(path, file_text)
    return f"File created successfully at: {path} ({len(split_lines(file_text))} lines)."


def edited(path, snip):
    return f"The file {path} has been edited. {snip}\nReview the change; edit again if it is not right."


def _fuzzy_hint(lines, old_str):
    """Where old_str would match if whitespace were ignored, or where its first line appears."""
    want = [" ".join(s.split()) for s in split_lines(old_str)]
    while want and not want[-1]:
        want.pop()
    while want and not want[0]:
        want.pop(0)
    if not want:
        return ""
    stripped = [" ".join(s.split()) for s in lines]
    for i in range(len(lines) - len(want) + 1):
        if stripped[i : i + len(want)] == want:
            lo, hi = i + 1, i + len(want)
            return (
                f"\nIgnoring differences in whitespace it would match lines {lo}-{hi}; the exact "
                f"text there is:\n{numbered(lines[lo - 1 : hi], lo)}\nCopy old_str exactly from "
                "this (spaces, tabs and indentation included)."
            )
    first = want[0]
    hits = [i for i, s in enumerate(stripped) if first and first in s][:3]
    if hits:
        show = sorted({n for i in hits for n in range(max(0, i - 2), min(len(lines), i + 3))})
        runs = [[show[0]]]
        for n in show[1:]:
            if n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        parts = [numbered(lines[r[0] : r[-1] + 1], r[0] + 1) for r in runs]
        return "\nThe first line of old_str appears near these lines, but the rest differs:\n{}".format(
            "\n...\n".join(parts)
        )
    return ""


def str_replace(path, old_str, new_str):
    if old_str is None or old_str == "":
        raise EditorError(
            "`str_replace` needs a non-empty `old_str`: the exact text to replace (view the file "
            "to copy it). To add text without replacing any, use `insert`."
        )
    new_str = "" if new_str is None else new_str
    text = read_text(path)
    if "\r\n" in text and "\r" not in old_str:
        # The model sees and writes "\n"; keep the file's own line endings.
        old_str = old_str.replace("\n", "\r\n")
        new_str = new_str.replace("\r\n", "\n").replace("\n", "\r\n")
    count = text.count(old_str)
    if count == 0:
        raise EditorError(
            f"No replacement was performed: old_str matched 0 times in {path}. old_str must match the "
            "file exactly, including whitespace and indentation; view the file (with view_range) "
            f"and copy the text.{_fuzzy_hint(split_lines(text), old_str)}"
        )
    if count > 1:
        starts = []
        pos = text.find(old_str)
        while pos >= 0:
            starts.append(text.count("\n", 0, pos) + 1)
            pos = text.find(old_str, pos + 1)
        raise EditorError(
            "No replacement was performed: old_str matched {} times in {} (starting at lines {}). "
            "It must match exactly once: add surrounding lines to old_str so it is unique.".format(
                count, path, ", ".join(str(s) for s in starts)
            )
        )
    if old_str == new_str:
        raise EditorError("old_str and new_str are the same, so nothing would change.")
    pos = text.find(old_str)
    start = text.count("\n", 0, pos) + 1
    new_text = text[:pos] + new_str + text[pos + len(old_str) :]
    push_history(path)
    write_text(path, new_text)
    end = start + new_str.count("\n")
    return edited(path, snippet(path, new_text, start, end))


def insert(path, insert_line, new_str):
    if new_str is None:
        raise EditorError("`insert` needs `new_str`: the text to insert after line insert_line.")
    if insert_line is None:
        raise EditorError(
            "`insert` needs `insert_line`: the line number after which new_str goes (0 for the "
            "top of the file)."
        )
    text = read_text(path)
    lines = split_lines(text)
    if not isinstance(insert_line, int) or isinstance(insert_line, bool):
        raise EditorError(f"insert_line must be an integer, got {json.dumps(insert_line)}.")
    if not 0 <= insert_line <= len(lines):
        raise EditorError(
            f"insert_line {insert_line} is out of range: {path} has {len(lines)} lines, so "
            f"insert_line must be between 0 (before the first line) and {len(lines)} (after the last)."
        )
    nl = "\r\n" if "\r\n" in text else "\n"
    body = new_str.replace("\r\n", "\n")
    if body.endswith("\n"):
        body = body[:-1]
    new_lines = body.split("\n")
    keep_crlf = [ln[:-1] if nl == "\r\n" and ln.endswith("\r") else ln for ln in lines]
    merged = keep_crlf[:insert_line] + new_lines + keep_crlf[insert_line:]
    new_text = nl.join(merged) + (nl if text.endswith("\n") or not text else "")
    push_history(path)
    write_text(path, new_text)
    return edited(path, snippet(path, new_text, insert_line + 1, insert_line + len(new_lines)))


def undo_edit(path):
    if not pop_history(path):
        raise EditorError(
            f"No edit history for {path}: nothing to undo. Only changes made with this editor can be "
            "undone (use str_replace to change the file by hand)."
        )
    if not os.path.exists(path):
        return f"Undid the last edit: {path} did not exist before it, so it was removed."
    text = read_text(path)
    lines = split_lines(text)
    return f"Last edit to {path} undone. {snippet(path, text, 1, min(len(lines), 10))}"


def handle(req):
    """One request (a dict) -> message. Raises EditorError for requests the model must change."""
    command = req.get("command")
    if command not in COMMANDS:
        raise EditorError(
            "Unknown command {}; use one of: {}.".format(json.dumps(command), ", ".join(COMMANDS))
        )
    path = req.get("path")
    if not isinstance(path, str) or not path.strip():
        raise EditorError(f"`path` is required: the file or directory to {command}.")
    base = req.get("workdir") or os.getcwd()
    path = os.path.normpath(os.path.join(base, os.path.expanduser(path)))
    if command == "view":
        return view(path, req.get("view_range"), int(req.get("max_view_chars") or MAX_VIEW_CHARS))
    if command == "create":
        return create(path, req.get("file_text"))
    if command == "str_replace":
        return str_replace(path, req.get("old_str"), req.get("new_str"))
    if command == "insert":
        return insert(path, req.get("insert_line"), req.get("new_str"))
    return undo_edit(path)


def parse_cli(argv):
    parser = argparse.ArgumentParser(
        prog="str_replace_editor",
        description="View, create and edit text files (relative paths: from the current directory).",
    )
    parser.add_argument("command", nargs="?", choices=COMMANDS)
    parser.add_argument("path", nargs="?")
    parser.add_argument("--file_text")
    parser.add_argument("--old_str")
    parser.add_argument("--new_str")
    parser.add_argument("--insert_line", type=int)
    parser.add_argument("--view_range", type=int, nargs=2, metavar=("START", "END"))
    parser.add_argument("--json-b64", dest="json_b64", help=argparse.SUPPRESS)
    parser.add_argument("--json-file", dest="json_file", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.json_b64 is not None:
        return json.loads(base64.b64decode(ns.json_b64).decode("utf-8"))
    if ns.json_file is not None:
        with open(ns.json_file, encoding="utf-8") as fh:
            req = json.load(fh)
        os.remove(ns.json_file)
        return req
    if ns.command is None or ns.path is None:
        parser.error("give a command and a path, e.g. `str_replace_editor view file.py`")
    req = {k: v for k, v in vars(ns).items() if v is not None and k not in ("json_b64", "json_file")}
    if "view_range" in req:
        req["view_range"] = list(req["view_range"])
    return req


def emit(text):
    sys.stdout.buffer.write(text.encode("utf-8", errors="replace") + b"\n")
    sys.stdout.flush()


def main(argv=None):
    req = parse_cli(sys.argv[1:] if argv is None else argv)
    try:
        emit(handle(req))
        return 0
    except EditorError as exc:
        emit(str(exc))
        return 1
    except Exception as exc:  # report, never hang or print a bare traceback to the model
        emit(f"The editor failed unexpectedly: {type(exc).__name__}: {exc}. Try again, or use bash.")
        return 3


if __name__ == "__main__":
    sys.exit(main())
