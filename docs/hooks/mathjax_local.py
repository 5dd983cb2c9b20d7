"""MkDocs hook: copies MathJax 3 (the es5 bundle and its fonts) from the django-static-mathjax
PyPI package into the site, so formulas render offline without a CDN, in the pages and in the
notebooks' markdown cells; and drops the CDN MathJax 2 that nbconvert's template would load."""

import importlib.util
import pathlib
import re
import shutil


def _es5() -> pathlib.Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("[docs] MathJax is missing: pip install '.[docs]' (it installs django-static-mathjax)")
    root = pathlib.Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (root / "tex-mml-chtml.js").is_file():
        raise RuntimeError(f"[docs] {root}/tex-mml-chtml.js not found: reinstall django-static-mathjax")
    return root


# Pages: pymdownx.arithmatex (generic mode) wraps math in \( \) and \[ \] inside class "arithmatex";
# the rest of a page is marked tex2jax_ignore (on_post_page) so a stray dollar stays a dollar.
# Notebooks: mkdocs-jupyter leaves the markdown cells' $...$ and $$...$$ as written; code cells and
# outputs (jp-CodeCell) keep their dollars.
_CONFIG = """window.MathJax = {
  tex: {inlineMath: [["\\\\(", "\\\\)"], ["$", "$"]], displayMath: [["\\\\[", "\\\\]"], ["$$", "$$"]],
        processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: "tex2jax_ignore|jp-CodeCell", processHtmlClass: "arithmatex"}
};
"""

def on_post_build(config, **kwargs):
    dest = pathlib.Path(config["site_dir"]) / "assets" / "mathjax"
    shutil.copytree(_es5(), dest, dirs_exist_ok=True)
    (dest / "config.js").write_text(_CONFIG, encoding="utf-8")


# nbconvert's template puts an empty <script src=""> and a MathJax 2 configuration block into each
# notebook page; MathJax 3 (above) does the typesetting, so both go.
_NB_MATHJAX2 = re.compile(r'<!-- Load mathjax -->\s*<script src="[^"]*">\s*</script>.*?<!-- End of mathjax configuration -->',
                          re.S)
_ARTICLE = '<article class="md-content__inner md-typeset">'


def on_post_page(output, page, config, **kwargs):
    if page.file.src_uri.endswith(".ipynb"):
        return _NB_MATHJAX2.sub("", output)
    return output.replace(_ARTICLE, _ARTICLE[:-2] + ' tex2jax_ignore">', 1)
