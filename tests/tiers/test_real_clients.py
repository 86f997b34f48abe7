"""The opt-in real-client tier: pyfront as third-party clients see it, next to vLLM 0.32's own front end.

Run with ``python -m pytest -q --real-clients -m real_clients tests/tiers/test_real_clients.py`` from the repo root
(or ``tools/real_clients/run_tier.sh``, which sets up both venvs first). The clients live in a venv of their
own (``tools/real_clients/setup_venv.sh``: ``$PYFRONT_CLIENTS_VENV``, default
``~/.cache/pyfront/clients-venv``) and run as subprocesses; the engines, the tiny model and vLLM's front end
come from the real-engine tier (tests/tiers/test_real_engine.py's fixtures and helpers).

1. The openai SDK (chat, streaming, tool calls, the SDK's stream helper, ``chat.completions.parse`` with a
   pydantic model, completions with echo and logprobs) against pyfront and against vLLM's own front end,
   each on a mock engine scripted with the same outputs: the same answers.
2. lm-evaluation-harness (``local-completions``: loglikelihood, loglikelihood_rolling, generate_until;
   ``local-chat-completions``: generate_until) on small local tasks, greedy, against pyfront and vLLM's own
   front end, each on a fresh real vLLM engine: every logged sample identical.
3. guidellm: a bounded load (N requests) against ``pyfront serve --mock-engine``: no errors in its report.

Every process runs in its own process group and is stopped in a ``finally``; each test asserts that none is
left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.tiers import test_real_engine as tier
from tools.real_engine import engine as real_engine

pytestmark = pytest.mark.real_clients

CLIENTS_DIR = REPO_ROOT / "tools" / "real_clients"
CLIENTS_SETUP_HINT = "run tools/real_clients/setup_venv.sh (it prints the venv path; PYFRONT_CLIENTS_VENV overrides it)"
CLIENT_TIMEOUT_S = 600.0

# The real-engine tier's session fixtures, shared (not rebuilt) here.
vllm_venv = tier.vllm_venv
tiny_model = tier.tiny_model
tokenizer = tier.tokenizer

CLIENT_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1"}


@pytest.fixture(scope="session")
def clients_venv() -> Path:
    """The clients' virtualenv; a clear failure (not a skip) when --real-clients was asked without it."""
    venv = Path(os.environ.get("PYFRONT_CLIENTS_VENV", Path.home() / ".cache" / "pyfront" / "clients-venv"))
    venv = venv.expanduser()
    needed = [venv / "bin" / "python", venv / "bin" / "lm_eval", venv / "bin" / "guidellm"]
    missing = [str(p) for p in needed if not os.access(p, os.X_OK)]
    if missing or not (venv / ".pyfront-clients-venv.stamp").is_file():
        what = f"missing {missing}" if missing else "no stamp"
        pytest.fail(f"the clients venv at {venv} is incomplete ({what}): {CLIENTS_SETUP_HINT}", pytrace=False)
    return venv


CLIENT_EXIT_GRACE_S = 5.0


