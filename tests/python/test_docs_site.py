"""The docs site builds in MkDocs strict mode (no broken links, no docstring warnings) with
MathJax served from the site itself."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_site_builds_strict(tmp_path):
    for mod in ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter", "mathjax"):
        pytest.importorskip(mod, reason=f"the docs site needs {mod}: pip install '.[docs]'")
    # mkdocstrings reads python/ itself (mkdocs.yml paths); the pictures hook imports the shardlab
    # this process sees (the installed package, or a dev tree with its SHARDLAB_CORE_DIR)
    env = dict(os.environ)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "assets" / "mathjax" / "tex-mml-chtml.js").is_file()  # served locally, no CDN
    viz_page = (site / "viz" / "index.html").read_text(encoding="utf-8")
    assert "shardlab.viz.sharding.sharding" in viz_page  # mkdocstrings rendered the reference
    nb = site / "notebooks" / "01_sharded_arrays" / "index.html"
    assert nb.is_file() and "jp-OutputArea" in nb.read_text(encoding="utf-8")
    assert "cdn.jsdelivr" not in (site / "index.html").read_text(encoding="utf-8")
    # helper scripts are not published; notebooks are listed in numeric order
    assert not list(site.glob("*.py")) and not (site / "hooks").exists()
    nav = re.findall(r'href="[./]*notebooks/(\d\d)_', (site / "index.html").read_text(encoding="utf-8"))
    assert nav and nav == sorted(nav)
    # formulas: the notebooks' $...$ are typeset by the site's MathJax 3, not nbconvert's MathJax 2
    page = (site / "notebooks" / "03_sharded_matmul" / "index.html").read_text(encoding="utf-8")
    assert "x-mathjax-config" not in page and 'src=""' not in page and "assets/mathjax/config.js" in page
    config = (site / "assets" / "mathjax" / "config.js").read_text(encoding="utf-8")
    assert '["$", "$"]' in config and "jp-CodeCell" in config
    assert "tex2jax_ignore" in (site / "cost_model" / "index.html").read_text(encoding="utf-8")
    # the Pictures page shows every kind of picture, drawn at build time
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    import pictures
    shown = set(re.findall(r'data-picture="([\w-]+)"', viz_page))
    assert shown == {p for p in pictures.PICTURES if not p.startswith("concepts-")}
    concepts = (site / "concepts" / "index.html").read_text(encoding="utf-8")
    assert {"concepts-specs", "concepts-storage", "collective-psum"} <= set(re.findall(r'data-picture="([\w-]+)"', concepts))
    assert viz_page.count("<svg") >= len(pictures.PICTURES) - 6   # the object displays are tables
    # wide pictures and tables scroll
    assert "overflow-x" in (site / "stylesheets" / "shardlab.css").read_text(encoding="utf-8")
