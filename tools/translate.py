"""The Chinese edition, built from the English notebooks and one translation file per notebook.

    python -m tools.translate build          # notebooks-zh/*.ipynb from notebooks/ and i18n/zh-CN/
    python -m tools.translate check          # fail, naming each cell, if a translation is missing or stale
    python -m tools.translate skeleton NB    # add entries for NB's untranslated cells to its file

i18n/zh-CN/<notebook>.toml holds one table per Markdown cell, keyed by the cell's id:

    ["9b94147d"]
    hash = "3f2a9c1b7d4e"          # of the English text this translates (sha256, 12 hex digits)
    en = "# 04 · torch.distributed with real processes"   # its first words, for people
    zh = '''
    # 04 · 用真实进程运行 torch.distributed
    ...'''

A code cell may have an entry too, with ``code`` in place of ``zh``: the same code with its comments
and string literals (the labels it prints) in Chinese. Nothing else may differ: ``same_code`` compares
the two token by token (Python's tokenizer), leaving out only comments and strings, so the code cannot
drift; a code cell without an entry is copied as it is. A translation whose English cell changed since
(another hash) is stale: `check` and `build` name the cell by id and first words, and fail. The Chinese
notebooks' outputs come from running them (``python tasks.py execute``).
The build keeps a Chinese notebook's outputs while its code is unchanged, and marks the notebook's
language in its metadata (``course.language``), where course_utils reads it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import io
import json
import re
import sys
import tokenize
import tomllib
from pathlib import Path

from course_utils import ROOT
from course_utils.inventory import notebooks_in
from tools.notebook import dumps

LANG = "zh-CN"
SOURCE = ROOT / "notebooks"
TARGET = ROOT / "notebooks-zh"
TRANSLATIONS = ROOT / "i18n" / LANG


#: tokens that may differ between a code cell and its translation: what a reader reads, not what runs
_FREE_TOKENS = {tokenize.COMMENT, tokenize.STRING, tokenize.NL}
if hasattr(tokenize, "FSTRING_MIDDLE"):  # Python 3.12+: an f-string's text, between its expressions
    _FREE_TOKENS.add(tokenize.FSTRING_MIDDLE)


def _fstring_code(literal: str) -> list[tuple[int, str]]:
    """The code inside an f-string literal (Python 3.11 reads the whole f-string as one STRING token;
    3.12+ tokenizes its expressions): each replacement field's expression tokens and conversion."""
    prefix = re.match(r"[A-Za-z]*", literal).group(0).lower()
    if "f" not in prefix:
        return []
    try:
        tree = ast.parse(literal.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not Python code the tokenizer can read: {exc}") from exc
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FormattedValue):
            found += [(tokenize.OP, "{"), *code_tokens(ast.unparse(node.value))[:-2],
                      (tokenize.OP, f"!{chr(node.conversion)}" if node.conversion > 0 else "}")]
    return found


def _located_tokens(source: str) -> list[tuple[tuple[int, str], int]]:
    """Each of :func:`code_tokens`' tokens with the line it is on."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError) as exc:
        raise ValueError(f"not Python code the tokenizer can read: {exc}") from exc
    blank = (tokenize.NEWLINE, tokenize.DEDENT, tokenize.ENDMARKER)  # ("\n" or "" at the very end)
    start_f = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+: an f-string is many tokens
    lines = source.splitlines(keepends=True)
    kept: list[tuple[tuple[int, str], int]] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if start_f is not None and t.type == start_f:  # read it whole, as Python 3.11's one STRING token
            depth, j = 0, i
            while True:
                depth += {start_f: 1, tokenize.FSTRING_END: -1}.get(tokens[j].type, 0)
                if depth == 0:
                    break
                j += 1
            kept += [(inner, t.start[0]) for inner in _fstring_code(_source_between(lines, t.start, tokens[j].end))]
            i = j + 1
            continue
        if t.type == tokenize.STRING:
            kept += [(inner, t.start[0]) for inner in _fstring_code(t.string)]
        elif t.type not in _FREE_TOKENS:
            kept.append(((t.type, "" if t.type in blank else t.string), t.start[0]))
        i += 1
    return kept


def _source_between(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The text of `lines` from `start` to `end`, (row, column) positions as tokenize gives them."""
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1]:end[1]]
    return lines[start[0] - 1][start[1]:] + "".join(lines[start[0]:end[0] - 1]) + lines[end[0] - 1][:end[1]]


