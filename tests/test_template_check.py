"""`spanlab template check/fix` on the real chat templates of popular open-weight families (REFERENCE §7).

The fixtures live in ../shared/fixtures (chat_templates/*.jinja, tokenizers/qwen3 and qwen2.5); every
test here skips with the path when they are absent. The expectations for the families REFERENCE §7
names are its verdicts; the others record what the check finds today, so a change shows up.
Token-level results are cross-checked against transformers' own ``apply_chat_template``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import pytest

from spanlab.tito.jinja import compile_template
from spanlab.tito.templates import (
    DUMMY_TOOL,
    TemplateReport,
    check_template,
    check_template_file,
    dummy_tool_conversation,
    first_mismatch,
    fix_template,
    load_tokenizer,
)
from tests.conftest import SHARED

TEMPLATES = SHARED / "fixtures" / "chat_templates"
TOKENIZERS = SHARED / "fixtures" / "tokenizers"
SPANLAB = str(Path(sys.executable).with_name("spanlab"))
QWEN3 = "llamacpp__Qwen-Qwen3-0.6B.jinja"
QWEN25 = "llamacpp__Qwen-Qwen2.5-7B-Instruct.jinja"
EOS = "<｜end▁of▁sentence｜>"

needs_templates = pytest.mark.skipif(not TEMPLATES.is_dir(), reason=f"shared fixtures absent: {TEMPLATES}")
needs_tokenizers = pytest.mark.skipif(not (TOKENIZERS / "qwen3").is_dir(),
                                      reason=f"shared tokenizer fixtures absent: {TOKENIZERS}")


class Expect(NamedTuple):
    preserving: bool
    calls: bool  # renders tool calls
    results: bool  # renders tool results
    needs_tools: bool
    stop_gap: str
    end_of_turn: str | None
    in_reference: bool  # REFERENCE §7 states the verdict; otherwise: what the check finds


EXPECTED: dict[str, Expect] = {
    # REFERENCE §7: preserving
    QWEN25: Expect(True, True, True, False, "\n", "<|im_end|>", True),
    "llamacpp__meta-llama-Llama-3.1-8B-Instruct.jinja": Expect(True, True, True, False, "", "<|eot_id|>", True),
    "llamacpp__meta-llama-Llama-3.2-3B-Instruct.jinja": Expect(True, True, True, False, "", "<|eot_id|>", True),
    "llamacpp__deepseek-ai-DeepSeek-V3.1.jinja": Expect(True, True, True, False, "", EOS, True),
    "llamacpp__GLM-4.6.jinja": Expect(True, True, True, False, "", "<|user|>", True),
    "llamacpp__moonshotai-Kimi-K2.jinja": Expect(True, True, True, False, "", "<|im_end|>", True),
    "llamacpp__ibm-granite-granite-4.0.jinja": Expect(True, True, True, False, "\n", "<|end_of_text|>", True),
    "llamacpp__openai-gpt-oss-120b.jinja": Expect(True, True, True, False, "", "<|end|>", True),
    "llamacpp__google-gemma-4-31B-it.jinja": Expect(True, True, True, False, "\n", "<turn|>", True),
    "llamacpp__Qwen-QwQ-32B.jinja": Expect(True, True, True, False, "\n", "<|im_end|>", True),
    "llamacpp__Qwen3-Coder.jinja": Expect(True, True, True, False, "\n", "<|im_end|>", True),
    # REFERENCE §7: not preserving; SmolLM3 renders no tool call
    QWEN3: Expect(False, True, True, False, "\n", "<|im_end|>", True),
    "llamacpp__CohereForAI-c4ai-command-r-plus-tool_use.jinja": Expect(
        False, True, True, True, "", "<|END_OF_TURN_TOKEN|>", True),
    "llamacpp__HuggingFaceTB-SmolLM3-3B.jinja": Expect(True, False, True, False, "\n", "<|im_end|>", True),
    # Not in §7: what the check finds.
    "llamacpp__Qwen3.5-4B.jinja": Expect(True, True, True, False, "\n", "<|im_end|>", False),
    "llamacpp__NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": Expect(
        True, True, True, True, "\n", "<|im_end|>", False),  # raises without a tools list
    "llamacpp__mistralai-Mistral-Nemo-Instruct-2407.jinja": Expect(
        True, True, True, False, "", "{{ eos_token }}", False),  # needs the 9-character call ID
    "llamacpp__Mistral-Small-3.2-24B-Instruct-2506.jinja": Expect(
        True, True, True, False, "", "{{ eos_token }}", False),
    "llamacpp__deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": Expect(
        True, False, True, False, "", EOS, False),  # calls only when content is None (noted)
    "trl__glm4moe.jinja": Expect(True, True, True, False, "", "<|user|>", False),
    "trl__llama3.jinja": Expect(True, False, True, False, "", "<|eot_id|>", False),  # a tool-less template
}
FIXTURE_FILES = sorted(p.name for p in TEMPLATES.glob("*.jinja")) if TEMPLATES.is_dir() else sorted(EXPECTED)


CLI_ENV = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"}, "COLUMNS": "200"}


def spanlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPANLAB, *args], capture_output=True, text=True, timeout=120, env=CLI_ENV)


def spanlab_many(*argvs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Independent CLI runs side by side: each spends ~1 s importing, not working."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: spanlab(*argv), argvs))


@pytest.fixture(scope="module")
def reports() -> dict[str, TemplateReport]:
    """One check per fixture template, shared by the tests that read them."""
    if not TEMPLATES.is_dir():
        pytest.skip(f"shared fixtures absent: {TEMPLATES}")
    return {name: check_template_file(TEMPLATES / name) for name in FIXTURE_FILES}


@pytest.fixture(scope="module")
def qwen3_tok() -> Any:
    """The real Qwen3 BPE through ``AutoTokenizer`` (the transformers import costs ~8 s, paid once here)."""
    if not (TOKENIZERS / "qwen3").is_dir():
        pytest.skip(f"shared tokenizer fixture absent: {TOKENIZERS / 'qwen3'}")
    return load_tokenizer(TOKENIZERS / "qwen3")


# --- the fixture templates -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_fixture_template_matches_reference(name: str, reports: dict[str, TemplateReport]) -> None:
    report = reports[name]
    assert report.error is None, report.error
    expect = EXPECTED.get(name)
    if expect is None:  # a fixture added after this table: the check must at least run
        return
    got = (report.tool_append_prefix_preserving, report.renders_tool_calls, report.renders_tool_results,
           report.needs_tools, report.stop_gap, report.end_of_turn)
    assert got == expect[:6], report.notes
    assert report.string_level is not None and report.string_level.ok == expect.preserving
    assert report.token_level is None and report.exit_code == (0 if expect.preserving else 1)


def test_quirks_are_survived_and_reported(reports: dict[str, TemplateReport]) -> None:
    deepseek = reports["llamacpp__deepseek-ai-DeepSeek-V3.1.jinja"]
    assert deepseek.variant is not None and deepseek.variant.arguments == "json_string"  # a dict fails
    hermes = reports["llamacpp__NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"]
    assert hermes.variant is not None and hermes.variant.tools
    assert any("fails without a tools list" in n for n in hermes.notes)
    r1 = reports["llamacpp__deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"]
    assert any("only when the assistant's content is None" in n for n in r1.notes)
    smol = reports["llamacpp__HuggingFaceTB-SmolLM3-3B.jinja"]
    assert any("renders no tool call" in n for n in smol.notes)
    assert all(r.variant is not None and r.variant.sandbox == "immutable" for r in reports.values())


@needs_templates
def test_qwen3_fix_is_one_line_and_makes_it_preserving() -> None:
    text = (TEMPLATES / QWEN3).read_text()
    fixed, changes = fix_template(text)
    assert [(c.fix, c.line, c.after.strip()) for c in changes] == [("qwen3-think-loop-last", 40, "{%- if true %}")]
    assert sum(a != b for a, b in zip(text.splitlines(), fixed.splitlines(), strict=True)) == 1
    assert check_template(fixed).tool_append_prefix_preserving
    assert fix_template((TEMPLATES / QWEN25).read_text()) == ((TEMPLATES / QWEN25).read_text(), [])


def test_string_renders_match_transformers(reports: dict[str, TemplateReport]) -> None:
    """Our sandbox renders exactly what transformers' apply_chat_template machinery renders."""
    from transformers.utils.chat_template_utils import render_jinja_template

    for name, report in reports.items():
        text = (TEMPLATES / name).read_text()
        assert report.variant is not None and report.string_level is not None
        conv, tool_msg = dummy_tool_conversation(report.variant.arguments)
        tools = [DUMMY_TOOL] if report.variant.tools else None
        for msgs, gen, ours in ((conv, False, report.string_level.before),
                                ([*conv, tool_msg], True, report.string_level.after)):
            theirs, _ = render_jinja_template(conversations=[msgs], tools=tools, chat_template=text,
                                              add_generation_prompt=gen, bos_token="", eos_token="")
            assert theirs[0] == ours, name


