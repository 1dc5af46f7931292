"""The book's Sphinx extension: what the two editions need beyond Sphinx and MyST-NB.

- a link on every page to the same page in the other edition (``_templates/lang-switch.html``);
- each figure's alternative text, stored by the course in the output's metadata
  (``{"image/png": {"alt": ...}}``, see ``course_utils.figures``), carried into ``<img alt>``:
  MyST-NB 1.4 reads only ``width`` and ``height`` from there;
- the course's Chinese terms as a dictionary for the Chinese search (jieba), so that a term of the
  glossary such as 计算图 is one word of the index;
- a name for each button that opens a part of the sidebar's table of contents (the theme's
  ``<summary>`` holds only an icon, which screen readers cannot name: axe-core's "summary-name");
- the Chinese search's script working: Sphinx 9.0 names its stemmer for Latin words
  ``ChineseStemmer`` but ships the English one (``window.Stemmer = ChineseStemmer`` throws);
- MathJax served by the site itself: the files of the pinned ``sphinx-mathjax-offline`` package
  (MathJax 3.2.2), less the bundles the site does not load, in ``_static/mathjax/`` (Sphinx's
  default is a CDN).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

#: edition folder, label of the link to it, its language, and the book's title in it
EDITIONS = {
    "en": {"folder": "en", "label": "English", "title": "Read this page in English", "name": "PyTorch in depth",
           "toggle": "Show or hide the pages in this part"},
    "zh-CN": {"folder": "zh-CN", "label": "中文", "title": "阅读本页的中文版", "name": "PyTorch 深入",
              "toggle": "展开或收起这一部分的页面"},
}
_TOGGLE = '<summary><span class="toctree-toggle" role="presentation">'
SEARCH_WORDS = "_search_words.txt"  # written into the source folder by tools/book.py
MATHJAX = "mathjax/tex-chtml.js"  # in _static/
#: MathJax's other combined bundles and its server-side code: never loaded by a page of the book
MATHJAX_UNUSED = ("tex-svg", "tex-mml", "mml-", "tex-chtml-full", "node-main", "output/svg")


def edition(language: str | None) -> str:
    """``"en"`` or ``"zh-CN"`` for Sphinx's ``language`` setting."""
    return "zh-CN" if (language or "en").lower().replace("_", "-").startswith("zh") else "en"


def other_url(pagename: str, other: str) -> str:
    """The URL of page `pagename` in the edition `other`, relative to the page itself: the editions
    are sibling folders with the same page names."""
    return "../" * (pagename.count("/") + 1) + EDITIONS[other]["folder"] + "/" + pagename + ".html"


def _configure(app: Sphinx, config: Any) -> None:
    this = edition(config.language)
    config.project = config.html_title = EDITIONS[this]["name"]
    config.mathjax_path = MATHJAX
    words = Path(app.srcdir) / SEARCH_WORDS
    if this == "zh-CN" and words.is_file():
        config.html_search_options = dict(config.html_search_options or {}, dict=str(words))
    if this == "zh-CN":
        import logging

        try:
            import jieba
        except ImportError:  # Sphinx then indexes Chinese text without splitting it into words
            return
        jieba.setLogLevel(logging.WARNING)  # no "Building prefix dict..." on every build


def mathjax_files() -> Path:
    """MathJax's folder in the pinned ``sphinx-mathjax-offline`` package."""
    import importlib.util

    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    folder = Path(spec.origin).parent / "static" / "mathjax" if spec and spec.origin else None
    if folder is None or not (folder / "tex-chtml.js").is_file():
        raise RuntimeError("MathJax's files are missing: install docs/book/requirements.txt (make book does)")
    return folder


def _copy_mathjax(app: Sphinx, exc: Exception | None) -> None:
    if exc is not None or app.builder.format != "html":
        return
    source = mathjax_files()
    target = Path(app.outdir) / "_static" / "mathjax"
    for f in sorted(source.rglob("*")):
        rel = f.relative_to(source).as_posix()
        if f.is_file() and not rel.startswith(MATHJAX_UNUSED) and "__pycache__" not in rel:
            dest = target / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists() or dest.stat().st_size != f.stat().st_size:
                dest.write_bytes(f.read_bytes())


def _page_context(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    other = "en" if edition(app.config.language) == "zh-CN" else "zh-CN"
    context.update(course_other_url=other_url(pagename, other), course_other_lang=other,
                   course_other_label=EDITIONS[other]["label"], course_other_title=EDITIONS[other]["title"])


def _name_toggles(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    """The theme's table of contents, each toggle's ``<summary>`` with a name (after the theme set it up)."""
    toctree = context.get("generate_toctree_html")
    if callable(toctree) and not getattr(toctree, "course_named", False):
        label = EDITIONS[edition(app.config.language)]["toggle"]

        def named(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 (the theme's signature)
            from markupsafe import Markup

            html = str(toctree(*args, **kwargs))
            return Markup(html.replace(_TOGGLE, _TOGGLE.replace("<summary>", f'<summary aria-label="{label}">')))

        named.course_named = True
        context["generate_toctree_html"] = named


def _carry_alt_text() -> None:
    """MyST-NB's image rendering, plus the alt text of the output's metadata (where the cell's own
    ``mystnb.image`` options give none)."""
    from myst_nb.core.render import NbElementRenderer

    original = NbElementRenderer.render_image
    if getattr(original, "course_alt", False):
        return

    def render_image(self, data):  # noqa: ANN001, ANN202 (MyST-NB's signature)
        nodes = original(self, data)
        alt = (data.output_metadata.get(data.mime_type) or {}).get("alt")
        for node in nodes:
            if isinstance(alt, str) and alt.strip() and not node.get("alt"):
                node["alt"] = alt.strip()
        return nodes

    render_image.course_alt = True
    NbElementRenderer.render_image = render_image


def _chinese_search_stemmer() -> None:
    """Sphinx's Chinese search, whose page script names the stemmer it ships (the English one)."""
    from sphinx import search
    from sphinx.search.zh import SearchChinese

    if getattr(search.languages.get("zh"), "course_stemmer", False):
        return

    class CourseSearchChinese(SearchChinese):
        language_name = "English"  # language_data.js: window.Stemmer = EnglishStemmer (english-stemmer.js)
        course_stemmer = True

    search.languages["zh"] = CourseSearchChinese


def setup(app: Sphinx) -> dict[str, Any]:
    _carry_alt_text()
    _chinese_search_stemmer()
    app.connect("config-inited", _configure)
    # before the theme drops the header's templates that render empty (the switch needs its link by then)
    app.connect("html-page-context", _page_context, priority=400)
    app.connect("html-page-context", _name_toggles, priority=900)  # after the theme set up its functions
    app.connect("build-finished", _copy_mathjax)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
