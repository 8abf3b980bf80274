#!/usr/bin/env python3
"""The project's DSML probes and what the official encoder/parser answers to each.

The probes (below, written for this project: edge cases of DSML.md §2 rendering and §3
parsing) call the release `encoding/encoding.py` entry points the engine surface mirrors:
`encode_messages(messages, thinking_mode, reasoning_effort=...)` (a prompt string) and
`parse_message_from_completion_text(text, thinking_mode)` (a message dict). Each result is
`{"ok": true, "value": ...}` or `{"ok": false, "error": "<ExceptionType>: <message>"}`.

Writes, into --out: `probe_inputs.json` (`{"_about", "probes": {name: {call, ...arguments}}}`)
and `probe_results.json` (`{name: result}`), read by conformance/cases/dsml/goldens.yaml.
--encoding names the directory holding the release encoding.py (never vendored).

    python3 goldens/regen/dsml_probes.py --encoding RELEASE/encoding --out goldens/dsml_probes --provenance
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

SCRIPT = "goldens/regen/dsml_probes.py"
ENCODE = "encode_messages"
PARSE = "parse_message_from_completion_text"
EOS = "<｜end▁of▁sentence｜>"
D = "｜DSML｜"


def calls(*invokes):
    return f"\n\n<{D} calls>\n" + "\n".join(invokes) + f"\n</{D} calls>"


def invoke(name, *params):
    body = "".join(params)
    return f'<{D} invoke name="{name}">\n{body}</{D} invoke>'


def param(name, value, string="true"):
    return f'<{D} parameter name="{name}" string="{string}">{value}</{D} parameter>\n'


def tool(name, description="", properties=None, namespace=None):
    t = {"type": "function", "function": {"name": name, "description": description,
                                          "parameters": {"type": "object", "properties": properties or {}}}}
    if namespace is not None:
        t["namespace"] = namespace
    return t


def call(name, arguments, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if id is not None:
        c["id"] = id
    return c


WEATHER = tool("weather", "Current weather.", {"city": {"type": "string"}, "days": {"type": "integer"}})


def encode_probes():
    u = lambda c, **k: {"role": "user", "content": c, **k}  # noqa: E731
    a = lambda c, **k: {"role": "assistant", "content": c, **k}  # noqa: E731
    s = lambda c, **k: {"role": "system", "content": c, **k}  # noqa: E731
    p = {}

    def enc(name, messages, mode="chat", **kw):
        p[name] = {"call": ENCODE, "messages": messages, "thinking_mode": mode, **kw}

    enc("single_user_chat", [u("Ping?")])
    enc("single_user_thinking", [u("Ping?")], "thinking")
    enc("effort_low_thinking", [u("Sum 2+2.")], "thinking", reasoning_effort="low")
    enc("effort_max_thinking", [s("Be brief."), u("Sum 2+2.")], "thinking", reasoning_effort="max")
    enc("effort_int_7", [u("x")], "thinking", reasoning_effort=7)
    enc("effort_int_100", [u("x")], "thinking", reasoning_effort=100)
    enc("effort_int_0_rejected", [u("x")], "thinking", reasoning_effort=0)
    enc("effort_int_250_rejected", [u("x")], "thinking", reasoning_effort=250)
    enc("effort_unknown_word_rejected", [u("x")], "thinking", reasoning_effort="extreme")
    enc("effort_float_rejected", [u("x")], "thinking", reasoning_effort=33.0)
    enc("effort_in_chat_ignored", [u("x")], "chat", reasoning_effort="low")
    enc("system_only", [s("You are terse.")])
    enc("empty_user_content", [u("")])
    enc("two_turns_thinking_drops_old_reasoning",
        [u("Q1"), a("A1", reasoning_content="r1"), u("Q2")], "thinking")
    enc("assistant_last_thinking",
        [u("Q1"), a("A1", reasoning_content="kept because it follows the last user")], "thinking")
    enc("assistant_prefill_wo_eos", [u("Continue:"), a("Once upon", wo_eos=True)])
    enc("system_after_assistant", [u("Hi"), a("Hello"), s("Switch to French.")], "thinking")
    enc("system_then_user_after_assistant", [u("Hi"), a("Hello"), s("New rules."), u("Ok?")])
    enc("tools_on_system", [s("Use tools.", tools=[WEATHER]), u("Weather in Oslo?")])
    enc("tools_without_system_text", [s("", tools=[WEATHER]), u("Weather?")], "thinking")
    enc("tool_call_and_result",
        [s("", tools=[WEATHER]), u("Oslo weather for 2 days"),
         a("", tool_calls=[call("weather", '{"city": "Oslo", "days": 2}', "c1")]),
         {"role": "tool", "tool_call_id": "c1", "content": "rain"}], "thinking")
    enc("tool_call_nested_arguments",
        [u("go"), a("", tool_calls=[call("plan", '{"steps": [1, {"k": null}], "ok": true, "name": "x"}')])])
    enc("tool_call_unicode_and_quotes",
        [u("go"), a("", tool_calls=[call("say", '{"text": "\\"Grüß\\" — 東京\\n"}')])])
    enc("tool_call_double_encoded_arguments",
        [u("go"), a("", tool_calls=[call("f", json.dumps('{"a": 1}'))])])
    enc("tool_call_scalar_arguments", [u("go"), a("", tool_calls=[call("f", "42")])])
    enc("tool_call_invalid_json_arguments", [u("go"), a("", tool_calls=[call("f", "{not json")])])
    enc("three_results_reordered",
        [u("go"), a("", tool_calls=[call("f", "{}", "x"), call("g", "{}", "y"), call("h", "{}", "z")]),
         {"role": "tool", "tool_call_id": "z", "content": "Z"},
         {"role": "tool", "tool_call_id": "x", "content": "X"},
         {"role": "tool", "tool_call_id": "y", "content": "Y"}])
    enc("namespaced_tool_and_call",
        [s("", tools=[tool("get", "Fetch.", namespace="web")]), u("go"),
         a("", tool_calls=[call("web::get", '{"url": "https://example.org"}')])])
    enc("namespace_conflict_rejected",
        [u("go"), a("", tool_calls=[dict(call("web::get", "{}"), namespace="fs")])])
    enc("tool_name_with_two_separators_rejected", [s("", tools=[tool("a::b::c")]), u("go")])
    enc("response_format_schema",
        [s("Answer in JSON.", response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {
            "type": "object", "properties": {"ok": {"type": "boolean"}}}}}), u("Is it?")])
    enc("latest_reminder_after_user", [u("Q"), {"role": "latest_reminder", "content": "Today is Monday."}], "thinking")
    enc("latest_reminder_first", [{"role": "latest_reminder", "content": "Be kind."}, u("Q")])
    enc("task_title_on_user", [u("Summarise this chat", task="title")])
    enc("task_action_chat", [u("Open the door", task="action")])
    enc("task_action_thinking", [u("Open the door", task="action")], "thinking")
    # (No invalid-task probe: the official message lists a Python set, whose order changes
    # with PYTHONHASHSEED, so its text is not reproducible.)
    enc("developer_role_rejected", [{"role": "developer", "content": "x"}, u("y")])
    enc("user_content_with_control_token_text", [u("literal <｜User｜> and </think> stay text")])
    enc("user_content_with_dsml_text", [u(f"<{D} calls>not a call</{D} calls>")])
    enc("image_placeholder_text_rejected", [u("see <｜deepseek_image｜> here")])
    enc("consecutive_assistants", [u("Q"), a("A1"), a("A2")])
    enc("user_content_blocks_text_only",
        [{"role": "user", "content_blocks": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}])
    return p


def parse_probes():
    p = {}

    def par(name, text, modes=("chat", "thinking"), raw=False):
        # In thinking mode the completion starts inside the reasoning (the prompt ends in <think>).
        for m in modes:
            body = text if m == "chat" or raw else "Let me see.\n</think>" + text
            p[f"parse_{m}_{name}"] = {"call": PARSE, "text": body, "thinking_mode": m}

    par("content_eos", "Fine, thanks." + EOS)
    par("empty_eos", EOS)
    par("reasoning_then_content", "first think</think>then answer" + EOS)
    par("missing_eos", "no end token")
    par("text_after_eos", "done" + EOS + "extra")
    par("one_call_string_and_number",
        "Checking." + calls(invoke("weather", param("city", "Oslo"), param("days", "3", "false"))) + EOS)
    par("call_without_eos", calls(invoke("weather", param("city", "Bergen"))))
    par("call_then_trailing_text", calls(invoke("f")) + " trailing" + EOS)
    par("call_namespaced", calls(invoke("web::get", param("url", "https://example.org"))) + EOS)
    par("call_bad_param_flag", calls(invoke("f", param("x", "1", "maybe"))) + EOS)
    par("call_value_with_newlines_and_quotes", calls(invoke("note", param("body", 'line "1"\nline 2'))) + EOS)
    par("call_object_value", calls(invoke("plan", param("cfg", '{"a": [1, 2]}', "false"))) + EOS)
    par("call_missing_newline_after_open", f"\n\n<{D} calls>" + invoke("f") + f"\n</{D} calls>" + EOS)
    par("eos_inside_content", "a" + EOS + "b" + EOS)
    par("bos_inside_content", "x<｜begin▁of▁sentence｜>y" + EOS)
    par("think_open_inside_content", "x<think>y" + EOS)
    par("no_think_close", "just an answer" + EOS, modes=("thinking",), raw=True)
    par("call_inside_reasoning", "thinking" + calls(invoke("f")) + EOS, modes=("thinking",), raw=True)
    par("one_letter_reasoning", "a</think>b" + EOS, modes=("thinking",), raw=True)
    par("calls_block_never_closed", calls(invoke("f"))[:-len(f"\n</{D} calls>")] + EOS)
    return p


def run(encoding, name, probe):
    args = {k: v for k, v in probe.items() if k != "call"}
    try:
        if probe["call"] == ENCODE:
            value = encoding.encode_messages(args.pop("messages"), **args)
        else:
            value = encoding.parse_message_from_completion_text(args["text"], args["thinking_mode"])
        return {"ok": True, "value": value}
    except Exception as e:  # the official code's refusal, recorded as it raised it
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def import_encoding(directory: Path):
    path = directory / "encoding.py"
    if not path.is_file():
        raise SystemExit(f"dsml_probes: no encoding.py in {directory}")
    spec = importlib.util.spec_from_file_location("ds41_official_encoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoding", type=Path, required=True, help="directory holding the release encoding.py")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--provenance", action="store_true")
    a = ap.parse_args(argv)
    encoding, encoding_py = import_encoding(a.encoding)
    probes = {**encode_probes(), **parse_probes()}
    inputs = {"_about": "The project's DSML probes (goldens/regen/dsml_probes.py): for each, the official "
                        "encoding.py entry point and its arguments; arguments not listed take the entry "
                        "point's defaults.", "probes": probes}
    results = {name: run(encoding, name, p) for name, p in probes.items()}
    a.out.mkdir(parents=True, exist_ok=True)
    for file, value in [("probe_inputs.json", inputs), ("probe_results.json", results)]:
        path = a.out / file
        text = json.dumps(value, indent=1, ensure_ascii=False) + "\n"
        old = path.read_bytes() if path.exists() else None
        path.write_text(text, encoding="utf-8")
        print(provenance.report_change(path, old, text.encode()))
    refused = sum(not r["ok"] for r in results.values())
    print(f"{len(probes)} probes, {refused} refused by the official code")
    if a.provenance:
        provenance.write_sidecar(
            a.out / ("probes" + provenance.SUFFIX),
            description="The project's DSML probes (rendering and parsing edge cases) and the official "
                        "encoding.py's answer to each; checked by conformance/cases/dsml/goldens.yaml "
                        "(official-probes) and engine/tests/dsml_official.rs.",
            generator={"kind": "official-code", "name": "encoding/encoding.py",
                       "version": provenance.sha256_file(encoding_py)[:8],
                       "revision": "dba1be0a40aa45a94ad051997016db3960a90277",
                       "environment": provenance.environment()},
            command=f"python3 {SCRIPT} --encoding <release encoding/> --out {{out}}",
            inputs=[provenance.describe_input("script", Path(__file__)),
                    {"name": "encoding.py", "location": "external", "path": "encoding/encoding.py",
                     "sha256": provenance.sha256_file(encoding_py)}],
            outputs=["probe_inputs.json", "probe_results.json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
