#!/usr/bin/env python3
"""The hand-derived DSML goldens, as written (see goldens/dsml/README.md).

Each case is an input in the official test-case format and an expected prompt typed by hand
from the rules of DSML.md (section named per case), using only the notation below, which is
the grammar of DSML.md §2 spelled out; no renderer is involved. Running this script rewrites
goldens/dsml/NN_name.json and NN_name.txt (or NN_name.error for inputs the reference rejects).
"""
import json
import os
import sys

B = "<｜begin▁of▁sentence｜>"
E = "<｜end▁of▁sentence｜>"
S = "<｜System｜>"
U = "<｜User｜>"
A = "<｜Assistant｜>"
T = "<think>"
TE = "</think>"
D = "｜DSML｜"
R = "<｜latest_reminder｜>"
IMG = "<｜deepseek_image｜>"
QUERY, ACTION, TITLE, DOMAIN, AUTHORITY, READ_URL = (
    "<｜query｜>", "<｜action｜>", "<｜title｜>", "<｜domain｜>", "<｜authority｜>", "<｜read_url｜>")


def EFF(n):  # DSML.md §2.1
    return f"Reasoning Effort: {n} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"


# DSML.md §2.3 part 1 (the 848-character preamble) and part 3.
PRE = ("## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<" + D + " calls>\" block like the following:\n\n"
       "<" + D + " calls>\n<" + D + " invoke name=\"$TOOL_NAME\">\n<" + D + " parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + D + " parameter>\n...\n</" + D + " invoke>\n<" + D + " invoke name=\"$TOOL_NAME2\">\n...\n</" + D + " invoke>\n</" + D + " calls>\n\n"
       "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
       "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
       "Otherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n")
assert len(PRE) == 848 and len(PRE.encode()) == 884, (len(PRE), len(PRE.encode()))
EPI = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
RF = "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"


def calls(*invokes):  # DSML.md §2.2
    return "\n\n<" + D + " calls>\n" + "\n".join(invokes) + "\n</" + D + " calls>"


def inv(name, *params):
    return "<" + D + " invoke name=\"" + name + "\">\n" + "\n".join(params) + "\n</" + D + " invoke>"


def par(k, v, string):
    return "<" + D + " parameter name=\"" + k + "\" string=\"" + string + "\">" + v + "</" + D + " parameter>"


def user(c): return {"role": "user", "content": c}
def asst(c, **kw): return dict({"role": "assistant", "content": c}, **kw)
def system(c, **kw): return dict({"role": "system", "content": c}, **kw)
def tool(c, call_id=None):
    m = {"role": "tool", "content": c}
    if call_id is not None:
        m["tool_call_id"] = call_id
    return m
def call(name, arguments, **kw): return dict({"type": "function", "function": {"name": name, "arguments": arguments}}, **kw)
def fn(name, **kw): return {"type": "function", "function": dict({"name": name}, **kw)}


CASES = []


def case(name, inp, expected=None, error=None):
    CASES.append((name, inp, expected, error))


F_SCHEMA = '{"name": "f", "description": "Do f.", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}'
F_TOOL = fn("f", description="Do f.", parameters={"type": "object", "properties": {"x": {"type": "integer"}}})

case("chat_system_two_turns",  # §2.1 BOS, system prefix; §2.4 header </think> in chat; §2.2 EOS
     [system("You are terse."), user("Hi"), asst("Hello.", reasoning_content="greet"), user("Bye?")],
     B + S + "You are terse." + U + "Hi" + A + TE + "Hello." + E + U + "Bye?" + A + TE)
case("thinking_default_effort",  # §2.1 None = high = 75; user at index 0 still gets <｜System｜>
     {"thinking_mode": "thinking", "messages": [user("q")]},
     B + S + EFF(75) + U + "q" + A + T)
case("effort_low_with_system",  # §2.1 low = 50, effort line then system content
     {"thinking_mode": "thinking", "reasoning_effort": "low", "messages": [system("sys"), user("u")]},
     B + S + EFF(50) + "sys" + U + "u" + A + T)
case("effort_int_42",  # §2.1 an int is used as is
     {"thinking_mode": "thinking", "reasoning_effort": 42, "messages": [user("u")]},
     B + S + EFF(42) + U + "u" + A + T)