# --- token level -------------------------------------------------------------------------------------------


@needs_templates
def test_token_level_qwen3_before_and_after_fix(qwen3_tok: Any) -> None:
    text = (TOKENIZERS / "qwen3" / "chat_template.jinja").read_text()
    before = check_template(text, qwen3_tok)
    assert before.token_level is not None and not before.token_level.ok and before.exit_code == 1
    after = check_template(fix_template(text)[0], qwen3_tok)
    assert after.token_level is not None and after.token_level.ok and after.tool_append_prefix_preserving
    assert (after.stop_gap, after.end_of_turn) == ("\n", "<|im_end|>")  # eos_token from the tokenizer
    # The IDs are what transformers' apply_chat_template gives for the same template.
    conv, tool_msg = dummy_tool_conversation()
    hf = qwen3_tok.apply_chat_template([*conv, tool_msg], tools=[DUMMY_TOOL], add_generation_prompt=True,
                                       tokenize=True, chat_template=fix_template(text)[0])
    assert list(hf["input_ids"]) == after.token_level.ids_after
    delta = after.token_level.ids_after[len(after.token_level.ids_before) :]
    assert qwen3_tok.decode(delta) == (
        "<|im_start|>user\n<tool_response>\ndummy\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


QWEN_FAMILY = [QWEN25, "llamacpp__Qwen-QwQ-32B.jinja", "llamacpp__Qwen3-Coder.jinja", "llamacpp__Qwen3.5-4B.jinja"]


@needs_templates
def test_token_level_agrees_on_qwen_family_templates(qwen3_tok: Any) -> None:
    """Same BPE (Qwen2 vocab, same special-token IDs): the seams sit next to special tokens, so tokens agree."""
    for name in QWEN_FAMILY:
        report = check_template_file(TEMPLATES / name, qwen3_tok)
        assert report.token_level is not None and report.token_level.ok, name
        assert report.exit_code == 0


def test_token_level_can_fail_where_string_level_passes() -> None:
    """A string prefix is not a token prefix when BPE merges across the seam (REFERENCE §1)."""

    class CharPairs:  # merges "ab" into one token, like a BPE merge across a seam
        special_tokens_map: ClassVar[dict[str, Any]] = {}

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [ord(c) for c in text.replace("ab", "\x00")]

    template = ("{% for m in messages %}{% if m.role == 'tool' %}b{% endif %}{{ m.content }}"
                "{% if m.role == 'assistant' %}a{% endif %}{% endfor %}")  # "...a" + "b..." merges at the seam
    report = check_template(template, CharPairs())  # type: ignore[arg-type]
    assert report.string_level is not None and report.string_level.ok
    assert report.token_level is not None and not report.token_level.ok and report.exit_code == 1


NO_TOOL_RESULTS = """{%- for m in messages -%}{%- if m.role != 'tool' -%}
<|im_start|>{{ m.role }}
{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>
{% endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant
{% endif -%}"""


def test_a_template_that_renders_no_tool_result_is_not_usable(tmp_path: Path) -> None:
    """Skipping tool messages keeps every render a prefix, yet the model never sees what its tools answered:
    the verdict is "not preserving" and "not usable for tool calls" with exit 1 (issue 42, item 8: Phi-3.5-mini)."""
    report = check_template(NO_TOOL_RESULTS)
    assert report.string_level is not None and report.string_level.ok  # the renders do line up
    assert not report.tool_append_prefix_preserving and report.renders_tool_calls
    assert not report.renders_tool_results
    assert not report.usable_for_tools and report.exit_code == 1
    path = tmp_path / "no_results.jinja"
    path.write_text(NO_TOOL_RESULTS, encoding="utf-8")
    done = spanlab("template", "check", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not usable for tool calls (it renders no tool result)" in done.stdout
    assert "tool appends are prefix-preserving" not in done.stdout


# Phi-3.5-mini-instruct's template (its tokenizer_config.json, MIT licence): it renders no tool turn at all.
PHI_35_MINI = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + "
    "'<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}"
    "{{ eos_token }}{% endif %}"
)


def test_phi_35_mini_is_not_called_prefix_preserving() -> None:
    """Issue 42, item 8: it was, because dropping the tool message keeps the renders aligned."""
    for special in ({"eos_token": "<|endoftext|>", "bos_token": "<s>"}, None):
        report = check_template(PHI_35_MINI, special_tokens=special)
        assert report.error is None
        assert not report.tool_append_prefix_preserving and not report.renders_tool_results
        assert report.exit_code == 1
    assert report.string_level is not None and report.string_level.ok  # without an eos token the renders align
    assert any("renders nothing" in n for n in report.notes), report.notes


# --- quirks and errors on small templates ------------------------------------------------------------------

KIMI_LIKE = """{%- set seen = [] -%}
{%- for m in messages -%}
{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}{%- set _ = seen.append(c.id) -%}
<|call|>{{ c.function.name }}({{ c.function.arguments | tojson }})<|end|>
{%- endfor -%}
{%- elif m.role == 'tool' -%}
<|tool|>{{ m.content }}{% if m.tool_call_id in seen %}#{{ m.tool_call_id }}{% endif %}<|end|>
{%- else -%}<|{{ m.role }}|>{{ m.content }}<|end|>
{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"""


def test_list_append_falls_back_to_a_mutable_sandbox() -> None:
    with pytest.raises(Exception, match="unsafe"):  # transformers' immutable sandbox refuses list.append
        compile_template(KIMI_LIKE).render(dummy_tool_conversation()[0], tools=None, add_generation_prompt=False)
    report = check_template(KIMI_LIKE)
    assert report.variant is not None and report.variant.sandbox == "mutable"
    assert report.tool_append_prefix_preserving and report.renders_tool_calls and report.renders_tool_results
    assert any("mutable sandbox" in n for n in report.notes)
    assert report.string_level is not None and report.string_level.after.endswith("#dummy0001<|end|><|assistant|>")


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{% if %}", "does not compile"),
        ("{{ raise_exception('no tools for you') }}", "no tools for you"),
    ],
)
def test_broken_templates_are_errors_not_crashes(template: str, error: str) -> None:
    report = check_template(template)
    assert report.error is not None and error in report.error and report.exit_code == 2


