"""MkDocs hook: copies MathJax 3 (the es5 bundle and its fonts) from the django-static-mathjax
PyPI package into the site, so formulas render offline without a CDN."""

import importlib.util
import pathlib
import shutil


def _es5() -> pathlib.Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("[docs] MathJax is missing: pip install '.[docs]' (it installs django-static-mathjax)")
    root = pathlib.Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (root / "tex-mml-chtml.js").is_file():
        raise RuntimeError(f"[docs] {root}/tex-mml-chtml.js not found: reinstall django-static-mathjax")
    return root


# pymdownx.arithmatex (generic mode) wraps math in \( \) and \[ \] inside class "arithmatex".
_CONFIG = """window.MathJax = {
  tex: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]],
        processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
"""


def on_post_build(config, **kwargs):
    dest = pathlib.Path(config["site_dir"]) / "assets" / "mathjax"
    shutil.copytree(_es5(), dest, dirs_exist_ok=True)
    (dest / "config.js").write_text(_CONFIG, encoding="utf-8")
