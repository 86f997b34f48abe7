"""FEH's engine side for stock vLLM, as a vLLM general plugin (entry point group `vllm.general_plugins`).

vLLM calls `register` at the top of `EngineCore.__init__` (and in its other processes), before the engine
builds its block hasher and before its input thread starts. With the engine-side switch
`PYFRONT_ENGINE_FEH=1` set and the running vLLM the layout the plugin was checked against
(`layout.problems`), it swaps a few attributes (`patches.py`) so that the engine advertises
`native_frontend_hash_config` and uses the block hashes pyfront ships with each request, verifying a
sample of them. Without the switch, or on an unknown layout, it changes nothing (the latter says why in
the engine's log), so installing pyfront next to vLLM is harmless to engines that do not ask for FEH.

Knobs (engine environment): `PYFRONT_ENGINE_FEH_VERIFY` (fraction of blobs recomputed, default 0.01; the
first is always checked) and `PYFRONT_ENGINE_FEH_SALT` (`feh1` default, or `stock`), see `state.py`.
This package must not import `pyfront.server`: it runs inside the engine's process. What it relies on in
vLLM and the order of its checks: docs/engine-protocol.md#feh-on-stock-vllm-the-engine-side-plugin.
"""

from __future__ import annotations

import threading

from pyfront.engine_client.vllm_plugin.state import SWITCH_ENV, FehState, Settings, logger


class _Plugin:
    """The process's one plugin instance: installs at most once and keeps the state the patches share.

    vLLM loads general plugins once per process already; the lock and the flag make a second `register`
    (another caller, a test) a no-op rather than a second set of wrappers around the first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registered = False
        self.state: FehState | None = None

    def register(self) -> None:
        with self._lock:
            if self._registered:
                return
            self._registered = True
            try:
                settings = Settings.from_env()
            except ValueError as exc:
                logger.error("FEH plugin: %s; nothing patched, this engine advertises no FEH", exc)
                return
            if not settings.enabled:
                return
            # vLLM calls general plugins without catching their errors: an exception here would stop the
            # engine from starting, so every failure turns into "FEH off" with the reason logged.
            try:
                from pyfront.engine_client.vllm_plugin.patches import install

                state = FehState(settings)
                found = install(state)
            except Exception:
                logger.exception("FEH plugin: installing failed; this engine advertises no FEH")
                return
            if found:
                logger.warning(
                    "FEH plugin: %s is set, but this vLLM is not a layout the plugin was checked against, so it "
                    "patches nothing and the engine advertises no FEH: %s",
                    SWITCH_ENV,
                    "; ".join(found),
                )
                return
            self.state = state
            logger.info("FEH plugin: installed (%s=1); the engine decides at registration whether to advertise",
                        SWITCH_ENV)  # fmt: skip


PLUGIN = _Plugin()


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    PLUGIN.register()