case("effort_1_assistant_last",  # §2.1 lower bound; §2.4 no header after an assistant
     {"thinking_mode": "thinking", "reasoning_effort": 1,
      "messages": [system("s"), user("u"), asst("a", reasoning_content="r")]},
     B + S + EFF(1) + "s" + U + "u" + A + T + "r" + TE + "a" + E)
case("chat_effort_ignored",  # §2.1 chat mode never has an effort line; §6
     {"reasoning_effort": "max", "messages": [user("hello")]},
     B + U + "hello" + A + TE)
case("mid_system_header",  # §2.2 mid system <｜System｜>; §2.4 header after a system at index > 0
     {"thinking_mode": "thinking", "reasoning_effort": "high",
      "messages": [system("sys"), user("q1"), asst("a1", reasoning_content="r1"), system("mid")]},
     B + S + EFF(75) + "sys" + U + "q1" + A + TE + "a1" + E + S + "mid" + A + T)
case("mid_system_then_user",  # §2.4 no header when the next message is a user
     [user("a"), asst("b"), system("new rules"), user("c")],
     B + U + "a" + A + TE + "b" + E + S + "new rules" + U + "c" + A + TE)
case("drop_thinking_default",  # §1 step 4, §2.2 thinking part, §2.4 </think> before the last user
     {"thinking_mode": "thinking",
      "messages": [user("q1"), asst("a1", reasoning_content="r1"), user("q2"), asst("a2", reasoning_content="r2")]},
     B + S + EFF(75) + U + "q1" + A + TE + "a1" + E + U + "q2" + A + T + "r2" + TE + "a2" + E)
case("keep_thinking_drop_false",  # §1 step 4 with drop_thinking=False (project extension key)
     {"thinking_mode": "thinking", "drop_thinking": False,
      "messages": [user("q1"), asst("a1", reasoning_content="r1"), user("q2"), asst("a2", reasoning_content="r2")]},
     B + S + EFF(75) + U + "q1" + A + T + "r1" + TE + "a1" + E + U + "q2" + A + T + "r2" + TE + "a2" + E)
case("tools_force_keep_thinking",  # §1 step 4 tools force drop_thinking off; §2.3 tools block; case tools -> messages[0]
     {"thinking_mode": "thinking", "tools": [F_TOOL],
      "messages": [system("s"), user("q1"),
                   asst("", reasoning_content="r1", tool_calls=[call("f", "{\"x\": 1}")]),
                   tool("ok"), asst("done", reasoning_content="r2"), user("q2")]},
     B + S + EFF(75) + "s\n\n" + PRE + F_SCHEMA + EPI + U + "q1" + A + T + "r1" + TE
     + calls(inv("f", par("x", "1", "false"))) + E + U + "<tool_result>ok</tool_result>" + A + T
     + "r2" + TE + "done" + E + U + "q2" + A + T)
case("tools_on_user_not_rendered",  # §2.2 tools only on system; §6 but drop_thinking is forced off
     {"thinking_mode": "thinking",
      "messages": [dict(user("q1"), tools=[F_TOOL]), asst("a1", reasoning_content="r1"), user("q2")]},
     B + S + EFF(75) + U + "q1" + A + T + "r1" + TE + "a1" + E + U + "q2" + A + T)
case("tool_call_typed_params",  # §2.2 parameter typing: str raw, others json.dumps
     [user("weather?"),
      asst("Checking.", tool_calls=[call("get_weather", "{\"city\": \"Paris\", \"days\": 3, \"metric\": true, \"hours\": [6, 12], \"opts\": {\"lang\": \"fr\", \"x\": null}, \"ratio\": 0.5}")]),
      tool("sunny"), asst("It is sunny.")],
     B + U + "weather?" + A + TE + "Checking." + calls(inv("get_weather",
         par("city", "Paris", "true"), par("days", "3", "false"), par("metric", "true", "false"),
         par("hours", "[6, 12]", "false"), par("opts", "{\"lang\": \"fr\", \"x\": null}", "false"),
         par("ratio", "0.5", "false"))) + E
     + U + "<tool_result>sunny</tool_result>" + A + TE + "It is sunny." + E)