def test_first_mismatch() -> None:
    assert first_mismatch("abc", "abcd") is None
    assert first_mismatch("abc", "abXd") == 2
    assert first_mismatch([1, 2, 3], [1, 2]) == 2  # a shorter render cannot extend
    assert first_mismatch([], [5]) is None


def test_fix_keeps_whitespace_control() -> None:
    line = "  {% if loop.last or ( not loop.last and reasoning_content ) -%}\n"
    fixed, changes = fix_template(line)
    assert fixed == "  {% if true -%}\n" and changes[0].line == 1


# --- the console command -----------------------------------------------------------------------------------


@needs_templates
def test_cli_check_exit_codes_and_json(tmp_path: Path) -> None:
    raising = tmp_path / "raises.jinja"
    raising.write_text("{{ raise_exception('nope') }}")
    ok, bad, human, err_raise, err_missing = spanlab_many(
        ["template", "check", str(TEMPLATES / QWEN25), "--json"],
        ["template", "check", str(TEMPLATES / QWEN3), "--json"],
        ["template", "check", str(TEMPLATES / QWEN3)],
        ["template", "check", str(raising), "--json"],
        ["template", "check", str(tmp_path / "missing.jinja"), "--json"],
    )
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    for key in ("template", "tool_append_prefix_preserving", "renders_tool_calls", "renders_tool_results",
                "needs_tools", "stop_gap", "string_level", "token_level", "error"):
        assert key in data
    assert data["tool_append_prefix_preserving"] is True and data["stop_gap"] == "\n" and data["error"] is None
    TemplateReport.model_validate(data)

    assert bad.returncode == 1 and json.loads(bad.stdout)["string_level"]["ok"] is False
    assert human.returncode == 1 and "NOT prefix-preserving" in human.stdout and "<think>" in human.stdout
    for err in (err_raise, err_missing):
        assert err.returncode == 2 and json.loads(err.stdout)["error"]
    assert "nope" in json.loads(err_raise.stdout)["error"]


