"""The documentation site's generator: what the pages show of the code and of the results is read
at build time, never typed twice.

An MkDocs hook (mkdocs.yml ``hooks:``) and a small command:

- one page per `vse` command, ``commands/<name>.md``, for every entry of ``cli.main.COMMANDS``
  (mkdocs-click renders each from the click command itself), listed in the nav under "Commands";
- directives in the pages, HTML comments that GitHub shows as nothing and the build replaces:

  ``<!-- vse:table FILE columns="Model|rsum" -->``  a results table (``vse report``'s Markdown
      output, e.g. bench/results/f8k_fast/table_recall.md) with its footer, whole or some columns;
  ``<!-- vse:claims FILE -->``  the claims of a ``vse claims`` or ``experiments/tune_table.py``
      JSON file, one row each, with their p-values and verdicts;
  ``<!-- vse:make TARGET -->``  the recipe of a Makefile target, variables expanded: the exact
      commands that made a table;
  ``<!-- vse:include FILE -->``  a Markdown file of the repository (a results folder's README);
  ``<!-- vse:benchfiles FOLDER -->``  every JSON file of a bench/results folder with its measured
      values, as the file holds them;
  ``<!-- vse:parts KIND -->``  losses, networks, pools or readers from the registries'
      declarations (``pipeline.core.registry``): each name, its class, and its options' types,
      defaults, ranges and help, as docs/OPTIONS.md is generated from ``TrainConfig``.

  FILE is relative to the repository root. A directive followed by ``<!-- /vse:NAME -->`` keeps
  its generated text between the two in the file itself: README.md's results table is such a
  region (``python docs/hooks/vse_docs.py --readme`` writes it; tests/test_docs.py checks it).

- one measured number in a sentence or a table cell, always a region, on one line:

  ``<!-- vse:value FILE KEY [SPEC] -->718<!-- /vse:value -->``

  KEY is a path into the JSON file FILE, dotted, list items by their index
  (``service.requests_per_s``, ``results.1.query.single_p50_ms``; a key that holds dots or
  spaces is found too, the path quoted if it has spaces: ``"claims.8.a + b.mean"``); SPEC a
  Python format spec (``.0f``, ``,.0f``, ``+.1f``, ``.1%``, ``.2g``), none: the value as Python
  writes it. A number is rounded half up from its digits in the file (1.335 → ``1.34``), its
  exponent has no leading zero (``1.5e-8``) and a negative one the typographic minus (``−9.8``),
  as the pages write them. The text between the markers is what a repository host shows; the
  build writes the value from FILE, ``python docs/hooks/vse_docs.py --readme`` writes it into the
  page, and tests/test_docs.py fails while a page's text differs from its file. Only what the
  file holds: a ratio, difference or unit the file does not store stays typed, out of a region
  (the pages compute nothing).

A directive whose file is missing, or whose columns, target or key are not there, stops the build
(``mkdocs build --strict``, and so ``make test``).
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import inspect
import json
import math
import re
import shlex
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `mkdocs build` from the repository root imports cli and pipeline
    sys.path.insert(0, str(ROOT))

# vse:value is a region of its own (VALUE); vse:run marks a block that tests/test_docs_run.py runs: an
# HTML comment the page keeps, never a directive the build fills
DIRECTIVE = re.compile(r"<!-- vse:(?!value |run[ >-])(?P<name>[a-z]+) (?P<args>[^>]*?) -->"
                       r"(?:\n(?P<body>.*?)<!-- /vse:(?P=name) -->)?", re.S)
VALUE = re.compile(r"<!-- vse:value (?P<args>[^>\n]*?) -->(?P<body>[^<\n]*)<!-- /vse:value -->")
VALUE_OPENING = re.compile(r"<!-- vse:value (?P<args>[^>\n]*?) -->")


class DocsError(Exception):
    """A directive that cannot be filled (a missing file, column or target)."""


# ---------------------------------------------------------------------------- results files
def _path(name: str) -> Path:
    path = ROOT / name
    if not path.is_file():
        raise DocsError(f"{name}: no such results file")
    return path


def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row (``\\|`` inside a cell kept)."""
    parts = re.split(r"(?<!\\)\|", line.strip())
    return [cell.strip() for cell in parts[1:-1]]