def _run_client(cmd: list[str], what: str, log_path: Path, timeout: float = CLIENT_TIMEOUT_S) -> str:
    """Run a client to completion in its own process group (killed with it on a timeout); its stdout."""
    env = {**os.environ, **CLIENT_ENV}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=log_path.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            real_engine.stop_group(proc.pid, grace=5, proc=proc)
            pytest.fail(f"{what} ran over {timeout:.0f} s; log {log_path}:\n{_tail(log_path)}")
    # A client's worker processes may still be exiting when its main process has (guidellm's did, once in CI:
    # one worker alive at the first look): a process still there CLIENT_EXIT_GRACE_S later is one it left running.
    deadline = time.monotonic() + CLIENT_EXIT_GRACE_S
    while (left := real_engine.group_pids(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        real_engine.stop_group(proc.pid, grace=5)
    assert not left, f"{what} left processes running {CLIENT_EXIT_GRACE_S:g} s after it exited: {left}"
    if proc.returncode != 0:
        pytest.fail(f"{what} exited {proc.returncode}; log {log_path}:\n{_tail(log_path)}", pytrace=False)
    return stdout.decode(errors="replace")


def _tail(path: Path, n: int = 40) -> str:
    return "".join(path.read_text(errors="replace").splitlines(True)[-n:])


def _clients_python(clients_venv: Path) -> str:
    return str(clients_venv / "bin" / "python")


def _hermes(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _stopped(procs: tier.Processes, *handles: real_engine.Handle) -> None:
    left = procs.stop(*handles)
    assert not left, f"processes left after stop: {left} ({procs.stopped_by})"


# ---------------------------------------------------------------------------------------- 1. openai SDK

# The outputs the mock engines are scripted with, one per request in tools/real_clients/openai_sdk_cases.py's
# CASES order (the cases after these get the mock's own deterministic tokens). Each is followed by the EOS.
WEATHER_JSON = {"city": "Paris", "temperature_c": 21.5, "conditions": ["sunny", "windy"]}
SCRIPTED = {
    "chat": "Paris is the capital of France.",
    "chat_stream": "Streaming works, one token at a time.",
    "tools": _hermes("get_weather", {"city": "Paris", "unit": "celsius"}),
    "tools_stream": _hermes("get_weather", {"city": "Berlin"}),
    "parse": json.dumps(WEATHER_JSON),
}
SDK_CASES = [*SCRIPTED, "completions_echo_logprobs", "completions_echo_max_tokens_0", "completions_prompt_logprobs",
             "completions_token_ids_batch_echo"]  # fmt: skip
SDK_SERVER_FLAGS = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
ECHO_PROMPT = "The quick brown fox jumps over the lazy dog"  # openai_sdk_cases.py's


def _sdk_expectations(results: dict, tokenizer) -> list[str]:
    """What the SDK must read from any correct server, independently of the other server's answer."""
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    n_prompt = len(tokenizer.encode(ECHO_PROMPT, add_special_tokens=False))
    chat = results["chat"]
    check(chat.get("content") == SCRIPTED["chat"] and chat.get("finish_reason") == "stop", f"chat: {chat}")
    stream = results["chat_stream"]
    check(stream.get("content") == SCRIPTED["chat_stream"] and stream.get("finish_reasons") == ["stop"],
          f"chat_stream: {stream}")  # fmt: skip
    check(stream.get("usage") is not None, f"chat_stream: no usage chunk: {stream}")
    for case, city in (("tools", {"city": "Paris", "unit": "celsius"}), ("tools_stream", {"city": "Berlin"})):
        calls = [{"type": "function", "name": "get_weather", "arguments": city, "has_id": True}]
        got = results[case]
        check(got.get("tool_calls") == calls and got.get("finish_reason") == "tool_calls", f"{case}: {got}")
    check(
        results["tools_stream"].get("arguments_done_events") == ["get_weather"],
        f"tools_stream: {results['tools_stream']}",
    )
    check(results["parse"].get("parsed") == WEATHER_JSON, f"parse: {results['parse']}")

    echo = results["completions_echo_logprobs"]
    if "error" in echo:
        problems.append(f"completions_echo_logprobs: {echo}")
    else:
        choice = echo["choices"][0]
        tokens = (choice["logprobs"] or {}).get("tokens") or []
        check(choice["text"].startswith(ECHO_PROMPT) and len(choice["text"]) > len(ECHO_PROMPT),
              f"echo: text is not the prompt and one more token: {choice['text']!r}")  # fmt: skip
        check(len(tokens) == n_prompt + 1, f"echo logprobs=1 max_tokens=1: {len(tokens)} tokens, not the prompt's "
              f"{n_prompt} and the generated one: {tokens}")  # fmt: skip
        check(bool(choice["logprobs"]) and choice["logprobs"]["token_logprobs"][:1] == [None],
              "echo: the first prompt token's logprob must be null")  # fmt: skip
    zero = results["completions_echo_max_tokens_0"]
    if "error" in zero:
        problems.append(f"completions_echo_max_tokens_0: {zero}")
    else:
        choice = zero["choices"][0]
        check(choice["text"] == ECHO_PROMPT, f"echo max_tokens=0: text {choice['text']!r}, not the prompt alone")
        tokens = (choice["logprobs"] or {}).get("tokens") or []
        check(len(tokens) == n_prompt, f"echo max_tokens=0: {len(tokens)} logprob tokens, prompt has {n_prompt}")
    plp = results["completions_prompt_logprobs"]
    if "error" in plp:
        problems.append(f"completions_prompt_logprobs: {plp}")
    else:
        got = plp["choices"][0]["prompt_logprobs"]
        check(isinstance(got, list) and len(got) == n_prompt and got[0] is None,
              f"prompt_logprobs=1: {got!r} (want {n_prompt} entries, the first null)")  # fmt: skip
    return problems


def test_openai_sdk_matches_vllm_frontend(
    tiny_model: Path, vllm_venv: Path, clients_venv: Path, tokenizer, tmp_path: Path
) -> None:
    """The openai SDK's view of pyfront equals its view of vLLM 0.32's own front end, both with `--tool-call-parser
    hermes --enable-auto-tool-choice` on mock engines scripted alike; and it reads what a correct server says."""
    t_test = time.monotonic()
    script = []
    for text in SCRIPTED.values():
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        script.append(ids)
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    mock_args = ("--script-file", str(script_file), "--step-interval", "0.002")
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = tier._ports(4)
    results: dict[str, dict] = {}
    with tier.managed_processes() as procs:
        frontend = procs.add(
            real_engine.start_vllm_frontend(
                tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv, extra_args=SDK_SERVER_FLAGS
            )
        )
        vllm_mock = procs.add(
            tier._start_mock_engine(rpc_vllm, tmp_path / "vllm-mock.log", *mock_args,
                                    "--arrival-log", str(tmp_path / "vllm-arrivals.log"))
        )  # fmt: skip
        pyfront = procs.add(
            tier._start_pyfront_server(
                tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log", *SDK_SERVER_FLAGS
            )
        )
        pyfront_mock = procs.add(
            tier._start_mock_engine(rpc_pyfront, tmp_path / "pyfront-mock.log", *mock_args,
                                    "--arrival-log", str(tmp_path / "pyfront-arrivals.log"))
        )  # fmt: skip
        real_engine.wait_healthy(pyfront, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[pyfront_mock])
        real_engine.wait_healthy(frontend, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[vllm_mock])
        for side, server in (("vllm", frontend), ("pyfront", pyfront)):
            out = tmp_path / f"sdk-{side}.json"
            cmd = [_clients_python(clients_venv), str(CLIENTS_DIR / "openai_sdk_cases.py"), server.url,
                   tier._model_id(server.url), str(out)]  # fmt: skip
            _run_client(cmd, f"openai SDK cases against {side}", tmp_path / f"sdk-{side}.log")
            results[side] = json.loads(out.read_text())
        # The scripted cases must each have reached their mock as one request, in order, on both sides.
        for side in ("vllm", "pyfront"):
            arrivals = (tmp_path / f"{side}-arrivals.log").read_text().splitlines()
            assert len(arrivals) >= len(SCRIPTED), f"{side}'s mock saw only {len(arrivals)} requests"
        assert all(h.alive() for h in (frontend, vllm_mock, pyfront, pyfront_mock))
    print(f"\nopenai SDK cases took {time.monotonic() - t_test:.1f} s; answers in {tmp_path}")

    assert list(results["pyfront"]) == SDK_CASES
    vllm, ours = results["vllm"], results["pyfront"]
    errors_vllm = {k: v for k, v in vllm.items() if "error" in v}
    assert not errors_vllm, f"vLLM's own front end failed SDK cases (the reference is broken): {errors_vllm}"
    assert not _sdk_expectations(vllm, tokenizer), "vLLM's own front end fails the expectations: fix the test"
    differ = [case for case in SDK_CASES if ours[case] != vllm[case]]
    for case in differ:
        print(f"--- {case} differs\n  vllm:    {json.dumps(vllm[case])[:1500]}")
        print(f"  pyfront: {json.dumps(ours[case])[:1500]}")
    problems = _sdk_expectations(ours, tokenizer)
    assert not differ and not problems, (
        f"pyfront's answers differ from vLLM's in {differ}; pyfront's own problems: {problems}"
    )


# ----------------------------------------------------------------------------------------------- 2. lm-eval

# Small local tasks, written by the test (dataset_path json + data_files: nothing downloaded).
LM_EVAL_MC = [
    {"question": "What color is the sky on a clear day?", "choices": ["blue", "green", "red"], "answer": 0},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight", "ten", "four"], "answer": 1},
    {"question": "Which is a fruit?", "choices": ["carrot", "potato", "apple"], "answer": 2},
    {"question": "The capital of Japan is", "choices": [" Tokyo", " Kyoto", " Osaka"], "answer": 0},
    {"question": "Water freezes at", "choices": ["0 degrees Celsius", "100 degrees Celsius"], "answer": 0},
    {"question": "2 + 2 =", "choices": ["3", "4", "5", "22"], "answer": 1},
    {"question": "Café, naïve and jalapeño have", "choices": ["accents", "no accents"], "answer": 0},
    {"question": "日本の首都は", "choices": ["東京", "大阪"], "answer": 0},
]
LM_EVAL_ROLLING = [
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"text": "Once upon a time, in a land far away, there lived a small dragon who loved books. " * 6},
    {"text": "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"},
    {"text": 'Emoji and accents: ☀️ 雨 café — "quoted" text, tabs\tand\nnew lines.'},
]
LM_EVAL_GEN = [
    {"prompt": "Q: What is the capital of France?\nA:", "target": " Paris"},
    {"prompt": "Translate to French: cat\nFrench:", "target": " chat"},
    {"prompt": "Count: one, two, three,", "target": " four"},
    {"prompt": "Write a haiku about the sea.\n", "target": ""},
    {"prompt": "The opposite of hot is", "target": " cold"},
]
# lm-eval's default max_length is 2048; 128 makes the long rolling doc span several windows (each window a
# loglikelihood request whose context is the previous window's end), while every other request fits.
LM_EVAL_MAX_LENGTH = 128
LM_EVAL_TASKS = {
    "pyfront_mc": """
output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "pyfront_rolling": """
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "pyfront_gen": """
output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{target}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
""",
}
LM_EVAL_DATA = {"pyfront_mc": LM_EVAL_MC, "pyfront_rolling": LM_EVAL_ROLLING, "pyfront_gen": LM_EVAL_GEN}


def _write_lm_eval_tasks(task_dir: Path) -> None:
    task_dir.mkdir(parents=True)
    for task, header in LM_EVAL_TASKS.items():
        data = task_dir / f"{task}.jsonl"
        data.write_text("".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in LM_EVAL_DATA[task]))
        yaml = (f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
                f"test_split: test\n{header.lstrip()}")  # fmt: skip
        (task_dir / f"{task}.yaml").write_text(yaml)


def _sample_key(sample: dict) -> tuple:
    return sample["request_type"], sample["doc_id"]


def _compare_samples(vllm: dict, ours: dict) -> tuple[dict[str, list[int]], list[str]]:
    """Per request type (the API model kind and lm-eval's request type): [identical, total], and the diffs."""
    counts: dict[str, list[int]] = {}
    diffs: list[str] = []
    for kind in ("completions", "chat"):
        assert sorted(ours[kind]) == sorted(vllm[kind]), (kind, sorted(ours[kind]), sorted(vllm[kind]))
        for task in sorted(vllm[kind]):
            theirs, mine = vllm[kind][task], ours[kind][task]
            assert [_sample_key(s) for s in mine] == [_sample_key(s) for s in theirs], f"{kind}/{task}: other docs"
            for a, b in zip(theirs, mine, strict=True):
                key = f"{kind}/{a['request_type']}"
                entry = counts.setdefault(key, [0, 0])
                entry[1] += 1
                assert a["arguments"] == b["arguments"], f"{kind}/{task} doc {a['doc_id']}: lm-eval sent other requests"
                if a["resps"] == b["resps"] and a["filtered_resps"] == b["filtered_resps"]:
                    entry[0] += 1
                elif len(diffs) < 12:
                    diffs.append(f"{kind}/{task} doc {a['doc_id']}:\n  vllm:    {a['resps']}\n  pyfront: {b['resps']}")
    return counts, diffs


def test_lm_eval_matches_vllm_frontend(tiny_model: Path, vllm_venv: Path, clients_venv: Path, tmp_path: Path) -> None:
    """lm-evaluation-harness 0.4 (`local-completions`: loglikelihood, loglikelihood_rolling, generate_until;
    `local-chat-completions`: generate_until), greedy, gets the same per-sample answers from pyfront as from
    vLLM 0.32's own front end, each on a fresh real vLLM engine (same model and arguments)."""
    t_test = time.monotonic()
    task_dir = tmp_path / "tasks"
    _write_lm_eval_tasks(task_dir)
    rpc_vllm, http_vllm, rpc_pyfront, http_pyfront = tier._ports(4)
    with tier.managed_processes() as procs:
        # Both engines start at once, each bound to its own core (as in test_real_engine.py's token comparison).
        engines = {}
        second_core = str(min(1, (os.cpu_count() or 1) - 1))
        for side, rpc, core in (("vllm", rpc_vllm, "0"), ("pyfront", rpc_pyfront, second_core)):
            engines[side] = procs.add(
                real_engine.start_headless_engine(
                    tiny_model, rpc, tmp_path / f"engine-{side}.log", venv=vllm_venv,
                    extra_args=tier.ENGINE_EXTRA_ARGS, env={"VLLM_CPU_OMP_THREADS_BIND": core},
                )
            )  # fmt: skip
        frontend = procs.add(
            real_engine.start_vllm_frontend(tiny_model, rpc_vllm, http_vllm, tmp_path / "vllm-fe.log", venv=vllm_venv)
        )
        pyfront = procs.add(tier._start_pyfront_server(tiny_model, http_pyfront, rpc_pyfront, tmp_path / "pyfront.log"))
        real_engine.wait_healthy(pyfront, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[engines["pyfront"]])
        real_engine.wait_healthy(frontend, timeout=tier.STARTUP_TIMEOUT_S, also_alive=[engines["vllm"]])
        t_ready = time.monotonic()
        job = {
            "servers": [{"name": side, "base_url": server.url, "model": tier._model_id(server.url)}
                        for side, server in (("vllm", frontend), ("pyfront", pyfront))],
            "tokenizer": str(tiny_model),
            "task_dir": str(task_dir),
            "completions_tasks": sorted(LM_EVAL_TASKS),
            "chat_tasks": ["pyfront_gen"],
            "completions_args": {"max_length": LM_EVAL_MAX_LENGTH, "tokenized_requests": True},
            "chat_args": {},
        }  # fmt: skip
        job_file, out = tmp_path / "lm-eval-job.json", tmp_path / "lm-eval-samples.json"
        job_file.write_text(json.dumps(job, indent=1))
        cmd = [_clients_python(clients_venv), str(CLIENTS_DIR / "lm_eval_run.py"), str(job_file), str(out)]
        _run_client(cmd, "lm-eval", tmp_path / "lm-eval.log")
        assert all(h.alive() for h in (frontend, pyfront, *engines.values()))
    results = json.loads(out.read_text())
    print(f"\nlm-eval: servers ready after {t_ready - t_test:.1f} s, whole test {time.monotonic() - t_test:.1f} s; "
          f"samples in {out}, log {tmp_path / 'lm-eval.log'}")  # fmt: skip

    vllm = results["vllm"]
    # The reference itself must be meaningful: real, negative loglikelihoods (not lm-eval's 0 for a server
    # that did not echo the prompt's logprobs) and non-empty generations.
    lls = [request[0][0] for s in vllm["completions"]["pyfront_mc"] for request in s["resps"]]
    assert lls and all(isinstance(x, float) and x < 0 for x in lls), lls
    assert any(s["resps"][0][0] for s in vllm["chat"]["pyfront_gen"]), vllm["chat"]["pyfront_gen"]
    counts, diffs = _compare_samples(vllm, results["pyfront"])
    summary = ", ".join(f"{kind} {same}/{total}" for kind, (same, total) in sorted(counts.items()))
    print(f"lm-eval samples identical (pyfront vs vLLM's front end): {summary}")
    assert set(counts) == {"completions/loglikelihood", "completions/loglikelihood_rolling",
                           "completions/generate_until", "chat/generate_until"}, counts  # fmt: skip
    assert all(same == total for same, total in counts.values()), f"{summary}\n" + "\n".join(diffs)


# ------------------------------------------------------------------------------------------------ 3. guidellm

GUIDELLM_REQUESTS = 200
GUIDELLM_STREAMS = 6
GUIDELLM_PROMPT_TOKENS = 64
GUIDELLM_OUTPUT_TOKENS = 16


def test_guidellm_load_against_pyfront(tiny_model: Path, clients_venv: Path, tmp_path: Path) -> None:
    """guidellm (`guidellm run`, concurrent profile, synthetic prompts, a request-count bound) against
    `pyfront serve --mock-engine` on the chat and the completions endpoints: its JSON report counts every
    request successful, none errored or incomplete, each with exactly the asked output tokens; pyfront logged
    as many 200s and nothing else."""
    t_test = time.monotonic()
    rpc, http = tier._ports(2)
    pyfront_log = tmp_path / "pyfront.log"
    with tier.managed_processes() as procs:
        pyfront = procs.add(tier._start_pyfront_mock(tiny_model, http, rpc, pyfront_log))
        real_engine.wait_healthy(pyfront, timeout=tier.STARTUP_TIMEOUT_S)
        for endpoint in ("/v1/chat/completions", "/v1/completions"):
            name = endpoint.strip("/").replace("/", "-")
            report = tmp_path / f"guidellm-{name}.json"
            cmd = [str(clients_venv / "bin" / "guidellm"), "run",
                   "--backend", f"kind=openai_http,target={pyfront.url},model=tiny,request_format={endpoint}",
                   "--profile", f"kind=concurrent,streams={GUIDELLM_STREAMS}",
                   "--constraint", f"kind=max_requests,count={GUIDELLM_REQUESTS}",
                   "--data", f"kind=synthetic_text,prompt_tokens={GUIDELLM_PROMPT_TOKENS},"
                             f"output_tokens={GUIDELLM_OUTPUT_TOKENS}",
                   "--tokenizer", f"kind=huggingface_auto,model={tiny_model}",
                   "--seed", "kind=static,value=42",
                   "--output", f"kind=json,path={report}",
                   "--disable-console-interactive"]  # fmt: skip
            _run_client(cmd, f"guidellm ({endpoint})", tmp_path / f"guidellm-{name}.log")
            (benchmark,) = json.loads(report.read_text())["benchmarks"]
            metrics = benchmark["metrics"]
            context = f"report {report}, log {tmp_path / f'guidellm-{name}.log'}"
            assert metrics["request_totals"] == {"successful": GUIDELLM_REQUESTS, "errored": 0, "incomplete": 0,
                                                 "total": GUIDELLM_REQUESTS}, context  # fmt: skip
            outputs = metrics["output_token_count"]["successful"]
            assert outputs["count"] == GUIDELLM_REQUESTS, context
            assert outputs["min"] == outputs["max"] == GUIDELLM_OUTPUT_TOKENS, (outputs, context)
            prompts = metrics["prompt_token_count"]["successful"]
            assert prompts["min"] >= GUIDELLM_PROMPT_TOKENS, (prompts, context)
            print(f"\nguidellm {endpoint}: {GUIDELLM_REQUESTS} requests in {benchmark['duration']:.1f} s, "
                  f"prompt tokens {prompts['min']}-{prompts['max']}, "
                  f"TTFT median {metrics['time_to_first_token_ms']['successful']['median']:.1f} ms")  # fmt: skip
        assert pyfront.alive()
        _stopped(procs, pyfront)
    statuses = Counter(
        (line.split('"')[1].split()[1], line.rsplit('" ', 1)[1].split()[0])
        for line in pyfront_log.read_text(errors="replace").splitlines()
        if '"POST /v1/' in line
    )
    assert statuses == {
        ("/v1/chat/completions", "200"): GUIDELLM_REQUESTS,
        ("/v1/completions", "200"): GUIDELLM_REQUESTS,
    }, statuses
    print(f"guidellm test took {time.monotonic() - t_test:.1f} s")