def code_tokens(source: str) -> list[tuple[int, str]]:
    """The tokens of `source` that decide what it does: every token but comments, string literals
    (an f-string's text and format specs; the expressions in it count) and line breaks inside a statement."""
    return [token for token, _ in _located_tokens(source)]


def same_code(english: str, chinese: str) -> str | None:
    """None if `chinese` is `english` with other comments and string literals only; else where the
    first other token differs (line numbers of the Chinese cell)."""
    try:
        en, located = code_tokens(english), _located_tokens(chinese)
    except ValueError as exc:
        return str(exc)
    zh = [token for token, _ in located]
    if en == zh:
        return None
    k = next((i for i, (a, b) in enumerate(zip(en, zh, strict=False)) if a != b), min(len(en), len(zh)))
    line = located[k][1] if k < len(located) else len(chinese.splitlines())
    want = en[k][1] if k < len(en) else "(end of cell)"
    got = zh[k][1] if k < len(zh) else "(end of cell)"
    return f"line {line}: {got!r} where the English code has {want!r}"


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def first_words(text: str, n: int = 60) -> str:
    line = " ".join(text.split())
    return line if len(line) <= n else line[: n - 1] + "…"


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def notebooks() -> list[Path]:
    """The chapters' English notebooks, in order (``course_utils.inventory``)."""
    return notebooks_in(SOURCE)


def translations(name: str) -> dict:
    path = TRANSLATIONS / f"{Path(name).stem}.toml"
    return tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _untranslated(en: str, zh: str) -> bool:
    """The English text itself (as a skeleton leaves it), where it has English prose to translate."""
    prose = re.sub(r"```.*?```|`[^`]*`|\$[^$]*\$|\([^)]*\)", " ", en, flags=re.S)
    return en.strip() == zh.strip() and len(re.findall(r"[A-Za-z]{3,}", prose)) >= 3


def problems(nb_path: Path) -> list[str]:
    """What stops `nb_path` from being built: missing, stale or orphaned translations."""
    nb, done = load(nb_path), translations(nb_path.name)
    found = []
    ids = set()
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        entry = done.get(cell["id"])
        where = f"{nb_path.name} cell {cell['id']} ({first_words(src, 50)!r})"
        if cell["cell_type"] == "code":
            if entry is None:
                continue  # copied as it is
            ids.add(cell["id"])
            if entry.get("hash") != text_hash(src):
                found.append(f"stale translation (the English code changed): {where}")
            elif (differs := same_code(src, str(entry.get("code", "")).strip("\n"))) is not None:
                found.append(f"the Chinese code differs from the English beyond comments and strings: {where}, "
                             f"{differs}")
            continue
        if cell["cell_type"] != "markdown":
            continue
        ids.add(cell["id"])
        if entry is None or not str(entry.get("zh", "")).strip() or _untranslated(src, entry["zh"]):
            found.append(f"missing translation: {where}")
        elif entry.get("hash") != text_hash(src):
            found.append(f"stale translation (the English text changed): {where}")
    for orphan in sorted(done.keys() - ids):
        found.append(f"translation of a cell that is no longer there: {nb_path.name} cell {orphan}")
    return found