def results_table(name: str, columns: str = "") -> str:
    """The table in ``name`` (a `vse report` Markdown table, a caption line before it and its
    footer lines after it, each kept where it stands), all of its columns or those named in
    ``columns`` ("A|B|C", as its header spells them)."""
    lines = _path(name).read_text(encoding="utf-8").strip().splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("|")]
    if len(at) < 2:
        raise DocsError(f"{name}: no Markdown table")
    first, last = at[0], at[-1]
    if len(at) != last - first + 1:
        gap = next(i for i in range(first, last) if not lines[i].startswith("|"))
        raise DocsError(f"{name}: more than one Markdown table (line {gap + 1} is not a row)")
    table = lines[first:last + 1]
    caption = [line for line in lines[:first] if line.strip()]
    notes = [line for line in lines[last + 1:] if line.strip()]
    if columns:
        header = _cells(table[0])
        wanted = [c.strip() for c in columns.split("|")]
        missing = [c for c in wanted if c not in header]
        if missing:
            raise DocsError(f"{name}: no column {', '.join(map(repr, missing))} (it has {', '.join(header)})")
        index = [header.index(c) for c in wanted]
        rows = [_cells(line) for line in table]
        table = ["| " + " | ".join(row[i] for i in index) + " |" for row in rows]
    return "\n".join((caption + [""] if caption else []) + table + ([""] + notes if notes else []))


def _p(value) -> str:
    if value is None:
        return ""
    return f"{value:.2g}" if value < 0.001 else f"{value:.3f}"


def _arm(value, metric: str = "") -> str:
    if not isinstance(value, dict) or "mean" not in value:
        return str(value)
    mean, std = value["mean"], value.get("std")
    digits = 3 if any(word in metric for word in ("tau", "cs@", "spearman", "auc", "ndcg")) else 1
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "") + \
        (f" ({value['n']})" if "n" in value else "")