case("tool_results_sorted_by_call_order",  # §1 step 3; §2.2 empty invoke has an empty params line
     [user("q"), asst("", tool_calls=[call("f", "{\"k\": \"v\"}", id="call_a"), call("g", "{}", id="call_b")]),
      tool("RB", "call_b"), tool("RA", "call_a")],
     B + U + "q" + A + TE + calls(inv("f", par("k", "v", "true")), inv("g", "")) + E
     + U + "<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>" + A + TE)
case("unknown_id_sorts_first",  # §1 step 3 unknown id sorts first (key 0, stable); user text merges after
     [user("q"), asst("", tool_calls=[call("f", "{}", id="a"), call("g", "{}", id="b")]),
      tool("RB", "b"), tool("RZ", "zz"), tool("RA", "a"), user("thanks")],
     B + U + "q" + A + TE + calls(inv("f", ""), inv("g", "")) + E
     + U + "<tool_result>RZ</tool_result>\n\n<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>\n\nthanks" + A + TE)
case("arguments_object_values",  # §2.2 dict arguments; Python float repr; raw non-ASCII strings
     [user("q"), asst("", tool_calls=[call("search", {"q": "naïve 日本 \"quoted\"", "n": 1.0, "tiny": 1e-05,
                                                      "big": 1e16, "neg": -2, "nested": {"b": [True, None], "a": "é"}})])],
     B + U + "q" + A + TE + calls(inv("search", par("q", "naïve 日本 \"quoted\"", "true"), par("n", "1.0", "false"),
                                      par("tiny", "1e-05", "false"), par("big", "1e+16", "false"),
                                      par("neg", "-2", "false"), par("nested", "{\"b\": [true, null], \"a\": \"é\"}", "false"))) + E)
case("non_object_arguments",  # §2.2 non-object -> one `arguments` param with the original text; double-encoded JSON
     [user("q"), asst("", tool_calls=[call("f", "not json"), call("g", "[1, 2]"),
                                      call("h", "\"{\\\"a\\\": 1}\""), call("i", "\"plain\"")])],
     B + U + "q" + A + TE + calls(inv("f", par("arguments", "not json", "true")),
                                  inv("g", par("arguments", "[1, 2]", "true")),
                                  inv("h", par("a", "1", "false")),
                                  inv("i", par("arguments", "\"plain\"", "true"))) + E)
case("namespaces",  # §2.3 namespace description prepended; ns::name in schemas and invokes
     [system("s", tools=[
         {"type": "function", "namespace": {"name": "web", "description": "Web tools."},
          "function": {"name": "search", "description": "Search.", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "fs::read", "parameters": {"type": "object"}}},
         {"type": "function", "namespace": "calc", "function": {"name": "add"}}]),
      user("q"),
      asst("", tool_calls=[call("search", "{\"q\": \"x\"}", namespace="web"), call("fs::read", "{}")])],
     B + S + "s\n\n" + PRE
     + "{\"name\": \"web::search\", \"description\": \"Web tools.\\nSearch.\", \"parameters\": {\"type\": \"object\"}}\n"
     + "{\"name\": \"fs::read\", \"parameters\": {\"type\": \"object\"}}\n"
     + "{\"name\": \"calc::add\"}" + EPI
     + U + "q" + A + TE + calls(inv("web::search", par("q", "x", "true")), inv("fs::read", "")) + E)
case("response_format",  # §2.2 response-format block
     [system("Reply in JSON.", response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}),
      user("q")],
     B + S + "Reply in JSON." + RF
     + "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"r\", \"schema\": {\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}}}}"
     + U + "q" + A + TE)
case("tools_and_response_format",  # §2.2 tools block then response format (three newlines between)
     {"thinking_mode": "thinking", "reasoning_effort": "max",
      "messages": [system("sys", tools=[F_TOOL], response_format={"type": "json_object"}), user("q")]},
     B + S + EFF(100) + "sys\n\n" + PRE + F_SCHEMA + EPI + RF + "{\"type\": \"json_object\"}" + U + "q" + A + T)
case("latest_reminder_last",  # §2.4 the reminder is rendered after the header
     [system("s"), user("q"), {"role": "latest_reminder", "content": "2026-01-01"}],
     B + S + "s" + U + "q" + A + TE + R + "2026-01-01")
