"""Sphinx settings of the book: both editions (``language`` "en" or "zh_CN", given by tools/book.py).

Nothing is executed (the notebooks' stored outputs are the content) and nothing is fetched, at build
time or at reading time: MathJax, fonts, scripts and the search index are files of the site.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

project = "PyTorch in depth"
author = "the course's authors"
copyright = "the course's authors; text and figures CC BY 4.0, code MIT"
language = "en"  # tools/book.py builds the Chinese edition with -D language=zh_CN

extensions = [
    "myst_nb",
    "sphinx.ext.mathjax",
    "course_book",  # the language switch, figures' alt text, the search dictionary, MathJax's files
]

# MyST-NB: the notebooks as they are stored, outputs included
nb_execution_mode = "off"
nb_merge_streams = True
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 4  # GitHub-style anchors, as the course's own links use

exclude_patterns = ["_notebooks", "**.ipynb_checkpoints"]
templates_path = [str(Path(__file__).resolve().parent / "_templates")]
html_static_path = [str(Path(__file__).resolve().parent / "_static")]
html_css_files = ["course-book.css"]
html_favicon = str(Path(__file__).resolve().parent / "_static" / "course-icon.svg")  # no request for /favicon.ico

html_theme = "sphinx_book_theme"
html_title = project
html_copy_source = False  # the download link on each chapter gives the notebook itself
html_show_sourcelink = False
html_last_updated_fmt = None
html_context = {"default_mode": "auto"}  # light or dark as the reader's system says
html_theme_options = {
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_issues_button": False,
    "use_source_button": False,
    "launch_buttons": {},
    "article_header_end": ["lang-switch.html", "article-header-buttons.html"],
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
# a chapter may go from "#" to "###"; a stored traceback may not lex as one (Pygments then
# shows it as plain text): neither breaks a page
suppress_warnings = ["myst.header", "misc.highlighting_failure"]