def claims_table(name: str) -> str:
    """The claims of ``name``: a claims.json (`vse claims`) or a claims_compare.json
    (experiments/tune_table.py), one row per claim."""
    data = json.loads(_path(name).read_text(encoding="utf-8"))
    claims = data.get("claims") if isinstance(data, dict) else None
    if not claims:
        raise DocsError(f"{name}: no claims")
    lines = [f"Test: {data['test']}." if data.get("test") else "", ""]
    if "change" in claims[0]:  # default against tuned
        lines += ["| claim | default | tuned | change |", "|:---|:---|:---|:---|"]
        def verdict(c, side):
            p = c.get(f"{side}_p_claimed")
            return f"{c.get(side, '')}" + (f" (p {_p(p)})" if p is not None else "")

        lines += [f"| {c['claim']} | {verdict(c, 'default')} | {verdict(c, 'tuned')} | {c['change']} |"
                  for c in claims]
        if data.get("summary"):
            lines += ["", "Summary: " + ", ".join(f"{k} {v}" for k, v in data["summary"].items()) + "."]
        if data.get("pairs_summary"):
            lines += ["", "Orderings of two methods: " +
                      ", ".join(f"{k} {v}" for k, v in data["pairs_summary"].items()) + "."]
        return "\n".join(lines)
    lines += ["| claim | paper | metric | measured (mean ± std (n)) | p (claimed) | p (reverse) | verdict |",
              "|:---|:---|:---|:---|---:|---:|:---|"]
    for c in claims:
        arms = "; ".join(f"{k} {_arm(v, c.get('metric', ''))}" for k, v in c.items() if isinstance(v, dict))
        lines.append(f"| {c['claim']} | {c.get('paper', '')} | `{c.get('metric', '')}` | {arms} | "
                     f"{_p(c.get('p_claimed'))} | {_p(c.get('p_reverse'))} | {c.get('verdict', '')} |")
    if isinstance(data.get("ranking"), dict):
        ranking = data["ranking"]
        lines += ["", f"{ranking.get('claim', 'Ranking')}:", "",
                  "| pair | " + " | ".join(k for k in ranking["pairs"][0] if k != "pair") + " |",
                  "|:---|" + ":---|" * (len(ranking["pairs"][0]) - 1)]
        for pair in ranking["pairs"]:
            cells = [f"{v['order']} (p {_p(v['p'])}{', separated' if v.get('separated') else ''})"
                     for k, v in pair.items() if k != "pair"]
            lines.append(f"| {pair['pair']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _flat(value, prefix: str = "", depth: int = 0):
    """(dotted key, scalar) of a JSON value, two levels of objects deep; lists and long text left out."""
    if isinstance(value, dict) and depth < 2:
        for key, item in value.items():
            yield from _flat(item, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    elif isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 80):
        yield prefix, value


def _scalar(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", chr(92) + "|")


def bench_files(folder: str, rows: int = 16) -> str:
    """Every JSON file of a bench/results folder, what made it and its measured values (the first
    ``rows`` scalars, two levels deep), as the file holds them."""
    path = ROOT / folder
    files = sorted(path.glob("*.json"))
    if not files:
        raise DocsError(f"{folder}: no JSON results files")
    out = []
    for file in files:
        data = json.loads(file.read_text(encoding="utf-8"))
        script = ROOT / "bench" / f"{file.stem}.py"
        made = f" (`bench/{script.name}`)" if script.is_file() else ""
        values = list(_flat(data))
        out += [f"### {file.name}{made}", "", f"`{folder}/{file.name}`" +
                (f", {len(values) - rows} more values in the file." if len(values) > rows else "."), ""]
        if values:
            out += ["| value | measured |", "|:---|---:|"]
            out += [f"| `{key}` | {_scalar(value)} |" for key, value in values[:rows]]
            out.append("")
    return "\n".join(out)


def _lookup(data, key: str, name: str):
    """The value at ``key`` (dotted; list items by index) in ``data``, the JSON of ``name``."""
    parts, value, i = key.split("."), data, 0
    while i < len(parts):
        where = ".".join(parts[:i]) or "the top level"
        if isinstance(value, list):
            if not re.fullmatch(r"-?\d+", parts[i]) or not -len(value) <= int(parts[i]) < len(value):
                raise DocsError(f"{name}: no key {key!r} ({where} is a list of {len(value)}, "
                                f"not indexed by {parts[i]!r})")
            value, i = value[int(parts[i])], i + 1
        elif isinstance(value, dict):
            # the longest run of parts that is a key: keys may hold dots ("noise=0.2")
            j = next((j for j in range(len(parts), i, -1) if ".".join(parts[i:j]) in value), None)
            if j is None:
                raise DocsError(f"{name}: no key {key!r} (no {parts[i]!r} under {where})")
            value, i = value[".".join(parts[i:j])], j
        else:
            raise DocsError(f"{name}: no key {key!r} ({where} is a value, {value!r})")
    return value


@functools.lru_cache(maxsize=64)
def _json_file(name: str, path: Path, mtime_ns: int, size: int):
    """A JSON results file parsed once while it is unchanged (a page holds dozens of its values;
    ``mtime_ns`` and ``size`` key the cache, so a file rewritten since is read again)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DocsError(f"{name}: not a JSON file ({exc})") from exc


def json_value(name: str, key: str, spec: str = "") -> str:
    """One value of the JSON file ``name``, the one at ``key``, written by the format ``spec``."""
    path = _path(name)
    stat = path.stat()
    found = _lookup(_json_file(name, path, stat.st_mtime_ns, stat.st_size), key, name)
    if found is None or isinstance(found, (dict, list)):
        raise DocsError(f"{name}: {key!r} holds {type(found).__name__ if found is not None else 'null'}, "
                        f"not one value")
    try:
        if isinstance(found, float) and spec and math.isfinite(found):
            # rounded as a person rounds the number the file writes: 1.335 → 1.34 (not 1.33, as
            # the binary float 1.33499… would give)
            with decimal.localcontext() as context:
                context.rounding = decimal.ROUND_HALF_UP
                text = format(decimal.Decimal(repr(found)), spec)
        else:
            text = format(found, spec)
    except (TypeError, ValueError) as exc:
        raise DocsError(f"{name}: {key!r} = {found!r} does not take the format {spec!r} ({exc})") from exc
    if isinstance(found, (int, float)) and not isinstance(found, bool):
        text = re.sub(r"e([+-])0*(\d)", lambda m: "e" + m.group(1).replace("+", "") + m.group(2), text)
        text = re.sub(r"^(\s*)-", "\\1\u2212", text)
    return text


def value_from_args(args: str) -> str:
    """The text of ``<!-- vse:value ARGS -->``: ARGS is ``FILE KEY [SPEC]``."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise DocsError(f"vse:value {args}: {exc}") from exc
    if len(words) not in (2, 3):
        raise DocsError(f"vse:value {args}: FILE KEY [SPEC] ({len(words)} words given)")
    return json_value(*words)


# ---------------------------------------------------------------------------- the Makefile
def _make_variables(text: str) -> dict:
    variables = {}
    for match in re.finditer(r"^([A-Z0-9_]+)\s*\??=\s*(.*)$", text, re.M):
        variables.setdefault(match.group(1), match.group(2).strip())
    variables.update(VSE="vse", PY="python", VENV=".venv")
    return variables


def make_recipe(target: str) -> str:
    """The commands of Makefile target ``target``, its variables expanded (``$(VSE)`` → ``vse``)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n?)+)", text, re.M)
    if not match:
        raise DocsError(f"Makefile: no target {target!r}")
    variables = _make_variables(text)

    def expand(value: str, depth: int = 0) -> str:
        if depth > 10:
            return value
        return re.sub(r"\$\(([A-Z0-9_]+)\)",
                      lambda m: expand(variables.get(m.group(1), m.group(0)), depth + 1), value)

    lines = [expand(line[1:]).replace("$$", "$") for line in match.group(1).splitlines()]
    return "```bash\n" + "\n".join(lines) + "\n```"


def include(name: str) -> str:
    text = _path(name).read_text(encoding="utf-8")
    # its headings go one level down, under the page's own
    return re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)


# ---------------------------------------------------------------------------- the registries
def _first_paragraph(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _options_rows(options) -> list[str]:
    from pipeline.core.values import option_facts

    if options is None or not dataclasses.is_dataclass(options) or not dataclasses.fields(options):
        return ["No options of its own."]
    hints = typing.get_type_hints(options)
    rows = ["| option | type | default | allowed | what it does |", "|:---|:---|:---|:---|:---|"]
    for f in dataclasses.fields(options):
        facts = option_facts(f)
        kind = str(hints.get(f.name, f.type)).replace("typing.", "").replace("<class '", "").replace("'>", "")
        allowed = ", ".join(map(str, facts.choices)) if facts.choices else facts.range_words()
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
        rows.append(f"| `{f.name}` | {kind.replace('|', chr(92) + '|')} | `{default!r}` | {allowed} | "
                    f"{' '.join(facts.help.split()).replace('|', chr(92) + '|')} |")
    return rows


def _where(obj) -> str:
    return f"`{obj.__module__}.{obj.__qualname__}`"


def parts(kind: str) -> str:
    """Every built-in part of ``kind`` (losses, networks, pools, readers) from its registry."""
    from pipeline.core import registry

    out: list[str] = []
    if kind == "losses":
        for name in registry.LOSSES.names:
            cls = registry.LOSSES.get_part(name)
            out += [f"## `{name}`", "", f"{_first_paragraph(cls)}", "", f"Class: {_where(cls)}. "
                    f"Options: `--loss-option NAME=VALUE`.", ""]
            out += _options_rows(getattr(cls, "Options", None)) + [""]
    elif kind == "networks":
        for name in registry.NETWORKS.names:
            spec = registry.NETWORKS.spec(name)
            cls = registry.NETWORKS.get_part(name)
            defaults = ", ".join(f"`{k}` {v!r}" for k, v in spec.defaults.items()) or "none"
            out += [f"## `{name}`", "", f"{_first_paragraph(cls)}", "",
                    f"Kind: {spec.kind}. Class: {_where(cls)}. Sets when left at their defaults: {defaults}. "
                    f"Options: `--network-option NAME=VALUE`.", ""]
            out += _options_rows(spec.Options) + [""]
    elif kind == "pools":
        for name in registry.SET_POOLS.names:
            cls = registry.SET_POOLS.get_part(name)
            out += [f"## `{name}`", "", f"{_first_paragraph(cls)}", "", f"Class: {_where(cls)}. "
                    f"Used by `--image-pool {name}` and `--text-pool {name}`.", ""]
            out += _options_rows(getattr(cls, "Options", None)) + [""]
    elif kind == "readers":
        for name, entry in registry.READERS.entries.items():
            function = registry.READERS.get_part(name)
            files = "image files" if entry.images else "precomputed features, no image files"
            out += [f"## `{name}`", "", f"{_first_paragraph(function)}", "",
                    f"Reader: {_where(function)}; {files}. Used by `--dataset {name}`.", ""]
            out += _options_rows(registry.READERS.layout_class(name)) + [""]
    else:
        raise DocsError(f"unknown parts kind {kind!r} (losses, networks, pools, readers)")
    return "\n".join(out)


# ---------------------------------------------------------------------------- directives
def _arguments(args: str) -> tuple[str, dict]:
    words = shlex.split(args)
    positional = [w for w in words if "=" not in w]
    named = dict(w.split("=", 1) for w in words if "=" in w)
    return (positional[0] if positional else ""), named


def render(name: str, args: str) -> str:
    first, named = _arguments(args)
    if name == "table":
        return results_table(first, named.get("columns", ""))
    if name == "claims":
        return claims_table(first)
    if name == "make":
        return make_recipe(first)
    if name == "include":
        return include(first)
    if name == "parts":
        return parts(first)
    if name == "benchfiles":
        return bench_files(first)
    raise DocsError(f"unknown directive vse:{name}")


def fill_values(markdown: str, keep_markers: bool = False) -> str:
    """``markdown`` with every value region replaced by its value (``keep_markers``: the region
    stays, the value between its markers)."""
    def replace(match):
        text = value_from_args(match.group("args"))
        return f"<!-- vse:value {match.group('args')} -->{text}<!-- /vse:value -->" if keep_markers else text

    ends = {m.start() for m in VALUE.finditer(markdown)}
    stray = [m.group("args") for m in VALUE_OPENING.finditer(markdown) if m.start() not in ends]
    if stray:
        raise DocsError(f"vse:value {stray[0]}: no <!-- /vse:value --> after it on its line "
                        "(a value is a region: <!-- vse:value FILE KEY -->TEXT<!-- /vse:value -->)")
    return VALUE.sub(replace, markdown)


def fill(markdown: str, keep_markers: bool = False) -> str:
    """``markdown`` with every directive replaced by what it names (``keep_markers``: the
    directives stay, their generated text between them and their end marker, as in README.md)."""
    def replace(match):
        text = render(match.group("name"), match.group("args"))
        if keep_markers:
            name, args = match.group("name"), match.group("args")
            return f"<!-- vse:{name} {args} -->\n{text}\n<!-- /vse:{name} -->"
        return text

    return DIRECTIVE.sub(replace, fill_values(markdown, keep_markers))


def fill_regions(markdown: str) -> str:
    """``markdown`` with the generated text of its regions written again, and nothing else: a
    directive without an end marker stays as it is (the build fills it)."""
    def replace(match):
        if match.group("body") is None:
            return match.group(0)
        name, args = match.group("name"), match.group("args")
        return f"<!-- vse:{name} {args} -->\n{render(name, args)}\n<!-- /vse:{name} -->"

    return DIRECTIVE.sub(replace, fill_values(markdown, keep_markers=True))


def regions_up_to_date(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    return fill(text, keep_markers=True) == text


def stale_values(text: str) -> list[str]:
    """'KEY of FILE: TEXT, the file holds VALUE' for each value region whose text is not its file's."""
    stale = []
    for match in VALUE.finditer(text):
        now = value_from_args(match.group("args"))
        if match.group("body") != now:
            line = text.count("\n", 0, match.start()) + 1
            stale.append(f"line {line}: {match.group('args')}: {match.group('body')!r}, "
                         f"the file holds {now!r}")
    return stale


# ---------------------------------------------------------------------------- MkDocs hooks
COMMAND_PAGE = """::: mkdocs-click
    :module: {module}
    :command: {attribute}
    :prog_name: vse {name}
    :style: plain
    :list_subcommands: false
"""


def commands() -> dict:
    from cli.main import COMMANDS

    return dict(COMMANDS)


def on_config(config, **kwargs):
    """The "Commands" section of the nav gets one page per command, in ``COMMANDS``' order."""
    for item in config["nav"] or []:
        if isinstance(item, dict) and "Commands" in item:
            section = item["Commands"]
            section[:] = [entry for entry in section if not str(entry).startswith("{'vse ")]
            section += [{f"vse {name}": f"commands/vse-{name}.md"} for name in commands()]
    return config


def commands_index() -> str:
    """commands.md: every command with the first line of its help."""
    from cli.main import cli

    lines = ["# Commands", "",
             "Every command of `vse`, each on its page, generated from the click command itself "
             "(its options, their types and defaults, its help): an option exists in one place only. "
             "All commands take `-h`; [Getting started](getting-started.md#conventions-of-every-command) "
             "says what they have in common.", "", "| command | what it does |", "|:---|:---|"]
    for name in commands():
        command = cli.commands[name]
        lines.append(f"| [`vse {name}`](commands/vse-{name}.md) | {command.get_short_help_str(limit=150)} |")
    return "\n".join(lines) + "\n"


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "commands.md", content=commands_index()))
    for name, spec in commands().items():
        module, _, attribute = spec.partition(":")
        page = COMMAND_PAGE.format(name=name, module=module, attribute=attribute)
        files.append(File.generated(config, f"commands/vse-{name}.md", content=page))
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    from mkdocs.exceptions import PluginError

    try:
        return fill(markdown)
    except DocsError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from exc


