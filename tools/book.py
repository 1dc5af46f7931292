"""The course as a book: both editions as one static website, from the notebooks' stored outputs.

    python -m tools.book build [--out _build/book]   # stage both editions, then Sphinx builds each
    python -m tools.book stage [--out _build/book]   # only write the Sphinx sources (_build/book-src/)

``make book`` runs it in its own venv (``.venv-book``, pinned by ``docs/book/requirements.txt``). The
site: ``_build/book/index.html`` (a choice of language), ``en/`` and ``zh-CN/``, the same pages in
each, a link on every page to the same page in the other edition. Nothing is executed: a chapter
page shows the notebook's code and stored outputs, as the test suite checked them.

What the staging step does to each edition's sources (one small named step each):

- the chapters: ``notebooks/`` (``notebooks-zh/``), each with a line under its title saying when its
  outputs were made (the ``course.last_run`` metadata that ``make execute`` records) and a download
  link to the notebook itself, and a note where a live widget would be, before its static view;
- the errata, the glossary, the instructor guide and the README's learner sections, as pages;
- every relative link between these files rewritten to the page that holds its target; a link to a
  file of the repository that is not in the book becomes the file's name in code font;
- for the Chinese search, the glossary's terms as a word list (``_search_words.txt``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from course_utils.i18n import speaking, tr
from course_utils.inventory import notebooks_in

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "docs" / "book"
OUT = ROOT / "_build" / "book"
EDITIONS = ("en", "zh-CN")
SOURCES = {"en": ROOT / "notebooks", "zh-CN": ROOT / "notebooks-zh"}  # --notebooks, --notebooks-zh: others
FOLDERS = {"en": "notebooks", "zh-CN": "notebooks-zh"}  # where the links of the docs expect them
ERRATA = {"en": ROOT / "docs" / "errata.md", "zh-CN": ROOT / "docs" / "errata.zh-CN.md"}
GLOSSARY = ROOT / "i18n" / "zh-CN" / "glossary.md"
GUIDE = ROOT / "docs" / "instructor"
README = ROOT / "README.md"
SPHINX_LANGUAGE = {"en": "en", "zh-CN": "zh_CN"}
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
_SOLUTION = re.compile(r"^[^#\n]*\bq\w*\.solution\(\)", re.M)  # an exercise's answer shown by the notebook
BUILD_TIMEOUT_S = 600  # one edition; about 30 s on 2 cores

#: The README's sections for learners, in the order of the "About the course" page (the Chinese
#: section opens the Chinese edition's home page instead). The rest is for maintainers and
#: instructors (the instructor guide is in the book).
LEARNER_SECTIONS = (
    "Two commands",
    "Other set-ups",
    "How the notebooks start processes",
    "Running on a GPU",
    "Beyond one machine",
    "Contributing and licence",
)
CHINESE_SECTION = "中文版（Chinese edition）"

def words(edition: str) -> dict[str, str]:
    """The words of the book's own lines (headings, notes) in `edition`, ``en`` or ``zh-CN``."""
    with speaking(edition):
        return {
            "chapters": tr("Chapters", "章节"),
            "reference": tr("Reference", "参考"),
            "glossary": tr("Glossary of the Chinese edition (术语表)", "术语表"),  # the page itself is in Chinese
            "about": tr("About the course", "关于本课程（英文）"),
            "english_only": tr("", "本页只有英文版。"),
        }


# ---------------------------------------------------------------- reading the sources


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def chapters(folder: Path) -> list[Path]:
    """The chapters' notebooks in `folder`, in order (``course_utils.inventory``)."""
    return notebooks_in(folder)


def title(nb: dict) -> str:
    """A notebook's title: its first line (``# 01 · Autograd and the dynamic graph``)."""
    return "".join(nb["cells"][0]["source"]).splitlines()[0].lstrip("# ").strip()


def last_run(nb: dict) -> dict | None:
    """``{"torch": ..., "date": ...}`` as ``make execute`` records it, or None where it is absent or
    incomplete (a notebook executed before it was recorded)."""
    run = (nb.get("metadata", {}).get("course") or {}).get("last_run")
    if isinstance(run, dict) and all(isinstance(run.get(k), str) and run[k].strip() for k in ("torch", "date")):
        return run
    return None