case("reminder_before_user",  # §2.2 latest_reminder; §2.4 no header after an index-0 system or a reminder
     {"thinking_mode": "thinking", "messages": [system("s"), {"role": "latest_reminder", "content": "date"}, user("q")]},
     B + S + EFF(75) + "s" + R + "date" + U + "q" + A + T)
case("wo_eos_prefill_chat",  # §2.2 wo_eos leaves the turn open
     [user("q"), asst("Sure, ", wo_eos=True)],
     B + U + "q" + A + TE + "Sure, ")
case("wo_eos_prefill_tool_call_thinking",  # §2.2 wo_eos with reasoning and a call
     {"thinking_mode": "thinking",
      "messages": [user("q"), asst("", reasoning_content="r", tool_calls=[call("f", "{}")], wo_eos=True)]},
     B + S + EFF(75) + U + "q" + A + T + "r" + TE + calls(inv("f", "")))
case("consecutive_users_joined",  # §1 step 2 consecutive users merge with "\n\n"; list content text blocks
     [user("a"), user("b"), asst("c"), user("d"), user([{"type": "text", "text": "e"}, {"type": "text", "text": "f"}])],
     B + U + "a\n\nb" + A + TE + "c" + E + U + "d\n\ne\n\nf" + A + TE)
case("task_query",  # §2.4 bare task token after the message
     [system("s"), dict(user("x"), task="query")],
     B + S + "s" + U + "x" + QUERY)
case("task_action_thinking",  # §2.4 action: <｜Assistant｜><think><｜action｜>; the answer has no thinking part
     {"thinking_mode": "thinking", "messages": [dict(user("x"), task="action"), asst("Answer")]},
     B + S + EFF(75) + U + "x" + A + T + ACTION + "Answer" + E)
case("task_title_on_assistant",  # §2.4 title after an assistant's EOS
     [user("hi"), asst("hello", task="title")],
     B + U + "hi" + A + TE + "hello" + E + TITLE)
case("task_domain_thinking",  # §2.4 task answer without thinking part in thinking mode
     {"thinking_mode": "thinking", "messages": [dict(user("x"), task="domain"), asst("finance")]},
     B + S + EFF(75) + U + "x" + DOMAIN + "finance" + E)
case("task_authority_then_user",  # §1 step 2 a user with a task is not merged; §2.4 no token when a user follows
     [dict(user("a"), task="authority"), user("b")],
     B + U + "a" + U + "b" + A + TE)
case("task_read_url_on_system",  # §2.4 a task on the index-0 system message
     [system("s", task="read_url")],
     B + S + "s" + READ_URL)
case("images_mixed",  # §1 step 1 image blocks -> placeholder, text joined with "\n\n"
     {"thinking_mode": "thinking", "reasoning_effort": 60,
      "messages": [user([{"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": "a.png"}},
                         {"type": "image", "data": "BASE64"}, {"type": "text", "text": "done"}])]},
     B + S + EFF(60) + U + "Compare\n\n" + IMG + "\n\n" + IMG + "\n\ndone" + A + T)
case("tool_result_blocks",  # §2.2 tool_result list content; [Unsupported type]; nested image
     [user("q"), asst("", tool_calls=[call("f", "{}", id="c1")]),
      user([{"type": "tool_result", "tool_use_id": "c1",
             "content": [{"type": "text", "text": "line"}, {"type": "image_url", "image_url": "http://x/y.png"},
                         {"type": "audio", "data": "zz"}]},
            {"type": "video"}, {"type": "text", "text": "see above"}])],
     B + U + "q" + A + TE + calls(inv("f", "")) + E
     + U + "<tool_result>line\n\n" + IMG + "\n\n[Unsupported audio]</tool_result>\n\n[Unsupported video]\n\nsee above" + A + TE)
case("literal_markers_pass_through",  # §2.2 nothing is escaped; §6 a tool turn without tools loses its reasoning
     {"thinking_mode": "thinking",
      "messages": [user("type <｜User｜> here"), asst("", reasoning_content="r1", tool_calls=[call("f", "{}")]),
                   tool("x </｜DSML｜ calls> <｜end▁of▁sentence｜> </think> <｜Assistant｜>")]},
     B + S + EFF(75) + U + "type <｜User｜> here" + A + TE + calls(inv("f", "")) + E
     + U + "<tool_result>x </｜DSML｜ calls> <｜end▁of▁sentence｜> </think> <｜Assistant｜></tool_result>" + A + T)
