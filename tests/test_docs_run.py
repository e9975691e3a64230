"""Docs that run: every fenced ```bash or ```python block of docs/*.md directly preceded by the line
``<!-- vse:run -->`` runs here, on the bundled data, and docs that state a fact the code decides
say what the code does.

The contract of a page's marked blocks (docs/getting-started.md, "Docs that run", says it to the
reader):

- they run in order, in one fresh temporary folder whose ``data`` and ``examples`` are links to
  the repository's data/ and examples/; each page is one test;
- a bash block runs with ``bash -euo pipefail`` in that folder, the virtualenv's bin first on
  PATH, HF_HUB_OFFLINE=1. A block of plain ``vse …`` lines only (no pipe, redirection, variable,
  unquoted glob or list) runs each line as ``vse ARGS`` in this process instead (click's runner:
  the same entry point, without a 3 s torch import per line); anything else needs a real shell;
- the python blocks of a page share one namespace, like a notebook's cells, with the folder as
  the working folder;
- ``<!-- vse:run file="NAME" -->`` before a block of any language (```yaml, ```python, …) writes
  the block to NAME in the folder instead of running it: a file the page shows, then uses;
- ``<!-- vse:run reduce="OLD=>NEW" -->`` runs the block with OLD replaced by NEW (repeatable, in
  order): a size too slow for the suite. OLD must occur in the block and NEW must be named in
  the page's visible text, so the reader sees what the suite ran;
- a ``vse extract`` that an earlier page of the session ran with the same options (``--out``
  aside) starts from that one's shards, as a rerun of `vse extract` resumes: the command runs,
  the bundled images go through the CNN once per session.

A failing block fails its page's test with the page, the block's first line and its output.
"""

from __future__ import annotations

import configparser
import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINKED = ("data", "examples")            # the page's folder sees these of the repository
DIRECTIVE = "<!-- vse:run"
ATTRIBUTE = re.compile(r'\s+(\w+)="([^"]*)"')
FENCE_OPEN = re.compile(r"^```(bash|python)\s*$")
FENCE_ANY = re.compile(r"^```([\w+-]*)\s*$")
QUICK_COMMANDS = {"info", "report", "compare", "--help", "-h"}   # with --dry-run: not slow
SHELL_SYNTAX = set("|&;<>()$`")


@dataclass
class Block:
    page: str
    line: int                       # 1-based line of the opening fence
    lang: str                       # bash or python, or file (written to ``path``, not run)
    code: str                       # as it runs (reductions applied)
    reduce: list = field(default_factory=list)
    path: str = ""

    @property
    def first_line(self) -> str:
        return next((s for s in self.code.splitlines() if s.strip()), "")


class DirectiveError(ValueError):
    """A marked block the runner cannot read: one line naming the page and the line."""


def visible_text(text: str) -> str:
    """The page as a reader sees it: HTML comments dropped."""
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def marked_blocks(text: str, page: str = "page.md") -> list[Block]:
    """The blocks of a page marked ``<!-- vse:run [reduce="OLD=>NEW" …] -->``, in page order, with
    their reductions applied; a directive not followed by a bash or python fence, an unknown or
    malformed attribute, a reduction whose OLD is not in its block or whose NEW the page does not
    name raises DirectiveError."""
    lines = text.splitlines()
    shown = visible_text(text)
    blocks = []
    for i, line in enumerate(lines):
        if not line.startswith(DIRECTIVE):
            continue
        where = f"{page}:{i + 1}"
        body = line[len(DIRECTIVE):]
        if not body.rstrip().endswith("-->"):
            raise DirectiveError(f"{where}: a vse:run directive is one line ending in -->")
        body = body.rstrip()[:-3]
        attributes = ATTRIBUTE.findall(body)
        if ATTRIBUTE.sub("", body).strip():
            raise DirectiveError(f"{where}: unreadable directive {line!r} (attributes are name=\"value\")")
        path = next((value for name, value in attributes if name == "file"), "")
        opening = (FENCE_ANY if path else FENCE_OPEN).match(lines[i + 1]) if i + 1 < len(lines) else None
        if not opening:
            raise DirectiveError(f"{where}: vse:run must be directly followed by a ```bash or ```python "
                                 "fence (or, with file=, a fence of any language)")
        if path and (Path(path).is_absolute() or ".." in Path(path).parts):
            raise DirectiveError(f"{where}: file={path!r} must be a relative path inside the page's folder")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].rstrip() == "```"), None)
        if end is None:
            raise DirectiveError(f"{where}: the fenced block is not closed")
        code = "\n".join(lines[i + 2:end]) + "\n"
        reduce = []
        for name, value in attributes:
            if name == "file":
                continue
            if name != "reduce":
                raise DirectiveError(f"{where}: unknown attribute {name!r} (known: reduce, file)")
            old, arrow, new = value.partition("=>")
            if not arrow or not old or "=>" in new:
                raise DirectiveError(f"{where}: reduce=\"OLD=>NEW\", got {value!r}")
            if old not in code:
                raise DirectiveError(f"{where}: reduce: {old!r} is not in the block")
            if new and new not in shown:
                raise DirectiveError(f"{where}: reduce: the page must name the reduced size {new!r} "
                                     "in its text")
            code = code.replace(old, new)
            reduce.append((old, new))
        blocks.append(Block(page, i + 2, "file" if path else opening[1], code, reduce, path))
    return blocks


