"""The docs match the code: the API reference is regenerated and every python example runs."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_api_reference_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        "docs/api.md is out of date; run `python docs/gen_api.py`\n" + result.stdout + result.stderr)


def _python_blocks():
    import re

    for doc in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]):
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)):
            yield pytest.param(block, id=f"{doc.name}-{i}")


@pytest.mark.parametrize("code", list(_python_blocks()))
def test_python_examples_in_the_docs_run(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "docs")
    assert result.returncode == 0, result.stderr