# ---------------------------------------------------------------------------- files with regions
REGION_FILES = ("README.md", "docs/PROTOCOL.md")  # they hold their generated regions themselves


def value_pages() -> list[Path]:
    """The site's pages that hold a value region (their other directives the build fills)."""
    pages = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
    return [p for p in pages if VALUE_OPENING.search(p.read_text(encoding="utf-8"))
            and str(p.relative_to(ROOT)) not in REGION_FILES]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _rewrite(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    new = fill(text, keep_markers=True) if _name(path) in REGION_FILES else fill_regions(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    """``--readme [FILE...]``: write the generated regions of REGION_FILES and the value regions of
    the site's pages (or of the files named only); ``--check``: exit 1 when one is stale."""
    paths = [ROOT / name for name in REGION_FILES] + value_pages()
    if argv[:1] == ["--check"]:
        stale = [_name(p) for p in paths
                 if (not regions_up_to_date(p) if _name(p) in REGION_FILES
                     else stale_values(p.read_text(encoding="utf-8")))]
        if stale:
            print(f"{', '.join(stale)}: stale regions: python docs/hooks/vse_docs.py --readme")
        return int(bool(stale))
    if argv[:1] == ["--readme"]:
        if argv[1:]:
            paths = [(ROOT / name).resolve() for name in argv[1:]]
        try:
            changed = [_name(p) for p in paths if _rewrite(p)]
        except DocsError as exc:
            return print(f"error: {exc}", file=sys.stderr) or 1
        print(f"rewrote {', '.join(changed)}" if changed else "every region is current")
        return 0
    return print(__doc__) or 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