def sections(markdown: str) -> dict[str, str]:
    """A Markdown text's ``##`` sections by heading (each with its ``###`` subsections), and the text
    before the first one under ``""``."""
    found: dict[str, str] = {}
    name, lines, fence = "", [], False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            found[name] = "".join(lines)
            name, lines = line[3:].strip(), []
        lines.append(line)
    found[name] = "".join(lines)
    return found


# ---------------------------------------------------------------- links between the book's pages

# inline code (left alone), or a link that is not an image: [label](url)
_LINK = re.compile(r"(?P<code>`[^`\n]*`)|(?<!!)\[(?P<label>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<url>[^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """The anchor of a heading, as MyST (and GitHub) make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def relink(markdown: str, source: Path, target: str, pages: dict[str, str],
           anchors: dict[str, set[str]] | None = None) -> str:
    """`markdown`, read from the repository file `source`, with each relative link made to work from
    the page `target` (a path in the edition, ``instructor/01_autograd.md``): a link to a file that
    the book holds (`pages`: repository path -> page path) points to that page; a link to another
    file of the repository becomes its text and the file's name in code font; a link to an anchor
    of a page that `anchors` lists (page path -> the anchors it has) but not among them becomes its
    text (a section the page leaves out). Web links and code are left alone."""
    anchors = anchors or {}
    here = source.parent.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT) else "."

    def fix(match: re.Match) -> str:
        if match.group("code"):
            return match.group(0)
        label, url = match.group("label"), match.group("url")
        if re.match(r"^[a-z][a-z0-9+.-]*:", url, re.I):
            return match.group(0)
        path, _, anchor = url.partition("#")
        page = target
        if path:
            repo = posixpath.normpath(posixpath.join(here, path))
            if repo not in pages:
                if not (ROOT / repo).exists():
                    return match.group(0)  # not a file of the repository: the build will say
                name = repo.rstrip("/").split("/")[-1]
                return label if name in label else f"{label} (`{repo}`)"
            page = pages[repo]
        if anchor and page in anchors and anchor not in anchors[page]:
            return label
        rel = posixpath.relpath(page, posixpath.dirname(target) or ".") if path else ""
        return f"[{label}]({rel}{'#' + anchor if anchor else ''})"

    out, fence = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            fence = not fence
            out.append(line)
            continue
        if fence:
            out.append(line)
            continue
        out.append(_LINK.sub(fix, line))
    return "".join(out)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors MyST gives the headings of `markdown` (``#`` to ``####``)."""
    found, fence = set(), False
    for line in markdown.splitlines():
        if _FENCE.match(line.lstrip()):
            fence = not fence
        m = None if fence else re.match(r"^(#{1,4}) (.+?)\s*#*\s*$", line)
        if m:
            found.add(slug(m.group(2)))
    return found


# ---------------------------------------------------------------- one edition's sources


def page_map(edition: str) -> dict[str, str]:
    """Repository path -> page path in `edition`, for every file the book holds."""
    pages = {f"{FOLDERS[edition]}/{nb.name}": nb.name for nb in chapters(SOURCES[edition])}
    pages[ERRATA[edition].relative_to(ROOT).as_posix()] = "errata.md"
    pages[GLOSSARY.relative_to(ROOT).as_posix()] = "glossary.md"
    for md in sorted(GUIDE.glob("*.md")):
        pages[md.relative_to(ROOT).as_posix()] = f"instructor/{md.name}"
    pages["README.md"] = "about.md"
    return pages


def chapter_header(nb: dict, edition: str, download: str) -> dict:
    """The Markdown cell under a chapter's title: its last run and the download link."""
    run, name = last_run(nb), posixpath.basename(download)
    with speaking(edition):
        if run:
            line = tr("Last run: torch {torch}, {date}: the run whose outputs this page shows.",
                      "最近一次运行：torch {torch}，{date}。本页的输出来自这次运行。",
                      torch=run["torch"], date=run["date"])
        else:
            line = tr("Last run: not recorded (`make execute` records the torch version and date of the run whose "
                      "outputs this page shows).",
                      "最近一次运行：未记录（`make execute` 会记下产生本页输出的那次运行的 torch 版本和日期）。")
        link = tr("Download this notebook ({name})", "下载此笔记本（{name}）", name=name)
    text = f":::{{container}} course-meta\n{line}\n\n{{download}}`{link} <{download}>`\n:::\n"
    return {"cell_type": "markdown", "id": "course-book-meta", "metadata": {}, "source": text}


def widget_note(edition: str, cell_id: str) -> dict:
    with speaking(edition):
        note = tr("**A live widget runs here in JupyterLab** (`make lab`): move its controls to see the view change. "
                  "What follows is its default view, as the next cell stores it.",
                  "**此处在 JupyterLab 中是一个可交互的控件**（`make lab-zh`）：拖动它的控件，视图随之变化。"
                  "下面是它的默认视图，由下一个单元格保存。")
    return {"cell_type": "markdown", "id": f"{cell_id}-live", "metadata": {}, "source": f":::{{note}}\n{note}\n:::\n"}


def stage_notebook(path: Path, edition: str, pages: dict[str, str], anchors: dict[str, set[str]]) -> dict:
    """The chapter as the book shows it (see the module's docstring); the notebook is not changed."""
    nb = copy.deepcopy(load(path))
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and _SOLUTION.search("".join(cell["source"])) and cell.get("outputs"):
            raise SystemExit(f"{FOLDERS[edition]}/{path.name} cell {cell.get('id')} shows an exercise's solution "
                             "(.solution()): the book shows the exercises' prompts, and the answers stay in the "
                             "instructor guide's answer key. Remove the call from the notebook.")
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            cell["source"] = relink(src, ROOT / FOLDERS[edition] / path.name, path.name, pages, anchors)
        cells.append(cell)
        if i == 0:
            cells.append(chapter_header(nb, edition, f"_notebooks/{path.name}"))
        widgets = [o for o in cell.get("outputs", []) if WIDGET_MIME in o.get("data", {})]
        if widgets:
            cell["outputs"] = [o for o in cell["outputs"] if o not in widgets]
            cells.append(widget_note(edition, cell.get("id", str(i))))
    nb["cells"] = cells
    nb["metadata"].pop("widgets", None)
    return nb


def readme_pages(edition: str, pages: dict[str, str], anchors: dict[str, set[str]]) -> tuple[str, str]:
    """The edition's home page and its "About the course" page, from the README."""
    parts = sections(README.read_text(encoding="utf-8"))
    missing = [s for s in (*LEARNER_SECTIONS, CHINESE_SECTION, "Chapters") if s not in parts]
    if missing:
        raise SystemExit(f"README.md has no section {', '.join(map(repr, missing))}: update "
                         "tools/book.py's LEARNER_SECTIONS to the README's headings.")
    said = words(edition)
    about = "# " + said["about"] + "\n\n"
    if said["english_only"]:
        about += said["english_only"] + "\n\n"
    about += "".join(parts[s] for s in LEARNER_SECTIONS)
    about = relink(about, README, "about.md", pages, anchors)
    titles = [(nb.stem, title(load(nb))) for nb in chapters(SOURCES[edition])]
    if edition == "en":
        table = parts["Chapters"]
        for stem, name in titles:  # the table's notebook names become links to the chapters
            table = table.replace(f"| `{stem}.ipynb` |", f"| [{name}](notebooks/{stem}.ipynb) |")
        home = parts[""] + "\n" + table
    else:
        home = "# PyTorch 深入\n\n" + parts[CHINESE_SECTION].split("\n", 1)[1]
        home += "\n## " + said["chapters"] + "\n\n" + "".join(f"- [{t}]({s}.ipynb)\n" for s, t in titles)
    home = relink(home, README, "index.md", pages, anchors)
    home += "\n" + _toctree(said["chapters"], [s for s, _ in titles], maxdepth=1)
    home += _toctree(said["reference"], ["errata", f"{said['glossary']} <glossary>", "about", "instructor/README"],
                     maxdepth=1)
    return home, about


def _toctree(caption: str, entries: list[str], maxdepth: int = 1, hidden: bool = False) -> str:
    opts = f":caption: {caption}\n:maxdepth: {maxdepth}\n" + (":hidden:\n" if hidden else "")
    return "```{toctree}\n" + opts + "\n" + "".join(e + "\n" for e in entries) + "```\n\n"


def search_words(glossary: str) -> str:
    """The glossary's Chinese terms, one a line, as jieba reads a user dictionary (word, frequency)."""
    words = set()
    for line in glossary.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue
        for term in re.split(r"[；;，,、/（）()\s]+", cells[1]):
            if len(term) >= 2 and re.search(r"[\u4e00-\u9fff]", term) and not re.search(r"[A-Za-z`]", term):
                words.add(term)
    return "".join(f"{w} 1000\n" for w in sorted(words))


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` unless the file holds it already (Sphinx then rebuilds only what changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def copy_if_changed(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


def stage(edition: str, folder: Path) -> list[str]:
    """Write `edition`'s Sphinx sources into `folder`; returns the page names."""
    if not chapters(SOURCES[edition]):
        raise SystemExit(f"no chapters in {SOURCES[edition].relative_to(ROOT)}/: nothing to build")
    pages = page_map(edition)
    texts = {page: (ROOT / repo).read_text(encoding="utf-8") for repo, page in pages.items()
             if page.endswith(".md") and page != "about.md"}
    readme = sections(README.read_text(encoding="utf-8"))
    # the README's page holds some of its sections: a link to one left out becomes text; any other
    # anchor stays a link, which Sphinx checks (a wrong one fails the build)
    anchors = {"about.md": heading_anchors("".join(readme[s] for s in LEARNER_SECTIONS))}
    wanted = set()
    for nb in chapters(SOURCES[edition]):
        staged = stage_notebook(nb, edition, pages, anchors)
        write_if_changed(folder / nb.name, json.dumps(staged, indent=1, ensure_ascii=False) + "\n")
        copy_if_changed(nb, folder / "_notebooks" / nb.name)
        wanted |= {nb.name, f"_notebooks/{nb.name}"}
    english_only = words(edition)["english_only"]
    note = (english_only + "\n\n") if english_only else ""
    for repo, page in pages.items():
        if not page.endswith(".md") or page == "about.md":
            continue
        text = texts[page]
        if page == "errata.md":  # the book's own switch replaces the file's "English · 中文" line
            text = re.sub(r"\A(English|中文) · \[[^\]]*\]\([^)]*\)\n+", "", text)
            text = re.sub(r"\A\[English\]\([^)]*\) · 中文\n+", "", text)
            # an entry's anchor (<a id="erratum-N"></a>, for GitHub and JupyterLab) as a MyST target,
            # which Sphinx knows: links to errata.md#erratum-N then resolve, and are checked
            text = re.sub(r'^<a id="([\w-]+)"></a>\n\n', r"(\1)=\n", text, flags=re.M)
        if page.startswith("instructor/") and edition != "en":
            text = re.sub(r"\A(# .*\n)", lambda m: m.group(1) + "\n" + note, text, count=1)
        text = relink(text, ROOT / repo, page, pages, anchors)
        if page == "instructor/README.md":
            text += "\n" + _toctree("Pages", [p.removesuffix(".md").removeprefix("instructor/")
                                              for p in sorted(pages.values())
                                              if p.startswith("instructor/") and p != page], hidden=True)
        write_if_changed(folder / page, text)
        wanted.add(page)
    home, about = readme_pages(edition, pages, anchors)
    write_if_changed(folder / "index.md", home)
    write_if_changed(folder / "about.md", about)
    write_if_changed(folder / "_search_words.txt", search_words(GLOSSARY.read_text(encoding="utf-8")))
    wanted |= {"index.md", "about.md", "_search_words.txt"}
    for f in sorted(folder.rglob("*"), reverse=True):  # what an earlier build staged and is gone now
        rel = f.relative_to(folder).as_posix()
        if f.is_file() and rel not in wanted:
            f.unlink()
    return sorted(p.rsplit(".", 1)[0] for p in wanted if not p.startswith("_"))


# ---------------------------------------------------------------- the site

LANDING = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>PyTorch in depth · PyTorch 深入</title>
<link rel="icon" href="en/_static/course-icon.svg">
<style>
body {{ font-family: system-ui, sans-serif; max-width: 40rem; margin: 4rem auto; padding: 0 1rem; \
line-height: 1.6; color: #1a1a1a; }}
a {{ color: #0b5cad; font-size: 1.25rem; }}
li {{ margin: 0.5rem 0; }}
</style>
</head>
<body>
<main>
<h1>PyTorch in depth · <span lang="zh-CN">PyTorch 深入</span></h1>
<p>An interactive, offline PyTorch course, as a book: every chapter with the outputs of its last tested run.</p>
<ul>
<li><a href="en/index.html">English edition</a></li>
<li><a href="zh-CN/index.html" lang="zh-CN" hreflang="zh-CN">中文版</a></li>
</ul>
</main>
</body>
</html>
"""


def sphinx(edition: str, src: Path, out: Path, doctrees: Path) -> None:
    """Build one edition with Sphinx, every page afresh (-E), warnings as errors: a broken link fails."""
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-E", "-q", "-W", "--keep-going", "-j", "2",
           "-c", str(CONF), "-d", str(doctrees), "-D", f"language={SPHINX_LANGUAGE[edition]}",
           str(src), str(out)]
    env = dict(os.environ, PYTHONHASHSEED="0")
    try:
        r = subprocess.run(cmd, cwd=str(ROOT), env=env, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the {edition} edition took more than {BUILD_TIMEOUT_S} s to build") from None
    if r.returncode != 0:
        raise SystemExit(f"Sphinx could not build the {edition} edition (its messages are above).")


def site_size(folder: Path) -> tuple[int, int]:
    """(number of HTML pages, bytes) of a built folder."""
    files = [f for f in folder.rglob("*") if f.is_file()]
    return sum(f.suffix == ".html" for f in files), sum(f.stat().st_size for f in files)


def build(out: Path = OUT) -> int:
    try:
        import myst_nb  # noqa: F401
        import sphinx as _sphinx  # noqa: F401
    except ImportError:
        raise SystemExit("the book needs its own packages: run `make book` (or `python tasks.py book`), "
                         "which installs docs/book/requirements.txt into .venv-book.") from None
    t0 = time.perf_counter()
    work = out.parent / (out.name + "-src")
    for edition in EDITIONS:
        stage(edition, work / edition)
        sphinx(edition, work / edition, out / edition, out.parent / (out.name + "-doctrees") / edition)
    (out / "index.html").write_text(LANDING.format(), encoding="utf-8")
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and _images/ as they are
    took = time.perf_counter() - t0
    for edition in EDITIONS:
        n, size = site_size(out / edition)
        print(f"  {edition:6s} {n:3d} pages, {size / 1e6:5.1f} MB")
    n, size = site_size(out)
    print(f"book: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/ in {took:.0f} s, "
          f"{n} pages, {size / 1e6:.1f} MB; open {out.name}/index.html, or serve the folder "
          f"(python -m http.server -d {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.book", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "stage"])
    parser.add_argument("--out", type=Path, default=OUT, help="the site's folder (default _build/book)")
    parser.add_argument("--notebooks", type=Path, help="read the English chapters from here, not notebooks/")
    parser.add_argument("--notebooks-zh", type=Path, help="read the Chinese chapters from here, not notebooks-zh/")
    opts = parser.parse_args(argv)
    out = opts.out.resolve()
    for edition, folder in (("en", opts.notebooks), ("zh-CN", opts.notebooks_zh)):
        if folder is not None:
            SOURCES[edition] = folder.resolve()
    if opts.command == "stage":
        for edition in EDITIONS:
            stage(edition, out.parent / (out.name + "-src") / edition)
        return 0
    return build(out)


if __name__ == "__main__":
    sys.exit(main())