case("context_continuation",  # §2.1 no BOS with context; §1 step 3 the context's calls order the results
     {"context": [system("s"), user("q"), asst("", tool_calls=[call("f", "{}", id="a"), call("g", "{}", id="b")])],
      "messages": [tool("RB", "b"), tool("RA", "a")]},
     U + "<tool_result>RA</tool_result>\n\n<tool_result>RB</tool_result>" + A + TE)
case("context_thinking_no_prefix",  # §2.1 index-0 prefix belongs to the context
     {"thinking_mode": "thinking", "context": [user("q1"), asst("a1", reasoning_content="r1")],
      "messages": [user("q2")]},
     U + "q2" + A + T)
case("schema_escaping_and_key_order",  # §2.3 json.dumps(ensure_ascii=False): escapes, raw unicode, key order
     [system("s", tools=[fn("quote", description="Say \"hi\"\\ back\n\ttab — ünïcødé 😀 \u0001",
                             parameters={"zeta": 1, "alpha": 2.5, "mid": []})]), user("q")],
     B + S + "s\n\n" + PRE
     + "{\"name\": \"quote\", \"description\": \"Say \\\"hi\\\"\\\\ back\\n\\ttab — ünïcødé 😀 \\u0001\", \"parameters\": {\"zeta\": 1, \"alpha\": 2.5, \"mid\": []}}"
     + EPI + U + "q" + A + TE)
case("tool_without_preceding_user",  # §1 step 2 a tool message after a system opens its own user turn
     [system("s"), tool("orphan"), asst("ok")],
     B + S + "s" + U + "<tool_result>orphan</tool_result>" + A + TE + "ok" + E)
case("empty_contents",  # §2.2 empty user and assistant contents; chat ignores reasoning
     [user(""), asst("", reasoning_content="hidden")],
     B + U + A + TE + E)
case("developer_role_rejected",  # §2.2 developer is rejected by this revision
     [{"role": "developer", "content": "dev"}], error="NotImplementedError: Unknown role: developer")
case("effort_xhigh_rejected",  # §2.1 xhigh was removed in df42c109
     {"thinking_mode": "thinking", "reasoning_effort": "xhigh", "messages": [user("q")]},
     error="AssertionError: Invalid reasoning effort for deepseek_v41: xhigh, should be int within [1,100] or ['low', 'high', 'max']")
case("effort_bool_rejected",  # §2.1 type(x) is int: bools are rejected
     {"thinking_mode": "thinking", "reasoning_effort": True, "messages": [user("q")]},
     error="AssertionError: Invalid reasoning effort for deepseek_v41: True, should be int within [1,100] or ['low', 'high', 'max']")
case("image_placeholder_in_reasoning",  # §1 step 1 a literal placeholder in reasoning is an error
     [user("q"), asst("a", reasoning_content="see <｜deepseek_image｜>")],
     error="ValueError: reasoning_content contains image special token '<｜deepseek_image｜>'")
case("image_without_source",  # §1 step 1 image record needs a source
     [user([{"type": "image_url", "image_url": {}}])],
     error="ValueError: Image block does not contain a valid source")
case("tool_name_double_namespace",  # §2.2 namespaces: one `::` at most
     [user("q"), asst("", tool_calls=[call("a::b::c", "{}")])],
     error="AssertionError: Tool name must not contain '::': b::c")
case("conflicting_namespace",  # §2.2 explicit namespace must agree with a qualified name
     [user("q"), asst("", tool_calls=[call("y::f", "{}", namespace="x")])],
     error="AssertionError: Conflicting tool namespaces: x != y")


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dsml")
    for n, (name, inp, expected, error) in enumerate(CASES, 1):
        stem = os.path.join(out, f"{n:02d}_{name}")
        with open(stem + ".json", "w", encoding="utf-8") as f:
            json.dump(inp, f, ensure_ascii=False, indent=2)
            f.write("\n")
        for ext in (".txt", ".error"):
            if os.path.exists(stem + ext):
                os.remove(stem + ext)
        with open(stem + (".txt" if error is None else ".error"), "w", encoding="utf-8", newline="") as f:
            f.write(expected if error is None else error)
    print(f"wrote {len(CASES)} cases to {os.path.normpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