def plain_vse_lines(code: str) -> list[list[str]] | None:
    """The argument lists of a bash block made only of plain `vse …` lines (comments allowed), or
    None when the block needs a real shell."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        try:
            lexer = shlex.shlex(line, posix=False, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            raw = list(lexer)
        except ValueError:
            return None
        if not raw:
            continue
        if raw[0] != "vse":
            return None
        for token in raw:
            quoted = token[:1] in "'\""
            if (set(token) & SHELL_SYNTAX and not quoted) or (not quoted and set(token) & set("*?[~")):
                return None
        commands.append(shlex.split(line, comments=True)[1:])
    return commands


def page_is_slow(blocks: list[Block]) -> bool:
    for block in blocks:
        if block.lang == "file":
            continue
        commands = plain_vse_lines(block.code) if block.lang == "bash" else None
        if commands is None or any(not set(c[:1]) <= QUICK_COMMANDS and "--dry-run" not in c
                                   for c in commands):
            return True
    return False


def pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if DIRECTIVE in p.read_text(encoding="utf-8"))


def _page_param(path: Path):
    blocks = marked_blocks(path.read_text(encoding="utf-8"), path.name)
    marks = [pytest.mark.slow] if page_is_slow(blocks) else []
    return pytest.param(path, id=path.name, marks=marks)


# ---------------------------------------------------------------------------- running a page
_EXTRACTED: dict[tuple, Path] = {}    # a `vse extract`'s options (--out aside) → its shards folder


def _extract_key(args: list[str]) -> tuple[tuple, str | None]:
    rest, out, i = [], None, 0
    while i < len(args):
        if args[i] == "--out" and i + 1 < len(args):
            out, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--out="):
            out = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    return tuple(rest), out


def _fail(block: Block, output: str, note: str = "") -> None:
    pytest.fail(f"{block.page}:{block.line}: the block starting `{block.first_line}` failed{note}\n"
                f"{output.rstrip()}", pytrace=False)


def _run_vse_in_process(block: Block, commands: list[list[str]], folder: Path) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    for args in commands:
        key, out = _extract_key(args) if args[:1] == ["extract"] else ((), None)
        if out is not None and key in _EXTRACTED:
            shards = folder / f"{out}.shards"
            if not shards.exists() and _EXTRACTED[key].is_dir():
                shards.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(_EXTRACTED[key], shards)
        result = CliRunner().invoke(cli, args, prog_name="vse")
        if result.exit_code != 0:
            trace = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info and not \
                isinstance(result.exception, SystemExit) else ""
            _fail(block, f"$ vse {shlex.join(args)}\n{result.output}{trace}")
        if out is not None:
            _EXTRACTED.setdefault(key, folder / f"{out}.shards")


def _run_bash(block: Block, folder: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=folder, env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        _fail(block, result.stdout + result.stderr, f" (exit status {result.returncode})")


def _run_python(block: Block, namespace: dict) -> None:
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            exec(compile(block.code, f"{block.page}:{block.line}", "exec"), namespace)
    except Exception:  # noqa: BLE001 - any error of the example is the page's failure
        _fail(block, output.getvalue() + traceback.format_exc())


def run_block(block: Block, folder: Path, namespace: dict) -> None:
    """One marked block in ``folder`` (the working folder); python blocks in ``namespace``."""
    if block.lang == "file":
        (folder / block.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / block.path).write_text(block.code, encoding="utf-8")
    elif block.lang == "python":
        _run_python(block, namespace)
    else:
        commands = plain_vse_lines(block.code)
        if commands is None:
            _run_bash(block, folder)
        else:
            _run_vse_in_process(block, commands, folder)


def run_page(path: Path, folder: Path) -> None:
    """Every marked block of ``path``, in order, in ``folder`` (the working folder meanwhile)."""
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    namespace: dict = {"__name__": "__main__"}
    for block in marked_blocks(path.read_text(encoding="utf-8"), path.name):
        run_block(block, folder, namespace)


@pytest.mark.parametrize("path", [_page_param(p) for p in pages()])
def test_the_page_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_page(path, tmp_path)


# ---------------------------------------------------------------------------- the runner itself
def test_directives_are_read_as_documented():
    page = ("Intro; the suite trains `--epochs 1`.\n\n<!-- vse:run -->\n```bash\nvse info x.h5\n```\n"
            "text\n<!-- vse:run reduce=\"--epochs 30=>--epochs 1\" -->\n"
            "```python\nrun(\"--epochs 30\")\n```\n"
            "```bash\nvse not-marked\n```\n")
    blocks = marked_blocks(page, "p.md")
    assert [(b.lang, b.line, b.code) for b in blocks] == [
        ("bash", 4, "vse info x.h5\n"), ("python", 9, 'run("--epochs 1")\n')]
    assert blocks[1].reduce == [("--epochs 30", "--epochs 1")]
    shown = marked_blocks('<!-- vse:run file="conf/a.yaml" -->\n```yaml\nepochs: 3\n```\n', "p.md")
    assert [(b.lang, b.path, b.code) for b in shown] == [("file", "conf/a.yaml", "epochs: 3\n")]


@pytest.mark.parametrize("page, problem", [
    ("<!-- vse:run -->\ntext\n```bash\nvse info\n```\n", "directly followed"),
    ("<!-- vse:run -->\n```sh\nvse info\n```\n", "directly followed"),
    ("<!-- vse:run -->\n```bash\nvse info\n", "not closed"),
    ('<!-- vse:run size="small" -->\n```bash\nvse info\n```\n', "unknown attribute"),
    ('<!-- vse:run reduce="--epochs 3" -->\n```bash\nvse info\n```\n', 'reduce="OLD=>NEW"'),
    ('<!-- vse:run reduce="--epochs 3=>--epochs 1" -->\n```bash\nvse info\n```\n', "is not in the block"),
    ('<!-- vse:run reduce="--epochs 3=>--epochs 1" -->\n```bash\nvse x --epochs 3\n```\n',
     "must name the reduced size"),
    ("<!-- vse:run reduce=--epochs -->\n```bash\nvse info\n```\n", "unreadable directive"),
    ('<!-- vse:run file="../a.yaml" -->\n```yaml\na: 1\n```\n', "inside the page's folder"),
    ("<!-- vse:run -->\n```yaml\na: 1\n```\n", "directly followed"),
])
def test_a_directive_the_runner_cannot_follow_is_refused(page, problem):
    with pytest.raises(DirectiveError, match=re.escape(problem)):
        marked_blocks(page, "p.md")


@pytest.mark.parametrize("code, plain", [
    ("vse info cache/a.h5   # a comment\nvse report r.csv --columns recall\n",
     [["info", "cache/a.h5"], ["report", "r.csv", "--columns", "recall"]]),
    ("vse train --features a.h5 \\\n  --loss mh\n", [["train", "--features", "a.h5", "--loss", "mh"]]),
    ("vse evaluate --runs 'runs/x/*'\n", [["evaluate", "--runs", "runs/x/*"]]),
    ("vse report r.csv > table.md\n", None),
    ("vse report r.csv | tee t.md\n", None),
    ("vse evaluate --runs runs/x/*\n", None),
    ("cat > loss.py <<'EOF'\nx\nEOF\n", None),
    ("vse info $CACHE\n", None),
])
def test_only_plain_vse_lines_run_in_process(code, plain):
    assert plain_vse_lines(code) == plain


def test_an_extraction_is_known_by_its_options_without_its_out():
    assert _extract_key(["extract", "--root", "data", "--out", "cache/a.h5", "--quiet"]) == (
        ("extract", "--root", "data", "--quiet"), "cache/a.h5")
    assert _extract_key(["extract", "--out=cache/b.h5", "--root", "data"]) == (("extract", "--root", "data"),
                                                                              "cache/b.h5")


def _page(tmp_path, monkeypatch, text: str) -> tuple[Path, Path]:
    page, folder = tmp_path / "p.md", tmp_path / "run"
    page.write_text(text, encoding="utf-8")
    folder.mkdir()
    monkeypatch.chdir(folder)
    return page, folder


def test_a_page_runs_in_order_in_one_folder_and_one_namespace(tmp_path, monkeypatch):
    page, folder = _page(tmp_path, monkeypatch, (
        '<!-- vse:run file="conf/n.txt" -->\n```text\n3\n```\n'
        "<!-- vse:run -->\n```bash\ntest -d data/images && test -d examples\n"
        "echo $(( $(cat conf/n.txt) * 2 )) > doubled.txt\n```\n"
        "<!-- vse:run -->\n```python\nn = int(open('doubled.txt').read())\n```\n"
        "<!-- vse:run -->\n```python\nassert n == 6, n\nopen('seen.txt', 'w').write(str(n))\n```\n"))
    run_page(page, folder)
    assert (folder / "seen.txt").read_text() == "6"


@pytest.mark.parametrize("body, where", [
    ("```bash\necho start\nfalse | cat\ntouch never\n```\n",
     "p.md:2: the block starting `echo start` failed"),
    ("```bash\nvse info missing.h5\n```\n", "p.md:2: the block starting `vse info missing.h5` failed"),
    ("```python\nx = 1\nraise RuntimeError('boom')\n```\n", "p.md:2: the block starting `x = 1` failed"),
], ids=["bash-pipefail", "vse-in-process", "python"])
def test_a_failing_block_fails_its_page_naming_the_block(tmp_path, monkeypatch, body, where):
    page, folder = _page(tmp_path, monkeypatch, "<!-- vse:run -->\n" + body + "<!-- vse:run -->\n"
                         "```bash\ntouch after.txt\n```\n")
    with pytest.raises(pytest.fail.Exception, match=re.escape(where)):
        run_page(page, folder)
    assert not (folder / "after.txt").exists() and not (folder / "never").exists()


def test_every_marked_block_of_the_docs_is_readable():
    for path in pages():
        assert marked_blocks(path.read_text(encoding="utf-8"), path.name), path


# ---------------------------------------------------------------------------- docs that are true
def test_a_one_way_flag_shows_its_true_default():
    """--no-img-norm is off unless given (img_norm stays True): OPTIONS.md said `True`."""
    from cli.train_options import options_markdown

    row = next(r for r in options_markdown().splitlines() if r.startswith("| `--no-img-norm` |"))
    assert row.split(" | ")[2] == "off (`img_norm: True`)", row


def test_the_python_version_is_the_one_setup_cfg_requires():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    required = re.fullmatch(r">=\s*(3\.\d+)", setup["options"]["python_requires"].strip())
    assert required, setup["options"]["python_requires"]
    stated = {(path.name, m[1]) for path in [ROOT / "README.md", *DOCS.glob("*.md")]
              for m in re.finditer(r"\bPython (3\.\d+)", path.read_text(encoding="utf-8"))}
    assert stated and {v for _, v in stated} == {required[1]}, (required[1], sorted(stated))


def test_the_quick_subset_has_one_measured_time():
    """setup.cfg's marker points to Getting started, which states the quick subset's time once."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    marker = setup["tool:pytest"]["markers"]
    times = re.search(r"\d+\s*(s|seconds?|minutes?)\b|a minute", marker)
    assert "getting-started.md" in marker and not times, marker
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert len(re.findall(r'-m "not slow"', page)) == 1, "the quick subset's command and time: once"


@pytest.mark.parametrize("name", ["extending.md", "networks.md", "sets.md", "train.md", "tune.md",
                                  "text-features.md", "relevance.md", "search.md", "own-data.md"])
def test_a_demo_cache_a_page_reads_is_made_on_that_page(name):
    """cache/demo_grid.h5 was read by extending.md and networks.md and made by no documented
    command: every cache/demo_*.h5 a page's commands read is the --out of a command on the page."""
    text = (DOCS / name).read_text(encoding="utf-8")
    named = set(re.findall(r"\bcache/demo_[\w.-]+\.h5\b", text))
    made = set(re.findall(r"--out (cache/demo_[\w.-]+\.h5)\b", text))
    assert named <= made, f"docs/{name} reads {sorted(named - made)} but no command on it makes them"
