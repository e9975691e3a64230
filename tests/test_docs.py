"""The documentation cannot drift from the code: README.md and the site (mkdocs.yml, docs/).

- the site builds with ``mkdocs build --strict``: no broken link, no missing anchor, no page
  outside the nav, no results file missing (docs/hooks/vse_docs.py reads the tables at build time);
- every `vse …` command line in README.md and docs/ names a real command and real options, parsed
  against the click CLI (cli/main.py);
- README.md's results table is its results file (a generated region), and README.md stays short;
- every measured number a page keeps as a value region (``<!-- vse:value FILE KEY -->``) is the
  number its JSON file holds now;
- a built page fetches nothing from the internet, in headless Chromium.

The README's ten-minute tour runs in tests/test_readme_tour.py.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250


def hook_module():
    """docs/hooks/vse_docs.py, the site's generator (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("vse_docs", DOCS / "hooks" / "vse_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the site's sources."""
    return [README] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)


# ---------------------------------------------------------------------------- command lines
FENCE = re.compile(r"^(```|~~~)(\w*)[^\n]*\n(.*?)^\1\s*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`(vse [^`\n]+)`(?!`)")
PLACEHOLDERS = {"...", "…"}


def _segments(line: str) -> list[list[str]]:
    """The `vse` invocations of one shell line: split at pipes and lists, comments dropped;
    ``torchrun … -m cli.main ARGS`` counts as ``vse ARGS``, and ``vse torchrun OPTIONS COMMAND ARGS`` as
    itself (torchrun's options) and ``vse COMMAND ARGS``."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return []
    segments, current = [], []
    for token in tokens + [";"]:
        if token and set(token) <= set("|&;"):
            if current:
                segments.append(current)
            current = []
        else:
            current.append(token)
    found = []
    for segment in segments:
        if segment[:2] == ["vse", "torchrun"]:  # torchrun's own options, then a vse command: both checked
            inner = next((i for i, token in enumerate(segment[2:], 2) if _command(token) is not None), None)
            found.append(segment[1:inner])
            if inner is not None:
                found.append(segment[inner:])
        elif segment[0] == "vse":
            found.append(segment[1:])
        elif segment[0] == "torchrun" and "cli.main" in segment:
            found.append(segment[segment.index("cli.main") + 1:])
    return found


def command_lines(path: Path) -> list[tuple[str, int, list[str], bool]]:
    """(file, line, arguments after `vse`, whole) of every `vse` command in ``path``: each one of a
    code block (``whole``: parsed as a command line), and each inline `vse …` span (its command and
    option names checked: prose writes ``[--opt VALUE]`` and placeholders)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for block in FENCE.finditer(text):
        if block.group(2) not in ("", "bash", "sh", "console", "shell"):
            continue
        first_line = text[:block.start(3)].count("\n") + 1
        lines = block.group(3).split("\n")
        joined, start = "", None
        for number, line in enumerate(lines, first_line):
            start = number if start is None else start
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            joined += line
            for args in _segments(joined):
                found.append((path.name, start, args, True))
            joined, start = "", None
    for span in INLINE.finditer(text):
        line = text[:span.start()].count("\n") + 1
        tokens = span.group(1).replace("[", " ").replace("]", " ").split()[1:]
        found.append((path.name, line, tokens, False))
    return found


def _command(name: str):
    from cli.main import ALIASES, cli

    name = ALIASES.get(name, name)
    return cli.commands.get(name) if name in cli.commands else None


def check_command_line(args: list[str], whole: bool) -> str:
    """'' when ``vse ARGS`` is a real command with real options, else why not (one line)."""
    from cli.main import cli

    args = [a for a in args if a not in PLACEHOLDERS]
    if not args or args[0] in ("-h", "--help", "--version"):
        return ""
    name, rest = args[0], args[1:]
    command = _command(name)
    if command is None:
        return f"no command `vse {name}` (commands: {', '.join(cli.commands)})"
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    options |= {"-h", "--help"}
    if not whole:
        unknown = [t.split("=")[0] for t in rest if t.startswith("-") and len(t) > 1
                   and not re.match(r"^-\d", t) and t.split("=")[0] not in options]
        return f"`vse {name}` has no option {', '.join(unknown)}" if unknown else ""
    context = click.Context(command, info_name=f"vse {name}")
    try:
        values, extra, _ = command.make_parser(context).parse_args(args=list(rest))
    except click.UsageError as exc:
        return f"`vse {name}`: {exc.format_message()}"
    if extra and not context.allow_extra_args:
        return f"`vse {name}`: unexpected argument(s) {' '.join(extra)}"
    for param in command.params:
        value = values.get(param.name)
        if isinstance(param.type, click.Choice) and isinstance(value, str):
            try:
                param.type.convert(value, param, context)
            except click.BadParameter as exc:
                return f"`vse {name}` {param.opts[0]}: {exc.format_message()}"
    return ""


def test_every_vse_command_line_in_the_docs_is_a_real_command_with_real_options():
    lines = [entry for path in doc_files() for entry in command_lines(path)]
    assert len(lines) > 100 and sum(whole for *_, whole in lines) > 80  # the extraction finds them
    problems = [f"{file}:{line}: vse {' '.join(args)}: {why}" for file, line, args, whole in lines
                if (why := check_command_line(args, whole))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line, why", [
    ("vse trian --features x.h5", "no command `vse trian`"),
    ("vse train --features x.h5 --lossy mh", "No such option '--lossy'"),
    ("vse report results.csv --columns recal", "'recal' is not one of"),
    ("vse info a.h5 b.h5", "unexpected argument(s) b.h5"),
    ("vse train ... --loss rcl --loss-option tau=0.05", ""),
    ("torchrun --nproc-per-node 4 -m cli.main train --features x --run-dir y", ""),
    ("vse evaluate --runs 'runs/*20' --out r.csv && vse report r.csv --columns noisy", ""),
])
def test_the_command_line_check_catches_what_it_should(line, why, tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"text\n\n```bash\n{line}\n```\n", encoding="utf-8")
    found = command_lines(page)
    assert found
    problems = [check_command_line(args, whole) for *_, args, whole in found]
    assert (why in " ".join(problems)) if why else not any(problems), problems


def test_inline_spans_are_checked_by_their_option_names(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `vse sweep FILE --epochs 2`, then `vse embed CKPT [--imagez SRC]`.\n",
                    encoding="utf-8")
    problems = [check_command_line(args, whole) for *_, args, whole in command_lines(page)]
    assert problems == ["", "`vse embed` has no option --imagez"]


MAKE = re.compile(r"`make ([a-z][a-z0-9-]*)")


def test_every_make_target_named_in_the_docs_is_in_the_makefile():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", makefile, re.M))
    named = {(path.name, target) for path in doc_files()
             for target in MAKE.findall(path.read_text(encoding="utf-8"))}
    assert len(named) > 20
    missing = sorted(f"{file}: make {target}" for file, target in named if target not in targets)
    assert not missing, "\n".join(missing)


# ---------------------------------------------------------------------------- README.md
def test_the_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    text = "\n".join(lines)
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^make \w+", setup, re.M) == ["make demo", "make test"]


def test_the_readme_links_point_at_files_that_exist():
    """README.md is read on a repository host, outside the site's strict build: its relative links
    (into docs/ and the repository) must name files that exist, and their anchors headings there."""
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 10
    broken = []
    for link in links:
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / (path or "README.md")
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and target.suffix == ".md":
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
                     for h in re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.M)}
            if anchor not in slugs:
                broken.append(f"{link}: no heading #{anchor} in {path}")
    assert not broken, "\n".join(broken)


def test_the_readme_results_table_is_its_results_file():
    """The region between `<!-- vse:table FILE ... -->` and `<!-- /vse:table -->` is FILE's table
    (python docs/hooks/vse_docs.py --readme writes it)."""
    docs = hook_module()
    text = README.read_text(encoding="utf-8")
    assert "<!-- vse:table bench/results/" in text and "<!-- /vse:table -->" in text
    assert docs.fill(text, keep_markers=True) == text, (
        "README.md's results table differs from its results file: python docs/hooks/vse_docs.py --readme")


def test_a_results_directive_names_an_existing_file_and_columns():
    docs = hook_module()
    with pytest.raises(docs.DocsError, match="no such results file"):
        docs.fill("<!-- vse:table bench/results/nowhere/table_recall.md -->")
    with pytest.raises(docs.DocsError, match="no column 'R@1000'"):
        docs.fill('<!-- vse:table bench/results/f8k_fast/table_recall.md columns="Model|R@1000" -->')
    with pytest.raises(docs.DocsError, match="no target"):
        docs.fill("<!-- vse:make f8k-nothing -->")
    table = docs.fill('<!-- vse:table bench/results/f8k_fast/table_recall.md columns="Model|rsum" -->')
    assert table.splitlines()[0] == "| Model | rsum |" and "method=mh | 289.4 ± 3.2 (5)" in table


# ---------------------------------------------------------------------------- value regions
def stale_value_regions(paths: list[Path]) -> list[str]:
    """'FILE: line N: ARGS: TEXT, the file holds VALUE' for each value region whose text is not what
    its JSON file holds (python docs/hooks/vse_docs.py --readme writes them)."""
    docs = hook_module()
    return [f"{path.name}: {problem}" for path in paths
            for problem in docs.stale_values(path.read_text(encoding="utf-8"))]


def test_every_number_a_page_keeps_is_the_one_its_results_file_holds():
    docs = hook_module()
    pages = [p for p in doc_files() if docs.VALUE_OPENING.search(p.read_text(encoding="utf-8"))]
    assert DOCS / "benchmarks.md" in pages and DOCS / "results-noisy.md" in pages
    stale = stale_value_regions(pages)
    assert not stale, "numbers that differ from their results files (python docs/hooks/vse_docs.py " \
        "--readme writes them):\n" + "\n".join(stale)


def test_a_number_that_drifts_from_its_results_file_fails_and_the_rewrite_mends_it(tmp_path):
    """On copies: a page whose typed number is not its file's, and a results file measured again."""
    docs = hook_module()
    page = tmp_path / "benchmarks.md"
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    first = docs.VALUE.search(text)
    page.write_text(text[:first.start("body")] + "999999" + text[first.end("body"):], encoding="utf-8")
    line = text.count("\n", 0, first.start()) + 1
    assert stale_value_regions([page]) == [f"benchmarks.md: line {line}: {first.group('args')}: "
                                           f"'999999', the file holds {first.group('body')!r}"]
    assert docs.main(["--readme", str(page)]) == 0
    assert page.read_text(encoding="utf-8") == text and not stale_value_regions([page])

    results = tmp_path / "bench.json"
    results.write_text('{"service": {"requests_per_s": 717.9, "rounds": [{"p50_ms": 10.63}]}}')
    page.write_text(f"<!-- vse:table bench/results/f8k_fast/table_recall.md -->\n\n"
                    f"<!-- vse:value {results} service.requests_per_s .0f -->718<!-- /vse:value --> "
                    f"requests/s, p50 <!-- vse:value {results} service.rounds.0.p50_ms .1f -->10.6"
                    f"<!-- /vse:value --> ms\n", encoding="utf-8")
    assert not stale_value_regions([page])
    results.write_text('{"service": {"requests_per_s": 650.25, "rounds": [{"p50_ms": 12.05}]}}')
    assert len(stale_value_regions([page])) == 2
    docs.main(["--readme", str(page)])
    rewritten = page.read_text(encoding="utf-8")
    assert "-->650<!-- /vse:value --> requests/s" in rewritten
    assert "-->12.1<!-- /vse:value --> ms" in rewritten  # 12.05 rounded half up
    # the table directive, without an end marker, is the build's: the rewrite leaves it as it is
    assert rewritten.startswith("<!-- vse:table bench/results/f8k_fast/table_recall.md -->\n\n")
    assert docs.fill(rewritten).endswith("650 requests/s, p50 12.1 ms\n")


def test_a_value_whose_file_or_key_is_missing_stops_the_build_in_one_line(tmp_path):
    from mkdocs.exceptions import PluginError

    docs = hook_module()
    results = tmp_path / "search.json"
    results.write_text('{"service": {"requests_per_s": 717.9}, "results": [{"kind": "flat"}]}')
    page = type("Page", (), {"file": type("File", (), {"src_uri": "benchmarks.md"})()})()
    cases = {
        f"{results} service.requests_per_sec":
            f"{results}: no key 'service.requests_per_sec' (no 'requests_per_sec' under service)",
        f"{results} results.1.kind": f"{results}: no key 'results.1.kind' (results is a list of 1, not",
        f"{results} service": f"{results}: 'service' holds dict, not one value",
        "bench/results/nowhere.json service.requests_per_s":
            "bench/results/nowhere.json: no such results file",
    }
    for args, message in cases.items():
        markdown = f"Served <!-- vse:value {args} .0f -->718<!-- /vse:value --> requests/s.\n"
        with pytest.raises(PluginError) as raised:
            docs.on_page_markdown(markdown, page=page, config=None, files=None)
        assert str(raised.value).startswith(f"benchmarks.md: {message}") and "\n" not in str(raised.value)
    with pytest.raises(docs.DocsError, match="no <!-- /vse:value --> after it"):
        docs.fill(f"Served <!-- vse:value {results} service.requests_per_s --> 718 requests/s.")


def test_a_value_is_written_as_the_pages_write_numbers(tmp_path):
    docs = hook_module()
    results = tmp_path / "r.json"
    results.write_text('{"n": 21544, "ratio": 1.335, "diff": 1.4901161193847656e-08, "share": 0.556, '
                       '"change": -9.82, "up": 36.427, "rows": [{"kind": "flat"}, {"kind": "hnsw"}], '
                       '"1024-d hnsw": {"x": 437.7}, "noise=0.2,method=a + b": {"mean": 112.72}}')

    def value(key, spec=""):
        return docs.json_value(str(results), key, spec)

    assert value("n", ",") == "21,544" and value("n") == "21544"
    assert value("ratio", ".2f") == "1.34"  # half up from the file's digits (the float 1.335 is 1.33499…)
    assert value("diff", ".2g") == "1.5e-8" and value("share", ".0%") == "56%"
    assert value("change", "+.1f") == "\u22129.8" and value("up", "+.1f") == "+36.4"
    assert value("rows.-1.kind") == "hnsw" and value("1024-d hnsw.x", ".0f") == "438"
    assert value("noise=0.2,method=a + b.mean", ".1f") == "112.7"  # a key holding dots, '=' and spaces
    quoted = '"noise=0.2,method=a + b.mean"'
    assert docs.fill(f"<!-- vse:value {results} {quoted} .1f -->x<!-- /vse:value -->") == "112.7"


# ---------------------------------------------------------------------------- the site
def build_site(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: make install (the `docs` extra of setup.cfg)")
    out = tmp_path_factory.mktemp("site") / "site"
    result = build_site(out)
    output = (result.stdout + result.stderr).splitlines()
    problems = [line for line in output if line.startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems[::-1] or output[-20:])  # the cause first: an error's last line names it
    return out


@pytest.mark.slow
def test_the_site_builds_strictly_with_a_page_per_command(site):
    from cli.main import COMMANDS

    for name in COMMANDS:
        page = (site / "commands" / f"vse-{name}.html").read_text(encoding="utf-8")
        assert f"vse {name}" in page and "Usage:" in page
    train = (site / "commands" / "vse-train.html").read_text(encoding="utf-8")
    assert "--loss-option" in train and "--run-dir" in train  # the options come from the command
    losses = (site / "parts-losses.html").read_text(encoding="utf-8")
    assert "negative_set_size" in losses  # from MaxHingeLoss.Options
    api = (site / "api-losses.html").read_text(encoding="utf-8")
    assert 'id="pipeline.losses.base.VseLoss"' in api  # mkdocstrings, from the docstrings
    fast = (site / "results-losses.html").read_text(encoding="utf-8")
    assert "289.4 ± 3.2 (5)" in fast and "VSE++ (max of hinges) beats VSE0" in fast


EXTERNAL = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)=["']?(?:https?:)?//""",
                      re.I)


@pytest.mark.slow
def test_no_page_loads_an_asset_from_another_host(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > 30
    offenders = [f"{p.relative_to(site)}: {m.group(0)}" for p in pages
                 for m in EXTERNAL.finditer(p.read_text(encoding="utf-8"))]
    assert not offenders, "\n".join(offenders[:10])


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path) -> http.server.ThreadingHTTPServer:
    """``folder`` over HTTP on 127.0.0.1 (a free port), in a thread, as a static host would serve it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler,
                                                                                directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def served_site(site):
    server = serve(site)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def open_pages(url: str, paths: list[str], screenshot: Path | None = None) -> tuple[list, list]:
    """Every request the pages made, and their script errors, in headless Chromium."""
    from playwright.sync_api import sync_playwright

    requests, problems = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.on("request", lambda request: requests.append(request.url))
        page.on("pageerror", lambda error: problems.append(str(error)))
        for path in paths:
            page.goto(url + path, wait_until="networkidle")
            assert page.locator("article h1").count() == 1
        if screenshot is not None:
            page.goto(url + paths[0], wait_until="networkidle")
            page.screenshot(path=str(screenshot))
        browser.close()
    return requests, problems


@pytest.mark.slow
def test_the_site_renders_in_chromium_with_no_request_outside_it(served_site):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make install: apt-get install -y chromium)")
    requests, problems = open_pages(served_site, ["/commands/vse-train.html", "/", "/results-losses.html",
                                                  "/parts-networks.html", "/api-losses.html"])
    assert requests and all(url.startswith(served_site + "/") for url in requests), \
        [url for url in requests if not url.startswith(served_site + "/")]
    assert not problems, problems


if __name__ == "__main__":  # docs/img/command-page.png: python tests/test_docs.py SITE_DIR OUT.png
    httpd = serve(Path(sys.argv[1]))
    out = Path(sys.argv[2])
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    seen, errors = open_pages(url, ["/commands/vse-train.html"], out)
    print(f"{len(seen)} requests, all local: {all(u.startswith('http://127.0.0.1:') for u in seen)}; "
          f"script errors: {errors}")
    httpd.shutdown()


def test_a_table_with_a_caption_gives_each_row_once_after_its_caption(tmp_path):
    """A table file with a caption line above its rows (experiments/precision_table.py writes one):
    the caption, then every row exactly once, then the footer; two tables in one file refused."""
    docs = hook_module()
    table = tmp_path / "table.md"
    table.write_text("SAF, one epoch.\n\n| arm | rsum |\n|:---|---:|\n| fp32 | 115.5 |\n| bf16 | 191.7 |\n"
                     "| tf32 | 116.1 |\n\nrsum: dev, 100 images.\n", encoding="utf-8")
    assert docs.results_table(str(table)) == ("SAF, one epoch.\n\n| arm | rsum |\n|:---|---:|\n"
                                              "| fp32 | 115.5 |\n| bf16 | 191.7 |\n| tf32 | 116.1 |\n\n"
                                              "rsum: dev, 100 images.")
    assert docs.results_table(str(table), "rsum").splitlines()[2:] == [
        "| rsum |", "| ---: |", "| 115.5 |", "| 191.7 |", "| 116.1 |", "", "rsum: dev, 100 images."]
    table.write_text("| a |\n|---|\n| 1 |\n\nbetween\n\n| b |\n|---|\n", encoding="utf-8")
    with pytest.raises(docs.DocsError, match="more than one Markdown table"):
        docs.results_table(str(table))


def test_the_results_index_links_every_results_page():
    """docs/results.md's table is how a reader finds a results page: each docs/results-*.md is in it."""
    index = (DOCS / "results.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in DOCS.glob("results-*.md"))
    assert len(pages) >= 12
    assert [name for name in pages if f"]({name})" not in index] == []