@needs_templates
def test_cli_fix_writes_and_rechecks(tmp_path: Path) -> None:
    out = tmp_path / "qwen3_fixed.jinja"
    done, to_stdout, nothing = spanlab_many(
        ["template", "fix", str(TEMPLATES / QWEN3), "-o", str(out)],
        ["template", "fix", str(TEMPLATES / QWEN3)],
        ["template", "fix", str(TEMPLATES / QWEN25), "-o", str(tmp_path / "unused.jinja")],
    )
    assert done.returncode == 0, done.stderr
    assert "line 40" in done.stdout and "prefix-preserving" in done.stdout
    assert out.read_text() == fix_template((TEMPLATES / QWEN3).read_text())[0]
    assert to_stdout.returncode == 0 and to_stdout.stdout == out.read_text() and "line 40" in to_stdout.stderr
    assert nothing.returncode == 1 and "no known fix" in nothing.stderr
    assert not (tmp_path / "unused.jinja").exists()


@needs_templates
def test_cli_token_level_with_tokenizer(qwen3_tok: Any) -> None:
    """In-process (transformers is already imported; a second console process would pay ~10 s for it)."""
    from typer.testing import CliRunner

    from spanlab.cli import app

    tok_dir = str(TOKENIZERS / "qwen3")
    done = CliRunner().invoke(app, ["template", "check", str(TEMPLATES / QWEN3), "--tokenizer", tok_dir, "--json"])
    assert done.exit_code == 1, done.output
    data = json.loads(done.stdout)
    assert data["token_level"]["ok"] is False and data["string_level"]["ok"] is False
    assert data["end_of_turn"] == "<|im_end|>"
    # the console script fails fast (exit 2, before importing transformers) on a missing folder
    missing = spanlab("template", "check", str(TEMPLATES / QWEN3), "--tokenizer", "/nonexistent-tok", "--json")
    assert missing.returncode == 2 and "tokenizer" in json.loads(missing.stdout)["error"]
