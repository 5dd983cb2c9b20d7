"""The API reference is generated from the package; it must match the code."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_api_reference_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, (
        "docs/api.md is out of date; run `python docs/gen_api.py`\n" + result.stdout + result.stderr)