def build_one(nb_path: Path) -> dict:
    """The Chinese notebook: the English one with every Markdown cell translated; the outputs of
    the existing Chinese notebook kept where a code cell is unchanged."""
    nb, done = load(nb_path), translations(nb_path.name)
    old = TARGET / nb_path.name
    kept = {}
    if old.exists():
        for cell in load(old)["cells"]:
            if cell["cell_type"] == "code":
                kept[(cell["id"], "".join(cell["source"]))] = cell
    out = copy.deepcopy(nb)
    for cell in out["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = done[cell["id"]]["zh"].strip("\n").splitlines(keepends=True)
            continue
        if "code" in done.get(cell["id"], {}):
            cell["source"] = done[cell["id"]]["code"].strip("\n").splitlines(keepends=True)
        if (cell["id"], "".join(cell["source"])) in kept:
            prev = kept[(cell["id"], "".join(cell["source"]))]
            cell["outputs"], cell["execution_count"] = prev["outputs"], prev["execution_count"]
    out["metadata"]["course"] = {"language": LANG, "built_from": f"notebooks/{nb_path.name}"}
    if old.exists():  # the run that made the outputs kept (the English notebook's is another run)
        run = load(old)["metadata"].get("course", {}).get("last_run")
        if run:
            out["metadata"]["course"]["last_run"] = run
    return out


def code_drift(nb_path: Path) -> list[str]:
    """Cells of the Chinese notebook whose code or order differs from the English notebook's."""
    target = TARGET / nb_path.name
    if not target.exists():
        return [f"not built yet: notebooks-zh/{nb_path.name} (run `python -m tools.translate build`)"]
    want, have = build_one(nb_path), load(target)
    strip = lambda nb: [(c["id"], c["cell_type"], "".join(c["source"])) for c in nb["cells"]]  # noqa: E731
    if strip(want) != strip(have):
        return [f"notebooks-zh/{nb_path.name} is not the build of notebooks/{nb_path.name} and its "
                "translation: run `python -m tools.translate build`"]
    return []


def skeleton(nb_path: Path) -> int:
    """Append an entry (with the English text to translate in `zh`) for every cell lacking one."""
    nb, done = load(nb_path), translations(nb_path.name)
    path = TRANSLATIONS / f"{nb_path.stem}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    added = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown" and cell["id"] not in done:
            src = "".join(cell["source"])
            if "'''" in src:
                raise SystemExit(f"{nb_path.name} cell {cell['id']}: contains ''' (cannot be a TOML literal)")
            added.append(f'["{cell["id"]}"]\nhash = "{text_hash(src)}"\n'
                         f'en = {json.dumps(first_words(src), ensure_ascii=False)}\n'
                         f"zh = '''\n{src}'''\n")
    if added:
        head = ("" if path.exists()
                else f"# {nb_path.name} in Chinese: one table per Markdown cell (see tools/translate.py).\n\n")
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(head + "\n".join(added))
    return len(added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.translate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    sub.add_parser("check")
    sk = sub.add_parser("skeleton")
    sk.add_argument("notebook")
    args = parser.parse_args(argv)
    if args.cmd == "skeleton":
        nb = SOURCE / Path(args.notebook).name
        print(f"{skeleton(nb)} entries added to {TRANSLATIONS.relative_to(ROOT) / (nb.stem + '.toml')}")
        return 0
    found = [p for nb in notebooks() for p in problems(nb)]
    if args.cmd == "check" and not found:
        found = [p for nb in notebooks() for p in code_drift(nb)]
    if found:
        print("\n".join(found), file=sys.stderr)
        print(f"{len(found)} problem(s): translate or update those cells in {TRANSLATIONS.relative_to(ROOT)}/"
              " (`hash` is the English text's, see tools/translate.py)", file=sys.stderr)
        return 1
    if args.cmd == "build":
        TARGET.mkdir(exist_ok=True)
        for nb in notebooks():
            (TARGET / nb.name).write_text(dumps(build_one(nb)), encoding="utf-8")
        print(f"built {len(notebooks())} notebooks in {TARGET.relative_to(ROOT)}/")
    else:
        print(f"every Markdown cell of {len(notebooks())} notebooks has a current translation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
